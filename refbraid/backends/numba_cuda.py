"""Numba CUDA kernels (backend ``"cuda"``), part 1: the activations, and the host side the
other CUDA modules share.

The ``cuda`` backend is ten modules, one concept each (``refbraid.backends._MODULES``):

========================  ==================================================================
numba_cuda                activations and the Euler update; dtype checks, launch sizes and
                          the numba.cuda import the other modules share
numba_cuda_memory         where the arrays live (CuPy, simulator device, host) and the one
                          place kernels get views of them and outputs are allocated
numba_cuda_dense          tiled shared-memory GEMM: matmul, dense layers
numba_cuda_conv           'same' 2-D convolution and its adjoint as direct gather kernels
numba_cuda_attention      bmm, softmax, layer norm, GRU cell (transformer and GRU layers)
numba_cuda_conv3d         'same' 3-D convolution and its adjoint as direct gather kernels
numba_cuda_pool           2×2 and 2×2×2 average and max pooling and their adjoints
numba_cuda_batchnorm      batch norm over (batch, space): statistics, apply, adjoint
numba_cuda_batched        the dense ODE step on k intervals at once (MGRIT's sweeps)
numba_cuda_step           the dense step's adjoint as its GEMMs plus two fused kernels
========================  ==================================================================

The stride-2 convolution runs the reference kernel on the backend's (device) arrays.

Every public function has the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference`. The backend is device-resident: ``xp`` (and ``DEVICE``)
are those of :mod:`refbraid.backends.numba_cuda_memory` — CuPy on a GPU, ``array_api_strict``
on a non-default device in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``: one Python
thread per CUDA thread, so keep simulated sizes tiny) — and a function given the backend's
device arrays launches its kernel on them in place and returns device arrays, with no copy
either way. Given only host arrays (NumPy) it copies them in and returns NumPy arrays, so a
single kernel can still be tested on NumPy data. All memory goes through
:class:`~refbraid.backends.numba_cuda_memory.KernelCall`.

Kernels, one thread per element::

    _activation_kernel   a[i] = σ(z[i])                       flat 1-D grid
    _activation_adjoint  dz[i] = σ'(z[i]) dy[i]               flat 1-D grid
    _euler_act_kernel    y_next[i] = y[i] + h σ(z[i])         flat 1-D grid

The scalar activations are those of :mod:`refbraid.backends.numba_cpu`
(:func:`~refbraid.backends.numba_cpu.act_scalar`), compiled here as device functions.

Design (what a GPU course reader should take from it): an element-wise kernel is bound by
memory, not arithmetic, so what counts is that thread ``i`` of a flat 1-D grid touches element
``i``: the 32 threads of a warp read 32 neighbouring values in one coalesced transaction.
``_euler_act_kernel`` fuses ``y + h σ(z)`` into one pass (one read of y and z, one write),
where the reference makes three (σ, scale, add). Blocks of 128 threads and ⌈n/128⌉ blocks fill
a device once n reaches a few hundred thousand (an H100 holds 132 SMs × 2048 threads); below
that the launch latency (a few µs) dominates, and a grid-stride loop would not help. Inputs
and outputs stay in device memory between kernels: a PCIe copy (~10 GB/s effective for small
arrays, plus ~10 µs latency) would cost more than these kernels themselves, which is why the
backend is device-resident; tests/test_cudasim_training_step.py counts the copies of a whole
training step (zero).

Without numba-cuda installed this module still imports (``cuda`` is None, ``OVERRIDES`` is
empty, :func:`cuda_jit` only defines), so the ``cuda`` backend falls back to the reference
on NumPy arrays.
Inputs the kernels do not cover (complex, integer) go to the reference function on the host.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from . import reference
from .numba_cpu import act_adjoint_scalar, act_scalar, activation_code
from .numba_cuda_memory import (  # xp, DEVICE: the backend's arrays (get_backend reads them)
    DEVICE,  # noqa: F401
    MODE,  # noqa: F401
    KernelCall,
    is_backend_array,
    is_numba_device_array,
    mode_note,  # noqa: F401
    numpy_dtype,
    xp,  # noqa: F401
)

try:  # numba-cuda is optional: without it this backend is the reference on the host
    import numba
    from numba import cuda

    _CUDA_IMPORT_ERROR: Exception | None = None
except Exception as err:  # pragma: no cover - exercised by a subprocess test
    cuda = None
    _CUDA_IMPORT_ERROR = err

OVERRIDES = ("activation", "activation_adjoint", "euler_act") if cuda is not None else ()

THREADS = 128  # threads per block of the 1-D kernels


def is_usable() -> bool:
    """True when CUDA kernels can run here: a GPU, or the simulator (NUMBA_ENABLE_CUDASIM=1)."""
    if cuda is None:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver or toolkit counts as "no GPU"
        return False


def simulated() -> bool:
    """True when the kernels run in Numba's CUDA simulator rather than on a GPU."""
    return cuda is not None and bool(numba.config.ENABLE_CUDASIM)


