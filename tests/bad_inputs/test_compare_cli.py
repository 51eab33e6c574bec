"""``refbraid compare`` refuses bad input with one line naming what is wrong (exit code 2)."""

from __future__ import annotations

import json
import os
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
    # files of the wrong kind: each must be named, with what was expected
    np.savez(d / "float_labels.npz", x=rng.standard_normal((5, 2)), labels=np.array(
        [0.0, 1.5, 2.0, 1.0, 0.0]))
    np.savez(d / "objects.npz", x=np.array([{"a": 1}] * 5, dtype=object), labels=np.zeros(5))
    np.save(d / "one_array.npy", rng.standard_normal((5, 2)))
    (d / "garbage.npz").write_bytes(b"\x80\x04garbage that is not an archive")
    (d / "garbage.pt").write_bytes(b"\x80\x04 not a torch file")
    (d / "folder.npz").mkdir()
    (d / "s_list.json").write_text("[1, 2]")
    (d / "spec_list.json").write_text('["T"]')
    (d / "r_list.json").write_text('"forward"')
    (d / "not_utf8.json").write_bytes(b"\xff\xfe\x00{")
    g = {k: v.numpy() for k, v in sd.items()}
    np.savez(d / "g_missing.npz", **{k: v for k, v in g.items() if k != "closing.bias"})
    np.savez(d / "g_shape.npz", **{**g, "steps.2.0.weight": np.zeros((4, 3))})
    return d


CASES = [  # (extra args replacing defaults, message fragment)
    ({"--batch": "missing.npz"}, "`--batch` file '.*missing.npz' does not exist"),
    ({"--batch": "folder.npz"}, "`--batch` file '.*folder.npz' is a folder; expected a file"),
    ({"--batch": "garbage.npz"}, r"`--batch` file '.*garbage.npz' is not a .npz archive of "
                                 r"arrays"),
    ({"--batch": "one_array.npy"}, r"holds one array \(a .npy file\); expected a .npz"),
    ({"--batch": "objects.npz"}, r"`x` holds Python objects; expected a numeric array"),
    ({"--batch": "float_labels.npz"}, r"`labels` must hold 5 integer class labels .*float64"),
    ({"--model": "garbage.pt"}, r"`--model` file '.*garbage.pt' is not a PyTorch file"),
    ({"--model": "missing.pt"}, r"`--model` file '.*missing.pt' does not exist"),
    ({"--spec": "missing.json"}, r"`--spec` file '.*missing.json' does not exist"),
    ({"--spec": "spec_list.json"}, r"`--spec` file '.*spec_list.json' must hold a JSON object, "
                                   r"got a list"),
    ({"--settings": "s_list.json"}, r"`--settings` file '.*s_list.json' must hold a JSON "
                                    r"object, got a list"),
    ({"--settings": "not_utf8.json"}, r"`--settings` file .* is not a text file"),
    ({"--settings": "missing.toml"}, r"`--settings` file '.*missing.toml' does not exist"),
    ({"--their-residuals": "r_list.json"}, r"must hold a JSON object, got a string"),
    ({"--their-gradient": "garbage.npz"}, r"`--their-gradient` file .* is not a .npz archive"),
    ({"--out": "{files}/spec.json"}, r"`--out` '.*spec.json' is a file; give a folder"),
    ({"--batch": "nolabels.npz"}, "must hold `x` and `labels`"),
    ({"--batch": "batch_shape.npz"}, r"`--batch` file '.*batch_shape.npz': `x` samples of "
                                     r"shape \(3,\) do not fit the network input \(2,\)"),
    ({"--spec": None}, "holds a state dict: give `--spec`"),
    ({"--spec": "spec_bad.json"}, r"unknown field\(s\) \['depth'\]"),
    ({"--spec": "spec_conv.json"}, r"Conv2d step: the weight `W` has shape \(4, 4\), this "
                                   r"module's is \(C_out, C_in, 3, 3\): does the spec name"),
    ({"--settings": "s_unknown.json"}, r"unknown setting\(s\) \['max_level'\]"),
    ({"--settings": "s_cwt.toml"}, "XBraid setting `crelax_wt` cannot be mapped"),
    ({"--abs-tol": "abc"}, "`--abs-tol` must be a number or `none`"),
    ({"--fwd-iters": "-1"}, "`--fwd-iters` counts MGRIT cycles after the skipped first "
                            "down-cycle .* must be >= 0, got -1"),
    ({"--their-residuals": "r_bad.json"}, "`--their-residuals` file '.*r_bad.json' is not "
                                          "valid JSON"),
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
        argv += [flag, str(files / value) if is_file else value.format(files=files)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("refbraid compare: error: ")
    assert re.search(message, err[0]), err[0]
    text = err[0].replace(str(files), "")
    assert "pickle" not in text.lower() and "internal error" not in text


def test_compare_refuses_a_read_only_out_before_any_work(files, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["compare", "--model", str(files / "model.pt"), "--spec",
                     str(files / "spec.json"), "--batch", str(files / "batch.npz"),
                     "--out", str(locked / "out")]) == 2
    finally:
        locked.chmod(0o700)
    assert "`--out`" in capsys.readouterr().err


def test_a_failed_compare_leaves_no_empty_out_folder(files, tmp_path, capsys):
    out = tmp_path / "new" / "out"
    assert main(["compare", "--model", str(files / "model.pt"), "--spec",
                 str(files / "spec_bad.json"), "--batch", str(files / "batch.npz"),
                 "--out", str(out)]) == 2
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("target", ["file", "inside-a-file"])
def test_lessons_build_out_is_checked_like_a_run_folder(tmp_path, capsys, target):
    pytest.importorskip("nbclient", reason="the extra `lessons`")
    (tmp_path / "f.txt").write_text("a file")
    out = tmp_path / "f.txt" if target == "file" else tmp_path / "f.txt" / "nb"
    assert main(["lessons", "build", "0", "--small", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("refbraid lessons: error: `--out` "), err
    assert "is a file" in err[0] or "a part of it is a file" in err[0]
