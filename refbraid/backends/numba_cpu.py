"""Numba CPU kernels (backend ``"numba"``): the reference contract, fused and compiled.

Every public function here has the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference`; its docstring says only what it changes. The math::

    activation          a = σ(z)                              one pass (tanh: numpy.tanh)
    activation_adjoint  dz = σ'(z) ⊙ dy                       one pass (after numpy.tanh)
    euler_act           y_next = y + h σ(z)                   one pass (after numpy.tanh)
    linear              z = x Wᵀ + b                          BLAS GEMM, then bias in place
    linear_adjoint      dx = dz W, dW = dzᵀ x, db = Σ_B dz    two BLAS GEMMs, one column sum
    conv2d              z = W * x + b                         im2col + BLAS GEMM per image chunk
    conv2d_adjoint      dx = W *ᵀ dz, dW = dz ⋆ x̃, db = Σ dz  the same columns, col2im for dx
    softmax_cross_entropy L, p = softmax(logits)              one kernel: max, log-sum-exp, p
                                                              per row (adjoint: reference)

``matmul`` stays the reference's BLAS ``a @ b`` (nothing to fuse into it), and so does
``softmax_cross_entropy_adjoint`` (one subtraction and one scaling).

Shape legend: ``B`` batch, ``K`` input features, ``C`` features/channels, ``O`` output
channels, ``H, W`` image height and width, ``k`` (odd) kernel size, ``r = k // 2`` padding.

im2col: for image n the column matrix ``cols[(c,p,q), (i,j)] = x̃[n, c, i+p, j+q]``
(``(C·k·k, H·W)``, zero outside the image) turns the convolution into one GEMM,
``z[n] = W₂ cols`` with ``W₂ = W.reshape(O, C·k·k)``; its adjoint is
``dW₂ = Σ_n dz[n] colsᵀ`` and ``dcols = W₂ᵀ dz[n]``, summed back by col2im
(``dx̃[n, c, i+p, j+q] += dcols[(c,p,q), (i,j)]``) — the transposed convolution.

Choices, measured on the 2-core CI machine with one thread (``benchmarks/bench_layers.py``
prints the layer timings):

* The scalar activation and its derivative are small pure functions (:func:`act_scalar`,
  :func:`act_adjoint_scalar`) compiled ``njit(inline="always")`` here and
  ``cuda.jit(device=True)`` in :mod:`refbraid.backends.numba_cuda`: one tested source.
* tanh: a Numba loop calls the scalar libm ``tanh`` (≈18 ns per float64, no SIMD without
  Intel SVML), NumPy's vectorised ``tanh`` takes ≈1.3 ns; so tanh comes from NumPy and the
  kernels fuse what follows it (``1 − t²``, ``y + h t``). relu, gelu and identity are fully
  fused (the reference's GELU goes through ``numpy.vectorize(math.erf)``, ≈10× slower).
* conv2d: im2col + BLAS beat direct Numba loops by 4–8× (C = 8…32 channels at 28×28), and a
  column buffer of at most :data:`IM2COL_CHUNK_BYTES` per GEMM beat one buffer for the whole
  batch by up to 2× (it stays in cache).
* ``parallel=True`` is not used: the project runs one thread per (MPI) rank
  (``NUMBA_NUM_THREADS=1``), where a ``prange`` only adds its launch cost (≈0.5 µs per call,
  measured). With two threads a ``prange`` over images halves the im2col time, but the
  GEMMs (single-threaded BLAS) dominate the conv step; enabling it is left for runs that give
  each rank more than one core.
* No ``fastmath``: it would reorder sums and change tanh/erf, breaking the ≤1e-12 float64
  agreement with the reference the tests demand.

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

OVERRIDES = (
    "activation",
    "activation_adjoint",
    "euler_act",
    "linear",
    "linear_adjoint",
    "conv2d",
    "conv2d_adjoint",
    "softmax_cross_entropy",
)

#: Integer codes for the activations (kernels cannot branch on strings on the GPU).
TANH, RELU, GELU, IDENTITY = 0, 1, 2, 3
ACT_CODES = {"tanh": TANH, "relu": RELU, "gelu": GELU, "identity": IDENTITY}

SQRT2 = math.sqrt(2.0)
SQRT_2PI = math.sqrt(2.0 * math.pi)

#: Largest im2col buffer (bytes) handed to one GEMM: small images are batched into one
#: stacked GEMM up to this size, 28×28 images with ≥ 16 channels go one image at a time.
IM2COL_CHUNK_BYTES = 1 << 20


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


# ----------------------------------------------------------------------------- dense kernels
@njit(cache=True)
def _column_sum(a, out):
    """out[c] = Σ_n a[n, c].  a: (B, C)."""
    for c in range(a.shape[1]):
        out[c] = 0.0
    for n in range(a.shape[0]):
        for c in range(a.shape[1]):
            out[c] += a[n, c]


# ----------------------------------------------------------------------------- conv kernels
# Written as plain guarded loops over every (i, j): LLVM turns the guard into a masked,
# vectorised load, which measured 2–3× faster than splitting each row into zero / copy ranges.
@njit(cache=True)
def _im2col(x, n0, k, cols):
    """cols[m, (c,p,q), i·W + j] = x[n0+m, c, i+p−r, j+q−r] (0 outside).  cols: (M, C·k·k, H·W)."""
    C, H, Wd = x.shape[1], x.shape[2], x.shape[3]
    r = k // 2
    for m in range(cols.shape[0]):
        n = n0 + m
        for c in range(C):
            for p in range(k):
                for q in range(k):
                    row = (c * k + p) * k + q
                    for i in range(H):
                        ii = i + p - r
                        for j in range(Wd):
                            jj = j + q - r
                            inside = 0 <= ii < H and 0 <= jj < Wd
                            cols[m, row, i * Wd + j] = x[n, c, ii, jj] if inside else 0.0


@njit(cache=True)
def _col2im(dcols, n0, k, dx):
    """dx[n0+m, c, i, j] = Σ_{p,q} dcols[m, (c,p,q), (i−p+r)·W + (j−q+r)] over in-image terms.

    The transposed im2col (dx̃[c, i+p, j+q] += dcols[(c,p,q), (i,j)]) written as a gather.
    """
    C, H, Wd = dx.shape[1], dx.shape[2], dx.shape[3]
    r = k // 2
    for m in range(dcols.shape[0]):
        n = n0 + m
        for c in range(C):
            for i in range(H):
                for j in range(Wd):
                    dx[n, c, i, j] = 0.0
            for p in range(k):
                for q in range(k):
                    row = (c * k + p) * k + q
                    for i in range(H):
                        si = i - p + r
                        for j in range(Wd):
                            sj = j - q + r
                            if 0 <= si < H and 0 <= sj < Wd:
                                dx[n, c, i, j] += dcols[m, row, si * Wd + sj]


@njit(cache=True)
def _add_bias_channels(z, b):
    """z[n, o, t] += b[o] in place.  z: (B, O, H·W)."""
    for n in range(z.shape[0]):
        for o in range(z.shape[1]):
            bo = b[o]
            for t in range(z.shape[2]):
                z[n, o, t] += bo


@njit(cache=True)
def _channel_sum(dz, out):
    """out[o] = Σ_{n,t} dz[n, o, t].  dz: (B, O, H·W)."""
    for o in range(dz.shape[1]):
        out[o] = 0.0
    for n in range(dz.shape[0]):
        for o in range(dz.shape[1]):
            s = 0.0
            for t in range(dz.shape[2]):
                s += dz[n, o, t]
            out[o] += s


# ----------------------------------------------------------------------------- loss kernels
@njit(cache=True)
def _softmax_xent_kernel(logits, labels, probs):
    """probs = softmax rows; returns Σ_b −log p[b, y_b]."""
    total = 0.0
    for b in range(logits.shape[0]):
        m = logits[b, 0]
        for c in range(1, logits.shape[1]):
            if logits[b, c] > m:
                m = logits[b, c]
        s = 0.0
        for c in range(logits.shape[1]):
            s += math.exp(logits[b, c] - m)
        logsum = math.log(s)
        for c in range(logits.shape[1]):
            probs[b, c] = math.exp(logits[b, c] - m - logsum)
        total -= logits[b, labels[b]] - m - logsum
    return total


# ----------------------------------------------------------------------------- input handling
def activation_code(act: str) -> int:
    """The kernel code of ``act``; -1 for a reference activation this module does not know."""
    code = ACT_CODES.get(act, -1)
    if code < 0:
        check_activation(act)
    return code


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _fast(*arrays) -> bool:
    """True when every argument is a native-byte-order float32/float64 NumPy array (or None)."""
    for a in arrays:
        if a is None:
            continue
        if type(a) is not np.ndarray or (a.dtype is not _F64 and a.dtype is not _F32):
            return False
    return True


def _dtype(*arrays) -> np.dtype:
    """The NumPy result dtype of the (float) arrays, cheaply when they agree."""
    first = arrays[0].dtype
    for a in arrays[1:]:
        if a is not None and a.dtype != first:
            return np.result_type(*[a.dtype for a in arrays if a is not None])
    return first


def _flat(a: np.ndarray, dtype) -> np.ndarray:
    """A C-contiguous 1-D view (or copy, when a cast or a gather is needed) of ``a``."""
    if a.dtype == dtype and a.flags.c_contiguous:
        return a.reshape(-1)
    return np.ascontiguousarray(a, dtype=dtype).reshape(-1)


def _check_ndim(name: str, a: np.ndarray, ndim: int, legend: str) -> None:
    if a.ndim != ndim:
        raise ValueError(f"`{name}` must be {ndim}-D {legend}, got shape {a.shape}.")


def _check_size(name: str, actual: int, expected: int, what: str) -> None:
    if actual != expected:
        raise ValueError(f"`{name}` must have {what} {expected}, got {actual}.")


# ----------------------------------------------------------------------------- activations
def activation(z, act: str):
    """σ(z) element-wise (reference.activation), one fused pass over the raveled array.

    tanh is NumPy's (SIMD) tanh, i.e. the reference itself.
    """
    code = activation_code(act)
    if code < 0 or code == TANH or not _fast(z):
        return reference.activation(z, act)
    zf = _flat(z, z.dtype)
    out = np.empty_like(zf)
    _activation_kernel(zf, code, out)
    return out.reshape(z.shape)


def activation_adjoint(z, dy, act: str):
    """dz = σ'(z) ⊙ dy (reference.activation_adjoint), one fused pass (after numpy.tanh)."""
    code = activation_code(act)
    if code < 0 or not _fast(z, dy) or z.shape != dy.shape:
        return reference.activation_adjoint(z, dy, act)
    dtype = _dtype(z, dy)
    zf, dyf = _flat(z, dtype), _flat(dy, dtype)
    if code == TANH:
        out = np.tanh(zf)
        _tanh_adjoint_inplace(out, dyf)
    else:
        out = np.empty_like(zf)
        _activation_adjoint_kernel(zf, dyf, code, out)
    return out.reshape(z.shape)


