"""Numba CUDA kernels (backend ``"cuda"``): the reference contract as GPU kernels.

Every public function has the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference`. It accepts NumPy arrays (copied to the device) or device
arrays (``numba.cuda`` device arrays, CuPy arrays: anything with the CUDA array interface),
launches a kernel and returns a NumPy array, so ``xp`` is NumPy and the same tests run on a
GPU and in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``: one Python thread per CUDA
thread, so keep simulated sizes tiny).

Kernels, one thread per output element unless said otherwise::

    _activation_kernel   a[i] = σ(z[i])                       flat 1-D grid
    _activation_adjoint  dz[i] = σ'(z[i]) dy[i]               flat 1-D grid
    _euler_act_kernel    y_next[i] = y[i] + h σ(z[i])         flat 1-D grid
    _gemm_kernel         C = op(A) op(B) (+ bias[None, :])    TILE×TILE blocks, shared memory
    _column_sum_kernel   db[c] = Σ_n dz[n, c]                 one thread per column
    _conv2d_kernel       z[n,o,i,j] = b[o] + Σ_{c,p,q} W[o,c,p,q] x[n,c,i+p−r,j+q−r]
    _conv2d_dx_kernel    dx[n,c,i,j] = Σ_{o,p,q} W[o,c,p,q] dz[n,o,i−p+r,j−q+r]  (transposed conv)
    _conv2d_dw_kernel    dW[o,c,p,q] = Σ_{n,i,j} dz[n,o,i,j] x[n,c,i+p−r,j+q−r]  (one thread each)
    _channel_sum_kernel  db[o] = Σ_{n,i,j} dz[n,o,i,j]        one thread per channel

Shape legend: ``B`` batch, ``K`` inner dimension, ``C`` features/channels, ``O`` output
channels, ``H, W`` image size, ``k`` odd kernel size, ``r = k // 2``; ``op(A)`` is ``A`` or
``Aᵀ``. Index terms outside the image are zero (the zero padding of the reference).

The tiled GEMM: block (bx, by) owns the TILE×TILE tile of C at rows ``by·TILE…``, columns
``bx·TILE…``; for each TILE-wide slab of the inner dimension every thread loads one element
of op(A) and one of op(B) into shared memory, the block synchronises, and each thread adds
TILE products to its accumulator. Reductions are per output thread (no atomics), so results
are deterministic. Accumulators and shared tiles are float64 for both dtypes (exact for
float64, more accurate for float32, slower on GPUs with weak float64); outputs keep the
input dtype. The scalar activations are those of :mod:`refbraid.backends.numba_cpu`
(:func:`~refbraid.backends.numba_cpu.act_scalar`), compiled here as device functions.

Inputs the kernels do not cover (complex, integer) go to the reference function on the host.
"""

from __future__ import annotations

import math

import numpy as np

from . import reference
from .numba_cpu import (
    act_adjoint_scalar,
    act_scalar,
    activation_code,
    check_conv_args,
    check_linear_args,
)

try:  # numba-cuda is optional: without it this backend is the reference on the host
    import numba
    from numba import cuda

    _CUDA_IMPORT_ERROR: Exception | None = None
except Exception as err:  # pragma: no cover - exercised by a subprocess test
    cuda = None
    _CUDA_IMPORT_ERROR = err

xp = np

OVERRIDES = (
    (
        "activation",
        "activation_adjoint",
        "euler_act",
        "matmul",
        "linear",
        "linear_adjoint",
        "conv2d",
        "conv2d_adjoint",
    )
    if cuda is not None
    else ()
)

TILE = 16  # side of the shared-memory tiles of the GEMM (TILE×TILE threads per block)
THREADS = 128  # threads per block of the 1-D kernels
SMALL_BLOCK = 8  # block side of the per-element GEMM used for outputs smaller than a tile


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


