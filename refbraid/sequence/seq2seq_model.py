"""An encoder–decoder transformer whose layers are MGRIT time steps, for sequence-to-sequence
tasks (docs/references.md §1, Lu et al. 2019).

Two blocks of N steps each. The encoder's X[N] is the *memory* M, data of every decoder step
(all of them attend to it)::

    X[0] = W_emb[tok] + P,    X[n+1] = X[n] + h F_enc(θ_n, X[n]),   M = X[N]
    Z[0] = Q (learned queries, one per output position),   Z[n+1] = Z[n] + h F_dec(θ'_n, Z[n]; M)
    logits = Z[N] Wᵀ + b  (B, T, K)

Two decoders (``teacher_forcing``):

* non-autoregressive (``False``, model ``transformer-decoder``): Z[0] = Q, a learned query per
  output position, no causal mask; every position reads the source through cross-attention,
  which is all a copy/reverse task needs. It teaches that a decoder need not be sequential.
* autoregressive (``True``, model ``transformer-seq2seq``): Z[0] = W_dec[ỹ] + P with the
  target shifted right, ỹ = (BOS, y_0, …, y_{T−2}), BOS = K (an extra token id), and causal
  self-attention, so position t sees y_{<t} only. Training is teacher-forced (the true
  prefix); evaluation (:meth:`Seq2SeqModel.logits`) decodes token by token, feeding back its
  own argmax: ỹ_{t+1} = argmax logits[:, t], T decoder passes (by causality the last pass's
  logits at t are those of pass t).

Layer-parallel gradient: each block is an MGRIT problem (coarse steps ``m·h`` with the weights
of the first fine layer, TorchBraid's injection), solved in the order the data flows::

    forward   encoder solve → M → decoder solve → logits, loss
    adjoint   decoder adjoint solve from λ_Z[N] = ∂L/∂Z[N]
              ∂L/∂θ'_n and ∂L/∂M = Σ_n (∂Φ'_n/∂M)ᵀ λ_Z[n+1]   (from the final relaxation)
              encoder adjoint solve from λ_X[N] = ∂L/∂M,   ∂L/∂θ_n likewise

The memory rides in the decoder's stacked step parameters as a read-only broadcast
``memory`` (N, B, S, E), so the ResNet propagators of :mod:`refbraid.layer_parallel` serve
unchanged, and its adjoint comes out of the sweep as one entry per layer (summed here).

Shape legend: B batch, T tokens (source and output length), S memory tokens (= T here),
E width ``dim``, F MLP width ``hidden``, V vocabulary, K classes, N layers per block.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..backends import Backend, get_backend
from ..backends.portable import full_on
from ..input_checks import Expected, check_param_dict, param_spec
from ..layer_parallel import LayerParallelInfo, LayerParallelSettings, mgrit_forward
from ..layers import DecoderStep, EncoderStep, TokenClassifier, TokenEmbedding
from ..mgrit import MGRITSettings
from ..network import Network, forward, init_params
from .block_gradient import block_backprop, block_layer_parallel, for_batch
from .losses import cross_entropy
from .model_base import SIZE_FIELDS, LayeredModel
from .token_layers import Identity, Queries, TokenInput, check_tokens


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
class Seq2SeqModel(LayeredModel):
    """Encoder (N steps) → memory → decoder (N steps, learned queries) → per-token classifier."""

    vocab_size: int
    seq_len: int
    n_classes: int
    layers: int
    dim: int
    heads: int
    hidden: int
    T: float = 1.0
    teacher_forcing: bool = False  # autoregressive decoder (module docstring)

    def __post_init__(self):
        self.check_sizes((*SIZE_FIELDS, "n_classes"))
        if not isinstance(self.teacher_forcing, bool):
            raise TypeError(f"`teacher_forcing` must be a bool, got {self.teacher_forcing!r}.")
        _ = self.encoder, self.decoder  # validates the layers

    @property
    def encoder(self) -> Network:
        E, T = self.dim, self.seq_len
        return Network(opening=TokenInput(TokenEmbedding(self.vocab_size, E, T)),
                       step=EncoderStep(E, self.heads, self.hidden, T), closing=Identity((T, E)),
                       n_layers=self.layers, T=self.T)

    @property
    def decoder(self) -> Network:
        E, T, tf = self.dim, self.seq_len, self.teacher_forcing
        opening = TokenInput(TokenEmbedding(self.n_classes + 1, E, T)) if tf else Queries(T, E)
        return Network(opening=opening,
                       step=DecoderStep(E, self.heads, self.hidden, T, T, causal=tf),
                       closing=TokenClassifier(T, E, self.n_classes), n_layers=self.layers,
                       T=self.T)

    @property
    def first_block(self) -> Network:
        return self.encoder

    @property
    def last_block(self) -> Network:
        return self.decoder

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
        check_tokens("x", x, self.seq_len)

    @property
    def bos(self) -> int:
        """The start token of the autoregressive decoder's input (an id past the classes)."""
        return self.n_classes

    def decoder_input(self, x, labels, bk):
        """ỹ = (BOS, y_0, …, y_{T−2}) with teacher forcing, else x (the queries read only the
        batch size)."""
        if not self.teacher_forcing:
            return x
        shifted = full_on(labels, labels.shape, self.bos)
        shifted[:, 1:] = labels[:, :-1]
        return shifted

    def _decode(self, dec_params, bk, batch: int, solve):
        """Autoregressive greedy decoding: T passes of ``solve(decoder input)``, each fixing
        one more input token from the previous pass's argmax; the last pass's logits."""
        ids = np.full((batch, self.seq_len), self.bos, dtype=np.int64)
        for t in range(self.seq_len):
            z = solve(bk.asarray(ids))
            if t + 1 < self.seq_len:
                ids[:, t + 1] = bk.to_numpy(z[:, t, :]).argmax(axis=1)
        return z

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
        if self.teacher_forcing:
            return self._decode(dec, bk, x.shape[0],
                                lambda ids: forward(self.decoder, dec, ids, bk, keep=False)[0])
        return forward(self.decoder, dec, x, bk, keep=False)[0]

    def backprop(self, params, x, labels, bk: Backend | str = "numpy"):
        """Loss and gradient by sequential backprop through both blocks."""
        bk = get_backend(bk)
        self._check(params, x)
        enc_p = _sub(params, "encoder")
        memory = forward(self.encoder, enc_p, x, bk, keep=False)[0]
        dec = self._with_memory(_sub(params, "decoder"), memory, self.layers, bk)
        loss, dgrads, out = block_backprop(self.decoder, dec,
                                           self.decoder_input(x, labels, bk),
                                           lambda z: cross_entropy(z, labels, bk), bk)
        dmemory = bk.xp.sum(dgrads.pop("steps.memory"), axis=0)  # Σ_n ∂Φ'_n/∂M ᵀ λ
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
        if self.teacher_forcing:
            return self._decode(dec, bk, x.shape[0],
                                lambda ids: mgrit_forward(self.decoder, dec, ids, settings,
                                                          bk)[0])
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
        encoder = for_batch(self.encoder, x.shape[0])  # batched sweeps where they pay
        memory = mgrit_forward(encoder, enc_p, x, settings.forward, bk)[0]
        dec = self._with_memory(_sub(params, "decoder"), memory, self.layers, bk)
        loss, dgrads, dinfo = block_layer_parallel(
            self.decoder, dec, self.decoder_input(x, labels, bk),
            lambda z: cross_entropy(z, labels, bk), settings, bk)
        dmemory = bk.xp.sum(dgrads.pop("steps.memory"), axis=0)
        _, egrads, einfo = block_layer_parallel(encoder, enc_p, x,
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
