"""``compare`` on networks whose answer is known, and a wrong "their gradient" caught and named;
``refbraid compare`` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refbraid.cli import main
from refbraid.gradient_error import gradient_error_study
from refbraid.interop import TorchBraidSettings
from refbraid.interop.compare import compare
from refbraid.interop.convert import Converted
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.mgrit import MGRITSettings

from .test_xbraid import _net_batch


def _converted():
    net, params, x, y = _net_batch()
    return Converted(net, params, {k: k for k in params}, {k: None for k in params}, None), x, y


def test_one_level_is_exact():
    conv, x, y = _converted()
    report, _ = compare(conv, x, y, TorchBraidSettings(max_levels=1).to_refbraid())
    assert report["layer_parallel"]["gradient_error"]["total"] <= 1e-15


def test_converged_is_round_off():
    conv, x, y = _converted()
    s = MGRITSettings.torchbraid(max_iter=30, abs_tol=1e-14)
    report, _ = compare(conv, x, y, LayerParallelSettings(s, s))
    assert report["layer_parallel"]["gradient_error"]["total"] <= 1e-10


def test_torchbraid_defaults_give_verify_layer_parallel_error():
    """Without the adjoint's final relaxation, TorchBraid's settings are refbraid's default:
    the same error as the `default` row of `refbraid verify --layer-parallel`."""
    conv, x, y = _converted()
    settings = TorchBraidSettings(bwd_finalrelax=False, min_coarse=1).to_refbraid()
    report, _ = compare(conv, x, y, settings)
    rows = gradient_error_study(conv.net, conv.params, x, y, iterations=[])
    default = next(r for r in rows if r.label == "default")
    assert report["layer_parallel"]["gradient_error"]["total"] == pytest.approx(
        default.grad_error, rel=1e-12)
    assert default.grad_error > 1e-3  # inexact: there is something to find


def _perturbed(g, key, row=None, factor=1.01):
    out = {k: v.copy() for k, v in g.items()}
    if row is None:
        out[key] *= factor
    else:
        out[key][row] *= factor
    return out


def test_wrong_gradient_is_caught_and_named():
    conv, x, y = _converted()
    settings = TorchBraidSettings().to_refbraid()
    _, grads = compare(conv, x, y, settings)
    lp, exact = grads["layer_parallel"], grads["exact"]
    ok, _ = compare(conv, x, y, settings, their_gradient=lp)
    assert ok["verdict"] == "PASS"
    bad, _ = compare(conv, x, y, settings, their_gradient=_perturbed(lp, "steps.W", row=3))
    assert bad["verdict"] == "FAIL" and bad["their_gradient"]["worst"] == "steps.W"
    assert "in `steps.W` by" in bad["failures"][0]
    ex, _ = compare(conv, x, y, settings, their_gradient=exact)
    assert ex["verdict"] == "FAIL" and "It is the exact gradient" in ex["failures"][0]


def test_final_fc_relax_convention_is_recognised():
    """A gradient from the same settings without TorchBraid's adjoint final relaxation: a
    convention, and the report says so (the opening weights differ most)."""
    conv, x, y = _converted()
    tb = TorchBraidSettings().to_refbraid()
    _, plain = compare(conv, x, y, TorchBraidSettings(bwd_finalrelax=False).to_refbraid())
    report, _ = compare(conv, x, y, tb, their_gradient=plain["layer_parallel"])
    assert report["verdict"] == "FAIL" and report["their_gradient"]["worst"].startswith("opening")
    assert report["their_gradient"]["matches_flipped_final_fc_relax"]
    assert "convention difference" in report["failures"][0]


def test_their_residuals():
    conv, x, y = _converted()
    settings = TorchBraidSettings().to_refbraid()
    report, _ = compare(conv, x, y, settings)
    fwd = report["residuals"]["forward"]["xbraid"]["norms"]
    ok, _ = compare(conv, x, y, settings, their_residuals={"forward": fwd, "backward": -1.0})
    assert ok["verdict"] == "PASS"
    bad, _ = compare(conv, x, y, settings,
                     their_residuals={"forward": [fwd[0], fwd[0] / 10], "backward": []})
    assert bad["verdict"] == "FAIL"
    assert "forward: they report 2 residual norm(s), xbraid's convention gives 1" in \
        bad["failures"][0]
    rb = report["residuals"]["forward"]["refbraid"]["norms"]
    own, _ = compare(conv, x, y, settings,
                     their_residuals={"convention": "refbraid", "forward": rb})
    assert own["verdict"] == "PASS" and len(rb) == 2


def test_compare_cli_end_to_end(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason="PyTorch is optional; this test saves a torch "
                                                "state dict")
    from .torch_nets import batch, dense_net

    model = dense_net(N=8)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    spec = {"T": 1.5, "input_shape": [3],
            "opening": {"module": "Linear", "key": "opening.0", "activation": "tanh"},
            "steps": {"module": "Linear", "key": "steps.{n}.0", "activation": "tanh"},
            "closing": {"module": "Linear", "key": "closing"}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    x, labels = batch((3,), 4, B=7)
    np.savez(tmp_path / "batch.npz", x=x, labels=labels)
    args = ["compare", "--model", str(tmp_path / "model.pt"), "--spec",
            str(tmp_path / "spec.json"), "--batch", str(tmp_path / "batch.npz"),
            "--levels", "2", "--cfactor", "2", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    report = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert (tmp_path / "out" / "compare.png").is_file()
    with np.load(tmp_path / "out" / "gradients.npz") as f:
        lp = {k.split("/", 1)[1]: f[k] for k in f if k.startswith("layer_parallel/")}
    assert "steps.3.0.weight" in lp and report["settings"]["forward"]["levels"] == 2
    lp["opening.0.weight"] = lp["opening.0.weight"] * 1.05  # a wrong opening gradient
    np.savez(tmp_path / "theirs.npz", **lp)
    assert main([*args, "--their-gradient", str(tmp_path / "theirs.npz")]) == 4
    assert "FAIL: their gradient differs" in capsys.readouterr().out
    assert main([*args[:3], *args[5:]]) == 2  # a state dict without --spec
    assert "give `--spec`" in capsys.readouterr().err
    torch.save(model, tmp_path / "module.pt")  # a pickled module: no spec needed
    assert main(["compare", "--model", str(tmp_path / "module.pt"), "--batch",
                 str(tmp_path / "batch.npz"), "--levels", "1", "--out", str(tmp_path / "m")]) == 0
    report = json.loads((tmp_path / "m" / "compare.json").read_text())
    assert report["layer_parallel"]["gradient_error"]["total"] == 0.0


def test_compare_reads_a_refbraid_checkpoint(tmp_path):
    """A refbraid checkpoint is a network too: its own names are the keys."""
    from refbraid.models import build_network
    from refbraid.training import TrainConfig
    from refbraid.training.checkpoint import save_checkpoint
    from refbraid.training.optim import SGD

    config = TrainConfig(model="resnet", layers=16, width=4)
    net = build_network("resnet", (2,), 5, 16, 4, config.T)
    from refbraid import init_params

    params = init_params(net, 0)
    save_checkpoint(tmp_path / "ck.npz", epoch=1, params=params, optimizer=SGD(0.1),
                    rng=np.random.default_rng(0), config=config.to_dict(), history=[])
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "b.npz", x=rng.uniform(-3, 3, (8, 2)), labels=rng.integers(0, 5, 8))
    assert main(["compare", "--model", str(tmp_path / "ck.npz"), "--batch",
                 str(tmp_path / "b.npz"), "--levels", "1", "--out", str(tmp_path / "o")]) == 0
    report = json.loads((tmp_path / "o" / "compare.json").read_text())
    assert report["network"]["n_layers"] == 16
    assert report["layer_parallel"]["gradient_error"]["total"] == 0.0


def test_verify_layer_parallel_network_default_row():
    """On `refbraid verify --layer-parallel`'s own network and batch, compare with TorchBraid's
    settings (without the adjoint's final FC relaxation) reports its `default` row's error."""
    from refbraid.layer_parallel import layer_parallel_gradient, relative_gradient_error
    from refbraid.network import backprop
    from refbraid.training.config import TrainConfig
    from refbraid.training.gradients import layer_parallel_settings
    from refbraid.training.run import setup

    config = TrainConfig(quiet=True)
    net, data, state, bk = setup(config)
    x, y = data.x_train[: config.batch_size], data.y_train[: config.batch_size]
    _, g_ref, _ = backprop(net, state.params, x, y)
    _, g, _ = layer_parallel_gradient(net, state.params, x, y, layer_parallel_settings(config))
    conv = Converted(net, state.params, {k: k for k in state.params},
                     {k: None for k in state.params}, None)
    report, _ = compare(conv, x, y,
                        TorchBraidSettings(bwd_finalrelax=False, min_coarse=1).to_refbraid())
    assert report["layer_parallel"]["gradient_error"]["total"] == pytest.approx(
        relative_gradient_error(g, g_ref), rel=1e-12)
