"""Checkpoints: everything needed to continue a run bit-identically, in one ``.npz`` file.

Layout of the archive (``numpy.savez``, loaded with ``allow_pickle=False``)::

    param/<name>     the network parameters, e.g. ``param/steps.W`` (N, C, C)
    optim/<name>     the optimizer state, e.g. ``optim/step`` (), ``optim/exp_avg/steps.W``
    buffer/<name>    the model's buffers, if it has any: batch norm's running statistics,
                     e.g. ``buffer/stage0.running_mean`` (n_0, C), and ``buffer/updates`` ()
                     (:mod:`refbraid.training.buffers`; absent in checkpoints written before)
    meta             a JSON string: format tag and version, epoch, the training config,
                     the optimizer name and hyper-parameters, the shuffling RNG's
                     ``bit_generator.state`` and the log history so far

The file is written atomically (temporary file + ``os.replace``), so an interrupted run
leaves the previous checkpoint intact. Resuming restores the parameters, the optimizer
state, the buffers and the RNG state exactly, so the continued run equals an uninterrupted
one bit for bit.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..backends.host import to_host
from ..checked_files import read_arrays

FORMAT = "refbraid-checkpoint"
VERSION = 1
FILENAME = "checkpoint.npz"  # name inside a run's output folder


@dataclass
class Checkpoint:
    """The content of a checkpoint file, on the host."""

    epoch: int
    params: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray]
    optimizer: dict[str, Any]  # {"name": ..., "hyper": {...}}
    rng_state: dict[str, Any]
    config: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    buffers: dict[str, np.ndarray] = field(default_factory=dict)

    def rng(self) -> np.random.Generator:
        """A Generator in exactly the saved state."""
        return rng_from_state(self.rng_state)


def rng_from_state(state: dict[str, Any]) -> np.random.Generator:
    """Rebuild a Generator from ``bit_generator.state`` (the bit generator named inside it)."""
    try:
        bitgen = getattr(np.random, state["bit_generator"])()
        bitgen.state = state
    except (KeyError, AttributeError, TypeError, ValueError) as err:
        raise ValueError(f"invalid RNG state in checkpoint: {err}") from err
    return np.random.Generator(bitgen)


def _host(a) -> np.ndarray:
    return np.asarray(to_host(a))


def save_checkpoint(path: str | os.PathLike, *, epoch: int, params: dict[str, Any], optimizer,
                    rng: np.random.Generator, config: dict[str, Any],
                    history: list[dict[str, Any]],
                    buffers: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint atomically; ``optimizer`` is an :class:`~.optim.Optimizer`,
    ``buffers`` the model's (:func:`refbraid.training.buffers.model_buffers`)."""
    arrays = {f"param/{k}": _host(v) for k, v in params.items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
    arrays.update({f"buffer/{k}": _host(v) for k, v in (buffers or {}).items()})
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "epoch": int(epoch),
        "config": config,
        "optimizer": {"name": optimizer.name, "hyper": optimizer.hyper()},
        "rng_state": rng.bit_generator.state,
        "history": history,
    }
    arrays["meta"] = np.array(json.dumps(meta))

    def write(fh):
        buf = io.BytesIO()  # savez needs seekable output; keep the fsync'd write in one go
        np.savez(buf, **arrays)
        fh.write(buf.getvalue())

    return atomic_write(path, write)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint and check every field (:func:`check_meta`, :func:`check_arrays`);
    a missing file raises FileNotFoundError, anything wrong inside a ValueError naming the
    file and the field."""
    if path is None or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` (the checkpoint) must be a file or run-folder path, got "
                        f"{type(path).__name__}.")
    path = Path(path)
    if path.is_dir():
        if not (path / FILENAME).is_file():
            raise FileNotFoundError(f"`--resume` folder {str(path)!r} holds no {FILENAME} (a "
                                    f"run writes one with --checkpoint-every).")
        path = path / FILENAME
    arrays = read_arrays(path, "`--resume` checkpoint")
    where = f"checkpoint {str(path)!r}"
    if "meta" not in arrays:
        raise ValueError(f"{where} is not a refbraid checkpoint (no `meta` entry).")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except ValueError:
        raise ValueError(f"{where} is corrupt: its `meta` entry is not valid JSON.") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{where} is not a refbraid checkpoint (format tag "
                         f"{meta.get('format') if isinstance(meta, dict) else None!r}).")
    if meta.get("version") != VERSION:
        raise ValueError(f"{where} has version {meta.get('version')!r}; this "
                         f"refbraid reads version {VERSION}.")
    check_meta(meta, where)
    ckpt = Checkpoint(
        epoch=meta["epoch"],
        params={k[6:]: v for k, v in arrays.items() if k.startswith("param/")},
        optimizer_state={k[6:]: v for k, v in arrays.items() if k.startswith("optim/")},
        optimizer=dict(meta["optimizer"]),
        rng_state=dict(meta["rng_state"]),
        config=dict(meta["config"]),
        history=list(meta["history"]),
        buffers={k[7:]: v for k, v in arrays.items() if k.startswith("buffer/")},
    )
    check_arrays(ckpt, arrays, where)
    return ckpt


#: meta fields and the JSON type each must have
META_FIELDS = {"epoch": int, "config": dict, "optimizer": dict, "rng_state": dict,
               "history": list}


def check_meta(meta: dict[str, Any], where: str) -> None:
    """Raise ValueError naming the field unless ``meta`` is a consistent checkpoint record:
    epoch ≥ 0, history records of epochs 1..epoch in order, an optimizer name with finite
    hyper-parameters, and an RNG state NumPy can restore."""
    for key, kind in META_FIELDS.items():
        if key not in meta:
            raise ValueError(f"{where} is incomplete: `meta.{key}` is missing.")
        value = meta[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{where}: `meta.{key}` must be a JSON {kind.__name__}, got "
                             f"{value!r:.60}.")
    epoch = meta["epoch"]
    if epoch < 0:
        raise ValueError(f"{where}: `meta.epoch` must be a whole number ≥ 0, got {epoch}.")
    epochs = [r.get("epoch") if isinstance(r, dict) else None for r in meta["history"]]
    numbered = all(isinstance(e, int) and not isinstance(e, bool) for e in epochs)
    if not numbered or epochs != sorted(set(epochs)) or any(not 1 <= e <= epoch for e in epochs):
        raise ValueError(f"{where}: `meta.history` must hold records of epochs 1..{epoch} in "
                         f"order, holds epochs {epochs[:8]}{' ...' if len(epochs) > 8 else ''}.")
    opt = meta["optimizer"]
    if not isinstance(opt.get("name"), str) or not isinstance(opt.get("hyper"), dict):
        raise ValueError(f"{where}: `meta.optimizer` must hold a `name` and a `hyper` table, "
                         f"got {opt!r:.80}.")
    for k, v in opt["hyper"].items():
        if not all(isinstance(x, bool) or isinstance(x, (int, float)) and np.isfinite(x)
                   for x in (v if isinstance(v, list) else [v])):
            raise ValueError(f"{where}: `meta.optimizer.hyper.{k}` must be a finite number "
                             f"(or a flag, or a list of them), got {v!r}.")
    try:
        rng_from_state(meta["rng_state"])
    except ValueError:
        raise ValueError(f"{where}: `meta.rng_state` is not a NumPy bit-generator state.") \
            from None


def check_arrays(ckpt: Checkpoint, arrays: dict[str, np.ndarray], where: str) -> None:
    """Raise ValueError naming the entry unless every array is numeric and the optimizer
    state and buffers are finite (NaN parameters are refused on resume, with their own
    message: a diverged run saved them)."""
    unknown = [k for k in arrays if k.partition("/")[0] not in ("param", "optim", "buffer")]
    if unknown:
        raise ValueError(f"{where} holds unexpected entries {unknown[:5]}.")
    if not ckpt.params:
        raise ValueError(f"{where} holds no parameters (`param/...` entries).")
    for key, value in arrays.items():
        if value.dtype.kind not in "biuf":
            raise ValueError(f"{where}: `{key}` must be a numeric array, got {value.dtype}.")
        if not key.startswith("param/") and not np.isfinite(value).all():
            raise ValueError(f"{where}: `{key}` holds NaN or infinite values; the checkpoint is "
                             f"damaged, so it cannot be resumed.")
    if "step" in ckpt.optimizer_state:
        step = ckpt.optimizer_state["step"]
        if step.shape != () or step.dtype.kind not in "iu" or int(step) < 0:
            raise ValueError(f"{where}: `optim/step` must be one whole number ≥ 0, got "
                             f"{step.dtype}{tuple(step.shape)}.")


def check_params_match(ckpt: Checkpoint, params: dict[str, Any],
                       source: str = "checkpoint") -> None:
    """Raise ValueError unless the checkpoint's parameters have the names, shapes and dtypes
    of ``params`` (the freshly built network's)."""
    if set(ckpt.params) != set(params):
        raise ValueError(
            f"{source} does not match the network: parameters "
            f"{sorted(set(ckpt.params) ^ set(params))} are in one but not the other."
        )
    for k, p in params.items():
        c = ckpt.params[k]
        if tuple(c.shape) != tuple(p.shape) or c.dtype != p.dtype:
            raise ValueError(f"{source} does not match the network: `{k}` is {c.dtype}"
                             f"{tuple(c.shape)} there and {p.dtype}{tuple(p.shape)} here.")
