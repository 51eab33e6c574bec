"""Numba CPU kernels (backend ``"numba"``), part 1: the activations, fused and compiled.

The ``numba`` backend is eight modules, one concept each (``refbraid.backends._MODULES``):

========================  ==================================================================
numba_cpu                 activations and the Euler update; the scalar activation bodies and
                          the input handling the other modules share
numba_cpu_dense           dense layers (BLAS GEMM glue) and the softmax cross-entropy loss
numba_cpu_conv            'same' 2-D convolution and its adjoint: direct 3×3 kernels, and
                          numba_cpu_im2col (im2col + BLAS) for the other kernel sizes
numba_cpu_attention       softmax, embedding (attention layers); the GRU's GPU bodies
numba_cpu_layernorm       layer norm
numba_cpu_conv3d          'same' 3-D convolution and its adjoint: direct loops, line by line
numba_cpu_pool            2×2 and 2×2×2 average and max pooling and their adjoints
numba_cpu_batchnorm       batch norm over (batch, space): statistics, apply, adjoint
========================  ==================================================================

The stride-2 convolution runs the reference kernel (:mod:`refbraid.backends.reference_spatial`)
on every backend.

Every public kernel has the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference`; its docstring says only what it changes. The math::

    activation          a = σ(z)                              one pass (tanh: numpy.tanh)
    activation_adjoint  dz = σ'(z) ⊙ dy                       one pass (after numpy.tanh)
    euler_act           y_next = y + h σ(z)                   one pass (after numpy.tanh)

Choices shared by the modules, measured on the 2-core CI machine with one thread
(``python -m benchmarks full kernels`` prints the layer timings):

* The scalar activation and its derivative are small pure functions (:func:`act_scalar`,
  :func:`act_adjoint_scalar`) compiled ``njit(inline="always")`` here and
  ``cuda.jit(device=True)`` in :mod:`refbraid.backends.numba_cuda`: one tested source.
* tanh: a Numba loop calls the scalar libm ``tanh`` (≈18 ns per float64, no SIMD without
  Intel SVML), NumPy's vectorised ``tanh`` takes ≈1.3 ns; so tanh comes from NumPy and the
  kernels fuse what follows it (``1 − t²``, ``y + h t``). relu, gelu and identity are fully
  fused (the reference's GELU goes through ``numpy.vectorize(math.erf)``, ≈10× slower).
* ``parallel=True`` is not used: the project runs one thread per (MPI) rank
  (``NUMBA_NUM_THREADS=1``), where a ``prange`` only adds its launch cost (≈0.5 µs per call,
  measured). Enabling it is left for runs that give each rank more than one core.
* No ``fastmath`` here: its approximate functions would change tanh/erf, breaking the ≤1e-12
  float64 agreement with the reference the tests demand. Loops that sum (convolutions, row
  sums) elsewhere take only the ``reassoc`` (SIMD partial sums) and ``contract`` (FMA) flags,
  each module saying where and why.

Arrays that are not float32/float64 NumPy arrays (complex steps from the verifier, integer or
CuPy arrays, broadcasting shapes) go to the reference function unchanged, so the contract
holds for every input; the fast paths preserve the dtype (the NumPy result type of the
array arguments).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import reference
from .reference import check_activation

OVERRIDES = ("activation", "activation_adjoint", "euler_act")

#: Integer codes for the activations (kernels cannot branch on strings on the GPU).
TANH, RELU, GELU, IDENTITY = 0, 1, 2, 3
ACT_CODES = {"tanh": TANH, "relu": RELU, "gelu": GELU, "identity": IDENTITY}

SQRT2 = math.sqrt(2.0)
SQRT_2PI = math.sqrt(2.0 * math.pi)

# ----------------------------------------------------------------------------- scalar helpers
def act_scalar(z, code):
    """σ(z) for one value: tanh, relu = max(z, 0), gelu = z Φ(z) = ½ z (1 + erf(z/√2)), z."""
    if code == TANH:
        return math.tanh(z)
    if code == RELU:
        return 0.0 if z < 0 else z  # NaN passes through, as numpy.maximum
    if code == GELU:
        return 0.5 * z * (1.0 + math.erf(z / SQRT2))
    return z


def act_adjoint_scalar(z, dy, code):
    """σ'(z)·dy for one value: (1 − tanh²z) dy, [z > 0] dy, (Φ(z) + z φ(z)) dy, dy."""
    if code == TANH:
        t = math.tanh(z)
        return (1.0 - t * t) * dy
    if code == RELU:
        return dy if z > 0 else 0.0
    if code == GELU:
        cdf = 0.5 * (1.0 + math.erf(z / SQRT2))
        pdf = math.exp(-0.5 * z * z) / SQRT_2PI
        return (cdf + z * pdf) * dy
    return dy


