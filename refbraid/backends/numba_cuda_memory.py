"""Where the ``cuda`` backend's arrays live, and the one place they meet ``numba.cuda``.

The ``cuda`` backend is *device-resident*: its array namespace ``xp`` holds arrays in device
memory, the Numba kernels read them and write new device arrays in place, and nothing goes
back to the host between kernels. The glue between kernels (MGRIT's ``u + h f``, the losses,
the optimizers) is the reference code on ``xp``'s arrays, as on the ``cupy`` backend. The
array namespace is chosen once, at import (:data:`MODE`):

=======  ======================================================================================
mode     arrays, and how a kernel sees them
=======  ======================================================================================
cupy     a GPU and CuPy: ``xp`` is ``cupy``. A kernel gets a Numba view of the same
         device memory made from ``__cuda_array_interface__`` (no copy), once per pointer
         and layout (:func:`cupy_view`); outputs are ``cupy.empty`` arrays. Both libraries
         use the default stream, so kernels and CuPy operations run in order without
         synchronising (keep CuPy on its default stream). Needs a CuPy the ``cupy``
         backend accepts (``cupy_gpu.is_usable``).
sim      Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, the CI): ``xp`` is
         ``array_api_strict`` on the logical device ``"device1"``, the strict stand-in of
         :mod:`refbraid.backends.strict_device` playing the GPU's memory. A kernel gets the
         simulator's device array wrapped around the array's own storage (no copy); outputs
         are ``xp.empty`` on the device. Host data mixed in, ``numpy.asarray`` of a device
         array, NumPy-only functions: all fail here as they would on a GPU.
host     a GPU without CuPy (or ``REFBRAID_CUDA_ARRAYS=host``): ``xp`` is NumPy and every
         kernel call copies its inputs to the device and its outputs back (correct, slow:
         PCIe per kernel). :func:`mode_note` says so, and how to get the device mode.
=======  ======================================================================================

Whatever the mode, a kernel wrapper given only host arrays (NumPy, or Numba device arrays)
works as before — inputs copied in, NumPy arrays out — so a single kernel can be tested on
NumPy data; the copies are then :class:`KernelCall`'s, and counted by the tests. A call
that mixes host NumPy arrays with the backend's device arrays is a TypeError (as CuPy refuses
``cupy_array + numpy_array``): a host array inside a device computation is a bug.

Every wrapper allocates through :meth:`KernelCall.out` and hands inputs to kernels through
:meth:`KernelCall.arg`; ``cuda.to_device``, ``device_array`` and ``copy_to_host`` appear in
this module only.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import dtypes

try:  # numba-cuda is optional (refbraid.backends.numba_cuda says what happens without it)
    import numba
    from numba import cuda
except Exception:  # pragma: no cover - numba without CUDA support
    numba = cuda = None

#: ``REFBRAID_CUDA_ARRAYS=host`` forces host-array mode (e.g. to measure what residency buys).
_FORCE_HOST = os.environ.get("REFBRAID_CUDA_ARRAYS", "").lower() == "host"


def _select_mode() -> tuple[str, Any, Any]:
    """(mode, xp, device) for this process: see the module docstring."""
    if cuda is None or _FORCE_HOST:
        return "host", np, None
    if numba.config.ENABLE_CUDASIM:
        import array_api_strict

        return "sim", array_api_strict, array_api_strict.Device("device1")
    from .cupy_gpu import is_usable as cupy_usable

    if cupy_usable():  # CuPy with a device and the array API functions the glue uses
        import cupy

        return "cupy", cupy, None
    return "host", np, None


MODE, xp, DEVICE = _select_mode()


def mode_note() -> str:
    """One line saying where the ``cuda`` backend keeps its arrays (for logs and --help)."""
    if MODE == "cupy":
        return "cuda backend: device-resident on CuPy arrays"
    if MODE == "sim":
        return "cuda backend: device-resident in Numba's CUDA simulator (array_api_strict device)"
    if cuda is None:
        return "cuda backend: numba-cuda is not installed; the reference kernels run on NumPy"
    why = "REFBRAID_CUDA_ARRAYS=host" if _FORCE_HOST else "no usable CuPy"
    return (f"cuda backend: host-array mode ({why}): every kernel copies its inputs to the GPU "
            "and its outputs back; install CuPy (pip install cupy-cuda12x) to keep arrays on "
            "the device")


def is_backend_array(a) -> bool:
    """True for an array of the device namespace (CuPy, or the simulator's device arrays)."""
    if MODE == "sim":
        return type(a).__module__.startswith("array_api_strict") and a.device == DEVICE
    return MODE == "cupy" and type(a).__module__.startswith("cupy")


def is_numba_device_array(a) -> bool:
    """A ``numba.cuda`` device array (or the simulator's stand-in for one)."""
    return bool(getattr(a, "__cuda_ndarray__", False))


def numpy_dtype(a) -> np.dtype:
    """The NumPy dtype of a host or device array."""
    return dtypes.numpy_dtype(a.dtype)


def _view(a):
    """The kernel's view of backend array ``a``: the same memory, no copy."""
    if MODE == "sim":  # the simulated device's storage, as the simulator's device array
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(a._array)
    return cupy_view(a)


#: at most this many views are kept (:func:`cupy_view`), the least recently used dropped
VIEW_CACHE_SIZE = 4096
_VIEWS: OrderedDict = OrderedDict()


def _new_view(desc: dict):
    """A Numba device array over the memory ``desc`` (a ``__cuda_array_interface__``)
    describes, owning nothing. No stream synchronisation: CuPy and the Numba launches both
    use the default stream, so they run in order."""
    return cuda.from_cuda_array_interface(desc, owner=None, sync=False)


def cupy_view(a):
    """Numba's view of CuPy array ``a``, made once per (device, pointer, shape, strides,
    dtype) and kept (:data:`VIEW_CACHE_SIZE`).

    Making one (``numba.cuda.as_cuda_array``: CuPy's interface dict, a memory pointer, an
    external stream object, the layout's dummy array) is Python work at every argument of
    every launch, the bulk of a launch's host cost. A view is a pointer and a layout that
    owns nothing, so the view made for one array is the right view of any later array with
    the same key: CuPy's memory pool hands the same blocks out again, step after step. Owning
    nothing, a view does not keep its array alive either: :class:`KernelCall` does, for as
    long as its launches need it. The interface's ``stream`` is left out: every launch runs
    on the default stream."""
    mem = a.data
    key = (mem.device_id, mem.ptr, a.shape, a.strides, a.dtype.char)
    view = _VIEWS.get(key)
    if view is None:
        desc = {k: v for k, v in a.__cuda_array_interface__.items() if k != "stream"}
        view = _VIEWS[key] = _new_view(desc)
        if len(_VIEWS) > VIEW_CACHE_SIZE:
            _VIEWS.popitem(last=False)
    else:
        _VIEWS.move_to_end(key)
    return view


@dataclass(frozen=True)
class Output:
    """A new output: ``arg`` for the kernel to write, ``array`` the same memory as the caller
    gets it (the backend array; in host mode the Numba device array to copy back)."""

    arg: Any
    array: Any


class KernelCall:
    """The memory of one wrapper call: inputs as kernel arguments, outputs where they live.

    ``KernelCall(*inputs)`` decides: device mode when any input is a backend device array
    (no copies at all), host mode otherwise (NumPy inputs copied in, outputs copied back).

    A kernel argument is a view that owns nothing (:func:`cupy_view`), so the call keeps
    every device array behind one alive until it is dropped itself, after the wrapper's
    launches are queued: a temporary made here (a cast, a contiguous copy, a placeholder)
    would otherwise go back to CuPy's pool at once, and the next allocation (an output) could
    get its memory before the kernel has read it. CuPy frees an array's memory for reuse by
    later work on the same stream, so dropping it after the launches is safe."""

    def __init__(self, *inputs, names: tuple[str, ...] = ()):
        self._alive: list = []  # the device arrays the kernel arguments view
        given = [a for a in inputs if a is not None]
        self.on_device = any(is_backend_array(a) for a in given)
        if self.on_device:
            for i, a in enumerate(inputs):
                if a is not None and not is_backend_array(a):
                    name = names[i] if i < len(names) else f"argument {i}"
                    raise TypeError(
                        f"`{name}` is a host {type(a).__name__} but the other arguments are "
                        f"device arrays; move it with backend.asarray first.")

    def arg(self, a, dtype, shape: tuple[int, ...] | None = None):
        """Input ``a`` as a kernel argument of ``dtype`` (and ``shape``, e.g. flattened)."""
        dtype = np.dtype(dtype)
        if self.on_device:
            if numpy_dtype(a) != dtype:
                a = xp.astype(a, getattr(xp, dtype.name))
            if shape is not None and tuple(a.shape) != tuple(shape):
                a = xp.reshape(a, shape)
            if MODE == "cupy":
                a = xp.ascontiguousarray(a)
            self._alive.append(a)
            return _view(a)
        if is_numba_device_array(a):
            if numpy_dtype(a) != dtype:
                raise TypeError(f"device arrays must all have dtype {dtype}, got "
                                f"{numpy_dtype(a)}.")
            return a if shape is None else a.reshape(shape)
        host = np.ascontiguousarray(a, dtype=dtype)
        return cuda.to_device(host if shape is None else host.reshape(shape))

    def out(self, shape, dtype) -> Output:
        """A new uninitialised output of ``shape`` and ``dtype`` where the inputs live."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if self.on_device:
            if MODE == "sim":
                array = xp.empty(shape, dtype=getattr(xp, dtype.name), device=DEVICE)
            else:
                array = xp.empty(shape, dtype=dtype)
            self._alive.append(array)
            return Output(_view(array), array)
        array = cuda.device_array(shape, dtype=dtype)
        return Output(array, array)

    def placeholder(self, dtype, ndim: int = 1):
        """A one-element kernel argument for an input the kernel is told not to read (no
        bias, no mask): allocated where the inputs live, never copied."""
        return self.out((1,) * ndim, dtype).arg

    def result(self, output: Output, shape=None, dtype=None):
        """What the caller gets: the backend array (device mode) or a NumPy copy (host
        mode), reshaped to ``shape`` and cast to ``dtype`` when given."""
        if self.on_device:
            a = output.array
            if shape is not None and tuple(a.shape) != tuple(shape):
                a = xp.reshape(a, tuple(shape))
            if dtype is not None and numpy_dtype(a) != np.dtype(dtype):
                a = xp.astype(a, getattr(xp, np.dtype(dtype).name))
            return a
        a = output.array.copy_to_host()
        a = a if shape is None else a.reshape(tuple(shape))
        return a if dtype is None else a.astype(dtype)
