"""One checked reader for every file a user hands to refbraid.

``refbraid compare`` (``--model``, ``--batch``, ``--settings``, ``--spec``, ``--their-gradient``,
``--their-residuals``), ``refbraid train --resume`` and ``--data-dir`` (IDX files) read their
files here, so every problem reads the same way: one sentence that names the file (as the
user's flag calls it, ``what``), the key inside it when one is at fault, and what was
expected — never a pickle module's text or an "internal error"::

    `--batch` file 'b.npz' does not exist.
    `--batch` file 'runs/' is a folder; expected a file.
    `--settings` file 's.json' must hold a JSON object of settings, got a list.
    `--batch` file 'b.npz' is not a .npz archive of arrays (NumPy cannot read it as one).
    `--batch` file 'b.npz' has no `labels` (it holds: x, y_true).

Every error is a ``ValueError`` (``FileNotFoundError`` for a missing file, ``TypeError`` for a
path that is not a path), so the command line exits with code 2.
"""

from __future__ import annotations

import gzip
import json
import os
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

#: what a ``.toml``/``.json`` mapping file's top level must be, for the message
MAPPING_KINDS = {"JSON": "a JSON object", "TOML": "a TOML table"}


def input_path(path: Any, what: str) -> Path:
    """``path`` as a Path to an existing, readable regular file (checked, named by ``what``)."""
    if path is None or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (a string), got {type(path).__name__}.")
    p = Path(path)
    if not str(path).strip():
        raise ValueError(f"{what} must name a file, got an empty path.")
    if p.is_dir():
        raise ValueError(f"{what} {str(p)!r} is a folder; expected a file.")
    if not p.exists():
        raise FileNotFoundError(f"{what} {str(p)!r} does not exist.")
    if not p.is_file():
        raise ValueError(f"{what} {str(p)!r} is not a regular file.")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{what} {str(p)!r} cannot be read (permission denied).")
    return p


def read_bytes(path: Any, what: str) -> bytes:
    """The bytes of a file (gunzipped when its name ends in ``.gz``)."""
    p = input_path(path, what)
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rb") as fh:
                return fh.read()
        return p.read_bytes()
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{what} {str(p)!r} cannot be read ({type(err).__name__}: {err}): "
                         f"the file is damaged or truncated.") from None


def read_text(path: Any, what: str) -> str:
    """A UTF-8 text file's content."""
    p = input_path(path, what)
    try:
        return read_bytes(p, what).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {str(p)!r} is not a text file (not UTF-8).") from None


def read_mapping(path: Any, what: str) -> dict[str, Any]:
    """A TOML (``.toml``) or JSON (anything else) file whose top level is a mapping."""
    p = input_path(path, what)
    kind = "TOML" if p.suffix == ".toml" else "JSON"
    text = read_text(p, what)
    try:
        if kind == "TOML":
            try:
                import tomllib
            except ImportError:  # pragma: no cover - Python 3.10
                raise ValueError(f"{what} {str(p)!r}: TOML needs Python >= 3.11; write it as "
                                 f"JSON.") from None
            value = tomllib.loads(text)
        else:
            value = json.loads(text)
    except ValueError as err:  # json.JSONDecodeError and tomllib.TOMLDecodeError
        raise ValueError(f"{what} {str(p)!r} is not valid {kind}: {err}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} {str(p)!r} must hold {MAPPING_KINDS[kind]}, got "
                         f"{_json_kind(value)}.")
    return value


def _json_kind(value: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def read_arrays(path: Any, what: str, required: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The numeric arrays of a ``.npz`` archive (``numpy.savez``); pickled objects refused.

    ``required``: keys that must be present (the message lists what the archive holds).
    """
    p = input_path(path, what)
    not_npz = f"{what} {str(p)!r} is not a .npz archive of arrays (NumPy cannot read it as one)."
    try:
        loaded = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):
        raise ValueError(not_npz) from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{what} {str(p)!r} holds one array (a .npy file); expected a .npz "
                         f"archive of named arrays.")
    arrays: dict[str, np.ndarray] = {}
    with loaded:
        for key in loaded.files:
            try:
                arrays[key] = loaded[key]
            except ValueError:
                raise ValueError(f"{what} {str(p)!r}: `{key}` holds Python objects; expected "
                                 f"a numeric array.") from None
            except (OSError, EOFError, zipfile.BadZipFile, zlib.error):
                raise ValueError(f"{what} {str(p)!r} is damaged: `{key}` cannot be read.") \
                    from None
    missing = [k for k in required if k not in arrays]
    if missing:
        raise ValueError(f"{what} {str(p)!r} has no {', '.join(f'`{k}`' for k in missing)} "
                         f"(it holds: {', '.join(arrays) or 'nothing'}).")
    return arrays


def read_torch(path: Any, what: str) -> Any:
    """A PyTorch file: a state dict (read with ``weights_only``) or a pickled module (the
    user's own file, trusted)."""
    p = input_path(path, what)
    try:
        import torch
    except ImportError:
        raise ImportError("reading a PyTorch file needs PyTorch (pip install torch; the CPU "
                          "build is enough).") from None
    with warnings.catch_warnings():  # torch's warnings about pickle protocols: not for users
        warnings.simplefilter("ignore")
        try:
            return torch.load(p, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - not a plain state dict: try it as a saved module
            pass
        try:
            return torch.load(p, map_location="cpu", weights_only=False)
        except Exception as err:  # noqa: BLE001 - any failure: not a file torch can read
            raise ValueError(f"{what} {str(p)!r} is not a PyTorch file that torch.load can read "
                             f"(a state dict or a saved module; {type(err).__name__}).") \
                from None
