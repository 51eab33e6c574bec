"""A CuPy-like device on the CPU that counts what a GPU would do (:mod:`.launch_model`).

:class:`DeviceArray` holds a NumPy array and behaves like a ``cupy.ndarray`` where refbraid
can tell the difference: no implicit conversion to NumPy (``numpy.asarray`` of it raises, as
CuPy's "Implicit conversion to a NumPy array is not allowed"), ``float()``/``bool()``/``.get()``
copy to the host (each a synchronisation), integer-array indexing works, creation functions
take no ``device=`` (accepted and ignored), and refbraid's CuPy checks
(``type(a).__module__`` starting with ``cupy``, :mod:`refbraid.backends.portable`) take the
CuPy branch. Unlike real CuPy it has ``__array_namespace__`` (:data:`xp`): it is a counter, not
the test of how refbraid finds a namespace.

Every operation runs in NumPy, so results are NumPy's bits, and is reported to the active
:class:`~refbraid.backends.launch_model.Tracker` as CuPy would run it:

=====================================  ============================================================
operation                              counted as
=====================================  ============================================================
element-wise, reductions, ``matmul``,  one launch reading the array inputs, writing the result
``concat``/``stack``, ``take``, ``where``
``zeros``/``ones``/``full``/``arange`` one launch (a fill), new memory
``empty``/``empty_like``               new memory, no launch
views (``reshape`` of contiguous       nothing
data, ``permute_dims``, slicing)
``x[int_array]``, ``x[mask]``          one launch (a NumPy index array: a host→device copy too)
``x[...] = v``, ``x += v``             one launch writing into ``x``
``asarray(host data)``                 a host→device copy
``float(x)``, ``x.get()``, ...         a device→host copy and a synchronisation
=====================================  ============================================================
"""

from __future__ import annotations

import math
import numbers
import types
from types import SimpleNamespace

import numpy as np

from .launch_model import current

#: NumPy functions that return a view of their input (no launch when they do).
_VIEWS = frozenset({"reshape", "permute_dims", "transpose", "expand_dims", "squeeze",
                    "broadcast_to", "swapaxes", "moveaxis", "matrix_transpose", "ravel",
                    "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_arrays", "unstack",
                    "split", "flip"})
#: Functions that make new memory without writing it.
_EMPTY = frozenset({"empty", "empty_like"})
#: Functions that fill new memory (one launch each, no array read unless given one).
_FILLS = frozenset({"zeros", "ones", "full", "zeros_like", "ones_like", "full_like",
                    "arange", "eye", "linspace", "tri"})
#: Functions on dtypes, shapes and scalars: no device work.
_HOST_ONLY = frozenset({"finfo", "iinfo", "isdtype", "result_type", "can_cast", "dtype",
                        "broadcast_shapes", "ndim", "shape", "size"})


def _host_to_device(values, dtype=None) -> DeviceArray:
    a = np.array(values, dtype=dtype, copy=True)
    out = DeviceArray(a)
    t = current()
    if t is not None:
        t.to_device(a)
    return out


def _unwrap(v, reads: list):
    """``v`` with DeviceArrays replaced by their NumPy arrays (collected in ``reads``)."""
    if isinstance(v, DeviceArray):
        reads.append(v._a)
        return v._a
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(x, reads) for x in v)
    return v


def _wrap(v, reads: list, fresh: bool):
    """NumPy results as DeviceArrays (0-d for NumPy scalars: CuPy keeps them on device)."""
    if isinstance(v, np.ndarray):
        return DeviceArray(v)
    if isinstance(v, np.generic) and fresh:
        return DeviceArray(np.asarray(v))
    if isinstance(v, (list, tuple)):
        return type(v)(_wrap(x, reads, fresh) for x in v)
    return v


def _arrays(v) -> list[np.ndarray]:
    if isinstance(v, DeviceArray):
        return [v._a]
    if isinstance(v, (list, tuple)):
        return [a for x in v for a in _arrays(x)]
    return []


def _shares(result: list[np.ndarray], reads: list[np.ndarray]) -> bool:
    return any(np.shares_memory(r, a) for r in result for a in reads)


