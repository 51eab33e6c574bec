"""A checkpoint handed to ``--resume`` is checked field by field on load: each damaged field
is named (``meta.epoch``, ``optim/exp_avg/steps.W``, ...) with what was expected, before any
work — a negative epoch or NaN optimizer state is never trained on (and never blamed on
``--lr`` later)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from refbraid.cli import EXIT_USAGE, main
from refbraid.training.checkpoint import load_checkpoint

TINY = ["--samples", "200", "--layers", "16", "--width", "4", "--quiet", "--serial"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("meta") / "run"
    assert main(["train", *TINY, "--epochs", "2", "--optimizer", "adam", "--checkpoint-every",
                 "1", "--out", str(out)]) == 0
    return out


def _doctored(src: Path, dest: Path, meta_edit=None, array_edit=None) -> Path:
    with np.load(src / "checkpoint.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays["meta"]))
    if meta_edit is not None:
        meta_edit(meta)
        arrays["meta"] = np.array(json.dumps(meta))
    if array_edit is not None:
        array_edit(arrays)
    dest.mkdir(parents=True, exist_ok=True)
    np.savez(dest / "checkpoint.npz", **arrays)
    return dest / "checkpoint.npz"


def _set(key, value):
    return lambda m: m.__setitem__(key, value)


def _nan(key):
    def edit(arrays):
        arrays[key] = np.full_like(arrays[key], np.nan)
    return edit


META_CASES = [  # (id, meta edit, message)
    ("epoch-negative", _set("epoch", -1), r"`meta.epoch` must be a whole number ≥ 0, got -1"),
    ("epoch-text", _set("epoch", "2"), r"`meta.epoch` must be a JSON int, got '2'"),
    ("epoch-bool", _set("epoch", True), r"`meta.epoch` must be a JSON int"),
    ("epoch-float", _set("epoch", 2.5), r"`meta.epoch` must be a JSON int"),
    ("epoch-below-history", _set("epoch", 1), r"`meta.history` must hold records of epochs "
                                              r"1..1 in order, holds epochs \[1, 2\]"),
    ("epoch-zero-with-history", _set("epoch", 0), r"epochs 1..0 in order, holds epochs "
                                                  r"\[1, 2\]"),
    ("history-renumbered", lambda m: m["history"][1].__setitem__("epoch", 0),
     r"`meta.history` must hold records of epochs 1..2 in order, holds epochs \[1, 0\]"),
    ("history-repeated", lambda m: m["history"][1].__setitem__("epoch", 1),
     r"holds epochs \[1, 1\]"),
    ("history-not-a-list", _set("history", {"1": {}}), r"`meta.history` must be a JSON list"),
    ("config-missing", lambda m: m.pop("config"), r"`meta.config` is missing"),
    ("config-a-list", _set("config", [1]), r"`meta.config` must be a JSON dict"),
    ("optimizer-nameless", lambda m: m["optimizer"].pop("name"),
     r"`meta.optimizer` must hold a `name` and a `hyper` table"),
    ("optimizer-lr-nan", lambda m: m["optimizer"]["hyper"].__setitem__("lr", float("nan")),
     r"`meta.optimizer.hyper.lr` must be a finite number .*got nan"),
    ("rng-garbage", _set("rng_state", {"bit_generator": "NoSuchGenerator"}),
     r"`meta.rng_state` is not a NumPy bit-generator state"),
]

ARRAY_CASES = [  # (id, array edit, message)
    ("optimizer-state-nan", _nan("optim/exp_avg/steps.W"),
     r"`optim/exp_avg/steps.W` holds NaN or infinite values; the checkpoint is damaged"),
    ("optimizer-step-negative", lambda a: a.__setitem__("optim/step", np.array(-3)),
     r"`optim/step` must be one whole number ≥ 0"),
    ("optimizer-step-float", lambda a: a.__setitem__("optim/step", np.array(2.0)),
     r"`optim/step` must be one whole number ≥ 0, got float64"),
    ("unknown-entry", lambda a: a.__setitem__("junk/x", np.zeros(2)),
     r"holds unexpected entries \['junk/x'\]"),
    ("no-parameters", lambda a: [a.pop(k) for k in list(a) if k.startswith("param/")],
     r"holds no parameters"),
    ("text-parameter", lambda a: a.__setitem__("param/steps.W", np.array(["a", "b"])),
     r"`param/steps.W` must be a numeric array, got <U1"),
    ("meta-not-json", lambda a: a.__setitem__("meta", np.array("{epoch: 2")),
     r"its `meta` entry is not valid JSON"),
    ("meta-missing", lambda a: a.pop("meta"), r"is not a refbraid checkpoint \(no `meta`"),
]


@pytest.mark.parametrize("case_id, edit, message", META_CASES, ids=[c[0] for c in META_CASES])
def test_each_meta_field_is_checked_on_load(finished, tmp_path, case_id, edit, message):
    path = _doctored(finished, tmp_path, meta_edit=edit)
    with pytest.raises(ValueError, match=message):
        load_checkpoint(path)


@pytest.mark.parametrize("case_id, edit, message", ARRAY_CASES, ids=[c[0] for c in ARRAY_CASES])
def test_each_array_is_checked_on_load(finished, tmp_path, case_id, edit, message):
    path = _doctored(finished, tmp_path, array_edit=edit)
    with pytest.raises(ValueError, match=message):
        load_checkpoint(path)


@pytest.mark.parametrize("meta_edit, array_edit, message", [
    (_set("epoch", -1), None, r"`meta.epoch` must be a whole number ≥ 0"),
    (None, _nan("optim/exp_avg_sq/steps.W"), r"`optim/exp_avg_sq/steps.W` holds NaN"),
], ids=["negative-epoch", "nan-optimizer-state"])
def test_resume_refuses_a_doctored_checkpoint_before_any_work(finished, tmp_path, capsys,
                                                              meta_edit, array_edit, message):
    path = _doctored(finished, tmp_path / "bad", meta_edit, array_edit)
    out = tmp_path / "new"
    assert main(["train", *TINY, "--epochs", "4", "--optimizer", "adam", "--resume", str(path),
                 "--out", str(out)]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lr" not in err[0], err
    assert err[0].startswith("refbraid train: error: ") and __import__("re").search(message,
                                                                                  err[0])
    assert not out.exists()  # refused before the folder held anything


def test_load_checkpoint_names_a_path_that_is_not_a_path():
    with pytest.raises(TypeError, match=r"`path` \(the checkpoint\) must be a file or "
                                        r"run-folder path, got NoneType"):
        load_checkpoint(None)


def test_an_existing_folder_without_a_checkpoint_is_not_called_missing(tmp_path, capsys):
    assert main(["train", *TINY, "--resume", str(tmp_path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"`--resume` folder {str(tmp_path)!r} holds no checkpoint.npz" in err
    assert "does not exist" not in err
