"""Checkpoints: interrupted + resumed training is bit-identical to an uninterrupted run;
damaged or mismatched checkpoints give clear errors; writes are atomic."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refbraid.atomic import atomic_write, write_json
from refbraid.training import TrainConfig, train
from refbraid.training.checkpoint import (
    FILENAME,
    load_checkpoint,
    rng_from_state,
    save_checkpoint,
)
from refbraid.training.optim import Adam

BASE = dict(samples=300, layers=3, width=6, T=1.5, batch_size=25, lr=1e-2, quiet=True, serial=True)
COMPARED = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "steps", "stats")


@pytest.mark.parametrize("opt", [dict(optimizer="adam"), dict(optimizer="sgd", momentum=0.9)])
def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, opt):
    full = train(TrainConfig(**BASE, **opt, epochs=5, out=str(tmp_path / "full")))
    part = tmp_path / "part"
    first = train(TrainConfig(**BASE, **opt, epochs=2, checkpoint_every=1, out=str(part)))
    assert first.state.epoch == 2 and (part / FILENAME).is_file()
    resumed = train(TrainConfig(**BASE, **opt, epochs=5, resume=str(part / FILENAME),
                                out=str(tmp_path / "resumed")))
    for k, v in full.state.params.items():
        assert resumed.state.params[k].dtype == v.dtype
        np.testing.assert_array_equal(resumed.state.params[k], v, err_msg=k)
    for k, v in full.state.optimizer.state.items():
        np.testing.assert_array_equal(resumed.state.optimizer.state[k], v, err_msg=k)
    strip = lambda h: [{k: r[k] for k in COMPARED} for r in h]
    assert strip(resumed.state.history) == strip(full.state.history)
    assert (resumed.state.rng.bit_generator.state == full.state.rng.bit_generator.state)
    log = json.loads((tmp_path / "resumed" / "log.json").read_text())
    assert [r["epoch"] for r in log["history"]] == [1, 2, 3, 4, 5]


def test_resume_from_a_run_folder_and_checkpoint_content(tmp_path):
    train(TrainConfig(**BASE, epochs=3, checkpoint_every=2, out=str(tmp_path)))
    ckpt = load_checkpoint(tmp_path)  # a folder means its checkpoint.npz
    assert ckpt.epoch == 3  # every 2 epochs and at the end
    assert ckpt.optimizer["name"] == "adam" and ckpt.optimizer["hyper"]["lr"] == 1e-2
    assert ckpt.config["width"] == 6 and len(ckpt.history) == 3
    assert set(ckpt.params) == {"opening.W", "opening.b", "steps.W", "steps.b", "closing.W",
                                "closing.b"}
    assert ckpt.params["steps.W"].shape == (3, 6, 6)
    assert int(ckpt.optimizer_state["step"]) == 3 * 10
    resumed = train(TrainConfig(**BASE, epochs=3, resume=str(tmp_path), out=str(tmp_path / "r")))
    assert resumed.state.epoch == 3 and len(resumed.state.history) == 3  # nothing left to do


def test_rng_state_round_trips_through_json():
    rng = np.random.default_rng(7)
    rng.permutation(10)
    state = json.loads(json.dumps(rng.bit_generator.state))
    np.testing.assert_array_equal(rng_from_state(state).permutation(50), rng.permutation(50))
    with pytest.raises(ValueError, match="invalid RNG state"):
        rng_from_state({"bit_generator": "NoSuchGenerator"})


@pytest.fixture()
def checkpoint(tmp_path):
    train(TrainConfig(**BASE, epochs=1, checkpoint_every=1, out=str(tmp_path / "run")))
    return tmp_path / "run" / FILENAME


@pytest.mark.parametrize("change, flag", [(dict(width=8), "--width"), (dict(layers=4), "--layers"),
                                          (dict(model="resnet", T=2.0), "--T"),
                                          (dict(optimizer="sgd"), "--optimizer"),
                                          (dict(dtype="float32"), "--dtype"),
                                          (dict(seed=1), "--seed")])
def test_mismatched_checkpoint_names_what_differs(checkpoint, change, flag):
    cfg = TrainConfig(**{**BASE, **change}, epochs=2, resume=str(checkpoint))
    with pytest.raises(ValueError, match=f"does not match this run: .*{flag}"):
        train(cfg)


def test_mismatched_parameter_shapes_are_reported(tmp_path, checkpoint):
    ckpt = load_checkpoint(checkpoint)
    params = dict(ckpt.params)
    params["steps.W"] = np.zeros((3, 6, 5))
    opt = Adam(0.01)
    bad = tmp_path / "bad.npz"
    save_checkpoint(bad, epoch=1, params=params, optimizer=opt, rng=np.random.default_rng(0),
                    config=ckpt.config, history=[])
    with pytest.raises(ValueError, match=r"`steps.W` is float64\(3, 6, 5\) there"):
        train(TrainConfig(**BASE, epochs=2, resume=str(bad)))


def test_damaged_or_foreign_files_are_rejected(tmp_path, checkpoint):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="is not a .npz archive of arrays"):
        load_checkpoint(garbage)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(checkpoint.read_bytes()[:200])
    with pytest.raises(ValueError, match="is not a .npz archive|is damaged"):
        load_checkpoint(truncated)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, a=np.zeros(3))
    with pytest.raises(ValueError, match="is not a refbraid checkpoint"):
        load_checkpoint(foreign)
    tagged = tmp_path / "tagged.npz"
    np.savez(tagged, meta=np.array(json.dumps({"format": "something-else"})))
    with pytest.raises(ValueError, match="not a refbraid checkpoint"):
        load_checkpoint(tagged)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.npz")


def test_resume_needs_enough_epochs(tmp_path):
    train(TrainConfig(**BASE, epochs=2, checkpoint_every=2, out=str(tmp_path)))
    with pytest.raises(ValueError, match="`--epochs` 1 is below the checkpoint's epoch 2"):
        train(TrainConfig(**BASE, epochs=1, resume=str(tmp_path), out=str(tmp_path / "r")))
    train(TrainConfig(**BASE, epochs=2, resume=str(tmp_path), out=str(tmp_path / "r")))


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "log.json"
    write_json(target, {"a": 1})

    def fails(fh):
        fh.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, fails)
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.json"]  # temp file removed
