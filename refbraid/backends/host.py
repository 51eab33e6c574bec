"""The one door from device memory to the host: :func:`to_host` and :func:`host_float`.

refbraid computes on the array type of its backend (NumPy, CuPy, Numba CUDA device arrays,
or the strict device stand-in of the tests, :mod:`refbraid.backends.strict_device`). Some
values must reach the host: the loss for a log line, a residual norm MGRIT stops on, the
weights a checkpoint writes, the curves a plot draws. They go through these two functions
and nowhere else, so a GPU run copies to the host exactly where the code says so. An
implicit conversion — ``numpy.asarray(device_array)``, ``float(device_scalar)``, ``if
device_bool:``, an f-string of a device value — works on CuPy (with a hidden copy and a
device synchronisation each time) and fails on the strict stand-in, which is how the tests
find them.

:data:`COUNTS` counts the copies (``"to_host"``), so a test can assert how many a training
step makes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from .capture_state import HostReadDeferred, host_reads_allowed
from .portable import namespace

#: Copies made by :func:`to_host` since the start (``COUNTS["to_host"]``); tests read it.
COUNTS: Counter = Counter()

_HOST_TYPES = (np.ndarray, np.generic, int, float, complex, bool)


def to_host(a: Any) -> Any:
    """``a`` as host data: a NumPy array for any device array (CuPy ``.get()``, Numba
    ``copy_to_host()``, array-api-strict ``to_device`` the CPU), host values unchanged.

    This is the documented conversion; everything else keeps arrays where they live. Inside
    :func:`~refbraid.backends.capture_state.host_reads_deferred` a device array raises
    :class:`~refbraid.backends.capture_state.HostReadDeferred`."""
    if a is None or isinstance(a, _HOST_TYPES):
        return a
    if not host_reads_allowed():
        raise HostReadDeferred(
            f"a {type(a).__name__} of shape {getattr(a, 'shape', '?')} was read on the host "
            f"inside host_reads_deferred() (work recorded into a CUDA graph cannot wait for "
            f"the device): defer the read to after the replay.")
    COUNTS["to_host"] += 1
    module = type(a).__module__
    if module.startswith("array_api_strict"):
        import array_api_strict

        return np.asarray(a.to_device(array_api_strict.Device("CPU_DEVICE")))
    get = getattr(a, "get", None)  # CuPy
    if callable(get):
        return get()
    copy_to_host = getattr(a, "copy_to_host", None)  # numba.cuda device arrays
    if callable(copy_to_host):
        return copy_to_host()
    return np.asarray(a)


def host_float(a: Any) -> float:
    """A Python float of a 0-d (or one-element) array or scalar, through :func:`to_host`."""
    return float(np.asarray(to_host(a)).reshape(()))


def loss_value(a: Any) -> Any:
    """The loss a gradient returns: :func:`host_float` of ``a``, or inside
    :func:`~refbraid.backends.capture_state.host_reads_deferred` the 0-d device array itself
    (read after the replay)."""
    return host_float(a) if host_reads_allowed() else a


def tree_to_host(tree: Any) -> Any:
    """:func:`to_host` applied to every array in nested dicts, lists and tuples."""
    if isinstance(tree, dict):
        return {k: tree_to_host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_to_host(v) for v in tree)
    return to_host(tree)


def all_finite(a: Any) -> bool:
    """True when every entry of ``a`` is finite: reduced where ``a`` lives, then one value
    brought over through :func:`to_host` (an input check, not a per-element loop). A NumPy
    array is checked exactly (``all(isfinite(a))``); a device array by its sum
    (:func:`finite_by_sum`: one reduction, not a block of flags and a second one)."""
    if isinstance(a, np.ndarray):
        return all_finite_exactly(a)
    xp = namespace(a)
    return finite_by_sum(np.asarray(to_host(xp.sum(a))), a)


def finite_by_sum(total, a) -> bool:
    """Whether ``a`` is finite, given its sum ``total`` on the host: a sum is finite whenever
    every value is (one NaN or ±inf makes it NaN or ±inf); a sum that is not (a NaN/inf, or
    finite values whose sum overflows) is checked again exactly, where ``a`` lives."""
    return bool(np.isfinite(total)) or all_finite_exactly(a)


def all_finite_exactly(a: Any) -> bool:
    """:func:`all_finite` by a flag per entry, ``all(isfinite(a))``, wherever ``a`` lives."""
    xp = namespace(a)
    return bool(to_host(xp.all(xp.isfinite(a))))


def host_range(a: Any) -> tuple[int, int]:
    """(min, max) of a non-empty integer array as Python ints: reduced where ``a`` lives,
    then two scalars brought over through :func:`to_host` (a range check of token ids or
    labels copies two numbers, not the batch)."""
    xp = namespace(a)
    return int(to_host(xp.min(a))), int(to_host(xp.max(a)))


def first_non_finite(named: Iterable[tuple[str, Any]]) -> str | None:
    """The name of the first array holding a NaN or ±inf, or None when all are finite.

    Each array is reduced where it lives, the results are stacked there and brought over in
    one copy through :func:`to_host` — one device synchronisation for a whole dict of
    parameters or gradients, not one per array (:func:`all_finite` is the one-array form).
    NumPy arrays: a flag each (``all(isfinite(a))``, exact); device arrays: their sums, one
    launch each where flags took two, and only an array whose sum is not finite is checked
    again exactly (:func:`finite_by_sum`)."""
    named = list(named)
    if not named:
        return None
    first = named[0][1]
    if isinstance(first, np.ndarray):
        flags = [all_finite_exactly(a) for _, a in named]
    else:
        xp = namespace(first)
        sums = np.asarray(to_host(xp.stack([xp.sum(a) for _, a in named])))
        flags = [finite_by_sum(total, a) for total, (_, a) in zip(sums, named, strict=True)]
    for (name, _), ok in zip(named, flags, strict=True):
        if not ok:
            return name
    return None
