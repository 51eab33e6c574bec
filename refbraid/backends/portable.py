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
* :func:`namespace` — the array's namespace (NumPy for host values);
* :func:`stack_rows` — ``stack``, without CuPy's host-made address table while a CUDA graph
  is recorded.

Which library an array belongs to is asked of `array-api-compat
<https://data-apis.org/array-api-compat/>`_ and nowhere else: it knows NumPy, CuPy (whose
arrays have no ``__array_namespace__``), PyTorch and every library that has that method
(array-api-strict). NumPy and CuPy answer with their own modules (both carry the
standard's functions in their main namespace: NumPy since 2.0, CuPy since 13), PyTorch with
array-api-compat's wrapper of ``torch``.
"""

from __future__ import annotations

import array_api_compat
import numpy as np
from array_api_compat import is_cupy_array, is_numpy_array

from .capture_state import is_recording_graph


def namespace(*arrays):
    """The array namespace the arrays compute in (``numpy``, ``cupy``, array-api-compat's
    ``torch``, or an array's ``__array_namespace__()``); NumPy when every argument is a host
    value (a Python scalar, None, a list) or one object no array library claims (a Numba
    device array). Arrays of two libraries are a TypeError."""
    xs = [a for a in arrays if not isinstance(a, (int, float, complex, type(None)))]
    if not xs:
        return np
    if all(is_numpy_array(a) or is_cupy_array(a) for a in xs):
        return array_api_compat.array_namespace(*xs, use_compat=False)
    if len(xs) == 1 and not array_api_compat.is_array_api_obj(xs[0]):
        return np
    return array_api_compat.array_namespace(*xs)


def _current_device_library(a) -> bool:
    """True for NumPy and CuPy arrays: creation functions already use their device."""
    return is_numpy_array(a) or is_cupy_array(a)


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


#: CuPy concatenates more than this many arrays of one dtype with a host-made address table.
POINTER_TABLE_ABOVE = 8


def stack_rows(arrays, dtype=None):
    """``xp.stack(arrays)`` (``out[n] = arrays[n]``), optionally cast to ``dtype``. While a
    CUDA graph is recorded (:func:`~refbraid.backends.capture_state.recording_graph`) and
    there are more than :data:`POINTER_TABLE_ABOVE` arrays, one row assignment each instead:
    CuPy's one-kernel stack reads a table of the arrays' addresses it copies from the host,
    which a replay would read from freed host memory. (In a graph the extra launches cost
    the host nothing: they are replayed by one launch.)"""
    arrays = list(arrays)
    xp = namespace(arrays[0])
    if not (is_recording_graph() and len(arrays) > POINTER_TABLE_ABOVE):
        out = xp.stack(arrays)
        return out if dtype is None or out.dtype == dtype else xp.astype(out, dtype)
    first = arrays[0]
    out = empty_on(first, (len(arrays), *first.shape), first.dtype if dtype is None else dtype)
    for n, a in enumerate(arrays):
        out[n, ...] = a
    return out


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
    if is_cupy_array(a):
        return a.copy()
    return namespace(a).asarray(a, copy=True)
