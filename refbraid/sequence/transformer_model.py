"""Transformers whose layers are MGRIT time steps: an encoder-only classifier / token tagger and
an encoder–decoder for sequence-to-sequence tasks (docs/references.md §1, Lu et al. 2019).

Encoder-only (a :class:`~refbraid.network.Network`, so every solver of the ResNets applies)::

    X[0] = W_emb[tok] + P,    X[n+1] = X[n] + h F_enc(θ_n, X[n]),   n = 0..N-1,   h = T/N
    logits = mean_t(X[N]) Wᵀ + b   (B, K)        or per token   X[N] Wᵀ + b   (B, T, K)

Encoder–decoder: the encoder's X[N] is the *memory* M, data of every decoder step (all of them
attend to it)::

    Z[0] = Q (learned queries, one per output position),   Z[n+1] = Z[n] + h F_dec(θ'_n, Z[n]; M)
    logits = Z[N] Wᵀ + b  (B, T, K)

The decoder is non-autoregressive (no causal mask, no teacher forcing): every output position
has its own learned query and reads the source through cross-attention, which is all a
copy/reverse task needs, and accuracy is measured without feeding the answer in.

Layer-parallel gradient: each block is an MGRIT problem (coarse steps ``m·h`` with the weights
of the first fine layer, TorchBraid's injection), solved in the order the data flows::

    forward   encoder solve → M → decoder solve → logits, loss
    adjoint   decoder adjoint solve from λ_Z[N] = ∂L/∂Z[N]
              ∂L/∂θ'_n and ∂L/∂M = Σ_n (∂Φ'_n/∂M)ᵀ λ_Z[n+1]   (from the final relaxation)
              encoder adjoint solve from λ_X[N] = ∂L/∂M,   ∂L/∂θ_n likewise

The memory rides in the decoder's stacked step parameters as a read-only broadcast
``memory`` (N, B, S, E), so the ResNet propagators of :mod:`refbraid.training.layer_parallel`
serve unchanged, and its adjoint comes out of the sweep as one entry per layer (summed here).

Token inputs arrive as integer ids, or as floats holding integer ids (the trainer casts inputs
to the run's dtype): :class:`TokenInput` checks and casts them back.

Shape legend: B batch, T tokens (source and output length), S memory tokens (= T here),
E width ``dim``, F MLP width ``hidden``, V vocabulary, K classes, N layers per block.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from ..backends import Backend, get_backend
from ..layers import (
    DecoderStep,
    EncoderStep,
    PooledClassifier,
    TokenClassifier,
    TokenEmbedding,
)
from ..layers.init import check_adjoint, check_positive_int
from ..mgrit import MGRITSettings, Problem, solve
from ..network import (
    Expected,
    Network,
    check_param_dict,
    forward,
    group,
    init_params,
    layer_params,
    param_spec,
)
from ..training.layer_parallel import (
    CachingForward,
    CapturingAdjoint,
    LayerParallelInfo,
    LayerParallelSettings,
    captured_gradient,
    mgrit_forward,
)
from .losses import cross_entropy


# ----------------------------------------------------------------------------- openings
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
        if x.dtype.kind == "f":
            tok = x.astype(np.int64)
            if not bool((tok == x).all()):
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
        return bk.xp.ascontiguousarray(bk.xp.broadcast_to(Q, shape)), shape

    def adjoint(self, params, cache, dout, bk):
        """dQ = Σ_b dZ[0][b]; no input adjoint."""
        check_adjoint("dout", dout, cache)
        return None, {"pos": dout.sum(axis=0)}


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


def _check_tokens(name: str, x, seq_len: int) -> None:
    if getattr(x, "ndim", None) != 2 or x.shape[1] != seq_len:
        raise ValueError(f"`{name}` must have shape (batch, {seq_len}), "
                         f"got {getattr(x, 'shape', type(x).__name__)}.")


# ----------------------------------------------------------------------------- one block
def block_backprop(net: Network, params, x, dloss_fn, bk: Backend):
    """Sequential forward and discrete adjoint through one Network with a given loss.

    ``dloss_fn(out) -> (loss, dout)``. Returns (loss, grads keyed like params, out).
    """
    out, _, (open_cache, step_caches, close_cache) = forward(net, params, x, bk)
    loss, dout = dloss_fn(out)
    lam, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dout, bk)
    steps = group(params, "steps")
    dsteps = {k: bk.xp.zeros_like(v) for k, v in steps.items()}
    for n in reversed(range(net.n_layers)):
        lam, dtheta = net.step.adjoint(layer_params(steps, n), step_caches[n], lam, net.h, bk)
        for k, v in dtheta.items():
            dsteps[k][n] = v
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, lam, bk)
    grads = {f"opening.{k}": v for k, v in dopen.items()}
    grads.update({f"steps.{k}": v for k, v in dsteps.items()})
    grads.update({f"closing.{k}": v for k, v in dclose.items()})
    return loss, grads, out


def block_layer_parallel(net: Network, params, x, dloss_fn, settings: LayerParallelSettings,
                         bk: Backend):
    """MGRIT forward solve, loss, MGRIT adjoint solve (gradient rows from its last relaxation).

    Returns (loss, grads keyed like params, info).
    """
    steps = group(params, "steps")
    caching = CachingForward(net, steps, bk)
    out, fwd, (open_cache, close_cache) = mgrit_forward(net, params, x, settings.forward, bk,
                                                        caching)
    loss, dout = dloss_fn(out)
    lam_N, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dout, bk)
    adjoint = CapturingAdjoint(net, steps, fwd.solution, caching.caches, bk)
    bwd = solve(Problem(adjoint, lam_N, net.n_layers, direction="backward"), settings.backward)
    dsteps = captured_gradient(adjoint, steps, range(net.n_layers))
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, bwd.solution[0], bk)
    grads = {f"opening.{k}": v for k, v in dopen.items()}
    grads.update({f"steps.{k}": v for k, v in dsteps.items()})
    grads.update({f"closing.{k}": v for k, v in dclose.items()})
    return loss, grads, LayerParallelInfo(fwd, bwd, fwd.solution, bwd.solution, out)


# ----------------------------------------------------------------------------- encoder only
@dataclass(frozen=True)
class TransformerModel:
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
        for name in ("vocab_size", "seq_len", "n_classes", "layers", "dim", "heads", "hidden"):
            check_positive_int(name, getattr(self, name))
        _ = self.net  # validates the layers

    @property
    def net(self) -> Network:
        E, T = self.dim, self.seq_len
        head = (TokenClassifier if self.per_token else PooledClassifier)(T, E, self.n_classes)
        return Network(opening=TokenInput(TokenEmbedding(self.vocab_size, E, T)),
                       step=EncoderStep(E, self.heads, self.hidden, T), closing=head,
                       n_layers=self.layers, T=self.T)

    # the Network-like description the trainer reads
    @property
    def opening(self):
        return self.net.opening

    @property
    def step(self):
        return self.net.step

    @property
    def n_layers(self) -> int:
        return self.layers

    @property
    def h(self) -> float:
        return self.T / self.layers

    def init_params(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """``opening.*``, stacked ``steps.*`` (N, ...) and ``closing.*`` (as torch initialises)."""
        return init_params(self.net, rng, dtype)

    def logits(self, params, x, bk: Backend | str = "numpy"):
        """Sequential forward: (B, K) or (B, T, K) logits."""
        bk = get_backend(bk)
        _check_tokens("x", x, self.seq_len)
        return forward(self.net, params, x, bk, keep=False)[0]

    def backprop(self, params, x, labels, bk: Backend | str = "numpy"):
        """Loss and gradient by sequential backprop; returns (loss, grads, info)."""
        bk = get_backend(bk)
        _check_tokens("x", x, self.seq_len)
        loss, grads, out = block_backprop(self.net, params, x,
                                          lambda z: cross_entropy(z, labels, bk), bk)
        return loss, {k: grads[k] for k in params}, {"logits": out}

    def mgrit_logits(self, params, x, settings: MGRITSettings, bk: Backend | str = "numpy"):
        """Logits with the encoder block solved by MGRIT (what layer-parallel training trains)."""
        bk = get_backend(bk)
        _check_tokens("x", x, self.seq_len)
        return mgrit_forward(self.net, params, x, settings, bk)[0]

    def layer_parallel_gradient(self, params, x, labels,
                                settings: LayerParallelSettings | None = None,
                                bk: Backend | str = "numpy"):
        """Loss and gradient with MGRIT forward and adjoint solves over the layers."""
        bk = get_backend(bk)
        settings = LayerParallelSettings() if settings is None else settings
        _check_tokens("x", x, self.seq_len)
        loss, grads, info = block_layer_parallel(
            self.net, params, x, lambda z: cross_entropy(z, labels, bk), settings, bk)
        return loss, {k: grads[k] for k in params}, info


# ----------------------------------------------------------------------------- encoder–decoder
@dataclass
class Seq2SeqInfo:
    """Both blocks' layer-parallel records."""

    encoder: LayerParallelInfo
    decoder: LayerParallelInfo

    def stats(self) -> dict[str, float]:
        """Worst final residuals and total cycles / Φ applications over the two blocks."""
        e, d = self.encoder.stats(), self.decoder.stats()
        out = {k: max(e[k], d[k]) for k in ("fwd_res", "bwd_res")}
        out.update({k: e[k] + d[k] for k in ("fwd_iters", "bwd_iters", "phi_calls")})
        return out