def euler_act(y, z, h: float, act: str):
    """y_next = y + h σ(z) (reference.euler_act) in one pass: no h σ(z) temporary."""
    code = activation_code(act)
    if code < 0 or not _fast(y, z) or y.shape != z.shape:
        return reference.euler_act(y, z, h, act)
    if isinstance(h, bool) or not isinstance(h, (int, float, np.integer, np.floating)):
        raise TypeError(f"`h` must be a real number, got {h!r}.")
    dtype = _dtype(y, z)
    if isinstance(h, np.generic):  # a NumPy scalar h takes part in the promotion (NEP 50)
        dtype = np.result_type(dtype, h)
    hd = dtype.type(h)  # h in the array dtype, as NumPy treats a Python float
    yf, zf = _flat(y, dtype), _flat(z, dtype)
    if code == TANH:
        out = np.tanh(zf)
        _axpy_inplace(yf, hd, out)
    else:
        out = np.empty_like(yf)
        _euler_act_kernel(yf, zf, hd, code, out)
    return out.reshape(y.shape)


# ----------------------------------------------------------------------------- dense
def check_linear_args(x, W, b=None, dz=None) -> None:
    """ValueError unless x: (B, K), W: (C, K), b: (C,) or None, dz: (B, C) or None."""
    _check_ndim("x", x, 2, "(batch, in_features)")
    _check_ndim("W", W, 2, "(out_features, in_features)")
    _check_size("W", W.shape[1], x.shape[1], "in_features (shape[1]) equal to x.shape[1] =")
    if b is not None and b.shape != (W.shape[0],):
        raise ValueError(f"`b` must have shape ({W.shape[0]},), got {b.shape}.")
    if dz is not None and dz.shape != (x.shape[0], W.shape[0]):
        raise ValueError(f"`dz` must have shape {(x.shape[0], W.shape[0])}, got {dz.shape}.")


