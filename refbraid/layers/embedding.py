"""Opening layer of a transformer: token embedding plus a positional encoding.

Forward and adjoint (tokens are integers, so there is no input adjoint)::

    X[b, t] = W[tok[b, t]] + P[t]                            # B,T,E
    dW[v]   = Σ_{(b,t): tok[b,t] = v} dX[b, t]               # V,E   (kernel embedding_adjoint)
    dP      = Σ_b dX[b]                                       # T,E   (learned P only)

``W`` maps onto ``torch.nn.Embedding(V, E).weight``. The positional encoding P is either
``"sinusoidal"`` (fixed, Vaswani et al. 2017, not scaled by √E)::

    P[t, 2i] = sin(t / 10000^(2i/E)),   P[t, 2i+1] = cos(t / 10000^(2i/E))

or ``"learned"``: a parameter ``pos`` (T, E), as ``torch.nn.Embedding(T, E).weight`` applied
to positions 0..T−1.

Shape legend: B batch, T tokens (``seq_len``), E width (``dim``), V vocabulary size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..backends.dtypes import dtype_kind, numpy_dtype
from ..backends.host import host_range
from .init import check_adjoint, check_positive_int

POSITIONAL = ("sinusoidal", "learned")
BASE = 10000.0  # wavelength base of the sinusoidal encoding


def sinusoidal_positions(seq_len: int, dim: int, dtype=np.float64) -> np.ndarray:
    """P[t, 2i] = sin(t ω_i), P[t, 2i+1] = cos(t ω_i), ω_i = BASE^(−2i/E); shape (T, E)."""
    t = np.arange(seq_len, dtype=np.float64)[:, None]  # T,1
    omega = BASE ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)  # ⌈E/2⌉
    P = np.zeros((seq_len, dim))
    P[:, 0::2] = np.sin(t * omega)
    P[:, 1::2] = np.cos(t * omega[: dim // 2])
    return P.astype(dtype)


@dataclass(frozen=True)
class TokenEmbedding:
    """``X[b, t] = W[tok[b, t]] + P[t]``: integer tokens (B, T) to states (B, T, E)."""

    vocab_size: int
    dim: int
    seq_len: int
    positional: str = "sinusoidal"

    #: the input is integer token ids, not a differentiable array
    discrete_input: ClassVar[bool] = True

    def __post_init__(self):
        for name in ("vocab_size", "dim", "seq_len"):
            check_positive_int(name, getattr(self, name))
        if self.positional not in POSITIONAL:
            raise ValueError(f"`positional` must be one of {POSITIONAL}, got {self.positional!r}.")

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.seq_len,)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """W ~ N(0, 1) as torch.nn.Embedding; learned ``pos`` ~ N(0, 1) likewise."""
        params = {"W": rng.standard_normal((self.vocab_size, self.dim)).astype(dtype)}
        if self.positional == "learned":
            params["pos"] = rng.standard_normal((self.seq_len, self.dim)).astype(dtype)
        return params

    def example_input(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        """Random token ids, int64 (batch, T), uniform over the vocabulary."""
        check_positive_int("batch", batch)
        return rng.integers(0, self.vocab_size, size=(batch, self.seq_len), dtype=np.int64)

    def _check_tokens(self, x) -> None:
        dtype = getattr(x, "dtype", None)
        if dtype is None or dtype_kind(dtype) not in "iu":
            raise TypeError(f"`x` must be an integer array of token ids, got dtype {dtype}.")
        if x.ndim != 2 or x.shape[1] != self.seq_len:
            raise ValueError(f"`x` must have shape (batch, {self.seq_len}), got {tuple(x.shape)}.")
        if x.size == 0:
            return
        lo, hi = host_range(x)  # reduced on the device: two ids come to the host
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"`x` token ids must lie in [0, {self.vocab_size}), got range "
                             f"[{lo}, {hi}].")

    def positions(self, params, bk):
        """P (T, E): the learned ``pos`` or the fixed sinusoidal table in W's real dtype."""
        if self.positional == "learned":
            return params["pos"]
        real = np.finfo(numpy_dtype(params["W"].dtype)).dtype  # float64 for complex128 too
        return bk.asarray(sinusoidal_positions(self.seq_len, self.dim, real))

    def forward(self, params, x, bk):
        """X = W[x] + P; returns (X, cache = x)."""
        self._check_tokens(x)
        return bk.embedding(x, params["W"]) + self.positions(params, bk), x

    def adjoint(self, params, cache, dout, bk):
        """(None, {W: onehotᵀ dout [, pos: Σ_b dout]}): no adjoint for integer input."""
        check_adjoint("dout", dout, (*cache.shape, self.dim))  # cache = the token ids (B, T)
        dparams = {"W": bk.embedding_adjoint(cache, dout, self.vocab_size)}
        if self.positional == "learned":
            dparams["pos"] = bk.xp.sum(dout, axis=0)
        return None, dparams
