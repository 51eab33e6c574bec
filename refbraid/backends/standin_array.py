"""The array of the CuPy-like stand-in (:mod:`.cupy_standin`): NumPy storage, CuPy's manners,
and, while a :mod:`.launch_model` tracker is active, the events a GPU would see.

One fake device serves two jobs. The tests run the ``cupy`` backend on it (tests/strict) to
catch what CuPy refuses; :mod:`.launch_count` runs the same backend on it under a tracker to
count what one gradient costs a GPU. Counting is optional: outside
:func:`~refbraid.backends.launch_model.tracking` nothing is reported.

Manners (CuPy's, where refbraid has been wrong):

* no ``__array_namespace__``: the namespace must be found the way array-api-compat finds it;
* ``numpy.asarray(a)`` (``__array__``) is the TypeError CuPy raises ("Implicit conversion to
  a NumPy array is not allowed"); the way to the host is ``a.get()``
  (:func:`refbraid.backends.host.to_host`);
* a host ``numpy.ndarray`` mixed into an operation or a module function is CuPy's
  ``TypeError: Unsupported type <class 'numpy.ndarray'>``; Python and NumPy scalars are
  fine, as on CuPy; ``asarray``/``array`` copy host data over, index arrays and assigned
  values may be NumPy arrays (CuPy copies them over);
* reductions give 0-d arrays, not NumPy scalars (a NumPy scalar computed from host scalars
  alone stays a host scalar); NumPy functions applied to these arrays dispatch here
  (``__array_ufunc__``, ``__array_function__``) as they dispatch to CuPy;
* module functions are the array API standard's names (taken from ``array_api_strict``) and
  a few CuPy extras: a NumPy-only function is an AttributeError;
* under :func:`forbid_host_conversions` (the tests' default) ``float``, ``int``, ``bool``,
  ``complex``, ``operator.index``, ``format``, ``item``, ``tolist`` and pickling raise
  :class:`~refbraid.backends.strict_device.HostConversionError` — stricter than CuPy, which
  makes each silently with a device synchronisation.

Counting (the events of :class:`~refbraid.backends.launch_model.Tracker`, as CuPy runs them):

=====================================  ============================================================
operation                              counted as
=====================================  ============================================================
element-wise, reductions, ``matmul``,  one launch reading the array inputs, writing the result
``concat``/``stack``, ``take``, ``where`` (``matmul``: and one copy launch per operand CuPy
                                       copies first — see :func:`matmul`)
``zeros``/``ones``/``full``/``arange`` one launch (a fill), new memory
``empty``/``empty_like``               new memory, no launch
views (``reshape`` of contiguous       nothing
data, ``permute_dims``, slicing)
``x[int_array]``, ``x[mask]``          one launch (a NumPy index array: a host→device copy too)
``x[...] = v``, ``x += v``             one launch writing into ``x`` (a NumPy ``v``: a copy too)
``asarray(host data)``                 a host→device copy
``float(x)``, ``x.get()``, ...         a device→host copy and a synchronisation
=====================================  ============================================================

Inside :func:`~refbraid.backends.capture_state.recording_graph` (the contract of a CUDA graph
capture) every copy between host and device raises
:class:`~refbraid.backends.standin_rules.CaptureViolation`, and so does a ``stack``/``concat``
of more than 8 arrays of one dtype (:mod:`.standin_rules` says why).

The rules (the device, the refused host conversions, the capture check, which functions are
views, each operator's reported name) are :mod:`.standin_rules`; this module is the array and
:func:`run`, the one door every operation on it passes.
"""

from __future__ import annotations

import numpy as np

from .launch_model import current
from .portable import POINTER_TABLE_ABOVE
from .standin_rules import (
    DEVICE,
    EMPTY,
    IMPLICIT,
    VIEWS,
    _capture_check,
    _guarded,
    _is_basic,
    _refuse_host,
    _reported,
)


def module_function(name: str):
    """The stand-in module's function ``name`` (None: no such function), which NumPy's
    functions dispatch to (``__array_function__``); :mod:`.cupy_standin` replaces this."""
    return None


# ----------------------------------------------------------------------------- the one door


def _unwrap(x, reads: list, host_ok: bool = False):
    """Storage of stand-in arrays (recursively in lists, tuples, dicts), collected in
    ``reads``; a host NumPy array is CuPy's TypeError unless ``host_ok`` (creation from host
    data, indices, assigned values)."""
    if isinstance(x, ndarray):
        reads.append(x._a)
        return x._a
    if isinstance(x, np.ndarray):
        return x if host_ok else _refuse_host(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, reads, host_ok) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v, reads, host_ok) for k, v in x.items()}
    return x


