"""A CuPy-like stand-in (tests only): the ``cupy`` backend without a GPU, found the way
CuPy is found.

The strict stand-in (:mod:`refbraid.backends.strict_device`) holds the code to the array API
standard, but its arrays carry ``__array_namespace__`` and CuPy's do not (CuPy 14). Code
that asked an array for its namespace that way passed on the strict stand-in and made host
arrays on a GPU. This module is a fake ``cupy``: :func:`install` puts it into
``sys.modules["cupy"]`` (and ``cupyx.scipy.special`` beside it), so that
``array_api_compat.is_cupy_array`` and ``array_namespace`` see its :class:`ndarray` exactly
as they see CuPy's. Its arrays behave like CuPy's where refbraid has been wrong:

* no ``__array_namespace__``: the namespace must be found the way array-api-compat finds it;
* ``numpy.asarray(a)`` (``__array__``) is the TypeError CuPy raises ("Implicit conversion to
  a NumPy array is not allowed"); the way to the host is ``a.get()``
  (:func:`refbraid.backends.host.to_host`);
* a host ``numpy.ndarray`` mixed into an operation or a function of this module is CuPy's
  ``TypeError: Unsupported type <class 'numpy.ndarray'>``; Python and NumPy scalars are
  fine, as on CuPy; ``asarray``/``array`` copy host data over, index arrays and assigned
  values may be NumPy arrays (CuPy copies them over);
* reductions give 0-d arrays, not NumPy scalars; NumPy functions applied to these arrays
  dispatch here (``__array_ufunc__``, ``__array_function__``) as they dispatch to CuPy;
* the module offers the array API standard's names (taken from ``array_api_strict``) and
  ``ascontiguousarray``: a NumPy-only function is an AttributeError;
* under :func:`forbid_host_conversions` (the tests' default) ``float``, ``int``, ``bool``,
  ``complex``, ``operator.index``, ``format``, ``item``, ``tolist`` and pickling raise
  :class:`~refbraid.backends.strict_device.HostConversionError` — stricter than CuPy, which
  makes each silently with a device synchronisation.

What it cannot see (docs/gpu.md): device memory, streams and their ordering, kernel launches
and compilation (the Numba CUDA kernels are compiled for real targets by
tests/test_cuda_compile.py instead), cuBLAS rounding (results are NumPy's, bit for bit),
NumPy functions CuPy lacks beyond the standard's names, standard names CuPy lacks, and any
CuPy behaviour not listed above.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator

import numpy as np

from .strict_device import HostConversionError, erf_values

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
            "construct a NumPy array explicitly.")

#: The module's function and constant names: the array API standard's and CuPy extras.
EXTRAS = ("ascontiguousarray", "array", "asnumpy", "float16", "complex64", "newaxis")


class _Device:
    """``ndarray.device``: the one (pretend) GPU, as CuPy's ``cupy.cuda.Device(0)``."""

    id = 0

    def __repr__(self) -> str:
        return "<CUDA Device 0>"

    def __eq__(self, other) -> bool:
        return isinstance(other, _Device)

    def __hash__(self) -> int:
        return 0


DEVICE = _Device()
_state = {"guard": False}


def _refuse_host(x):
    raise TypeError(f"Unsupported type {type(x)}")


def _unwrap(x, host_ok: bool = False):
    """Storage of stand-in arrays (recursively in lists, tuples, dicts); a host NumPy array
    is CuPy's TypeError unless ``host_ok`` (creation from host data, indices, assigned
    values)."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        return x if host_ok else _refuse_host(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, host_ok) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v, host_ok) for k, v in x.items()}
    return x


def _wrap(r):
    """NumPy results as stand-in arrays (a NumPy scalar as a 0-d array, as CuPy returns)."""
    if isinstance(r, np.ndarray):
        return ndarray(r)
    if isinstance(r, np.generic):
        return ndarray(np.asarray(r))
    if isinstance(r, (list, tuple)) and any(isinstance(v, (np.ndarray, np.generic)) for v in r):
        return type(r)(_wrap(v) for v in r)
    return r


def _guarded(name: str, convert):
    def method(self, *args):
        if _state["guard"]:
            raise HostConversionError(
                f"implicit host conversion `{name}` of a device array (shape {self.shape}); "
                "use refbraid.backends.host.to_host")
        return convert(self._a, *args)

    method.__name__ = name
    return method


class ndarray:  # noqa: N801 - the name CuPy (and array-api-compat's detection) uses
    """A device array stand-in: NumPy storage, CuPy's manners (the module docstring)."""

    __slots__ = ("_a",)
    __array_priority__ = 100  # as CuPy's: NumPy defers binary operators to this class

    def __init__(self, data: np.ndarray):
        self._a = data

    # --- the host door and the doors CuPy keeps shut
    def get(self, stream=None, order="C", out=None) -> np.ndarray:
        """A host copy (``cupy.ndarray.get``)."""
        return np.array(self._a, copy=True, order=order)

    def __array__(self, *args, **kwargs):
        raise TypeError(IMPLICIT)

    __float__ = _guarded("__float__", float)
    __int__ = _guarded("__int__", int)
    __bool__ = _guarded("__bool__", bool)
    __complex__ = _guarded("__complex__", complex)
    __index__ = _guarded("__index__", lambda a: a.__index__())
    __format__ = _guarded("__format__", format)
    item = _guarded("item", lambda a, *i: a.item(*i))
    tolist = _guarded("tolist", lambda a: a.tolist())
    __reduce__ = _guarded("__reduce__", lambda a: (ndarray, (a,)))

    # --- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    device = property(lambda self: DEVICE)
    T = property(lambda self: ndarray(self._a.T))
    mT = property(lambda self: ndarray(np.matrix_transpose(self._a)))
    real = property(lambda self: ndarray(self._a.real))
    imag = property(lambda self: ndarray(self._a.imag))

    @property
    def __cuda_array_interface__(self) -> dict:
        """What CuPy exports (here the pointer is host memory: nothing may launch on it)."""
        return {"shape": self._a.shape, "typestr": self._a.dtype.str, "version": 3,
                "data": (self._a.ctypes.data, False),
                "strides": None if self._a.flags.c_contiguous else self._a.strides}

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        return (ndarray(row) for row in self._a)

    def __repr__(self) -> str:
        return "standin_" + repr(self._a)

    __str__ = __repr__

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key, host_ok=True)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key, host_ok=True)] = _unwrap(value, host_ok=True)

    def __getattr__(self, name: str):
        """The NumPy ndarray methods CuPy's ndarray has, on the storage."""
        if name.startswith("__") or name in ("to_device",):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *a, **k: _wrap(attr(*_unwrap(a), **_unwrap(k)))

    # --- NumPy's protocols, as CuPy answers them
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        result = getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types_, args, kwargs):
        mine = _MODULE.__dict__.get(func.__name__) or _function(func.__name__)
        if mine is None:
            return NotImplemented
        return mine(*args, **kwargs)

    __hash__ = None


