"""The few array operations the array API standard spells differently from NumPy and CuPy.

The reference kernels and the layers are written against the standard
(``x.__array_namespace__()``), which makes new arrays on the *default* device unless told
``device=``, and knows nothing of memory layout. NumPy and CuPy make new arrays on the
*current* device and have C-contiguous copies, which the Numba kernels want. These helpers
say each once, so a kernel line reads the same on every backend:

* :func:`zeros_on`, :func:`empty_on`, :func:`full_on`, :func:`arange_on`, :func:`asarray_on`
  — new arrays where ``like`` lives;
* :func:`indexes_with_integer_arrays` — whether ``a[int_array, ...]`` works (NumPy, CuPy;
  the standard leaves it out, so array-api-strict refuses it);
* :func:`contiguous` — a C-contiguous array where layout exists (NumPy, CuPy), else a
  fresh copy (a broadcast view becomes a writable array either way);
* :func:`copy_of` — a copy that shares no memory, made where the array lives;
* :func:`namespace` — the array's namespace (NumPy for host values).
"""

from __future__ import annotations

import numpy as np


def namespace(a):
    """The array namespace ``a`` computes in: its ``__array_namespace__()``, NumPy for host
    values (Python scalars, NumPy arrays of a NumPy without the array API)."""
    get = getattr(a, "__array_namespace__", None)
    return get() if get is not None else np


def _current_device_library(a) -> bool:
    """True for NumPy and CuPy arrays: creation functions already use their device."""
    return isinstance(a, np.ndarray) or type(a).__module__.startswith("cupy")


def indexes_with_integer_arrays(a) -> bool:
    """True for NumPy and CuPy arrays, which take (and assign through) integer-array indices
    ``a[idx, ...]``; other array API arrays (array-api-strict) may refuse them."""
    return _current_device_library(a)


def zeros_on(like, shape, dtype=None):
    """Zeros of ``shape`` (``like``'s dtype by default) on the device ``like`` lives on."""
    xp = namespace(like)
    dtype = like.dtype if dtype is None else dtype
    if _current_device_library(like):
        return xp.zeros(shape, dtype=dtype)
    return xp.zeros(shape, dtype=dtype, device=like.device)


def empty_on(like, shape, dtype=None):
    """An uninitialised array of ``shape`` (``like``'s dtype by default) where ``like`` lives."""
    xp = namespace(like)
    dtype = like.dtype if dtype is None else dtype
    if _current_device_library(like):
        return xp.empty(shape, dtype=dtype)
    return xp.empty(shape, dtype=dtype, device=like.device)


def full_on(like, shape, value, dtype=None):
    """An array of ``shape`` filled with ``value`` (``like``'s dtype by default) where ``like``
    lives."""
    xp = namespace(like)
    dtype = like.dtype if dtype is None else dtype
    if _current_device_library(like):
        return xp.full(shape, value, dtype=dtype)
    return xp.full(shape, value, dtype=dtype, device=like.device)


def arange_on(like, n: int):
    """The integers 0 … n−1 on the device ``like`` lives on."""
    xp = namespace(like)
    if _current_device_library(like):
        return xp.arange(n)
    return xp.arange(n, device=like.device)


def contiguous(a):
    """``a`` as a C-contiguous array where arrays have a layout (NumPy, CuPy: a copy only
    when it is not one already); other array API arrays: a copy."""
    if _current_device_library(a):
        return namespace(a).ascontiguousarray(a)
    return namespace(a).asarray(a, copy=True)


def asarray_on(like, values, dtype=None):
    """Host ``values`` (a list, a NumPy array) as an array on the device ``like`` lives on."""
    xp = namespace(like)
    if _current_device_library(like):
        return xp.asarray(values, dtype=dtype)
    return xp.asarray(values, dtype=dtype, device=like.device)


def copy_of(a):
    """A copy of ``a`` that shares no memory, on the device ``a`` lives on (a Python scalar
    or a NumPy array: a NumPy array)."""
    if isinstance(a, (np.ndarray, np.generic)) or not hasattr(a, "shape"):
        return np.array(a, copy=True)
    if type(a).__module__.startswith("cupy"):
        return a.copy()
    return namespace(a).asarray(a, copy=True)
