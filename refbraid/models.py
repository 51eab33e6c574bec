"""Network builders: a model name and a data set's shape → a :class:`refbraid.network.Network`.

=======  =====================================================================  ==============
model    layers                                                                  data
=======  =====================================================================  ==============
resnet   DenseLift(K→C) → N × DenseStep(C): y += h σ(W y + b) → Classifier        any (flattened)
conv     ConvLift(C_in→C) → N × ConvStep(C, 3×3) → Classifier                     images (C,H,W)
         3-D: Conv3dLift(C_in→C) → N × Conv3dStep(C, 3×3×3) → Classifier          volumes (C,D,H,W)
=======  =====================================================================  ==============

``h = T/N`` for N = ``layers`` steps. A model is a builder function registered in
:data:`MODELS`. The sequence models (:mod:`refbraid.sequence`) are registered too:

===================  =========================================================  ==============
transformer          TokenEmbedding → N × EncoderStep → pooled / per-token head   token data
transformer-decoder  encoder (N steps) → memory → decoder (N steps) → per token   token data
                     (non-autoregressive: learned queries, no causal mask)
transformer-seq2seq  the same with a causal decoder on the shifted target: teacher    token data
                     forcing in training, token-by-token decoding at evaluation
gpt                  embedding → N causal steps → LM head tied to the embedding     lm-* data
gpt-untied           the same with the LM head's own matrix                         lm-* data
gru                  GRU over the L positions (MGRIT over the sequence), coarse    (L, I),
                     levels implicit GRU; ``width`` = hidden size                  (1, H, W)
implicit-gru         the same with the implicit GRU on every level
conv-stages          ConvLift → N/2 ConvSteps → 2×2 avg pool → widen to 2C →       images (C,H,W),
                     N/2 ConvSteps → Classifier (refbraid.stages.model); with     volumes
                     --batch-norm BN steps and a BN transition, --transition      (C,D,H,W)
                     strided a stride-2 conv
===================  =========================================================  ==============

Defaults differ per model (:data:`MODEL_DEFAULTS`): a ``refbraid train`` flag left unset
takes its model's value (see :mod:`refbraid.training.config`). For the GRUs the sequence is
the time grid (Δt = 1, as torch.nn.GRUCell), so ``layers``, ``T`` and ``activation`` are unused.

Shape legend: K = prod(data_shape) input features, C = ``width`` (channels), H, W image size.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np

from .layers import Classifier, Conv3dLift, Conv3dStep, ConvLift, ConvStep, DenseLift, DenseStep
from .network import Network, init_params


def _resnet(data_shape, n_classes, layers, width, T, activation, info=None) -> Network:
    K = prod(data_shape)
    return Network(
        opening=DenseLift(K, width, activation),
        step=DenseStep(width, activation),
        closing=Classifier((width,), n_classes),
        n_layers=layers,
        T=T,
    )


def _conv(data_shape, n_classes, layers, width, T, activation, info=None) -> Network:
    if len(data_shape) == 2:  # (H, W) grey-scale images
        data_shape = (1, *data_shape)
    if len(data_shape) == 4:  # (C, D, H, W) volumes, e.g. the voxel set
        c_in, D, H, W = data_shape
        return Network(opening=Conv3dLift(c_in, width, D, H, W, activation),
                       step=Conv3dStep(width, D, H, W, activation),
                       closing=Classifier((width, D, H, W), n_classes), n_layers=layers, T=T)
    if len(data_shape) != 3:
        raise ValueError(
            f"model 'conv' needs image data of shape (channels, height, width) or volumes "
            f"(channels, depth, height, width); the data has samples of shape "
            f"{tuple(data_shape)}. Use model 'resnet' for vector data."
        )
    c_in, H, W = data_shape
    return Network(
        opening=ConvLift(c_in, width, H, W, activation),
        step=ConvStep(width, H, W, activation),
        closing=Classifier((width, H, W), n_classes),
        n_layers=layers,
        T=T,
    )


def _transformer(data_shape, n_classes, layers, width, T, activation, info=None):
    from .sequence import transformer_model

    return transformer_model(data_shape, n_classes, layers, width, T, info)


def _transformer_decoder(data_shape, n_classes, layers, width, T, activation, info=None):
    from .sequence import transformer_model

    return transformer_model(data_shape, n_classes, layers, width, T, info, decoder=True)


def _transformer_seq2seq(data_shape, n_classes, layers, width, T, activation, info=None):
    from .sequence import transformer_model

    return transformer_model(data_shape, n_classes, layers, width, T, info, decoder=True,
                             teacher_forcing=True)


def _gpt(data_shape, n_classes, layers, width, T, activation, info=None, buffer=0):
    from .sequence import transformer_model

    return transformer_model(data_shape, n_classes, layers, width, T, info, causal_lm=True,
                             buffer=buffer)


def _gpt_untied(data_shape, n_classes, layers, width, T, activation, info=None, buffer=0):
    from .sequence import transformer_model

    return transformer_model(data_shape, n_classes, layers, width, T, info, causal_lm=True,
                             tied=False, buffer=buffer)


def _gru(data_shape, n_classes, layers, width, T, activation, info=None):
    from .sequence import gru_model

    return gru_model(data_shape, n_classes, width, "classic")


def _implicit_gru(data_shape, n_classes, layers, width, T, activation, info=None):
    from .sequence import gru_model

    return gru_model(data_shape, n_classes, width, "implicit")


def _conv_stages(data_shape, n_classes, layers, width, T, activation, info=None,
                 batch_norm=False, transition="pool"):
    from .stages.model import ConvStagesModel

    return ConvStagesModel(data_shape, n_classes, layers, width, T, activation, batch_norm,
                           transition)


#: Model name → builder(data_shape, n_classes, layers, width, T, activation, info) -> a
#: Network, or a sequence model with the same duck type (refbraid.sequence).
MODELS: dict[str, Callable[..., Network]] = {
    "resnet": _resnet, "conv": _conv, "transformer": _transformer,
    "transformer-decoder": _transformer_decoder, "transformer-seq2seq": _transformer_seq2seq,
    "gpt": _gpt, "gpt-untied": _gpt_untied,
    "gru": _gru, "implicit-gru": _implicit_gru,
    "conv-stages": _conv_stages,
}

#: the models with buffer layers (refbraid.sequence.buffer_layers)
BUFFERED_MODELS = ("gpt", "gpt-untied")

_RESNET_DEFAULTS = dict(data="peaks", layers=64, width=16, T=3.0, epochs=40, lr=5e-3,
                        cfactor=4, fwd_iters=1, bwd_iters=0, relax="F,FCF")
#: gpt on lm-reverse (2000 sequences, seed 0, numba): serial reaches perplexity 1.007 and 100 %
#: exact match in 8 epochs; layer-parallel with 2 / 1 cycles the same (docs/transformers_bias.md)
_GPT_DEFAULTS = dict(data="lm-reverse", layers=8, width=32, T=2.0, epochs=8, lr=3e-3,
                     cfactor=2, fwd_iters=2, bwd_iters=1, relax="F,FCF")
#: The values of the ``refbraid train`` flags a user leaves unset, per model. The sequence
#: models use cfactor 2 (8 layers or 8–16 positions allow 3 levels) and more MGRIT cycles than
#: TorchBraid's ResNet defaults, measured on their tasks:
#: * GRUs: 2 forward / 1 adjoint cycles with FCF on every level (the classic fine / implicit
#:   coarse pair converges slowly with F: 3.3 points behind serial on digits, 0.0 with FCF);
#: * encoder transformer: 3 / 2 cycles and lr 5e-3 (with 2 / 1 cycles the forward residual
#:   grows with the weights during training and the run ends 11–27 points behind serial);
#: * encoder–decoder: 2 / 1 cycles per block.
MODEL_DEFAULTS: dict[str, dict] = {
    "resnet": _RESNET_DEFAULTS,
    "conv": {**_RESNET_DEFAULTS, "data": "digits"},  # images: a default that fits
    "transformer": dict(data="seq-match", layers=8, width=16, T=2.0, epochs=20, lr=5e-3,
                        cfactor=2, fwd_iters=3, bwd_iters=2, relax="F,FCF"),
    "transformer-decoder": dict(data="seq-reverse", layers=4, width=16, T=2.0, epochs=10,
                                lr=1e-2, cfactor=2, fwd_iters=2, bwd_iters=1, relax="F,FCF"),
    # two conv stages (pooling + widening between them) on digits; FCF so that
    # --spatial-levels works without changing --relax
    "conv-stages": dict(data="digits", layers=16, width=4, T=1.0, epochs=10, lr=5e-3,
                        cfactor=2, fwd_iters=1, bwd_iters=1, relax="FCF"),
    "transformer-seq2seq": dict(data="seq-reverse", layers=4, width=16, T=2.0, epochs=10,
                                lr=1e-2, cfactor=2, fwd_iters=2, bwd_iters=1, relax="F,FCF"),
    "gpt": _GPT_DEFAULTS,
    "gpt-untied": _GPT_DEFAULTS,
    "gru": dict(data="seq-memory", layers=64, width=32, T=3.0, epochs=15, lr=1e-2, cfactor=2,
                fwd_iters=2, bwd_iters=1, relax="FCF"),
    "implicit-gru": dict(data="seq-memory", layers=64, width=32, T=3.0, epochs=15, lr=1e-2,
                         cfactor=2, fwd_iters=2, bwd_iters=1, relax="FCF"),
}


def build_network(model: str, data_shape: tuple[int, ...], n_classes: int, layers: int,
                  width: int, T: float, activation: str = "tanh", info: dict | None = None,
                  buffer: int = 0, **options):
    """The network ``model`` for samples of shape ``data_shape`` and ``n_classes`` classes.

    ``info`` is the data set's ``info`` (the sequence models read the vocabulary from it);
    ``buffer``: serial buffer steps at each end of a ``gpt`` model; ``options`` go to the
    model's builder (conv-stages: ``batch_norm``, ``transition``)."""
    if model not in MODELS:
        raise ValueError(f"`model` must be one of {tuple(MODELS)}, got {model!r}.")
    data_shape = tuple(data_shape)
    if not data_shape or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1
                             for s in data_shape):
        raise ValueError(f"`data_shape` must be a tuple of positive sizes, got {data_shape!r}.")
    extra = {}
    if buffer:
        if model not in BUFFERED_MODELS:
            raise ValueError(f"`--buffer` applies to the models {BUFFERED_MODELS}, not "
                             f"{model!r}.")
        extra["buffer"] = buffer
    return MODELS[model](tuple(int(s) for s in data_shape), n_classes, layers, width, T,
                         activation, info, **extra, **options)


def as_network_input(net: Network, x: np.ndarray) -> np.ndarray:
    """Reshape samples (n, *data_shape) to the network's input (n, *opening.in_shape).

    A view (no copy) for contiguous data; e.g. (n, 1, 8, 8) images → (n, 64) for 'resnet'.
    """
    shape = tuple(net.opening.in_shape)
    if prod(x.shape[1:]) != prod(shape):
        raise ValueError(f"`x` samples of shape {tuple(x.shape[1:])} do not fit the network "
                         f"input {shape}.")
    return x.reshape((x.shape[0], *shape))


def initial_params(net, rng: np.random.Generator, dtype) -> dict:
    """Fresh parameters of ``net``: :func:`refbraid.network.init_params` for a Network, the
    model's own ``init_params`` for a sequence model (refbraid.sequence lays out its own)."""
    if isinstance(net, Network):
        return init_params(net, rng, dtype)
    return net.init_params(rng, dtype)
