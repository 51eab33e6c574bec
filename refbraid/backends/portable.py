"""The few array operations the array API standard spells differently from NumPy and CuPy.

The reference kernels and the layers are written against the standard
(``x.__array_namespace__()``), which makes new arrays on the *default* device unless told
``device=``, and knows nothing of memory layout. NumPy and CuPy make new arrays on the
*current* device and have C-contiguous copies, which the Numba kernels want. These helpers
say each once, so a kernel line reads the same on every backend:

* :func:`zeros_on`, :func:`arange_on`, :func:`asarray_on` — new arrays where ``like`` lives;
* :func:`contiguous` — a C-contiguous array where layout exists (NumPy, CuPy), else a
  fresh copy (a broadcast view becomes a writable array either way).
"""

from __future__ import annotations

import numpy as np


def _namespace(a):
    get = getattr(a, "__array_namespace__", None)
    return get() if get is not None else np


def _current_device_library(a) -> bool:
    """True for NumPy and CuPy arrays: creation functions already use their device."""
    return isinstance(a, np.ndarray) or type(a).__module__.startswith("cupy")


def zeros_on(like, shape, dtype=None):
    """Zeros of ``shape`` (``like``'s dtype by default) on the device ``like`` lives on."""
    xp = _namespace(like)
    dtype = like.dtype if dtype is None else dtype
    if _current_device_library(like):
        return xp.zeros(shape, dtype=dtype)
    return xp.zeros(shape, dtype=dtype, device=like.device)


def arange_on(like, n: int):
    """The integers 0 … n−1 on the device ``like`` lives on."""
    xp = _namespace(like)
    if _current_device_library(like):
        return xp.arange(n)
    return xp.arange(n, device=like.device)


def contiguous(a):
    """``a`` as a C-contiguous array where arrays have a layout (NumPy, CuPy: a copy only
    when it is not one already); other array API arrays: a copy."""
    if _current_device_library(a):
        return _namespace(a).ascontiguousarray(a)
    return _namespace(a).asarray(a, copy=True)


def asarray_on(like, values, dtype=None):
    """Host ``values`` (a list, a NumPy array) as an array on the device ``like`` lives on."""
    xp = _namespace(like)
    if _current_device_library(like):
        return xp.asarray(values, dtype=dtype)
    return xp.asarray(values, dtype=dtype, device=like.device)