def _run(name: str, fn, args, kwargs):
    """Call NumPy's ``fn`` on unwrapped arguments and report it (module docstring table)."""
    reads: list[np.ndarray] = []
    kwargs = dict(kwargs)
    kwargs.pop("device", None)
    out = kwargs.get("out")
    args = _unwrap(args, reads)
    kwargs = {k: _unwrap(v, reads) for k, v in kwargs.items()}
    if out is not None:
        reads = [a for a in reads if a is not kwargs["out"]]
    result = fn(*args, **kwargs)
    t = current()
    wrapped = _wrap(result, reads, fresh=bool(reads) or name in _FILLS)
    if t is None or name in _HOST_ONLY:
        return wrapped
    made = _arrays(wrapped)
    if name in _VIEWS and (not made or _shares(made, reads)):
        return wrapped
    if out is not None:
        t.launch(reads, _arrays(out), name)
        return wrapped
    for a in made:
        t.fresh(a)
    if name not in _EMPTY and made:
        t.launch(reads, made, name)
    return wrapped


class _Namespace(SimpleNamespace):
    """The array namespace of :class:`DeviceArray`: NumPy's functions, counted."""

    def __getattr__(self, name: str):
        target = getattr(np, name)
        if not callable(target) or isinstance(target, type):
            return target  # constants, dtypes (float64 ...), classes
        if name == "asarray":
            return _asarray
        if name == "ascontiguousarray":
            return _ascontiguousarray

        def counted(*args, **kwargs):
            return _run(name, target, args, kwargs)

        counted.__name__ = name
        return counted


def _asarray(a, dtype=None, copy=None, device=None):
    """Device arrays pass through (a launch only for a cast or a copy); host data is copied
    to the device."""
    if isinstance(a, DeviceArray):
        if (dtype is None or np.dtype(dtype) == a.dtype) and not copy:
            return a
        return _run("astype", lambda x: np.array(x, dtype=dtype, copy=True), (a,), {})
    if isinstance(a, (list, tuple)) and any(isinstance(x, DeviceArray) for x in a):
        return _run("stack", lambda x: np.asarray(x, dtype=dtype), (list(a),), {})
    return _host_to_device(a, dtype)


def _ascontiguousarray(a, dtype=None):
    if isinstance(a, DeviceArray) and a._a.flags.c_contiguous and dtype is None:
        return a
    if not isinstance(a, DeviceArray):
        return _host_to_device(np.ascontiguousarray(a), dtype)
    return _run("ascontiguousarray", np.ascontiguousarray, (a,), {"dtype": dtype})


def _erf(z):
    """erf, element-wise (CuPy: ``cupyx.scipy.special.erf``, one launch)."""
    return _run("erf", lambda a: np.vectorize(math.erf, otypes=[a.dtype])(a), (z,), {})


xp = _Namespace(erf=_erf)
xp.linalg = SimpleNamespace(**{n: (lambda f: lambda *a, **k: _run(f.__name__, f, a, k))(
    getattr(np.linalg, n)) for n in ("norm", "vector_norm", "matrix_norm", "solve", "inv")})


def _binary(op):
    def method(self, other):
        return _run(op, getattr(np, op), (self, other), {})
    return method


def _reflected(op):
    def method(self, other):
        return _run(op, getattr(np, op), (other, self), {})
    return method


def _inplace(op):
    def method(self, other):
        _run(op, getattr(np, op), (self, other), {"out": self})
        return self
    return method


def _unary(op):
    def method(self):
        return _run(op, getattr(np, op), (self,), {})
    return method


def _is_basic(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (slice, numbers.Integral))
               for i in items)


