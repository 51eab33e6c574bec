"""MNIST from IDX files in a folder (the format of LeCun's distribution; docs/references.md §7).

IDX layout (all integers big-endian)::

    bytes 0-1   0x00 0x00
    byte  2     element type: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
                0x0D float32, 0x0E float64
    byte  3     number of dimensions d
    then        d uint32 sizes, then the elements in C order

The loader reads ``train-images-idx3-ubyte`` (n, 28, 28) and ``train-labels-idx1-ubyte`` (n,)
(each optionally ``.gz``), scales pixels to [0, 1] and normalises with one scalar mean and
standard deviation of the training images. Nothing is downloaded.

Shape legend: n images; each sample has input shape (1, H, W) = (1, 28, 28).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from ..checked_files import read_bytes
from .dataset import VAL_FRACTION, Dataset, make_dataset

IMAGES = "train-images-idx3-ubyte"
LABELS = "train-labels-idx1-ubyte"
PIXEL_MAX = 255.0

#: IDX element type codes and their big-endian NumPy dtypes.
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into an array of its stored shape."""
    path = Path(path)
    data = read_bytes(path, "MNIST file")  # checked: named, damaged or truncated gzip said so
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {data[:4].hex()!r}).")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path} is truncated: header needs {header} bytes, file has {len(data)}.")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(IDX_TYPES[data[2]])
    expected = header + dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        raise ValueError(
            f"{path} is corrupt: shape {shape} of {dtype} needs {expected} bytes, file has "
            f"{len(data)}."
        )
    flat = np.frombuffer(data, dtype=dtype, offset=header)
    return flat.reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file (gzip-compressed when the name ends in ``.gz``)."""
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in IDX_TYPES.items()}
    code = codes.get(array.dtype.newbyteorder("="))
    if code is None:
        raise TypeError(f"`array` dtype {array.dtype} has no IDX type code; use one of "
                        f"{sorted(str(d) for d in codes)}.")
    if array.ndim > 255:
        raise ValueError(f"`array` has {array.ndim} dimensions; IDX stores at most 255.")
    body = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    body += np.ascontiguousarray(array, dtype=IDX_TYPES[code]).tobytes()
    path = Path(path)
    with (gzip.open(path, "wb") if path.suffix == ".gz" else open(path, "wb")) as fh:
        fh.write(body)


def find_idx_files(data_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Paths of the training images and labels in ``data_dir`` (plain or ``.gz``)."""
    folder = Path(data_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"`data_dir` {str(folder)!r} is not a folder (expected the MNIST "
                                f"IDX files {IMAGES} and {LABELS} in it).")
    found, missing = [], []
    for stem in (IMAGES, LABELS):
        hits = [folder / name for name in (stem, stem + ".gz") if (folder / name).is_file()]
        if hits:
            found.append(hits[0])
        else:
            missing.append(f"{stem}[.gz]")
    if missing:
        raise FileNotFoundError(f"MNIST files missing in {str(folder)!r}: {', '.join(missing)}.")
    return found[0], found[1]


def load_mnist(data_dir: str | os.PathLike, n_samples: int | None = None, seed: int = 0,
               val_fraction: float = VAL_FRACTION) -> Dataset:
    """MNIST training images from IDX files as (1, H, W) images; ``n_samples`` keeps a subset."""
    images_path, labels_path = find_idx_files(data_dir)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3:
        raise ValueError(f"{images_path} must hold images (n, H, W), got shape {images.shape}.")
    if labels.shape != (images.shape[0],):
        raise ValueError(f"{labels_path} holds {labels.shape} labels for {images.shape[0]} images.")
    rng = np.random.default_rng(seed)
    if n_samples is not None:
        if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) \
                or n_samples < 2:
            raise ValueError(f"`n_samples` must be an integer ≥ 2, got {n_samples!r}.")
        keep = np.sort(rng.permutation(images.shape[0])[: int(n_samples)])
        images, labels = images[keep], labels[keep]
    x = images[:, None, :, :].astype(np.float64) / PIXEL_MAX  # n,1,H,W
    return make_dataset("mnist", x, labels.astype(np.int64), 10, seed=rng,
                        val_fraction=val_fraction, image=True, info={"pixel_max": PIXEL_MAX})