_act = njit(inline="always")(act_scalar)
_act_adjoint = njit(inline="always")(act_adjoint_scalar)


# ----------------------------------------------------------------------------- element-wise kernels
# One loop per activation with a constant code, so each loop body is branch-free after inlining.
# tanh is the exception: NumPy's SIMD tanh (≈1.3 ns per float64) is >10× faster than the scalar
# libm tanh a Numba loop calls (≈18 ns), so t = numpy.tanh(z) comes first and the kernels below
# fuse what follows it.
@njit(cache=True)
def _activation_kernel(z, code, out):
    """out[i] = σ(z[i]) on raveled arrays (relu, gelu, identity)."""
    n = z.size
    if code == RELU:
        for i in range(n):
            out[i] = _act(z[i], RELU)
    elif code == GELU:
        for i in range(n):
            out[i] = _act(z[i], GELU)
    else:
        for i in range(n):
            out[i] = _act(z[i], IDENTITY)


@njit(cache=True)
def _activation_adjoint_kernel(z, dy, code, out):
    """out[i] = σ'(z[i]) dy[i] on raveled arrays (relu, gelu, identity)."""
    n = z.size
    if code == RELU:
        for i in range(n):
            out[i] = _act_adjoint(z[i], dy[i], RELU)
    elif code == GELU:
        for i in range(n):
            out[i] = _act_adjoint(z[i], dy[i], GELU)
    else:
        for i in range(n):
            out[i] = _act_adjoint(z[i], dy[i], IDENTITY)


@njit(cache=True)
def _tanh_adjoint_inplace(t, dy):
    """t[i] ← (1 − t[i]²) dy[i], with t = tanh(z) precomputed.

    Written dy − dy t t: a literal 1.0 is float64 in Numba and would drag float32 arrays
    through float64 (measured 1.6× slower).
    """
    for i in range(t.size):
        t[i] = dy[i] - dy[i] * t[i] * t[i]


@njit(cache=True)
def _euler_act_kernel(y, z, h, code, out):
    """out[i] = y[i] + h σ(z[i]) on raveled arrays (relu, gelu, identity)."""
    n = z.size
    if code == RELU:
        for i in range(n):
            out[i] = y[i] + h * _act(z[i], RELU)
    elif code == GELU:
        for i in range(n):
            out[i] = y[i] + h * _act(z[i], GELU)
    else:
        for i in range(n):
            out[i] = y[i] + h * _act(z[i], IDENTITY)


@njit(cache=True)
def _axpy_inplace(y, h, t):
    """t[i] ← y[i] + h t[i] (the Euler update once t = tanh(z) is known)."""
    for i in range(t.size):
        t[i] = y[i] + h * t[i]


# ----------------------------------------------------------------------------- input handling
def activation_code(act: str) -> int:
    """The kernel code of ``act``; -1 for a reference activation this module does not know."""
    code = ACT_CODES.get(act, -1)
    if code < 0:
        check_activation(act)
    return code


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def native_floats(*arrays) -> bool:
    """True when every argument is a native-byte-order float32/float64 NumPy array (or None)."""
    for a in arrays:
        if a is None:
            continue
        if type(a) is not np.ndarray or (a.dtype != _F64 and a.dtype != _F32):  # == not `is`:
            return False  # a dtype rebuilt by pickle or a buffer equals NumPy's, is not it
    return True


