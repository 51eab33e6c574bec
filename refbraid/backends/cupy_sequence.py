"""The ``cupy`` backend's transformer and GRU kernels: layer norm, the attention's softmax,
the head split and merge, and the GRU cell's gate algebra as hand-written CuPy kernels.

==================  ============================  ==================================
kernel              launches (reference's)        module
==================  ============================  ==================================
layernorm           1 (10)                        :mod:`refbraid.backends.cupy_layernorm`
layernorm_adjoint   3 (13)                        :mod:`refbraid.backends.cupy_layernorm`
softmax             1 (5, masked 10; +1 scaled)   :mod:`refbraid.backends.cupy_softmax`
softmax_adjoint     1 (3; +1 scaled)              :mod:`refbraid.backends.cupy_softmax`
split_heads         1 (P, one per block)          :mod:`refbraid.backends.cupy_heads`
merge_heads         1 (P, and 1 to concatenate)   :mod:`refbraid.backends.cupy_heads`
gru_cell            1 (≈ 18)                      :mod:`refbraid.backends.cupy_gru`
gru_cell_adjoint    1 (≈ 20)                      :mod:`refbraid.backends.cupy_gru`
==================  ============================  ==================================

The reference's split of one head is P views, but CuPy's batched GEMM copies a strided view
before it reads it: the kernel's one launch is cheaper there too.

Each takes real floating arrays of one dtype while the fused kernels are on
(:func:`refbraid.backends.cupy_fused.fused`), and shapes its kernel handles; anything else
runs the reference operations. On a GPU the results agree with the reference to round-off;
off a GPU each runs the reference (its bits) and counts as its launches above.
"""

from __future__ import annotations

from .cupy_fused import one_float_dtype

OVERRIDES: tuple[str, ...] = ("layernorm", "layernorm_adjoint", "softmax", "softmax_adjoint",
                              "split_heads", "merge_heads", "gru_cell", "gru_cell_adjoint")


# ----------------------------------------------------------------------------- layer norm
def layernorm(x, gamma, beta, eps: float):
    """reference.layernorm in one launch (cupy_layernorm.layernorm_rows)."""
    from . import cupy_layernorm, reference

    G = cupy_layernorm.rows_per_gamma(x, gamma) if tuple(beta.shape) == tuple(gamma.shape) \
        else None
    if G is None or not one_float_dtype(x, gamma, beta):
        return reference.layernorm(x, gamma, beta, eps)
    return cupy_layernorm.layernorm(x, gamma, beta, eps, G)


def layernorm_adjoint(x, mean, rstd, gamma, dy):
    """reference.layernorm_adjoint in three launches (cupy_layernorm.layernorm_adjoint)."""
    from . import cupy_layernorm, reference

    G = cupy_layernorm.rows_per_gamma(x, gamma)
    if G is None or not one_float_dtype(x, mean, rstd, gamma, dy):
        return reference.layernorm_adjoint(x, mean, rstd, gamma, dy)
    return cupy_layernorm.layernorm_adjoint(x, mean, rstd, gamma, dy, G)


def _layernorm_adjoint_per_layer(x, mean, rstd, gamma, dy, grads: bool):
    """The batched transformer step's layer-norm adjoint (layers/transformer_batched.py):
    x (k, ..., N), γ (k, 1, ..., 1, N); dγ, dβ summed per layer j, (k, N) each (None without
    ``grads``). Three launches, or one without ``grads``."""
    from . import cupy_layernorm, reference

    G = cupy_layernorm.rows_per_gamma(x, gamma)
    if G is None or G * x.shape[0] * x.shape[-1] != x.size \
            or not one_float_dtype(x, mean, rstd, gamma, dy):
        dx, _, _ = reference.layernorm_adjoint(x, mean, rstd, gamma, dy)
        if not grads:
            return dx, None, None
        return dx, *cupy_layernorm.group_sums(True, x, mean, rstd, gamma, dy)[:, :, 0, :]
    return cupy_layernorm.layernorm_adjoint(x, mean, rstd, gamma, dy, G, True, grads)


# ----------------------------------------------------------------------------- softmax
def softmax(x, mask, scale: float = 1.0):
    """reference.softmax in one launch, the scale in it (cupy_softmax.softmax_rows)."""
    from . import cupy_softmax, reference

    if not one_float_dtype(x) or (mask is not None and (
            tuple(mask.shape) != tuple(x.shape) or mask.dtype.kind != "b")):
        return reference.softmax(x, mask, scale)
    return cupy_softmax.softmax(x, mask, scale)


def softmax_adjoint(p, dp, scale: float = 1.0):
    """reference.softmax_adjoint in one launch, the scale in it
    (cupy_softmax.softmax_adjoint_rows)."""
    from . import cupy_softmax, reference

    if not one_float_dtype(p, dp) or tuple(p.shape) != tuple(dp.shape):
        return reference.softmax_adjoint(p, dp, scale)
    return cupy_softmax.softmax_adjoint(p, dp, scale)


# ----------------------------------------------------------------------------- heads
def split_heads(a, B: int, L: int, heads: int, parts: int = 1):
    """reference.split_heads in one launch for all blocks (cupy_heads.split_heads_rows)."""
    from . import cupy_heads, reference

    if not one_float_dtype(a) or a.ndim != 2 or a.shape[0] != B * L \
            or a.shape[1] % (parts * heads):
        return reference.split_heads(a, B, L, heads, parts)
    return cupy_heads.split_heads(a, B, L, heads, parts)


def merge_heads(blocks, B: int, heads: int):
    """reference.merge_heads in one launch for all blocks (cupy_heads.merge_heads_rows)."""
    from . import cupy_heads, reference

    shape = tuple(blocks[0].shape)
    if not 1 <= len(blocks) <= cupy_heads.MAX_BLOCKS or not one_float_dtype(*blocks) \
            or any(tuple(b.shape) != shape for b in blocks) or len(shape) != 3 \
            or shape[0] != B * heads:
        return reference.merge_heads(blocks, B, heads)
    return cupy_heads.merge_heads(blocks, B, heads)


# ----------------------------------------------------------------------------- GRU cell
def gru_cell(gx, gh, h, dt: float, implicit: bool):
    """reference.gru_cell's gate algebra in one launch (cupy_gru.gru_cell_rows)."""
    from . import cupy_gru, reference

    if not one_float_dtype(gx, gh, h):
        return reference.gru_cell(gx, gh, h, dt, implicit)
    return cupy_gru.gru_cell(gx, gh, h, dt, implicit)


def gru_cell_adjoint(gates, gh, h, dh_new, dt: float, implicit: bool):
    """reference.gru_cell_adjoint in one launch (cupy_gru.gru_cell_adjoint_rows)."""
    from . import cupy_gru, reference

    if not one_float_dtype(gates, gh, h, dh_new):
        return reference.gru_cell_adjoint(gates, gh, h, dh_new, dt, implicit)
    return cupy_gru.gru_cell_adjoint(gates, gh, h, dh_new, dt, implicit)


#: what layers/transformer_batched.py asks of a backend's layer norm: γ, β broadcast per
#: group of rows in one call, and the adjoint with the gradients summed per layer
layernorm.takes_row_groups = True
layernorm_adjoint.per_layer = _layernorm_adjoint_per_layer
