"""Transformer encoders whose layers are MGRIT time steps: a sequence classifier or token tagger
(docs/references.md §1, Lu et al. 2019), and :func:`transformer_model`, which builds it or the
encoder–decoder of :mod:`refbraid.sequence.seq2seq_model` for a token data set.

A :class:`~refbraid.network.Network`, so every solver of the ResNets applies::

    X[0] = W_emb[tok] + P,    X[n+1] = X[n] + h F_enc(θ_n, X[n]),   n = 0..N-1,   h = T/N
    logits = mean_t(X[N]) Wᵀ + b   (B, K)        or per token   X[N] Wᵀ + b   (B, T, K)

Layer-parallel gradient: the encoder block is one MGRIT problem (coarse steps ``m·h`` with the
weights of the first fine layer, TorchBraid's injection), forward solve, loss, adjoint solve
(:func:`refbraid.sequence.block_gradient.block_layer_parallel`).

Shape legend: B batch, T tokens, E width ``dim``, F MLP width ``hidden``, V vocabulary,
K classes, N layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..layer_parallel import LayerParallelSettings, mgrit_forward
from ..layers import EncoderStep, PooledClassifier, TokenClassifier, TokenEmbedding
from ..mgrit import MGRITSettings
from ..network import Network, forward, init_params
from .block_gradient import block_backprop, block_layer_parallel, for_batch
from .gpt_model import GPTModel
from .losses import cross_entropy
from .model_base import SIZE_FIELDS, LayeredModel
from .seq2seq_model import Seq2SeqModel
from .token_layers import TokenInput, check_tokens


@dataclass(frozen=True)
class TransformerModel(LayeredModel):
    """Token embedding → N encoder steps over [0, T] → pooled or per-token classifier."""

    vocab_size: int
    seq_len: int
    n_classes: int
    layers: int
    dim: int
    heads: int
    hidden: int
    T: float = 1.0
    per_token: bool = False

    def __post_init__(self):
        self.check_sizes((*SIZE_FIELDS, "n_classes"))
        _ = self.net  # validates the layers

    @property
    def net(self) -> Network:
        E, T = self.dim, self.seq_len
        head = (TokenClassifier if self.per_token else PooledClassifier)(T, E, self.n_classes)
        return Network(opening=TokenInput(TokenEmbedding(self.vocab_size, E, T)),
                       step=EncoderStep(E, self.heads, self.hidden, T), closing=head,
                       n_layers=self.layers, T=self.T)

    @property
    def mpi_network(self) -> Network | None:
        """The Network the MPI gradient distributes: the model's parameters are its own."""
        return self.net

    @property
    def first_block(self) -> Network:
        return self.net

    @property
    def last_block(self) -> Network:
        return self.net

    def init_params(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """``opening.*``, stacked ``steps.*`` (N, ...) and ``closing.*`` (as torch initialises)."""
        return init_params(self.net, rng, dtype)

    def logits(self, params, x, bk: Backend | str = "numpy"):
        """Sequential forward: (B, K) or (B, T, K) logits."""
        bk = get_backend(bk)
        check_tokens("x", x, self.seq_len)
        return forward(self.net, params, x, bk, keep=False)[0]

    def backprop(self, params, x, labels, bk: Backend | str = "numpy"):
        """Loss and gradient by sequential backprop; returns (loss, grads, info)."""
        bk = get_backend(bk)
        check_tokens("x", x, self.seq_len)
        loss, grads, out = block_backprop(self.net, params, x,
                                          lambda z: cross_entropy(z, labels, bk), bk)
        return loss, {k: grads[k] for k in params}, {"logits": out}

    def mgrit_logits(self, params, x, settings: MGRITSettings, bk: Backend | str = "numpy"):
        """Logits with the encoder block solved by MGRIT (what layer-parallel training trains)."""
        bk = get_backend(bk)
        check_tokens("x", x, self.seq_len)
        net = for_batch(self.net, x.shape[0])  # batched sweeps where they pay
        return mgrit_forward(net, params, x, settings, bk)[0]

    def layer_parallel_gradient(self, params, x, labels,
                                settings: LayerParallelSettings | None = None,
                                bk: Backend | str = "numpy"):
        """Loss and gradient with MGRIT forward and adjoint solves over the layers."""
        bk = get_backend(bk)
        settings = LayerParallelSettings() if settings is None else settings
        check_tokens("x", x, self.seq_len)
        loss, grads, info = block_layer_parallel(
            for_batch(self.net, x.shape[0]), params, x, lambda z: cross_entropy(z, labels, bk),
            settings, bk)
        return loss, {k: grads[k] for k in params}, info


def default_heads(dim: int) -> int:
    """Heads for width E: E/8 (at least 1, and a divisor of E)."""
    heads = max(1, dim // 8)
    while dim % heads:
        heads -= 1
    return heads


def transformer_model(data_shape: tuple[int, ...], n_classes: int, layers: int, width: int,
                      T: float, info: dict[str, Any] | None, decoder: bool = False,
                      causal_lm: bool = False, tied: bool = True, buffer: int = 0,
                      teacher_forcing: bool = False):
    """An encoder-only, encoder–decoder (``decoder``) or decoder-only causal language model
    (``causal_lm``) for a token data set described by ``info``."""
    info = info or {}
    if "vocab_size" not in info or len(data_shape) != 1:
        raise ValueError(f"a transformer reads token sequences (a data set with a vocabulary, "
                         f"e.g. seq-match, seq-duplicates, seq-reverse); got samples of shape "
                         f"{tuple(data_shape)} without a vocabulary.")
    V, L = int(info["vocab_size"]), int(data_shape[0])
    heads, hidden = default_heads(width), 2 * width
    if causal_lm:
        if not info.get("language_model"):
            raise ValueError("model 'gpt' is a language model: it needs next-token data "
                             "(e.g. lm-reverse).")
        return GPTModel(V, L, layers, width, heads, hidden, T, tied=tied, buffer=buffer)
    if decoder:
        if not info.get("per_token"):
            raise ValueError("an encoder-decoder model needs per-token labels (e.g. "
                             "seq-reverse, seq-duplicates).")
        return Seq2SeqModel(V, L, n_classes, layers, width, heads, hidden, T,
                            teacher_forcing=teacher_forcing)
    return TransformerModel(V, L, n_classes, layers, width, heads, hidden, T,
                            per_token=bool(info.get("per_token")))