def common_dtype(*arrays) -> np.dtype:
    """The NumPy result dtype of the (float) arrays, cheaply when they agree."""
    first = arrays[0].dtype
    for a in arrays[1:]:
        if a is not None and a.dtype != first:
            return np.result_type(*[a.dtype for a in arrays if a is not None])
    return first


def flat(a: np.ndarray, dtype) -> np.ndarray:
    """A C-contiguous 1-D view (or copy, when a cast or a gather is needed) of ``a``."""
    if a.dtype == dtype and a.flags.c_contiguous:
        return a.reshape(-1)
    return np.ascontiguousarray(a, dtype=dtype).reshape(-1)


def check_ndim(name: str, a: np.ndarray, ndim: int, legend: str) -> None:
    if a.ndim != ndim:
        raise ValueError(f"`{name}` must be {ndim}-D {legend}, got shape {a.shape}.")


def check_size(name: str, actual: int, expected: int, what: str) -> None:
    if actual != expected:
        raise ValueError(f"`{name}` must have {what} {expected}, got {actual}.")


# ----------------------------------------------------------------------------- activations
def activation(z, act: str):
    """σ(z) element-wise (reference.activation), one fused pass over the raveled array.

    tanh is NumPy's (SIMD) tanh, i.e. the reference itself.
    """
    code = activation_code(act)
    if code < 0 or code == TANH or not native_floats(z):
        return reference.activation(z, act)
    zf = flat(z, z.dtype)
    out = np.empty_like(zf)
    _activation_kernel(zf, code, out)
    return out.reshape(z.shape)


def activation_adjoint(z, dy, act: str):
    """dz = σ'(z) ⊙ dy (reference.activation_adjoint), one fused pass (after numpy.tanh)."""
    code = activation_code(act)
    if code < 0 or not native_floats(z, dy) or z.shape != dy.shape:
        return reference.activation_adjoint(z, dy, act)
    dtype = common_dtype(z, dy)
    zf, dyf = flat(z, dtype), flat(dy, dtype)
    if code == TANH:
        out = np.tanh(zf)
        _tanh_adjoint_inplace(out, dyf)
    else:
        out = np.empty_like(zf)
        _activation_adjoint_kernel(zf, dyf, code, out)
    return out.reshape(z.shape)


def euler_act(y, z, h: float, act: str, out=None):
    """y_next = y + h σ(z) (reference.euler_act) in one pass: no h σ(z) temporary.

    ``out``: a C-contiguous array of y's shape and the result's dtype to write into (the same
    kernel, another destination); any other ``out`` is refused by NumPy's ufuncs or ignored:
    check ``result is out``."""
    code = activation_code(act)
    if code < 0 or not native_floats(y, z) or y.shape != z.shape:
        return reference.euler_act(y, z, h, act, out=out)
    if isinstance(h, bool) or not isinstance(h, (int, float, np.integer, np.floating)):
        raise TypeError(f"`h` must be a real number, got {h!r}.")
    dtype = common_dtype(y, z)
    if isinstance(h, np.generic):  # a NumPy scalar h takes part in the promotion (NEP 50)
        dtype = np.result_type(dtype, h)
    hd = dtype.type(h)  # h in the array dtype, as NumPy treats a Python float
    yf, zf = flat(y, dtype), flat(z, dtype)
    into = (out is not None and out.dtype == dtype and out.shape == y.shape
            and out.flags.c_contiguous)
    res = out.reshape(-1) if into else None
    if code == TANH:
        res = np.tanh(zf, out=res)
        _axpy_inplace(yf, hd, res)
    else:
        res = np.empty_like(yf) if res is None else res
        _euler_act_kernel(yf, zf, hd, code, res)
    return out if into else res.reshape(y.shape)
