"""The token openings and the memory closing that make each transformer block a
:class:`~refbraid.network.Network`: what the models put around their encoder and decoder steps.

==============  ================================================  =============================
layer           forward                                           adjoint
==============  ================================================  =============================
TokenInput      X = W_emb[tok] + P,   tok = x as integers         dW_emb, dP (no input adjoint)
Queries         Z[0][b] = Q for every sample b (x: batch only)    dQ = Σ_b dZ[0][b]
Identity        M = X[N]  (the encoder's memory, as its closing)  dX[N] = dM
==============  ================================================  =============================

Token inputs arrive as integer ids, or as floats holding integer ids (the trainer casts inputs
to the run's dtype): :class:`TokenInput` checks and casts them back. :func:`check_tokens` is the
models' entry-point check of a batch of token ids.

Shape legend: B batch, T tokens, E width ``dim``, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..backends.dtypes import dtype_kind
from ..backends.host import to_host
from ..backends.portable import contiguous
from ..layers import TokenEmbedding
from ..layers.init import check_adjoint


@dataclass(frozen=True)
class TokenInput:
    """:class:`TokenEmbedding` that also takes float arrays holding integer token ids."""

    embedding: TokenEmbedding

    #: the input is token ids (integers, or floats holding them), not a differentiable array
    discrete_input: ClassVar[bool] = True

    @property
    def in_shape(self) -> tuple[int, ...]:
        return self.embedding.in_shape

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.embedding.out_shape

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        return self.embedding.init(rng, dtype)

    def forward(self, params, x, bk):
        """X = W[tok] + P with tok = x as integers (x must hold whole numbers)."""
        if dtype_kind(x.dtype) == "f":
            tok = bk.xp.astype(x, bk.xp.int64)
            if not bool(to_host(bk.xp.all(tok == x))):
                raise ValueError("`x` must hold integer token ids; got non-integral values.")
            x = tok
        return self.embedding.forward(params, x, bk)

    def adjoint(self, params, cache, dout, bk):
        return self.embedding.adjoint(params, cache, dout, bk)


@dataclass(frozen=True)
class Queries:
    """Decoder opening ``Z[0][b] = Q`` for every sample: learned queries ``pos`` (T, E)."""

    seq_len: int
    dim: int

    #: only the batch size of the input is read
    discrete_input: ClassVar[bool] = True

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.seq_len,)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """``pos`` ~ N(0, 1), as a learned positional embedding."""
        return {"pos": rng.standard_normal((self.seq_len, self.dim)).astype(dtype)}

    def forward(self, params, x, bk):
        """Z[0] = Q broadcast over the batch of x (only x's batch size is used); the cache is
        the output shape."""
        Q = params["pos"]
        shape = (x.shape[0], *Q.shape)
        return contiguous(bk.xp.broadcast_to(Q, shape)), shape

    def adjoint(self, params, cache, dout, bk):
        """dQ = Σ_b dZ[0][b]; no input adjoint."""
        check_adjoint("dout", dout, cache)
        return None, {"pos": bk.xp.sum(dout, axis=0)}


@dataclass(frozen=True)
class Identity:
    """Closing of the encoder block of an encoder–decoder: the memory M = X[N] itself."""

    in_shape: tuple[int, ...]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.in_shape

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        return {}

    def forward(self, params, x, bk):
        return x, tuple(x.shape)

    def adjoint(self, params, cache, dout, bk):
        check_adjoint("dout", dout, cache)
        return dout, {}


def check_tokens(name: str, x, seq_len: int) -> None:
    """The models' entry-point check: ``x`` is a batch of token ids of shape (B, ``seq_len``)."""
    if getattr(x, "ndim", None) != 2 or x.shape[1] != seq_len:
        raise ValueError(f"`{name}` must have shape (batch, {seq_len}), "
                         f"got {getattr(x, 'shape', type(x).__name__)}.")