def _sub(params: dict, prefix: str) -> dict:
    head = prefix + "."
    return {k[len(head) :]: v for k, v in params.items() if k.startswith(head)}


@dataclass(frozen=True)
class Seq2SeqModel:
    """Encoder (N steps) → memory → decoder (N steps, learned queries) → per-token classifier."""

    vocab_size: int
    seq_len: int
    n_classes: int
    layers: int
    dim: int
    heads: int
    hidden: int
    T: float = 1.0

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "n_classes", "layers", "dim", "heads", "hidden"):
            check_positive_int(name, getattr(self, name))
        _ = self.encoder, self.decoder  # validates the layers

    @property
    def encoder(self) -> Network:
        E, T = self.dim, self.seq_len
        return Network(opening=TokenInput(TokenEmbedding(self.vocab_size, E, T)),
                       step=EncoderStep(E, self.heads, self.hidden, T), closing=Identity((T, E)),
                       n_layers=self.layers, T=self.T)

    @property
    def decoder(self) -> Network:
        E, T = self.dim, self.seq_len
        return Network(opening=Queries(T, E),
                       step=DecoderStep(E, self.heads, self.hidden, T, T, causal=False),
                       closing=TokenClassifier(T, E, self.n_classes), n_layers=self.layers,
                       T=self.T)

    @property
    def opening(self):
        return self.encoder.opening

    @property
    def step(self):
        return self.decoder.step

    @property
    def n_layers(self) -> int:
        """Layers per block (each block is one MGRIT problem of this many steps)."""
        return self.layers

    @property
    def h(self) -> float:
        return self.T / self.layers

    def init_params(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """``encoder.*`` and ``decoder.*`` (the decoder steps' memory stand-in dropped)."""
        params = {f"encoder.{k}": v for k, v in init_params(self.encoder, rng, dtype).items()}
        dec = init_params(self.decoder, rng, dtype)
        dec.pop("steps.memory")
        params.update({f"decoder.{k}": v for k, v in dec.items()})
        return params

    def param_spec(self) -> dict[str, Expected]:
        """Names and shapes of :meth:`init_params` (the encoder's and decoder's, prefixed)."""
        return _seq2seq_spec(self)

    def _check(self, params, x) -> None:
        """The entry-point checks of the whole model (each block's forward checks its own)."""
        check_param_dict(self.param_spec(), params, f"one row per layer: layers = {self.layers}")
        _check_tokens("x", x, self.seq_len)

    @staticmethod
    def _with_memory(dec_params: dict, memory, n: int, bk) -> dict:
        """Decoder params with the memory broadcast (read-only) over the N stacked steps."""
        return {**dec_params,
                "steps.memory": bk.xp.broadcast_to(memory, (n, *memory.shape))}

    def logits(self, params, x, bk: Backend | str = "numpy"):
        """Sequential forward: encoder, then decoder with the memory; (B, T, K) logits."""
        bk = get_backend(bk)
        self._check(params, x)
        memory = forward(self.encoder, _sub(params, "encoder"), x, bk, keep=False)[0]
        dec = self._with_memory(_sub(params, "decoder"), memory, self.layers, bk)
        return forward(self.decoder, dec, x, bk, keep=False)[0]

    def backprop(self, params, x, labels, bk: Backend | str = "numpy"):
        """Loss and gradient by sequential backprop through both blocks."""
        bk = get_backend(bk)
        self._check(params, x)
        enc_p = _sub(params, "encoder")
        memory = forward(self.encoder, enc_p, x, bk, keep=False)[0]
        dec = self._with_memory(_sub(params, "decoder"), memory, self.layers, bk)
        loss, dgrads, out = block_backprop(self.decoder, dec, x,
                                           lambda z: cross_entropy(z, labels, bk), bk)
        dmemory = dgrads.pop("steps.memory").sum(axis=0)  # Σ_n ∂Φ'_n/∂M ᵀ λ
        _, egrads, _ = block_backprop(self.encoder, enc_p, x, lambda m: (0.0, dmemory), bk)
        grads = {f"encoder.{k}": v for k, v in egrads.items()}
        grads.update({f"decoder.{k}": v for k, v in dgrads.items()})
        return loss, {k: grads[k] for k in params}, {"logits": out}

    def mgrit_logits(self, params, x, settings: MGRITSettings, bk: Backend | str = "numpy"):
        """Logits with both blocks solved by MGRIT."""
        bk = get_backend(bk)
        self._check(params, x)
        memory = mgrit_forward(self.encoder, _sub(params, "encoder"), x, settings, bk)[0]
        dec = self._with_memory(_sub(params, "decoder"), memory, self.layers, bk)
        return mgrit_forward(self.decoder, dec, x, settings, bk)[0]

    def layer_parallel_gradient(self, params, x, labels,
                                settings: LayerParallelSettings | None = None,
                                bk: Backend | str = "numpy"):
        """MGRIT solves block by block (module docstring); returns (loss, grads, Seq2SeqInfo).

        The encoder's forward solve is repeated inside its gradient pass (a second identical
        solve, cheaper to read than threading the record through).
        """
        bk = get_backend(bk)
        settings = LayerParallelSettings() if settings is None else settings
        self._check(params, x)
        enc_p = _sub(params, "encoder")
        memory = mgrit_forward(self.encoder, enc_p, x, settings.forward, bk)[0]
        dec = self._with_memory(_sub(params, "decoder"), memory, self.layers, bk)
        loss, dgrads, dinfo = block_layer_parallel(
            self.decoder, dec, x, lambda z: cross_entropy(z, labels, bk), settings, bk)
        dmemory = dgrads.pop("steps.memory").sum(axis=0)
        _, egrads, einfo = block_layer_parallel(self.encoder, enc_p, x,
                                                lambda m: (0.0, dmemory), settings, bk)
        grads = {f"encoder.{k}": v for k, v in egrads.items()}
        grads.update({f"decoder.{k}": v for k, v in dgrads.items()})
        return loss, {k: grads[k] for k in params}, Seq2SeqInfo(einfo, dinfo)


@lru_cache(maxsize=32)
def _seq2seq_spec(model: Seq2SeqModel) -> dict[str, Expected]:
    spec = {f"encoder.{k}": v for k, v in param_spec(model.encoder).items()}
    dec = dict(param_spec(model.decoder))
    dec.pop("steps.memory")  # the memory is the encoder's output, not a parameter
    spec.update({f"decoder.{k}": v for k, v in dec.items()})
    return spec


def default_heads(dim: int) -> int:
    """Heads for width E: E/8 (at least 1, and a divisor of E)."""
    heads = max(1, dim // 8)
    while dim % heads:
        heads -= 1
    return heads


def transformer_model(data_shape: tuple[int, ...], n_classes: int, layers: int, width: int,
                      T: float, info: dict[str, Any] | None, decoder: bool = False):
    """An encoder-only (or encoder–decoder) model for a token data set described by ``info``."""
    info = info or {}
    if "vocab_size" not in info or len(data_shape) != 1:
        raise ValueError(f"a transformer reads token sequences (a data set with a vocabulary, "
                         f"e.g. seq-match, seq-duplicates, seq-reverse); got samples of shape "
                         f"{tuple(data_shape)} without a vocabulary.")
    V, L = int(info["vocab_size"]), int(data_shape[0])
    heads, hidden = default_heads(width), 2 * width
    if decoder:
        if not info.get("per_token"):
            raise ValueError("model 'transformer-decoder' needs per-token labels (e.g. "
                             "seq-reverse, seq-duplicates).")
        return Seq2SeqModel(V, L, n_classes, layers, width, heads, hidden, T)
    return TransformerModel(V, L, n_classes, layers, width, heads, hidden, T,
                            per_token=bool(info.get("per_token")))
