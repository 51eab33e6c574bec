"""Layer normalisation over the feature axis, as ``torch.nn.LayerNorm(E, eps=1e-5)``.

Forward and adjoint (the kernels ``layernorm`` / ``layernorm_adjoint``; docs/references.md §1)::

    μ  = mean_e x_e,   σ² = mean_e (x_e − μ)²   (biased),   r = 1/√(σ² + eps)    # B,T
    x̂  = (x − μ) r,    y = γ ⊙ x̂ + β                                              # B,T,E
    g  = dy ⊙ γ
    dx = r (g − mean_e g − x̂ mean_e(g ⊙ x̂)),   dγ = Σ_{B,T} dy ⊙ x̂,   dβ = Σ_{B,T} dy

Parameters map one to one onto torch's: ``gamma`` ↔ ``weight``, ``beta`` ↔ ``bias``.

Shape legend: B batch, T tokens (``seq_len``), E features (``dim``). The layer normalises
the last axis of an input of any shape (..., E); ``seq_len`` only fixes ``in_shape`` for the
verification catalogue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .init import check_adjoint, check_dtype, check_positive_int

EPS = 1e-5  # torch.nn.LayerNorm's default


def check_eps(eps) -> float:
    """``eps`` as a float; ValueError unless it is a positive number."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps > 0):
        raise ValueError(f"`eps` must be a positive number, got {eps!r}.")
    return float(eps)


@dataclass(frozen=True)
class LayerNorm:
    """``y = γ ⊙ (x − μ)/√(σ² + eps) + β`` over the last axis (width ``dim``)."""

    dim: int
    seq_len: int = 1
    eps: float = EPS

    def __post_init__(self):
        check_positive_int("dim", self.dim)
        check_positive_int("seq_len", self.seq_len)
        check_eps(self.eps)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """γ = 1, β = 0, as torch initialises LayerNorm (``rng`` is unused)."""
        return {"gamma": np.ones(self.dim, dtype=dtype), "beta": np.zeros(self.dim, dtype=dtype)}

    def forward(self, params, x, bk):
        """y = γ ⊙ x̂ + β; returns (y, cache) with cache = (x, μ, r)."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"`x` must have last axis {self.dim}, got shape {tuple(x.shape)}.")
        check_dtype("x", x, params)
        y, mean, rstd = bk.layernorm(x, params["gamma"], params["beta"], self.eps)  # ...,E
        return y, (x, mean, rstd)

    def adjoint(self, params, cache, dout, bk, grads: bool = True):
        """dx = r (g − mean g − x̂ mean(g ⊙ x̂)), g = dout ⊙ γ; returns (dx, {gamma, beta}),
        or (dx, None) without ``grads``."""
        x, mean, rstd = cache
        check_adjoint("dout", dout, x.shape)
        dx, dgamma, dbeta = bk.layernorm_adjoint(x, mean, rstd, params["gamma"], dout)
        return dx, ({"gamma": dgamma, "beta": dbeta} if grads else None)