class _NoCuda:  # pragma: no cover - only without numba-cuda
    """Stands in for ``numba.cuda`` so that the kernels below still define (never launch)."""

    @staticmethod
    def jit(fn=None, **_options):
        return fn if fn is not None else (lambda f: f)


_cuda = cuda if cuda is not None else _NoCuda()
_act_dev = _cuda.jit(device=True)(act_scalar)
_act_adjoint_dev = _cuda.jit(device=True)(act_adjoint_scalar)


# ----------------------------------------------------------------------------- kernels
@_cuda.jit
def _activation_kernel(z, code, out):
    """out[i] = σ(z[i]) on flat arrays."""
    i = cuda.grid(1)
    if i < z.size:
        out[i] = _act_dev(z[i], code)


@_cuda.jit
def _activation_adjoint_kernel(z, dy, code, out):
    """out[i] = σ'(z[i]) dy[i] on flat arrays."""
    i = cuda.grid(1)
    if i < z.size:
        out[i] = _act_adjoint_dev(z[i], dy[i], code)


@_cuda.jit
def _euler_act_kernel(y, z, h, code, out):
    """out[i] = y[i] + h σ(z[i]) on flat arrays."""
    i = cuda.grid(1)
    if i < z.size:
        out[i] = y[i] + h * _act_dev(z[i], code)