def linear(x, W, b):
    """z = x Wᵀ + b (reference.linear): BLAS GEMM, then the bias added in place.

    The in-place add is NumPy's ``z += b``: a fused Numba bias loop measured the same at
    256×512 and ≈1 µs slower at 32×32 (its call overhead).
    """
    if not _fast(x, W, b):
        return reference.linear(x, W, b)
    check_linear_args(x, W, b)
    dtype = _dtype(x, W, b)
    if x.dtype is not dtype or W.dtype is not dtype:
        x, W = x.astype(dtype), W.astype(dtype)
    z = x @ W.T  # B,C
    if b is not None:
        z += b
    return z


def linear_adjoint(x, W, dz):
    """(dx, dW, db) = (dz W, dzᵀ x, Σ_B dz) (reference.linear_adjoint): two GEMMs, a column sum."""
    if not _fast(x, W, dz):
        return reference.linear_adjoint(x, W, dz)
    check_linear_args(x, W, dz=dz)
    dtype = _dtype(x, W, dz)
    if x.dtype is not dtype or W.dtype is not dtype or dz.dtype is not dtype:
        x, W, dz = x.astype(dtype), W.astype(dtype), dz.astype(dtype)
    db = np.empty(dz.shape[1], dtype)
    _column_sum(dz, db)
    return dz @ W, dz.T @ x, db