def _wrap(r, on_device: bool = True):
    """NumPy results as stand-in arrays (a NumPy scalar as a 0-d array, as CuPy returns, when
    it was computed ``on_device``)."""
    if isinstance(r, np.ndarray):
        return ndarray(r)
    if isinstance(r, np.generic) and on_device:
        return ndarray(np.asarray(r))
    if isinstance(r, (list, tuple)) and any(isinstance(v, (np.ndarray, np.generic)) for v in r):
        return type(r)(_wrap(v, on_device) for v in r)
    return r


def storage_of(v) -> list[np.ndarray]:
    """The storage of the stand-in arrays in ``v`` (an array, or lists, tuples and dicts of
    them)."""
    if isinstance(v, ndarray):
        return [v._a]
    if isinstance(v, dict):
        v = list(v.values())
    if isinstance(v, (list, tuple)):
        return [a for x in v for a in storage_of(x)]
    return []


def run(name: str, fn, args=(), kwargs=None):
    """``fn`` (NumPy's ``name``) on the storage of the stand-in arrays in ``args`` and
    ``kwargs``, its result as stand-in arrays; reported to the active tracker as the module
    docstring's table says (``out=``: a launch writing into it)."""
    kwargs = dict(kwargs or {})
    if name in ("stack", "concat", "concatenate") and args and isinstance(args[0], (list, tuple)):
        parts = [a for a in args[0] if isinstance(a, ndarray)]
        if len(parts) > POINTER_TABLE_ABOVE and len({a.dtype for a in parts}) == 1:
            _capture_check(f"{name} of {len(parts)} arrays (an address table from the host)")
    if "device" in kwargs and kwargs["device"] in (None, DEVICE):
        del kwargs["device"]  # CuPy's creation functions: the current device
    out = kwargs.get("out")
    writes = storage_of(out)
    reads: list[np.ndarray] = []
    args, kwargs = _unwrap(args, reads), _unwrap(kwargs, reads)
    reads = [a for a in reads if not any(a is w for w in writes)]
    wrapped = _wrap(fn(*args, **kwargs), on_device=bool(reads))
    if out is not None:
        wrapped = out[0] if isinstance(out, tuple) and len(out) == 1 else out
    t = current()
    if t is None:
        return wrapped
    if out is not None:
        t.launch(reads, writes, name)
        return wrapped
    made = storage_of(wrapped)
    if name in VIEWS and (not made or any(np.shares_memory(m, r) for m in made for r in reads)):
        return wrapped
    for a in made:
        t.fresh(a)
    if name not in EMPTY and made:
        t.launch(reads, made, name)
    return wrapped


def to_device(values, dtype=None) -> ndarray:
    """Host data copied to the device: a host→device copy."""
    _capture_check("a host→device copy")
    a = np.array(values, dtype=dtype, copy=True)
    t = current()
    if t is not None:
        t.to_device(a)
    return ndarray(a)


