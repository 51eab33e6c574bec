"""Atomic file writes: a reader never sees a half-written log, plot or checkpoint.

Every writer goes through :func:`atomic_write`: write to a temporary file in the SAME folder
(so the rename stays on one file system), flush and fsync it, then ``os.replace`` it onto the
target name, which POSIX and Windows perform atomically. On error the temporary file is
removed and the previous version of the target (if any) is untouched.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> Path:
    """Call ``write(fh)`` on a temporary binary file next to ``path``, then move it there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically."""
    text = json.dumps(obj, indent=1, sort_keys=False, allow_nan=True) + "\n"
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


def save_figure(fig, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Save a matplotlib Figure as PNG, atomically (renders with Agg; no window, no pyplot)."""
    return atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi))
