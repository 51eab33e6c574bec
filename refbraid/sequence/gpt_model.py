"""A decoder-only (GPT-style) causal language model whose layers are MGRIT time steps.

One block of N causal self-attention steps (Lu et al. 2019 as in docs/references.md §1, with
the causal mask of Vaswani et al.; arXiv 2601.09026 trains GPT-2 this way)::

    X[0] = W_emb[tok] + P                           (token + learned position embedding)
    X[n+1] = X[n] + h (a + c),  a = φ1(X[n]) = SA_causal(LN1 X[n]),  c = φ2(X[n] + a)
    logits = LN_f(X[N]) Wᵀ + b                      (W = W_emb when tied)
    (with ``buffer`` = b > 0 the first and last b steps run serially outside the MGRIT block:
    refbraid.sequence.buffer_layers)
    L = −(1/|S|) Σ_{(b,t) ∈ S} log softmax(logits[b, t])[tok[b, t+1]]     (next token)

Position t attends to positions ≤ t only, so the logits at t depend on ``tok[:, :t+1]`` and
generation can run the whole window and read position t (:mod:`refbraid.sequence.generate`).

Tied head: ``closing.W`` is not a parameter; the model hands ``opening.W`` to the head and
adds the head's gradient of it to the embedding's, ``dW_emb = dW_emb(opening) + dW(head)``.

Layer-parallel gradient: the block is one MGRIT problem (coarse steps ``m·h`` with the weights
of the first fine layer, TorchBraid's injection), forward solve, loss, adjoint solve, as the
encoder (:func:`refbraid.sequence.block_gradient.block_layer_parallel`).

Shape legend: B batch, L tokens (``seq_len``), E width ``dim``, F MLP width ``hidden``,
V vocabulary, N layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends import Backend, get_backend
from ..layer_parallel import LayerParallelSettings, mgrit_forward
from ..layers import EncoderStep, LMHead, TokenEmbedding
from ..mgrit import MGRITSettings
from ..network import Network, forward, init_params
from .block_gradient import block_backprop, block_layer_parallel, for_batch
from .buffer_layers import BufferedClosing, BufferedOpening
from .losses import cross_entropy
from .model_base import SIZE_FIELDS, LayeredModel
from .token_layers import TokenInput, check_tokens


@dataclass(frozen=True)
class GPTModel(LayeredModel):
    """Token + position embedding → N causal steps over [0, T] → LM head (tied or untied)."""

    vocab_size: int
    seq_len: int
    layers: int
    dim: int
    heads: int
    hidden: int
    T: float = 1.0
    tied: bool = True
    buffer: int = 0  # serial steps at each end, outside the MGRIT block (buffer_layers.py)

    def __post_init__(self):
        self.check_sizes(SIZE_FIELDS)
        if not isinstance(self.tied, bool):
            raise TypeError(f"`tied` must be a bool, got {self.tied!r}.")
        b = self.buffer
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 0 \
                or self.layers - 2 * b < 1:
            raise ValueError(f"`buffer` must be an integer in [0, {(self.layers - 1) // 2}] "
                             f"(buffer steps at each end of {self.layers} layers leave at "
                             f"least one for MGRIT), got {b!r}.")
        _ = self.net  # validates the layers

    @property
    def n_classes(self) -> int:
        return self.vocab_size

    @property
    def net(self) -> Network:
        """The MGRIT block of N − 2b steps between the (buffered) opening and closing; every
        step has size h = T/N."""
        V, E, L, b = self.vocab_size, self.dim, self.seq_len, self.buffer
        step = EncoderStep(E, self.heads, self.hidden, L, causal=True)
        opening = TokenInput(TokenEmbedding(V, E, L, positional="learned"))
        closing = LMHead(L, E, V)
        if b:
            opening = BufferedOpening(opening, step, b, self.h)
            closing = BufferedClosing(closing, step, b, self.h)
        middle = self.layers - 2 * b
        return Network(opening=opening, step=step, closing=closing, n_layers=middle,
                       T=self.h * middle)

    @property
    def n_layers(self) -> int:
        """Steps of the MGRIT block (all N layers without buffers)."""
        return self.layers - 2 * self.buffer

    @property
    def h(self) -> float:
        return self.T / self.layers

    @property
    def mpi_network(self) -> Network | None:
        """The Network the MPI gradient distributes: the model's parameters are its own
        (None with a tied head, whose one matrix is used on the first and the last rank:
        refbraid.distributed.chained distributes that model)."""
        return None if self.tied else self.net

    @property
    def first_block(self) -> Network:
        return self.net

    @property
    def last_block(self) -> Network:
        return self.net

    # ------------------------------------------------------------------ tied head
    def init_params(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """``opening.W``, ``opening.pos``, stacked ``steps.*``, ``closing.*`` (no
        ``closing.W`` when tied). The embeddings are torch's N(0, 1) scaled by 1/√E, so that
        the tied head's first logits are O(1)."""
        params = init_params(self.net, rng, dtype)
        scale = np.asarray(1.0 / np.sqrt(self.dim), dtype=dtype)
        params["opening.W"] = params["opening.W"] * scale
        params["opening.pos"] = params["opening.pos"] * scale
        if self.tied:
            params.pop("closing.W")
        return params

    def _with_head(self, params) -> dict:
        """The Network's params: the embedding handed to the head when tied."""
        return {**params, "closing.W": params["opening.W"]} if self.tied else params

    def _fold(self, grads, params) -> dict:
        """dW_emb += dW(head) when tied; keyed like ``params``."""
        if self.tied:
            grads = dict(grads)
            grads["opening.W"] = grads["opening.W"] + grads.pop("closing.W")
        return {k: grads[k] for k in params}

    # ------------------------------------------------------------------ the duck type
    def logits(self, params, x, bk: Backend | str = "numpy"):
        """Sequential forward: next-token logits (B, L, V)."""
        bk = get_backend(bk)
        check_tokens("x", x, self.seq_len)
        return forward(self.net, self._with_head(params), x, bk, keep=False)[0]

    def backprop(self, params, x, labels, bk: Backend | str = "numpy"):
        """Loss and gradient by sequential backprop; returns (loss, grads, info)."""
        bk = get_backend(bk)
        check_tokens("x", x, self.seq_len)
        loss, grads, out = block_backprop(self.net, self._with_head(params), x,
                                          lambda z: cross_entropy(z, labels, bk), bk)
        return loss, self._fold(grads, params), {"logits": out}

    def mgrit_logits(self, params, x, settings: MGRITSettings, bk: Backend | str = "numpy"):
        """Logits with the causal block solved by MGRIT (what layer-parallel training trains)."""
        bk = get_backend(bk)
        check_tokens("x", x, self.seq_len)
        net = for_batch(self.net, x.shape[0])  # batched sweeps where they pay
        return mgrit_forward(net, self._with_head(params), x, settings, bk)[0]

    def layer_parallel_gradient(self, params, x, labels,
                                settings: LayerParallelSettings | None = None,
                                bk: Backend | str = "numpy"):
        """Loss and gradient with MGRIT forward and adjoint solves over the layers."""
        bk = get_backend(bk)
        settings = LayerParallelSettings() if settings is None else settings
        check_tokens("x", x, self.seq_len)
        loss, grads, info = block_layer_parallel(
            for_batch(self.net, x.shape[0]), self._with_head(params), x,
            lambda z: cross_entropy(z, labels, bk),
            settings, bk)
        return loss, self._fold(grads, params), info