def _binary(op: str):
    def method(self, other):
        if isinstance(other, np.ndarray):
            _refuse_host(other)
        return _wrap(getattr(self._a, op)(_unwrap(other)))

    method.__name__ = op
    return method


def _inplace(op: str):
    def method(self, other):
        if isinstance(other, np.ndarray):
            _refuse_host(other)
        getattr(self._a, op)(_unwrap(other))
        return self

    method.__name__ = op
    return method


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
            "xor", "lshift", "rshift"):
    setattr(ndarray, f"__{_op}__", _binary(f"__{_op}__"))
    setattr(ndarray, f"__r{_op}__", _binary(f"__r{_op}__"))
    setattr(ndarray, f"__i{_op}__", _inplace(f"__i{_op}__"))
for _op in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(ndarray, f"__{_op}__", _binary(f"__{_op}__"))
for _op in ("neg", "pos", "abs", "invert"):
    setattr(ndarray, f"__{_op}__", (lambda name: lambda self: ndarray(getattr(self._a, name)()))(
        f"__{_op}__"))


# ----------------------------------------------------------------------------- the module
def _standard_names() -> frozenset[str]:
    import array_api_strict

    return frozenset(n for n in dir(array_api_strict) if not n.startswith("_")) | set(EXTRAS)


def _function(name: str):
    """The module function ``name``: NumPy's on the storage, host arrays refused (creation
    from host data excepted)."""
    if name not in _NAMES or not callable(getattr(np, name, None)):
        return None
    f = getattr(np, name)
    if isinstance(f, type):  # a dtype (float64, ...): NumPy's, as CuPy's are
        return f
    host_ok = name in ("asarray", "array")

    def function(*args, **kwargs):
        if "device" in kwargs and kwargs["device"] in (None, DEVICE):
            del kwargs["device"]  # CuPy's creation functions: the current device
        return _wrap(f(*_unwrap(args, host_ok), **_unwrap(kwargs, host_ok)))

    function.__name__ = name
    return function


def asnumpy(a, stream=None, order="C", out=None) -> np.ndarray:
    """``cupy.asnumpy``: a host copy of a stand-in array (host data passes through)."""
    return a.get(order=order) if isinstance(a, ndarray) else np.asarray(a, order=order)


def _module_getattr(name: str):
    if name in _NAMES and hasattr(np, name):
        value = getattr(np, name)
        if not callable(value) or isinstance(value, type):
            return value  # constants and dtypes
        return _function(name)
    raise AttributeError(f"module 'cupy' (stand-in) has no attribute {name!r}")


def _cuda_namespace() -> types.SimpleNamespace:
    return types.SimpleNamespace(is_available=lambda: True, Device=lambda i=0: DEVICE)


def _erf(z):
    """``cupyx.scipy.special.erf`` on the stand-in's storage."""
    return ndarray(erf_values(z._a))


_NAMES: frozenset[str] = _standard_names()
_MODULE = types.ModuleType("cupy", __doc__)
_MODULE.ndarray = ndarray
_MODULE.asnumpy = asnumpy
_MODULE.cuda = _cuda_namespace()
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
def install() -> Iterator[types.ModuleType]:
    """Within the block ``import cupy`` (and ``cupyx.scipy.special``) is this stand-in.

    Refuses (RuntimeError) where a real CuPy is already imported: tests of the real thing
    and of the stand-in must not share a process."""
    if real_cupy_imported():
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


@contextlib.contextmanager
def forbid_host_conversions() -> Iterator[None]:
    """Within the block every implicit host conversion of a stand-in array raises."""
    before = _state["guard"]
    _state["guard"] = True
    try:
        yield
    finally:
        _state["guard"] = before