class DeviceArray:
    """A counted CuPy-like device array around a NumPy array (module docstring)."""

    __slots__ = ("_a",)
    __array_priority__ = 100.0

    def __init__(self, a: np.ndarray):
        self._a = a

    # what refbraid reads of an array
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    device = property(lambda self: "counting device")
    T = property(lambda self: _run("transpose", np.transpose, (self,), {}))
    mT = property(lambda self: _run("matrix_transpose", np.matrix_transpose, (self,), {}))

    def __array_namespace__(self, api_version=None):
        return xp

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed (a counted "
                        "device array, as CuPy's): use refbraid.backends.host.to_host.")

    def __repr__(self) -> str:
        return f"DeviceArray({self._a!r})"

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        return (self[i] for i in range(len(self._a)))

    # the host door: a copy and a synchronisation each
    def get(self) -> np.ndarray:
        t = current()
        if t is not None:
            t.to_host(self._a)
        return np.array(self._a, copy=True)

    def item(self):
        return self.get().item()

    def tolist(self):
        return self.get().tolist()

    def __float__(self):
        return float(self.get())

    def __int__(self):
        return int(self.get())

    def __bool__(self):
        return bool(self.get())

    def __complex__(self):
        return complex(self.get())

    # indexing
    def __getitem__(self, index):
        if _is_basic(index):
            return DeviceArray(self._a[index])
        reads: list[np.ndarray] = []
        index = self._device_index(index, reads)
        out = self._a[index]
        t = current()
        if t is not None:
            t.fresh(out)
            t.launch([self._a, *reads], [out], "take")
        return DeviceArray(out)

    def __setitem__(self, index, value):
        reads: list[np.ndarray] = []
        basic = _is_basic(index)
        if not basic:
            index = self._device_index(index, reads)
        if isinstance(value, DeviceArray):
            reads.append(value._a)
            value = value._a
        elif isinstance(value, np.ndarray) and value.ndim > 0:
            raise TypeError("Unsupported type <class 'numpy.ndarray'> (a host array written "
                            "into a counted device array, as CuPy refuses it).")
        self._a[index] = value
        t = current()
        if t is not None:
            t.launch(reads, [self._a[index] if basic else self._a], "setitem")

    def _device_index(self, index, reads: list):
        items = index if isinstance(index, tuple) else (index,)
        out = []
        for i in items:
            if isinstance(i, DeviceArray):
                reads.append(i._a)
                i = i._a
            elif isinstance(i, (np.ndarray, list)):  # CuPy copies a host index to the device
                i = np.asarray(i)
                t = current()
                if t is not None:
                    t.to_device(np.array(i, copy=True))
            out.append(i)
        return tuple(out) if isinstance(index, tuple) else out[0]

    # methods refbraid (and CuPy code) call on arrays
    def reshape(self, *shape, **kwargs):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        return _run("reshape", np.reshape, (self, shape), kwargs)

    def astype(self, dtype, copy=True):
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return _run("astype", lambda a: a.astype(dtype), (self,), {})

    def copy(self):
        return _run("copy", np.copy, (self,), {})

    def __getattr__(self, name: str):
        fn = getattr(np, name, None)
        if fn is None or not callable(fn):
            raise AttributeError(f"'DeviceArray' has no attribute {name!r}")
        return lambda *args, **kwargs: _run(name, fn, (self, *args), kwargs)

    __add__, __radd__, __iadd__ = _binary("add"), _reflected("add"), _inplace("add")
    __sub__, __rsub__, __isub__ = (_binary("subtract"), _reflected("subtract"),
                                   _inplace("subtract"))
    __mul__, __rmul__, __imul__ = (_binary("multiply"), _reflected("multiply"),
                                   _inplace("multiply"))
    __truediv__, __rtruediv__, __itruediv__ = (_binary("divide"), _reflected("divide"),
                                               _inplace("divide"))
    __floordiv__, __rfloordiv__ = _binary("floor_divide"), _reflected("floor_divide")
    __mod__, __rmod__ = _binary("remainder"), _reflected("remainder")
    __pow__, __rpow__, __ipow__ = _binary("power"), _reflected("power"), _inplace("power")
    __matmul__, __rmatmul__ = _binary("matmul"), _reflected("matmul")
    __and__, __rand__, __or__, __ror__ = (_binary("bitwise_and"), _reflected("bitwise_and"),
                                          _binary("bitwise_or"), _reflected("bitwise_or"))
    __xor__, __rxor__ = _binary("bitwise_xor"), _reflected("bitwise_xor")
    __lt__, __le__, __gt__, __ge__ = (_binary("less"), _binary("less_equal"),
                                      _binary("greater"), _binary("greater_equal"))
    __eq__, __ne__ = _binary("equal"), _binary("not_equal")
    __neg__, __pos__, __abs__, __invert__ = (_unary("negative"), _unary("positive"),
                                             _unary("absolute"), _unary("invert"))
    __hash__ = None  # as ndarray


# refbraid's CuPy checks read the class's module (refbraid.backends.portable): CuPy-like
DeviceArray.__module__ = "cupy_counting"


def as_cupy_module() -> types.ModuleType:
    """A module named ``cupy`` whose ``ndarray`` is :class:`DeviceArray` and whose functions
    are :data:`xp`'s: put into ``sys.modules`` while counting (launch_count.counting), so code
    that recognises CuPy arrays by their library (array-api-compat) recognises these."""
    module = types.ModuleType("cupy", "the counting device of refbraid (not CuPy)")
    module.ndarray = DeviceArray
    module.__getattr__ = lambda name: getattr(xp, name)
    return module
