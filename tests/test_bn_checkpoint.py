"""Batch norm's running statistics in checkpoints: a resumed conv-stages run equals an
uninterrupted one (parameters, running statistics, evaluation); older checkpoints without
them and checkpoints of another architecture are refused with a message naming why."""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.cli import main
from refbraid.models import build_network
from refbraid.training import TrainConfig, train
from refbraid.training.buffers import (
    UPDATES,
    MissingBuffers,
    buffers_kept,
    model_buffers,
    restore_buffers,
)
from refbraid.training.checkpoint import FILENAME, load_checkpoint

BASE = dict(model="conv-stages", batch_norm=True, data="digits", samples=120, layers=4,
            width=2, batch_size=30, lr=1e-2, quiet=True, levels=2, checkpoint_every=1)
COMPARED = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc",
            "val_acc_sequential_forward", "steps")


def _rewrite(path, change):
    """Rewrite the checkpoint at ``path`` with ``change(arrays)`` applied (a test's forgery)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(arrays)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(uninterrupted 2 epochs, 1 epoch + resumed 1 epoch, the 1-epoch folder)."""
    root = tmp_path_factory.mktemp("bn_resume")
    full = train(TrainConfig(**BASE, epochs=2, out=str(root / "full")))
    train(TrainConfig(**BASE, epochs=1, out=str(root / "part")))
    resumed = train(TrainConfig(**BASE, epochs=2, resume=str(root / "part"),
                                out=str(root / "resumed")))
    return full, resumed, root


def test_resumed_run_equals_the_uninterrupted_one(runs):
    full, resumed, root = runs
    for k, v in full.state.params.items():
        np.testing.assert_array_equal(resumed.state.params[k], v, err_msg=k)
    a, b = load_checkpoint(root / "full").buffers, load_checkpoint(root / "resumed").buffers
    assert set(a) == set(b) and "stage0.running_mean" in a and "transition0.2_running_var" in a
    for k in a:
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)
    steps = sum(r["steps"] for r in full.state.history)  # one update per training step
    assert steps >= 6 and int(a[UPDATES]) == steps and a["stage1.running_mean"].shape == (2, 4)
    assert not np.allclose(a["stage0.running_var"], 1.0)  # the statistics did move
    strip = lambda h: [{k: r[k] for k in COMPARED} for r in h]
    assert strip(resumed.state.history) == strip(full.state.history)


def test_checkpoint_without_running_statistics_is_refused(runs, tmp_path, capsys):
    """A checkpoint written before the statistics were saved: a clear error, exit code 2."""
    _, _, root = runs
    old = tmp_path / "old"
    old.mkdir()
    (old / FILENAME).write_bytes((root / "part" / FILENAME).read_bytes())
    _rewrite(old / FILENAME, lambda a: [a.pop(k) for k in list(a) if k.startswith("buffer/")])
    assert load_checkpoint(old).buffers == {}
    with pytest.raises(MissingBuffers, match="holds no batch-norm running statistics"):
        train(TrainConfig(**BASE, epochs=2, resume=str(old), out=str(tmp_path / "r")))
    code = main(["train", "--model", "conv-stages", "--batch-norm", "--samples", "120",
                 "--layers", "4", "--width", "2", "--batch-size", "30", "--lr", "0.01",
                 "--levels", "2", "--epochs", "2", "--resume", str(old), "--quiet",
                 "--out", str(tmp_path / "cli")])
    assert code == 2 and "no batch-norm running statistics" in capsys.readouterr().err


@pytest.mark.parametrize("change,names", [
    (lambda a: a.update({"buffer/stage0.running_mean": np.zeros((3, 2))}),
     "`stage0.running_mean` is float64(3, 2) there and float64(2, 2) here"),
    (lambda a: a.update({"buffer/transition0.1_running_mean": a.pop(
        "buffer/transition0.2_running_mean")}),
     "['transition0.2_running_mean'] are missing in the checkpoint"),
])
def test_statistics_of_another_architecture_name_what_differs(runs, tmp_path, change, names):
    _, _, root = runs
    other = tmp_path / "other"
    other.mkdir()
    (other / FILENAME).write_bytes((root / "part" / FILENAME).read_bytes())
    _rewrite(other / FILENAME, change)
    with pytest.raises(ValueError, match="does not match the network's batch norm") as err:
        train(TrainConfig(**BASE, epochs=2, resume=str(other), out=str(tmp_path / "r")))
    assert names in str(err.value)


def test_resuming_with_another_batch_norm_flag_names_the_flag(runs, tmp_path):
    _, _, root = runs
    cfg = {**BASE, "batch_norm": False}
    with pytest.raises(ValueError, match="`--batch-norm`: checkpoint True, now False"):
        train(TrainConfig(**cfg, epochs=2, resume=str(root / "part"), out=str(tmp_path / "r")))


def test_restore_checks_values_and_models_without_batch_norm():
    model = build_network("conv-stages", (1, 8, 8), 10, 4, 2, 1.0, batch_norm=True)
    saved = model_buffers(model)
    saved["stage1.running_var"] = -saved["stage1.running_var"]
    with pytest.raises(ValueError, match=r"invalid running statistics in \['stage1.running_var'"):
        restore_buffers(model, saved)
    plain = build_network("conv-stages", (1, 8, 8), 10, 4, 2, 1.0)
    assert model_buffers(plain) == {}
    restore_buffers(plain, {})  # nothing to restore, nothing asked
    with pytest.raises(ValueError, match="holds running statistics"):
        restore_buffers(plain, model_buffers(model))


def test_buffers_kept_puts_the_statistics_back():
    model = build_network("conv-stages", (1, 8, 8), 10, 4, 2, 1.0, batch_norm=True)
    x = np.random.default_rng(0).standard_normal((5, 1, 8, 8))
    before = model_buffers(model)
    with buffers_kept(model):
        model.record_batch_stats(model.backprop(model.init_params(np.random.default_rng(1)),
                                                x, np.arange(5))[2])
        assert model.updates == 1
    after = model_buffers(model)
    assert all(np.array_equal(after[k], before[k]) for k in before)
