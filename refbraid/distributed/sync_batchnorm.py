"""Synchronised batch norm for data parallelism: every BN application normalises with the
statistics of the FULL batch, although each of the D data-parallel groups holds one shard.

The batch-norm kernels of a backend (``batchnorm_stats``, ``batchnorm_adjoint``,
:mod:`refbraid.backends.reference_spatial`) compute per-channel means over the samples and
space of the array they get. :func:`synchronised_backend` returns the same backend whose two
kernels take those means over all groups: each group adds its partial sums, one sum over the
``data`` communicator (the D ranks holding the same layer block) gives the totals (every
rank combines the same gathered parts in the same order: the same bits everywhere). With
n_g = B_g·|S| values per channel in group g and N = Σ_g n_g::

    forward    per group n_g, μ_g = mean x, M_g = Σ (x − μ_g)²  (gathered: one collective)
               μ = Σ_g n_g μ_g / N,   σ² = Σ_g (M_g + n_g (μ_g − μ)²) / N   (Chan et al.'s
               pairwise merge, as stable as two passes),   r = 1/√(σ² + eps)
    adjoint    g = dy ⊙ γ,  x̂ = (x − μ) r
               dx = r (g − Σ_g Σ g / N − x̂ Σ_g Σ (g ⊙ x̂) / N)          (training mode)
               dγ = Σ dy ⊙ x̂,  dβ = Σ dy        (this group's part: the gradient assembly
                                                  sums the groups, as for every weight)

Evaluation mode (running statistics) couples no samples and is left to the backend. Every
group's rank q makes the same BN applications in the same order (the groups run the same
MGRIT schedule: residual norms are reduced over the world), so the sums meet in lockstep.
The batch statistics for the running statistics combine the same way
(:func:`combined_batch_stats`): μ is already the full batch's, σ² = Σ_g n_g σ²_g / N.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..backends import Backend
from ..backends.reference_spatial import _channel_axes as _axes
from ..backends.reference_spatial import _per_channel
from ..layers.batchnorm import BatchStats


def synchronised_backend(bk: Backend, data) -> Backend:
    """``bk`` with full-batch batch-norm kernels over the ranks of ``data`` (an MPIComm with
    ``sum_to_all``; the same bits on every rank). Host (NumPy) arrays only."""

    def group_sum(*parts) -> np.ndarray:
        return data.sum_to_all(np.concatenate([np.ravel(np.asarray(p, np.float64))
                                               for p in parts]))

    def batchnorm_stats(x, eps: float):
        axes, C = _axes(x), x.shape[1]
        n_g = x.size // C
        m_g = np.mean(x, axis=axes)
        xc = x - _per_channel(m_g, x.ndim)
        parts = data.allgather((n_g, m_g, np.sum(xc * xc, axis=axes)))  # one collective
        n = sum(p[0] for p in parts)
        mean = sum(p[0] * p[1] for p in parts) / n
        m2 = sum(p[2] + p[0] * (p[1] - mean) ** 2 for p in parts)  # Chan et al.'s merge
        return mean.astype(x.dtype, copy=False), \
            (1.0 / np.sqrt(m2 / n + eps)).astype(x.dtype, copy=False)

    def batchnorm_adjoint(x, mean, rstd, gamma, dy, batch_stats: bool):
        if not batch_stats:
            return bk.batchnorm_adjoint(x, mean, rstd, gamma, dy, batch_stats)
        axes, C, nd = _axes(x), x.shape[1], x.ndim
        xhat = (x - _per_channel(mean, nd)) * _per_channel(rstd, nd)
        g = dy * _per_channel(gamma, nd)
        total = group_sum(np.sum(g, axis=axes), np.sum(g * xhat, axis=axes), [x.size // C])
        n = total[2 * C]
        mean_g = (total[:C] / n).astype(x.dtype, copy=False)
        mean_gx = (total[C:2 * C] / n).astype(x.dtype, copy=False)
        g = g - _per_channel(mean_g, nd) - xhat * _per_channel(mean_gx, nd)
        return g * _per_channel(rstd, nd), np.sum(dy * xhat, axis=axes), np.sum(dy, axis=axes)

    kernels = {**bk.kernels, "batchnorm_stats": batchnorm_stats,
               "batchnorm_adjoint": batchnorm_adjoint}
    return replace(bk, name=f"{bk.name}+sync-bn", kernels=kernels)


def combined_batch_stats(stats: list, data) -> list:
    """One group's ``(prefix, row, BatchStats)`` list made the full batch's: the same layers in
    the same order on every group; μ is already the full batch's (synchronised forward),
    σ² = Σ_g n_g σ²_g / Σ_g n_g, count = Σ_g n_g. Collective over ``data``."""
    per_group = data.allgather([(st.var, st.count) for _, _, st in stats])
    out = []
    for j, (prefix, row, st) in enumerate(stats):
        counts = [g[j][1] for g in per_group]
        n = sum(counts)
        var = sum(c * g[j][0] for c, g in zip(counts, per_group, strict=True)) / n
        out.append((prefix, row, BatchStats(st.mean, var, n)))
    return out
