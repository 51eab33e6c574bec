"""``refbraid compare`` refuses bad input with one line naming what is wrong (exit code 2)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from refbraid.cli import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch = pytest.importorskip("torch", reason="PyTorch is optional; these cases use a torch "
                                                "state dict")
    from torch import nn

    d = tmp_path_factory.mktemp("compare_bad")
    torch.manual_seed(0)
    sd = {"opening.0.weight": torch.randn(4, 2, dtype=torch.float64),
          "opening.0.bias": torch.randn(4, dtype=torch.float64)}
    for n in range(4):
        lin = nn.Linear(4, 4).double()
        sd[f"steps.{n}.0.weight"], sd[f"steps.{n}.0.bias"] = lin.weight.data, lin.bias.data
    sd["closing.weight"], sd["closing.bias"] = torch.randn(3, 4).double(), torch.randn(3).double()
    torch.save(sd, d / "model.pt")
    spec = {"T": 1.0, "input_shape": [2],
            "opening": {"module": "Linear", "key": "opening.0", "activation": "tanh"},
            "steps": {"module": "Linear", "key": "steps.{n}.0", "activation": "tanh"},
            "closing": {"module": "Linear", "key": "closing"}}
    (d / "spec.json").write_text(json.dumps(spec))
    (d / "spec_bad.json").write_text(json.dumps({**spec, "depth": 3}))
    (d / "spec_conv.json").write_text(json.dumps({**spec, "steps": {
        "module": "Conv2d", "key": "steps.{n}.0", "activation": "tanh"}}))
    rng = np.random.default_rng(0)
    np.savez(d / "batch.npz", x=rng.standard_normal((5, 2)), labels=rng.integers(0, 3, 5))
    np.savez(d / "nolabels.npz", x=rng.standard_normal((5, 2)))
    np.savez(d / "batch_shape.npz", x=rng.standard_normal((5, 3)), labels=rng.integers(0, 3, 5))
    (d / "s_unknown.json").write_text(json.dumps({"max_level": 2}))
    (d / "s_cwt.toml").write_text("crelax_wt = 0.5\n")
    (d / "r_bad.json").write_text("{forward: [1")
    g = {k: v.numpy() for k, v in sd.items()}
    np.savez(d / "g_missing.npz", **{k: v for k, v in g.items() if k != "closing.bias"})
    np.savez(d / "g_shape.npz", **{**g, "steps.2.0.weight": np.zeros((4, 3))})
    return d


CASES = [  # (extra args replacing defaults, message fragment)
    ({"--batch": "missing.npz"}, "batch file .*missing.npz does not exist"),
    ({"--batch": "nolabels.npz"}, "must hold `x` and `labels`"),
    ({"--batch": "batch_shape.npz"}, r"`x` samples of shape \(3,\) do not fit the network "
                                     r"input \(2,\)"),
    ({"--spec": None}, "holds a state dict: give `--spec`"),
    ({"--spec": "spec_bad.json"}, r"unknown field\(s\) \['depth'\]"),
    ({"--spec": "spec_conv.json"}, r"Conv2d step: the weight `W` has shape \(4, 4\), this "
                                   r"module's is \(C_out, C_in, 3, 3\): does the spec name"),
    ({"--settings": "s_unknown.json"}, r"unknown setting\(s\) \['max_level'\]"),
    ({"--settings": "s_cwt.toml"}, "XBraid setting `crelax_wt` cannot be mapped"),
    ({"--abs-tol": "abc"}, "`--abs-tol` must be a number or `none`"),
    ({"--fwd-iters": "-1"}, "`--fwd-iters` counts MGRIT cycles after the skipped first "
                            "down-cycle .* must be >= 0, got -1"),
    ({"--their-residuals": "r_bad.json"}, "residuals file .*r_bad.json is not valid json"),
    ({"--their-gradient": "g_missing.npz"}, "the their gradient has no `closing.bias`"),
    ({"--their-gradient": "g_shape.npz"}, r"`steps.2.0.weight` has shape \(4, 3\), the weight "
                                          r"has \(4, 4\)"),
    ({"--grad-tol": "-1"}, "`gradient` tolerance must be a positive number"),
]


@pytest.mark.parametrize("changes, message", CASES, ids=[m[:30] for _, m in CASES])
def test_bad_compare_input_is_one_line(files, tmp_path, capsys, changes, message):
    args = {"--model": "model.pt", "--spec": "spec.json", "--batch": "batch.npz",
            "--levels": "2", "--cfactor": "2", "--out": str(tmp_path / "out")}
    args.update(changes)
    argv = ["compare"]
    for flag, value in args.items():
        if value is None:
            continue
        is_file = flag in ("--model", "--spec", "--batch", "--settings", "--their-residuals",
                           "--their-gradient")
        argv += [flag, str(files / value) if is_file else value]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("refbraid compare: error: ")
    assert re.search(message, err[0]), err[0]