def numpy_incompatibility() -> str | None:
    """Why numba-cuda cannot compile kernels with this NumPy, in one sentence naming both
    versions, or None. Known case: numba-cuda up to at least 0.30.4 registers
    ``numpy.row_stack``, which NumPy 2.5 removed, when it first compiles a kernel (an
    AttributeError deep inside numba-cuda). Asked of the installed numba-cuda's source, so a
    release without that line passes; the simulator never loads it."""
    if cuda is None or simulated() or hasattr(np, "row_stack"):
        return None
    try:
        from importlib.metadata import version
        from importlib.util import find_spec

        origin = find_spec("numba.cuda.np.arrayobj").origin
        with open(origin, encoding="utf-8") as f:
            if "np.row_stack" not in f.read():
                return None
        numba_cuda = version("numba-cuda")
    except Exception:  # not the numba-cuda layout this check knows: nothing to say
        return None
    return (f"the cuda backend cannot compile kernels here: numba-cuda {numba_cuda} needs "
            f"numpy.row_stack, which NumPy {np.__version__} no longer has; install "
            f"numpy<2.5 (`pip install 'refbraid[cuda]'` pins it) or a numba-cuda release "
            f"that supports NumPy {np.__version__}.")


class _NoCuda:  # pragma: no cover - only without numba-cuda
    """Stands in for ``numba.cuda`` so that the kernels below still define (never launch)."""

    @staticmethod
    def jit(fn=None, **_options):
        return fn if fn is not None else (lambda f: f)


#: ``numba.cuda.jit``, or a stand-in that only defines the kernels when numba-cuda is missing.
cuda_jit = cuda.jit if cuda is not None else _NoCuda.jit


def kernel_factory(make):
    """Memoise ``make(*args) -> kernel`` for kernels whose shared arrays need compile-time
    values (an element type, a tile size): one kernel per distinct ``args`` (hashable,
    e.g. a dtype name and an int), built on first use. Each kernel remembers
    ``made_by = (module, name, args)``, so that tests/test_cuda_compile.py can build the same
    kernel in a process that compiles for real GPU targets."""
    made: dict = {}

    @functools.wraps(make)
    def kernel(*args):
        if args not in made:
            made[args] = make(*args)
            made[args].made_by = (make.__module__, make.__name__, args)
        return made[args]

    kernel.is_kernel_factory = True
    return kernel


def element_type(dtype):
    """The Numba element type of a float32/float64 dtype (for shared arrays)."""
    return numba.float32 if np.dtype(dtype) == np.float32 else numba.float64


_act_dev = cuda_jit(device=True)(act_scalar)
_act_adjoint_dev = cuda_jit(device=True)(act_adjoint_scalar)


# ----------------------------------------------------------------------------- kernels
@cuda_jit
def _activation_kernel(z, code, out):
    """out[i] = σ(z[i]) on flat arrays."""
    i = cuda.grid(1)
    if i < z.size:
        out[i] = _act_dev(z[i], code)


@cuda_jit
def _activation_adjoint_kernel(z, dy, code, out):
    """out[i] = σ'(z[i]) dy[i] on flat arrays."""
    i = cuda.grid(1)
    if i < z.size:
        out[i] = _act_adjoint_dev(z[i], dy[i], code)