@_cuda.jit
def _gemm_kernel(A, B, C, trans_a, trans_b, bias, has_bias):
    """C = op(A) op(B) (+ bias[None, :]),  op(A): (M, K), op(B): (K, N), C: (M, N)."""
    sA = cuda.shared.array((TILE, TILE), numba.float64)
    sB = cuda.shared.array((TILE, TILE), numba.float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    M, N = C.shape
    K = A.shape[0] if trans_a else A.shape[1]
    acc = 0.0
    for t0 in range(0, K, TILE):
        ka = t0 + tx  # this thread loads op(A)[row, ka] and op(B)[kb, col]
        kb = t0 + ty
        if row < M and ka < K:
            sA[ty, tx] = A[ka, row] if trans_a else A[row, ka]
        else:
            sA[ty, tx] = 0.0
        if kb < K and col < N:
            sB[ty, tx] = B[col, kb] if trans_b else B[kb, col]
        else:
            sB[ty, tx] = 0.0
        cuda.syncthreads()
        for kk in range(TILE):
            acc += sA[ty, kk] * sB[kk, tx]
        cuda.syncthreads()
    if row < M and col < N:
        if has_bias:
            acc += bias[col]
        C[row, col] = acc


@_cuda.jit
def _gemm_small_kernel(A, B, C, trans_a, trans_b, bias, has_bias):
    """C = op(A) op(B) (+ bias), one thread per output element, no shared memory.

    Used when C has fewer elements than one TILE×TILE tile, where tiling cannot pay (and
    where the CUDA simulator, one Python thread per CUDA thread, would idle 256 threads).
    """
    row, col = cuda.grid(2)
    M, N = C.shape
    if row >= M or col >= N:
        return
    K = A.shape[0] if trans_a else A.shape[1]
    acc = 0.0
    for k in range(K):
        a = A[k, row] if trans_a else A[row, k]
        b = B[col, k] if trans_b else B[k, col]
        acc += a * b
    if has_bias:
        acc += bias[col]
    C[row, col] = acc


@_cuda.jit
def _column_sum_kernel(a, out):
    """out[c] = Σ_n a[n, c], one thread per column c."""
    c = cuda.grid(1)
    if c < a.shape[1]:
        acc = 0.0
        for n in range(a.shape[0]):
            acc += a[n, c]
        out[c] = acc


@_cuda.jit
def _conv2d_kernel(x, W, bias, has_bias, z):
    """z[n,o,i,j] = b[o] + Σ_{c,p,q} W[o,c,p,q] x[n,c,i+p−r,j+q−r], one thread per output."""
    idx = cuda.grid(1)
    if idx < z.size:
        _, O, H, Wd = z.shape
        j = idx % Wd
        i = (idx // Wd) % H
        o = (idx // (Wd * H)) % O
        n = idx // (Wd * H * O)
        k = W.shape[3]
        r = k // 2
        acc = 0.0
        for c in range(x.shape[1]):
            for p in range(k):
                ii = i + p - r
                if 0 <= ii < H:
                    for q in range(k):
                        jj = j + q - r
                        if 0 <= jj < Wd:
                            acc += W[o, c, p, q] * x[n, c, ii, jj]
        if has_bias:
            acc += bias[o]
        z[n, o, i, j] = acc


@_cuda.jit
def _conv2d_dx_kernel(dz, W, dx):
    """dx[n,c,i,j] = Σ_{o,p,q} W[o,c,p,q] dz[n,o,i−p+r,j−q+r], one thread per input pixel."""
    idx = cuda.grid(1)
    if idx < dx.size:
        _, C, H, Wd = dx.shape
        j = idx % Wd
        i = (idx // Wd) % H
        c = (idx // (Wd * H)) % C
        n = idx // (Wd * H * C)
        k = W.shape[3]
        r = k // 2
        acc = 0.0
        for o in range(W.shape[0]):
            for p in range(k):
                ii = i - p + r
                if 0 <= ii < H:
                    for q in range(k):
                        jj = j - q + r
                        if 0 <= jj < Wd:
                            acc += W[o, c, p, q] * dz[n, o, ii, jj]
        dx[n, c, i, j] = acc


@_cuda.jit
def _conv2d_dw_kernel(x, dz, dW):
    """dW[o,c,p,q] = Σ_{n,i,j} dz[n,o,i,j] x[n,c,i+p−r,j+q−r], one thread per weight."""
    idx = cuda.grid(1)
    if idx < dW.size:
        _, C, k, _ = dW.shape
        q = idx % k
        p = (idx // k) % k
        c = (idx // (k * k)) % C
        o = idx // (k * k * C)
        r = k // 2
        H, Wd = x.shape[2], x.shape[3]
        acc = 0.0
        for n in range(x.shape[0]):
            for i in range(max(0, r - p), min(H, H + r - p)):
                for j in range(max(0, r - q), min(Wd, Wd + r - q)):
                    acc += dz[n, o, i, j] * x[n, c, i + p - r, j + q - r]
        dW[o, c, p, q] = acc


@_cuda.jit
def _channel_sum_kernel(dz, out):
    """out[o] = Σ_{n,i,j} dz[n,o,i,j], one thread per channel o."""
    o = cuda.grid(1)
    if o < dz.shape[1]:
        acc = 0.0
        for n in range(dz.shape[0]):
            for i in range(dz.shape[2]):
                for j in range(dz.shape[3]):
                    acc += dz[n, o, i, j]
        out[o] = acc


# ----------------------------------------------------------------------------- host side
def _is_device(a) -> bool:
    """A CUDA device array (numba, simulator, or anything with the CUDA array interface)?"""
    return bool(getattr(a, "__cuda_ndarray__", False)) or hasattr(a, "__cuda_array_interface__")


def _fast(*arrays) -> bool:
    """True when every argument is a float32/float64 host or device array (or None)."""
    for a in arrays:
        if a is None:
            continue
        if not (isinstance(a, np.ndarray) or _is_device(a)) or np.dtype(a.dtype).char not in "fd":
            return False
    return True


def _on_host(*arrays) -> bool:
    return all(a is None or isinstance(a, np.ndarray) for a in arrays)


def _dtype(*arrays) -> np.dtype:
    return np.result_type(*[np.dtype(a.dtype) for a in arrays if a is not None])


def _to_device(a, dtype):
    """A device array holding ``a`` as ``dtype`` (no copy when it already is one)."""
    if _is_device(a):
        if np.dtype(a.dtype) != dtype:
            raise TypeError(f"device arrays must all have dtype {dtype}, got {np.dtype(a.dtype)}.")
        return a
    return cuda.to_device(np.ascontiguousarray(a, dtype=dtype))


def _flat_device(a, dtype):
    """A 1-D device view of ``a`` (host arrays are raveled before the copy)."""
    if _is_device(a):
        return _to_device(a, dtype).reshape(a.size)
    return _to_device(np.ravel(a), dtype)


def _blocks(n: int, threads: int = THREADS) -> int:
    return max(1, math.ceil(n / threads))


def _no_bias(dtype):
    return cuda.to_device(np.zeros(1, dtype))  # placeholder argument when b is None


def _gemm(A, B, trans_a: bool, trans_b: bool, M: int, N: int, dtype, bias=None):
    """Launch the GEMM on device arrays (tiled, or per-element below one tile of output);
    returns the device array C (M, N)."""
    C = cuda.device_array((M, N), dtype=dtype)
    b = bias if bias is not None else _no_bias(dtype)
    if M * N < TILE * TILE:
        block = (min(M, SMALL_BLOCK), min(N, SMALL_BLOCK))
        grid = (_blocks(M, block[0]), _blocks(N, block[1]))
        _gemm_small_kernel[grid, block](A, B, C, trans_a, trans_b, b, bias is not None)
        return C
    grid = (_blocks(N, TILE), _blocks(M, TILE))
    _gemm_kernel[grid, (TILE, TILE)](A, B, C, trans_a, trans_b, b, bias is not None)
    return C


# ----------------------------------------------------------------------------- activations
def activation(z, act: str):
    """σ(z) element-wise (reference.activation): one thread per element."""
    code = activation_code(act)
    if code < 0 or not _fast(z):
        return reference.activation(z, act)
    dtype = np.dtype(z.dtype)
    zd = _flat_device(z, dtype)
    out = cuda.device_array(zd.size, dtype=dtype)
    _activation_kernel[_blocks(zd.size), THREADS](zd, code, out)
    return out.copy_to_host().reshape(z.shape)


def activation_adjoint(z, dy, act: str):
    """dz = σ'(z) ⊙ dy (reference.activation_adjoint): one thread per element."""
    code = activation_code(act)
    if code < 0 or not _fast(z, dy) or tuple(z.shape) != tuple(dy.shape):
        if _on_host(z, dy):
            return reference.activation_adjoint(z, dy, act)
        raise ValueError(f"`dy` must have the shape of `z` {tuple(z.shape)}, got {dy.shape}.")
    dtype = _dtype(z, dy)
    zd, dyd = _flat_device(z, dtype), _flat_device(dy, dtype)
    out = cuda.device_array(zd.size, dtype=dtype)
    _activation_adjoint_kernel[_blocks(zd.size), THREADS](zd, dyd, code, out)
    return out.copy_to_host().reshape(z.shape)


def euler_act(y, z, h: float, act: str):
    """y_next = y + h σ(z) (reference.euler_act): one thread per element."""
    code = activation_code(act)
    if code < 0 or not _fast(y, z) or tuple(y.shape) != tuple(z.shape):
        if _on_host(y, z):
            return reference.euler_act(y, z, h, act)
        raise ValueError(f"`z` must have the shape of `y` {tuple(y.shape)}, got {z.shape}.")
    if isinstance(h, bool) or not isinstance(h, (int, float, np.integer, np.floating)):
        raise TypeError(f"`h` must be a real number, got {h!r}.")
    dtype = _dtype(y, z)
    if isinstance(h, np.generic):  # a NumPy scalar h takes part in the promotion (NEP 50)
        dtype = np.result_type(dtype, h)
    yd, zd = _flat_device(y, dtype), _flat_device(z, dtype)
    out = cuda.device_array(zd.size, dtype=dtype)
    _euler_act_kernel[_blocks(zd.size), THREADS](yd, zd, float(h), code, out)
    return out.copy_to_host().reshape(y.shape)


# ----------------------------------------------------------------------------- dense
def matmul(a, b):
    """c = a @ b (reference.matmul) by the tiled shared-memory GEMM."""
    if not _fast(a, b):
        return reference.matmul(a, b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"`a` and `b` must be 2-D, got shapes {a.shape} and {b.shape}.")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"`b` must have {a.shape[1]} rows (a.shape[1]), got shape {b.shape}.")
    dtype = _dtype(a, b)
    C = _gemm(_to_device(a, dtype), _to_device(b, dtype), False, False, a.shape[0], b.shape[1],
              dtype)
    return C.copy_to_host()


def linear(x, W, b):
    """z = x Wᵀ + b (reference.linear): tiled GEMM with op(B) = Wᵀ and the bias fused."""
    if not _fast(x, W, b):
        return reference.linear(x, W, b)
    check_linear_args(x, W, b)
    dtype = _dtype(x, W, b)
    bd = None if b is None else _to_device(b, dtype)
    z = _gemm(_to_device(x, dtype), _to_device(W, dtype), False, True, x.shape[0], W.shape[0],
              dtype, bd)
    return z.copy_to_host()


def linear_adjoint(x, W, dz):
    """(dz W, dzᵀ x, Σ_B dz) (reference.linear_adjoint): two GEMMs and a column-sum kernel."""
    if not _fast(x, W, dz):
        return reference.linear_adjoint(x, W, dz)
    check_linear_args(x, W, dz=dz)
    dtype = _dtype(x, W, dz)
    xd, Wd, dzd = _to_device(x, dtype), _to_device(W, dtype), _to_device(dz, dtype)
    B, K = x.shape
    C = W.shape[0]
    dx = _gemm(dzd, Wd, False, False, B, K, dtype)  # B,K = (B,C)(C,K)
    dW = _gemm(dzd, xd, True, False, C, K, dtype)  # C,K = (C,B)(B,K)
    db = cuda.device_array(C, dtype=dtype)
    _column_sum_kernel[_blocks(C), THREADS](dzd, db)
    return dx.copy_to_host(), dW.copy_to_host(), db.copy_to_host()


# ----------------------------------------------------------------------------- conv
def conv2d(x, W, b):
    """'Same' cross-correlation (reference.conv2d): a direct kernel, one thread per output."""
    if not _fast(x, W, b):
        return reference.conv2d(x, W, b)
    check_conv_args(x, W, b)
    dtype = _dtype(x, W, b)
    B, _, H, Wd = x.shape
    z = cuda.device_array((B, W.shape[0], H, Wd), dtype=dtype)
    bd = _to_device(b, dtype) if b is not None else _no_bias(dtype)
    _conv2d_kernel[_blocks(z.size), THREADS](
        _to_device(x, dtype), _to_device(W, dtype), bd, b is not None, z
    )
    return z.copy_to_host()


def conv2d_adjoint(x, W, dz):
    """(dx, dW, db) of conv2d (reference.conv2d_adjoint): three gather kernels, no atomics."""
    if not _fast(x, W, dz):
        return reference.conv2d_adjoint(x, W, dz)
    check_conv_args(x, W, dz=dz)
    dtype = _dtype(x, W, dz)
    xd, Wdev, dzd = _to_device(x, dtype), _to_device(W, dtype), _to_device(dz, dtype)
    dx = cuda.device_array(tuple(x.shape), dtype=dtype)
    dW = cuda.device_array(tuple(W.shape), dtype=dtype)
    db = cuda.device_array(W.shape[0], dtype=dtype)
    _conv2d_dx_kernel[_blocks(dx.size), THREADS](dzd, Wdev, dx)
    _conv2d_dw_kernel[_blocks(dW.size), THREADS](xd, dzd, dW)
    _channel_sum_kernel[_blocks(W.shape[0]), THREADS](dzd, db)
    return dx.copy_to_host(), dW.copy_to_host(), db.copy_to_host()
