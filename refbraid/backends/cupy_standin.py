"""A CuPy-like stand-in: the ``cupy`` backend without a GPU, found the way CuPy is found, and
(while a :mod:`.launch_model` tracker is active) the counting device of :mod:`.launch_count`.

The strict stand-in (:mod:`refbraid.backends.strict_device`) holds the code to the array API
standard, but its arrays carry ``__array_namespace__`` and CuPy's do not (CuPy 14). Code
that asked an array for its namespace that way passed on the strict stand-in and made host
arrays on a GPU. This module is a fake ``cupy``: :func:`install` puts it into
``sys.modules["cupy"]`` (and ``cupyx.scipy.special`` beside it), so that
``array_api_compat.is_cupy_array`` and ``array_namespace`` see its :class:`ndarray` exactly
as they see CuPy's. Its arrays (:mod:`.standin_array`) behave like CuPy's where refbraid has
been wrong, and report what a GPU would do to the active tracker, if any.

What it cannot see (docs/gpu.md): device memory, streams and their ordering, kernel
compilation (the Numba CUDA kernels are compiled for real targets by
tests/test_cuda_compile.py instead), cuBLAS rounding (results are NumPy's, bit for bit),
NumPy functions CuPy lacks beyond the standard's names, standard names CuPy lacks, and any
CuPy behaviour listed in neither module docstring.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator

import numpy as np

from . import standin_array
from .standin_array import ndarray, run, to_device
from .standin_rules import DEVICE, forbid_host_conversions
from .strict_device import erf_values

__all__ = ["DEVICE", "forbid_host_conversions", "install", "is_standin", "module", "ndarray",
           "real_cupy_imported", "standin_backend"]


#: The module's function and constant names besides the array API standard's: CuPy extras.
EXTRAS = ("ascontiguousarray", "array", "asnumpy", "float16", "complex64", "newaxis")


def _standard_names() -> frozenset[str]:
    import array_api_strict

    return frozenset(n for n in dir(array_api_strict) if not n.startswith("_")) | set(EXTRAS)


NAMES: frozenset[str] = _standard_names()


def asarray(a, dtype=None, copy=None, device=None, **kwargs):
    """``cupy.asarray``: stand-in arrays pass through (a launch only for a cast or a copy),
    a list of them is stacked, host data is copied over."""
    if device not in (None, DEVICE):
        raise ValueError(f"`device` must be the stand-in's device or None, got {device!r}.")
    if isinstance(a, ndarray):
        if (dtype is None or np.dtype(dtype) == a.dtype) and not copy:
            return a
        return run("astype", lambda x: np.array(x, dtype=dtype, copy=True), (a,))
    if isinstance(a, (list, tuple)) and any(isinstance(x, ndarray) for x in a):
        return run("stack", lambda x: np.asarray(x, dtype=dtype), (list(a),))
    return to_device(a, dtype)


def ascontiguousarray(a, dtype=None):
    """``cupy.ascontiguousarray``: C-ordered stand-in arrays pass through."""
    if not isinstance(a, ndarray):
        return to_device(np.ascontiguousarray(a), dtype)
    if a._a.flags.c_contiguous and dtype is None:
        return a
    return run("ascontiguousarray", np.ascontiguousarray, (a,), {"dtype": dtype})


def array(a, dtype=None, copy=True, **kwargs):
    """``cupy.array``: a copy unless told ``copy=False``."""
    return asarray(a, dtype=dtype, copy=copy)


_SPECIAL = {"asarray": asarray, "array": array, "ascontiguousarray": ascontiguousarray,
            "matmul": standin_array.matmul}


def function(name: str):
    """The module function ``name``: NumPy's through :func:`run`, host arrays refused
    (creation from host data excepted); None where the module has no such function."""
    if name in _SPECIAL:
        return _SPECIAL[name]
    if name not in NAMES or not callable(getattr(np, name, None)):
        return None
    f = getattr(np, name)
    if isinstance(f, type):  # a dtype (float64, ...): NumPy's, as CuPy's are
        return f

    def fn(*args, **kwargs):
        return run(name, f, args, kwargs)

    fn.__name__ = name
    return fn


standin_array.module_function = function


def asnumpy(a, stream=None, order="C", out=None) -> np.ndarray:
    """``cupy.asnumpy``: a host copy of a stand-in array (host data passes through)."""
    return a.get(order=order) if isinstance(a, ndarray) else np.asarray(a, order=order)


def as_strided(x, shape=None, strides=None):
    """``cupy.lib.stride_tricks.as_strided``: a view of a stand-in array (no launch)."""
    return run("as_strided", np.lib.stride_tricks.as_strided, (x,),
               {"shape": shape, "strides": strides})


def _module_getattr(name: str):
    if name in NAMES and hasattr(np, name):
        value = getattr(np, name)
        if not callable(value) or isinstance(value, type):
            return value  # constants and dtypes
        return function(name)
    raise AttributeError(f"module 'cupy' (stand-in) has no attribute {name!r}")


def _cuda_namespace() -> types.SimpleNamespace:
    return types.SimpleNamespace(is_available=lambda: True, Device=lambda i=0: DEVICE)


def _erf(z):
    """``cupyx.scipy.special.erf`` (one launch)."""
    return run("erf", erf_values, (z,))


_MODULE = types.ModuleType("cupy", __doc__)
_MODULE.ndarray = ndarray
_MODULE.asnumpy = asnumpy
_MODULE.cuda = _cuda_namespace()
_MODULE.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=as_strided))
_MODULE.__getattr__ = _module_getattr
_MODULE.__version__ = "14.0.0+standin"
_MODULE.STANDIN = True
ndarray.__module__ = "cupy"


def _cupyx() -> dict[str, types.ModuleType]:
    cupyx, scipy, special = (types.ModuleType(n) for n in
                             ("cupyx", "cupyx.scipy", "cupyx.scipy.special"))
    special.erf = _erf
    cupyx.scipy, scipy.special = scipy, special
    return {"cupyx": cupyx, "cupyx.scipy": scipy, "cupyx.scipy.special": special}


def module() -> types.ModuleType:
    """The fake ``cupy`` module (installed or not)."""
    return _MODULE


def is_standin(xp) -> bool:
    """True for the fake ``cupy`` module of this file."""
    return getattr(xp, "STANDIN", False) is True


def real_cupy_imported() -> bool:
    """True when ``sys.modules["cupy"]`` is a real CuPy (the stand-in then stays out)."""
    real = sys.modules.get("cupy")
    return real is not None and not is_standin(real)


@contextlib.contextmanager
def install(replace_real: bool = False) -> Iterator[types.ModuleType]:
    """Within the block ``import cupy`` (and ``cupyx.scipy.special``) is this stand-in.

    Refuses (RuntimeError) where a real CuPy is already imported, unless ``replace_real``
    (counting, which touches no real CuPy array): tests of the real thing and of the
    stand-in must not share a process."""
    if real_cupy_imported() and not replace_real:
        raise RuntimeError("a real CuPy is imported in this process; the CuPy stand-in "
                           "would replace it")
    saved = {n: sys.modules.get(n) for n in ("cupy", *_cupyx())}
    sys.modules.update({"cupy": _MODULE, **_cupyx()})
    try:
        yield _MODULE
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


@contextlib.contextmanager
def standin_backend() -> Iterator:
    """The ``cupy`` backend (:func:`refbraid.backends.get_backend`) on this stand-in, within
    :func:`install`; the backend is built afresh and not kept after the block."""
    from . import _cache, get_backend

    with install():
        _cache.pop("cupy", None)
        try:
            yield get_backend("cupy")
        finally:
            _cache.pop("cupy", None)

