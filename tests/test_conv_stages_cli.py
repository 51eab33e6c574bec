"""``refbraid train --model conv-stages`` (pooling stages inside the layer-parallel section)
with ``--spatial-levels``; the flags' checks name the flag."""

import json

import numpy as np
import pytest

from refbraid.cli import main
from refbraid.layer_parallel import relative_gradient_error
from refbraid.models import build_network
from refbraid.training.config import TrainConfig
from refbraid.training.gradients import layer_parallel_settings, mgrit_gradient


def test_conv_stages_trains_layer_parallel_with_spatial_coarsening(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--model", "conv-stages", "--samples", "120", "--epochs", "1",
                 "--layers", "8", "--levels", "2", "--spatial-levels", "1", "--quiet",
                 "--out", str(out)])
    assert code == 0
    log = json.loads((out / "log.json").read_text())
    assert log["config"]["spatial_levels"] == "1"
    assert log["history"][-1]["stats"]["fwd_iters"] == 1


def test_conv_stages_converged_gradient_equals_backprop():
    cfg = TrainConfig(model="conv-stages", layers=8, levels=3, spatial_levels="1,2",
                      fwd_iters=12, bwd_iters=12, fwd_tol=1e-13, bwd_tol=1e-13)
    model = build_network("conv-stages", (1, 8, 8), 10, 8, 2, 1.0)
    params = model.init_params(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((3, 1, 8, 8)), rng.integers(0, 10, 3)
    settings = layer_parallel_settings(cfg)
    assert settings.spatial.levels == (1, 2)
    loss, g, stats = mgrit_gradient(model, settings)(params, x, y)
    loss_ref, ref, _ = model.backprop(params, x, y)
    assert relative_gradient_error(g, ref) <= 1e-10 and abs(loss - loss_ref) <= 1e-12
    logits = mgrit_gradient(model, settings).logits(params, x)
    np.testing.assert_allclose(logits, model.logits(params, x), atol=1e-10)


@pytest.mark.parametrize("flags,match", [
    (["--model", "resnet", "--spatial-levels", "1"], "`--spatial-levels` needs a model"),
    (["--model", "conv-stages", "--spatial-levels", "3"], "coarse levels 1..2"),
    (["--model", "conv-stages", "--spatial-levels", "x"], "comma-separated level numbers"),
    (["--model", "conv-stages", "--spatial-levels", "1", "--relax", "F"], "`--relax` must be FCF"),
])
def test_bad_spatial_flags_name_the_flag(flags, match, capsys, tmp_path):
    assert main(["train", *flags, "--out", str(tmp_path / "r")]) == 2
    assert match in capsys.readouterr().err


def _train(tmp_path, name, flags):
    out = tmp_path / name
    assert main(["train", "--model", "conv-stages", "--epochs", "1", "--quiet", "--out",
                 str(out), *flags]) == 0
    return json.loads((out / "log.json").read_text())


@pytest.mark.parametrize("flags", [
    ["--data", "digits", "--samples", "80", "--layers", "4", "--levels", "2",
     "--spatial-levels", "1"],
    ["--data", "digits", "--samples", "80", "--layers", "4", "--transition", "strided",
     "--serial"],
    ["--data", "voxels", "--samples", "24", "--layers", "2", "--width", "2", "--levels", "2",
     "--batch-size", "12"],
])
def test_conv_stages_trains_with_batch_norm(tmp_path, flags):
    """Digits (2-D, spatial coarsening; strided transition, serial) and voxels (3-D)."""
    log = _train(tmp_path, "bn", ["--batch-norm", *flags])
    assert log["config"]["batch_norm"] is True
    assert np.isfinite(log["history"][-1]["val_loss"])


def test_conv_stages_batch_norm_on_mnist_idx(tmp_path):
    from refbraid.data import write_idx

    rng = np.random.default_rng(0)
    folder = tmp_path / "mnist"
    folder.mkdir()
    write_idx(folder / "train-images-idx3-ubyte",
              rng.integers(0, 256, (40, 8, 8)).astype(np.uint8))
    write_idx(folder / "train-labels-idx1-ubyte", rng.integers(0, 10, 40).astype(np.uint8))
    log = _train(tmp_path, "mnist", ["--data", "mnist", "--data-dir", str(folder),
                                     "--layers", "4", "--levels", "2", "--batch-norm"])
    assert log["config"]["data"] == "mnist"


@pytest.mark.parametrize("flags,match", [
    (["--model", "resnet", "--batch-norm"], "`--batch-norm` applies to `--model conv-stages`"),
    (["--model", "conv", "--transition", "strided"], "`--transition` applies to"),
    (["--model", "conv-stages", "--transition", "max"], "`--transition` must be one of"),
])
def test_bad_stage_flags_name_the_flag(flags, match, capsys, tmp_path):
    assert main(["train", *flags, "--out", str(tmp_path / "r")]) == 2
    assert match in capsys.readouterr().err