# ----------------------------------------------------------------------------- conv
def check_conv_args(x, W, b=None, dz=None) -> None:
    """ValueError unless x: (B, C, H, W), W: (O, C, k, k) odd k, b: (O,), dz: (B, O, H, W)."""
    _check_ndim("x", x, 4, "(batch, channels, height, width)")
    _check_ndim("W", W, 4, "(out_channels, in_channels, k, k)")
    k = W.shape[-1]
    if W.shape[2] != k or k % 2 == 0:
        raise ValueError(f"`W` must hold odd square k×k kernels, got shape {W.shape}.")
    _check_size("W", W.shape[1], x.shape[1], "in_channels (shape[1]) equal to x.shape[1] =")
    if b is not None and b.shape != (W.shape[0],):
        raise ValueError(f"`b` must have shape ({W.shape[0]},), got {b.shape}.")
    expected = (x.shape[0], W.shape[0], x.shape[2], x.shape[3])
    if dz is not None and dz.shape != expected:
        raise ValueError(f"`dz` must have shape {expected}, got {dz.shape}.")


def _chunk(x: np.ndarray, k: int) -> int:
    """Images per GEMM so that the im2col buffer stays within IM2COL_CHUNK_BYTES."""
    per_image = x.shape[1] * k * k * x.shape[2] * x.shape[3] * x.itemsize
    return max(1, min(x.shape[0], IM2COL_CHUNK_BYTES // max(per_image, 1)))


def conv2d(x, W, b):
    """'Same' cross-correlation (reference.conv2d) as im2col + BLAS GEMM, chunk by chunk.

    z[n] = W₂ cols(x[n]) + b,  W₂ = W.reshape(O, C·k·k),  cols: (C·k·k, H·W).
    """
    if not _fast(x, W, b):
        return reference.conv2d(x, W, b)
    check_conv_args(x, W, b)
    dtype = _dtype(x, W, b)
    x = np.ascontiguousarray(x, dtype)  # B,C,H,W
    B, C, H, Wd = x.shape
    O, k = W.shape[0], W.shape[-1]
    W2 = np.ascontiguousarray(W, dtype).reshape(O, C * k * k)  # O,Ckk
    z = np.empty((B, O, H * Wd), dtype)  # B,O,HW
    step = _chunk(x, k)
    cols = np.empty((step, C * k * k, H * Wd), dtype)  # M,Ckk,HW
    for n0 in range(0, B, step):
        m = min(step, B - n0)
        _im2col(x, n0, k, cols[:m])
        np.matmul(W2, cols[:m], out=z[n0 : n0 + m])
    if b is not None:
        _add_bias_channels(z, np.ascontiguousarray(b, dtype))
    return z.reshape(B, O, H, Wd)


def conv2d_adjoint(x, W, dz):
    """(dx, dW, db) of conv2d (reference.conv2d_adjoint) from the im2col columns of x.

    dW₂ = Σ_n dz[n] colsᵀ;  dx[n] = col2im(W₂ᵀ dz[n]) (the transposed convolution);
    db[o] = Σ_{n,i,j} dz[n,o,i,j].
    """
    if not _fast(x, W, dz):
        return reference.conv2d_adjoint(x, W, dz)
    check_conv_args(x, W, dz=dz)
    dtype = _dtype(x, W, dz)
    x = np.ascontiguousarray(x, dtype)  # B,C,H,W
    B, C, H, Wd = x.shape
    O, k = W.shape[0], W.shape[-1]
    W2 = np.ascontiguousarray(W, dtype).reshape(O, C * k * k)  # O,Ckk
    dz3 = np.ascontiguousarray(dz, dtype).reshape(B, O, H * Wd)  # B,O,HW
    dx = np.empty_like(x)
    dW2 = np.zeros((O, C * k * k), dtype)
    step = _chunk(x, k)
    cols = np.empty((step, C * k * k, H * Wd), dtype)  # M,Ckk,HW
    dcols = np.empty_like(cols)
    for n0 in range(0, B, step):
        m = min(step, B - n0)
        dzc = dz3[n0 : n0 + m]  # M,O,HW
        _im2col(x, n0, k, cols[:m])
        dW2 += np.matmul(dzc, cols[:m].transpose(0, 2, 1)).sum(axis=0)
        np.matmul(W2.T, dzc, out=dcols[:m])
        _col2im(dcols[:m], n0, k, dx)
    db = np.empty(O, dtype)
    _channel_sum(dz3, db)
    return dx, dW2.reshape(W.shape), db


# ----------------------------------------------------------------------------- loss
def _check_labels(labels, B: int, n_classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"`labels` must be an integer array, got dtype {labels.dtype}.")
    if labels.shape != (B,):
        raise ValueError(f"`labels` must have shape ({B},), got {labels.shape}.")
    if B and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(
            f"`labels` must lie in [0, {n_classes}), got range [{labels.min()}, {labels.max()}]."
        )
    return np.ascontiguousarray(labels, np.int64)


def softmax_cross_entropy(logits, labels):
    """(L, p) as reference.softmax_cross_entropy: one kernel (row max, log-sum-exp, p per row)."""
    if not _fast(logits) or getattr(logits, "ndim", 0) != 2 or logits.shape[0] == 0:
        return reference.softmax_cross_entropy(logits, labels)
    labels = _check_labels(labels, logits.shape[0], logits.shape[1])
    logits = np.ascontiguousarray(logits)
    probs = np.empty_like(logits)
    total = _softmax_xent_kernel(logits, labels, probs)
    return logits.dtype.type(total / logits.shape[0]), probs