def _index(index, reads: list):
    """The NumPy index of ``index``: stand-in arrays' storage (read by the launch), host
    index arrays and lists copied over (a host→device copy each)."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for i in items:
        if isinstance(i, ndarray):
            reads.append(i._a)
            i = i._a
        elif isinstance(i, (np.ndarray, list)):
            _capture_check("a host index array copied over")
            i = np.asarray(i)
            t = current()
            if t is not None:
                t.to_device(np.array(i, copy=True))
        out.append(i)
    return tuple(out) if isinstance(index, tuple) else out[0]


class ndarray:  # noqa: N801 - the name CuPy (and array-api-compat's detection) uses
    """A device array stand-in: NumPy storage, CuPy's manners, counted launches (module
    docstring)."""

    __slots__ = ("_a",)
    __array_priority__ = 100  # as CuPy's: NumPy defers binary operators to this class

    def __init__(self, data: np.ndarray):
        self._a = data

    # --- the host door (a copy and a synchronisation) and the doors CuPy keeps shut
    def get(self, stream=None, order="C", out=None) -> np.ndarray:
        """A host copy (``cupy.ndarray.get``)."""
        _capture_check("a device→host copy")
        t = current()
        if t is not None:
            t.to_host(self._a)
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

    # --- indexing: views are free, gathers and writes are launches
    def __getitem__(self, key):
        if _is_basic(key):
            return _wrap(self._a[key])
        reads: list[np.ndarray] = [self._a]
        result = self._a[_index(key, reads)]
        t = current()
        if t is not None:
            t.fresh(result)
            t.launch(reads, [result], "take")
        return ndarray(result)

    def __setitem__(self, key, value):
        reads: list[np.ndarray] = []
        basic = _is_basic(key)
        key = key if basic else _index(key, reads)
        if isinstance(value, np.ndarray) and value.ndim > 0:
            value = to_device(value)  # CuPy copies a host array over
        value = _unwrap(value, reads, host_ok=True)
        self._a[key] = value
        t = current()
        if t is not None:
            t.launch(reads, [self._a[key] if basic else self._a], "setitem")

    # --- methods, operators and NumPy's protocols: each through :func:`run`
    def astype(self, dtype, copy=True):
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return run("astype", lambda a: a.astype(dtype), (self,))

    def __getattr__(self, name: str):
        """The NumPy ndarray methods CuPy's ndarray has, on the storage."""
        if name.startswith("__") or name in ("to_device",):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *args, **kwargs: run(
            name, lambda a, *rest, **kw: getattr(a, name)(*rest, **kw), (self, *args), kwargs)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return run(ufunc.__name__, getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        mine = module_function(func.__name__)
        if mine is None:
            return NotImplemented
        return mine(*args, **kwargs)

    __hash__ = None


def _binary(op: str):
    def method(self, other):
        if isinstance(other, np.ndarray):
            _refuse_host(other)
        return run(_reported(op), lambda a, b: getattr(a, op)(b), (self, other))

    method.__name__ = op
    return method


def matmul(a, b, strided_gemm: bool = False):
    """``a @ b`` as CuPy runs it: one launch (a GEMM), after CuPy's own copy of each operand
    its GEMM cannot read in place (an ``ascontiguousarray`` launch each): of a batched
    product (either side over 2-D) an operand that is not C-contiguous, of a 2-D product one
    neither C- nor F-contiguous (cuBLAS reads either order, transposed or not). With
    ``strided_gemm`` (:func:`refbraid.backends.cupy_blas.product`), and for a float product
    while a CUDA graph is recorded (:func:`~refbraid.backends.capture_state.recording_graph`),
    it is refbraid's own strided-batched GEMM (:func:`refbraid.backends.cupy_blas.matmul`),
    which copies only what :func:`~refbraid.backends.cupy_blas.gemm_plan` cannot describe by
    strides."""
    from .capture_state import is_recording_graph
    from .gemm_layout import gemm_plan

    batched = max(getattr(a, "ndim", 0), getattr(b, "ndim", 0)) > 2
    if ((strided_gemm or is_recording_graph()) and isinstance(a, ndarray)
            and isinstance(b, ndarray) and a.dtype == b.dtype
            and a.dtype in (np.float32, np.float64)):
        *_, pa, pb = gemm_plan(a.shape, a._a.strides, b.shape, b._a.strides, a.dtype.itemsize)
        copies = (pa.copy, pb.copy)
    else:  # CuPy's matmul
        copies = tuple(isinstance(x, ndarray) and not (
            x._a.flags.c_contiguous or (x._a.flags.f_contiguous and not batched)) for x in (a, b))
    read = [run("ascontiguousarray", np.ascontiguousarray, (x,)) if copy else x
            for x, copy in zip((a, b), copies, strict=True)]

    # the GEMM reads the copies (what it waits for) but multiplies the operands as given:
    # NumPy's product of the same views, so its bits do not depend on the counting
    return run("matmul", lambda _a, _b: np.matmul(_storage_of(a), _storage_of(b)), read)


def _storage_of(x):
    return x._a if isinstance(x, ndarray) else x


def _matmul_operator(op: str):
    def method(self, other):
        if isinstance(other, np.ndarray):
            _refuse_host(other)
        return matmul(self, other) if op == "__matmul__" else matmul(other, self)

    method.__name__ = op
    return method


def _inplace(op: str):
    def method(self, other):
        if isinstance(other, np.ndarray):
            _refuse_host(other)
        return run(_reported(op), lambda a, b, out: getattr(a, op)(b), (self, other),
                   {"out": self})

    method.__name__ = op
    return method


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
            "xor", "lshift", "rshift"):
    setattr(ndarray, f"__{_op}__", _binary(f"__{_op}__"))
    setattr(ndarray, f"__r{_op}__", _binary(f"__r{_op}__"))
    setattr(ndarray, f"__i{_op}__", _inplace(f"__i{_op}__"))
ndarray.__matmul__ = _matmul_operator("__matmul__")
ndarray.__rmatmul__ = _matmul_operator("__rmatmul__")
for _op in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(ndarray, f"__{_op}__", _binary(f"__{_op}__"))
for _op in ("neg", "pos", "abs", "invert"):
    setattr(ndarray, f"__{_op}__", (lambda name: lambda self: run(
        name, lambda a: getattr(a, name)(), (self,)))(f"__{_op}__"))
