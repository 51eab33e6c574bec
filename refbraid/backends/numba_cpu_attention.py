"""Numba CPU kernels of the attention, embedding and GRU layers (merged into backend ``"numba"``).

Every public function keeps the signature and semantics of the same-named function in
:mod:`refbraid.backends.reference` (section "transformer kernels"); its docstring says only
what it changes. What is fused::

    softmax            p = softmax(x) over unmasked entries   a pass per row for the shift, NumPy's
                                                            exp, a pass per row for Σ and scale
    softmax_adjoint    dx = p ⊙ (dp − Σ p ⊙ dp)              one pass per row
    embedding_adjoint  dW[tok] += dX                        a scatter-add loop: O(B·T·E), not
                                                            the reference's O(B·T·V·E) one-hot

The layer norm has its own module, :mod:`refbraid.backends.numba_cpu_layernorm`.

Not overridden, by choice: ``bmm`` (batched matrix product) stays the reference ``a @ b``,
i.e. NumPy's BLAS GEMM per matrix — a Numba triple loop is several times slower than BLAS, and
there is nothing to fuse into it (as ``linear`` in :mod:`refbraid.backends.numba_cpu_dense`,
which also calls BLAS). ``embedding`` (a gather) stays NumPy's fancy indexing. ``gru_cell`` and
``gru_cell_adjoint`` stay the reference too: a fused Numba pass over (B, H) was measured 1.5–3×
slower than NumPy's vectorised exp/tanh (scalar ``math`` calls, no SIMD without fastmath). Their
per-element bodies :func:`gru_cell_point` / :func:`gru_cell_adjoint_point` live here anyway,
as the single source the CUDA kernels compile. For the same reason (no SIMD ``exp`` in a Numba
loop) the softmax takes its exp from NumPy: ≈0.5 ns per element against ≈5 ns.

The per-row and per-element bodies are small pure functions of (arrays, index) —
:func:`softmax_row`, :func:`softmax_adjoint_row`, … — compiled with ``cuda.jit(device=True)``
in :mod:`refbraid.backends.numba_cuda_attention` and, for ``softmax_adjoint_row``, with
``njit(inline="always")`` here: one tested source. They use ``math`` only, so they compile on
either target. The CPU softmax splits :func:`softmax_row` into the passes above.

As in :mod:`refbraid.backends.numba_cpu`: no ``parallel=True`` (one thread per rank), and
arrays that are not float32/float64 NumPy arrays (the verifier's complex steps, CuPy arrays) go
to the reference unchanged. Sums accumulate in float64 also for float32 data. The only
fast-math flag is ``reassoc`` on the loops that sum along a row (see there): it reorders each
sum into SIMD partial sums, within the ≤1e-12 (float64) and ≤1e-5 (float32) agreement the
tests demand.

Shape legend: R rows (all leading axes flattened), N row length, B batch, H GRU hidden size,
E width, V vocabulary size.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import reference
from .reference import check_gru  # noqa: F401  (shared with the CUDA kernels)

OVERRIDES = (
    "softmax",
    "softmax_adjoint",
    "embedding_adjoint",
)

#: A mask argument for kernels called without a mask (``use_mask`` False): never read.
NO_MASK = np.zeros((1, 1), dtype=np.uint8)


# ----------------------------------------------------------------------------- shared bodies
# Plain Python over arrays and indices; compiled for the CPU below and for the GPU in
# numba_cuda_attention. Only math.* and arithmetic, so both targets accept them.
def softmax_row(x, mask, use_mask, p, i):
    """p[i] = softmax of x[i] over entries with mask[i, j] == 0; masked → 0, all masked → 0."""
    N = x.shape[1]
    m = -math.inf
    for j in range(N):
        if not (use_mask and mask[i, j]) and x[i, j] > m:
            m = x[i, j]
    if m == -math.inf:  # fully masked row: zeros, never NaN
        for j in range(N):
            p[i, j] = 0.0
        return
    s = 0.0
    for j in range(N):
        if use_mask and mask[i, j]:
            p[i, j] = 0.0
        else:
            e = math.exp(x[i, j] - m)
            p[i, j] = e
            s += e
    for j in range(N):
        p[i, j] = p[i, j] / s


def softmax_adjoint_row(p, dp, dx, i):
    """dx[i] = p[i] ⊙ (dp[i] − Σ_j p[i, j] dp[i, j])."""
    N = p.shape[1]
    s = 0.0
    for j in range(N):
        s += p[i, j] * dp[i, j]
    for j in range(N):
        dx[i, j] = p[i, j] * (dp[i, j] - s)


def gru_cell_point(gx, gh, h, dt, implicit, h_new, gates, b, j):
    """Gates r, z, n and h_new of unit j of sample b (reference.gru_cell)."""
    H = h.shape[1]
    r = 1.0 / (1.0 + math.exp(-(gx[b, j] + gh[b, j])))
    z = 1.0 / (1.0 + math.exp(-(gx[b, H + j] + gh[b, H + j])))
    n = math.tanh(gx[b, 2 * H + j] + r * gh[b, 2 * H + j])
    q = dt * (1.0 - z)
    if implicit:
        h_new[b, j] = (h[b, j] + q * n) / (1.0 + q)
    else:
        h_new[b, j] = h[b, j] + q * (n - h[b, j])
    gates[b, j] = r
    gates[b, H + j] = z
    gates[b, 2 * H + j] = n


def gru_cell_adjoint_point(gates, gh, h, dh_new, dt, implicit, dgx, dgh, dh, b, j):
    """dgx, dgh and the direct dh of unit j of sample b (reference.gru_cell_adjoint)."""
    H = h.shape[1]
    r, z, n = gates[b, j], gates[b, H + j], gates[b, 2 * H + j]
    lam = dh_new[b, j]
    q = dt * (1.0 - z)
    if implicit:
        D = 1.0 + q
        dhj, dn, dz = lam / D, lam * q / D, -dt * lam * (n - h[b, j]) / (D * D)
    else:
        dhj, dn, dz = lam * (1.0 - q), lam * q, -dt * lam * (n - h[b, j])
    da_n = dn * (1.0 - n * n)
    da_z = dz * z * (1.0 - z)
    da_r = da_n * gh[b, 2 * H + j] * r * (1.0 - r)
    dgx[b, j] = da_r
    dgx[b, H + j] = da_z
    dgx[b, 2 * H + j] = da_n
    dgh[b, j] = da_r
    dgh[b, H + j] = da_z
    dgh[b, 2 * H + j] = r * da_n
    dh[b, j] = dhj


_softmax_adjoint_row = njit(inline="always")(softmax_adjoint_row)


# ----------------------------------------------------------------------------- loops
@njit(cache=True)
def _softmax_shift_kernel(x, mask, use_mask, e):
    """e[i, j] = x[i, j] − m_i, −∞ where masked; m_i = max over the unmasked x[i, j] (0 when a
    mask leaves no finite maximum: the reference's shift)."""
    for i in range(x.shape[0]):
        m = -math.inf
        for j in range(x.shape[1]):
            if not (use_mask and mask[i, j]) and x[i, j] > m:
                m = x[i, j]
        if use_mask and not math.isfinite(m):
            m = 0.0
        for j in range(x.shape[1]):
            e[i, j] = -math.inf if use_mask and mask[i, j] else x[i, j] - m


# fastmath={"reassoc"} and no other flag, on the loops that sum along a row: it lets LLVM split
# each sum into SIMD partial sums, which is what vectorises it (a strict left-to-right float
# sum cannot be; 3–5× faster at E = 128). No approximate functions, NaN/Inf handling unchanged.
@njit(cache=True, fastmath={"reassoc"})
def _softmax_normalise_kernel(e):
    """e[i] ← e[i] / Σ_j e[i, j] in place; a row summing to 0 (fully masked) stays 0."""
    for i in range(e.shape[0]):
        s = 0.0
        for j in range(e.shape[1]):
            s += e[i, j]
        if s != 0:
            for j in range(e.shape[1]):
                e[i, j] = e[i, j] / s


@njit(cache=True, fastmath={"reassoc"})
def _softmax_adjoint_kernel(p, dp, dx):
    for i in range(p.shape[0]):
        _softmax_adjoint_row(p, dp, dx, i)


@njit(cache=True)
def _embedding_adjoint_kernel(tokens, dout, dW):
    """dW[tokens[i]] += dout[i] for every row i (dW zeroed by the caller)."""
    for i in range(tokens.shape[0]):
        v = tokens[i]
        for e in range(dout.shape[1]):
            dW[v, e] += dout[i, e]





# ----------------------------------------------------------------------------- input handling
def fast(*arrays) -> bool:
    """True when every argument is a float32/float64 NumPy array (or None)."""
    return all(a is None or (type(a) is np.ndarray and a.dtype.char in "fd") for a in arrays)


def result_dtype(*arrays) -> np.dtype:
    """The NumPy result dtype of the (float) arrays."""
    return np.result_type(*[a.dtype for a in arrays if a is not None])


def rows(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` as a C-contiguous (R, N) array of ``dtype`` (a view when possible)."""
    return np.ascontiguousarray(a, dtype=dtype).reshape(-1, a.shape[-1])


def mask_rows(mask, x: np.ndarray) -> tuple[np.ndarray, bool]:
    """(uint8 (R, N) mask, use_mask) for the kernels; validates shape and dtype."""
    if mask is None:
        return NO_MASK, False
    if getattr(mask, "dtype", None) != np.bool_ or tuple(mask.shape) != tuple(x.shape):
        raise ValueError(f"`mask` must be None or a bool array of shape {tuple(x.shape)}, "
                         f"got {getattr(mask, 'dtype', type(mask).__name__)} "
                         f"{tuple(getattr(mask, 'shape', ()))}.")
    return np.ascontiguousarray(mask).reshape(-1, x.shape[-1]).view(np.uint8), True


def check_same_shape(name: str, a, ref_name: str, ref) -> None:
    if tuple(a.shape) != tuple(ref.shape):
        raise ValueError(f"`{name}` must have the shape of `{ref_name}` {tuple(ref.shape)}, "
                         f"got {tuple(a.shape)}.")


def check_vector(name: str, v, n: int) -> None:
    if tuple(v.shape) != (n,):
        raise ValueError(f"`{name}` must have shape ({n},), got {tuple(v.shape)}.")


# ----------------------------------------------------------------------------- softmax
def softmax(x, mask, scale: float = 1.0):
    """Masked row softmax (reference.softmax) in three passes: a Numba pass per row for the
    shift e = x − max (−∞ where masked), NumPy's SIMD exp in place (≈10× faster per element
    than the scalar libm ``exp`` a Numba loop calls), a Numba pass per row for Σ and the scale.
    A ``scale`` ≠ 1 multiplies x first (NumPy), as the reference does.
    """
    if not fast(x) or x.ndim == 0 or x.size == 0:
        return reference.softmax(x, mask, scale)
    if scale != 1.0:
        x = x * scale
    m2, use_mask = mask_rows(mask, x)
    x2 = rows(x, x.dtype)  # R,N
    e = np.empty_like(x2)
    _softmax_shift_kernel(x2, m2, use_mask, e)
    np.exp(e, out=e)
    _softmax_normalise_kernel(e)
    return e.reshape(x.shape)


def softmax_adjoint(p, dp, scale: float = 1.0):
    """dx = scale · p ⊙ (dp − Σ p ⊙ dp) (reference.softmax_adjoint): one pass per row, the
    product by a ``scale`` ≠ 1 after it (NumPy), as the reference takes it."""
    if not fast(p, dp) or p.ndim == 0 or p.size == 0:
        return reference.softmax_adjoint(p, dp, scale)
    check_same_shape("dp", dp, "p", p)
    dtype = result_dtype(p, dp)
    p2, dp2 = rows(p, dtype), rows(dp, dtype)
    dx = np.empty_like(p2)
    _softmax_adjoint_kernel(p2, dp2, dx)
    dx = dx.reshape(p.shape)
    return dx * scale if scale != 1.0 else dx


# ----------------------------------------------------------------------------- embedding
def embedding_adjoint(tokens, dout, n_rows: int):
    """dW = onehot(tokens)ᵀ dout (reference.embedding_adjoint) as a scatter-add loop."""
    if not fast(dout) or type(tokens) is not np.ndarray or tokens.dtype.kind not in "iu":
        return reference.embedding_adjoint(tokens, dout, n_rows)
    if tuple(dout.shape[:-1]) != tuple(tokens.shape):
        raise ValueError(f"`dout` must have shape {(*tokens.shape, '…')} (tokens' shape, then "
                         f"features), got {tuple(dout.shape)}.")
    flat = np.ascontiguousarray(tokens, np.int64).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= n_rows):
        raise ValueError(f"`tokens` must lie in [0, {n_rows}), got range "
                         f"[{flat.min()}, {flat.max()}].")
    d2 = rows(dout, dout.dtype)  # R,E
    dW = np.zeros((n_rows, dout.shape[-1]), dout.dtype)
    _embedding_adjoint_kernel(flat, d2, dW)
    return dW