@cuda_jit
def _euler_act_kernel(y, z, h, code, out):
    """out[i] = y[i] + h σ(z[i]) on flat arrays."""
    i = cuda.grid(1)
    if i < z.size:
        out[i] = y[i] + h * _act_dev(z[i], code)


# ----------------------------------------------------------------------------- host side
def is_device(a) -> bool:
    """A device array: the backend's own (CuPy, the simulator's device), a ``numba.cuda``
    device array, or anything with the CUDA array interface."""
    return (is_backend_array(a) or is_numba_device_array(a)
            or hasattr(a, "__cuda_array_interface__"))


def cuda_floats(*arrays) -> bool:
    """True when every argument is a float32/float64 host or device array (or None)."""
    for a in arrays:
        if a is None:
            continue
        if not (isinstance(a, np.ndarray) or is_device(a)) or numpy_dtype(a).char not in "fd":
            return False
    return True


def on_host(*arrays) -> bool:
    """True when every argument is a NumPy array (or None): the reference can take them."""
    return all(a is None or isinstance(a, np.ndarray) for a in arrays)


def common_dtype(*arrays) -> np.dtype:
    """The NumPy result dtype of the (host or device) arrays."""
    return np.result_type(*[numpy_dtype(a) for a in arrays if a is not None])


def blocks(n: int, threads: int = THREADS) -> int:
    """Blocks of ``threads`` threads that cover ``n`` elements (at least one)."""
    return max(1, math.ceil(n / threads))


def size(a) -> int:
    """Number of elements of a host or device array."""
    return math.prod(a.shape)


# ----------------------------------------------------------------------------- activations
def activation(z, act: str):
    """σ(z) element-wise (reference.activation): one thread per element."""
    code = activation_code(act)
    if code < 0 or not cuda_floats(z):
        return reference.activation(z, act)
    call, dtype, n = KernelCall(z), numpy_dtype(z), size(z)
    out = call.out(n, dtype)
    _activation_kernel[blocks(n), THREADS](call.arg(z, dtype, (n,)), code, out.arg)
    return call.result(out, z.shape)


def activation_adjoint(z, dy, act: str):
    """dz = σ'(z) ⊙ dy (reference.activation_adjoint): one thread per element."""
    code = activation_code(act)
    if code < 0 or not cuda_floats(z, dy) or tuple(z.shape) != tuple(dy.shape):
        if on_host(z, dy):
            return reference.activation_adjoint(z, dy, act)
        raise ValueError(f"`dy` must have the shape of `z` {tuple(z.shape)}, got {dy.shape}.")
    call, dtype, n = KernelCall(z, dy, names=("z", "dy")), common_dtype(z, dy), size(z)
    out = call.out(n, dtype)
    _activation_adjoint_kernel[blocks(n), THREADS](
        call.arg(z, dtype, (n,)), call.arg(dy, dtype, (n,)), code, out.arg)
    return call.result(out, z.shape)


def euler_act(y, z, h: float, act: str):
    """y_next = y + h σ(z) (reference.euler_act): one thread per element."""
    code = activation_code(act)
    if code < 0 or not cuda_floats(y, z) or tuple(y.shape) != tuple(z.shape):
        if on_host(y, z):
            return reference.euler_act(y, z, h, act)
        raise ValueError(f"`z` must have the shape of `y` {tuple(y.shape)}, got {z.shape}.")
    if isinstance(h, bool) or not isinstance(h, (int, float, np.integer, np.floating)):
        raise TypeError(f"`h` must be a real number, got {h!r}.")
    dtype = common_dtype(y, z)
    if isinstance(h, np.generic):  # a NumPy scalar h takes part in the promotion (NEP 50)
        dtype = np.result_type(dtype, h)
    call, n = KernelCall(y, z, names=("y", "z")), size(z)
    out = call.out(n, dtype)
    _euler_act_kernel[blocks(n), THREADS](
        call.arg(y, dtype, (n,)), call.arg(z, dtype, (n,)), float(h), code, out.arg)
    return call.result(out, y.shape)
