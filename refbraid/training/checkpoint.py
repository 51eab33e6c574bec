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
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..backends.host import to_host
from .atomic import atomic_write

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
    """Read a checkpoint; a missing file raises FileNotFoundError, a damaged one ValueError."""
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"`--resume` checkpoint {str(path)!r} does not exist.")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as err:
        raise ValueError(f"checkpoint {str(path)!r} is corrupt or not a refbraid checkpoint "
                         f"({type(err).__name__}: {err}).") from err
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"checkpoint {str(path)!r} is not a refbraid checkpoint (format tag "
                         f"{meta.get('format') if isinstance(meta, dict) else None!r}).")
    if meta.get("version") != VERSION:
        raise ValueError(f"checkpoint {str(path)!r} has version {meta.get('version')!r}; this "
                         f"refbraid reads version {VERSION}.")
    try:
        return Checkpoint(
            epoch=int(meta["epoch"]),
            params={k[6:]: v for k, v in arrays.items() if k.startswith("param/")},
            optimizer_state={k[6:]: v for k, v in arrays.items() if k.startswith("optim/")},
            optimizer=dict(meta["optimizer"]),
            rng_state=dict(meta["rng_state"]),
            config=dict(meta["config"]),
            history=list(meta["history"]),
            buffers={k[7:]: v for k, v in arrays.items() if k.startswith("buffer/")},
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {str(path)!r} is incomplete: {err!r} missing or "
                         f"malformed.") from err


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
