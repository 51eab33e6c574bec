"""Layers with hand-written discrete adjoints: forward and adjoint side by side.

Two kinds of layer, each a small frozen dataclass holding hyper-parameters only (weights
live in plain dicts of named arrays):

* an ODE step ``y_next = y + h·F(params, y)`` (``forward(params, y, h, bk)`` and
  ``adjoint(params, cache, dy_next, h, bk, grads=True)``) — the time steps MGRIT sees;
* a plain layer (opening, closing) ``out = f(params, x)`` (``forward(params, x, bk)`` and
  ``adjoint(params, cache, dout, bk)``).

Adjoint outputs carry a ``d`` prefix and are returned fresh (never accumulated).

Shared argument checks (:mod:`refbraid.layers.init`): ``h`` must be a finite number > 0 where
it enters a step; an adjoint's incoming ``d…`` must have exactly the forward output's shape
(no silent broadcasting of a batch of 1); a forward's input and the floating arrays of its
params must share one dtype. A layer whose params carry data besides weights (an attention's
``memory``, a GRU cell's input ``x``, padding masks) lists them in ``data_entries``, so
:func:`refbraid.input_checks.check_params` does not take them for weights; data held fixed, with
no gradient returned (batch norm's running statistics in evaluation mode), is also listed in
``constant_entries``.
"""

from .attention import MultiheadAttention
from .batchnorm import BatchNorm, BatchStats, init_running_stats, update_running_stats
from .conv import ConvLift, ConvStep
from .conv3d import Conv3dLift, Conv3dStep
from .conv_bn import ConvBNStep
from .dense import DenseLift, DenseStep
from .embedding import TokenEmbedding, sinusoidal_positions
from .gru import GRUCell, GRUSequence
from .heads import Classifier, softmax_cross_entropy, softmax_cross_entropy_adjoint
from .layernorm import LayerNorm
from .lm_head import LMHead
from .mlp import MLP
from .transformer import (
    DecoderStep,
    EncoderStep,
    PooledClassifier,
    TokenClassifier,
    token_cross_entropy,
    token_cross_entropy_adjoint,
)
from .transitions import ChannelWiden, Pool, StridedConv

__all__ = [
    "Classifier",
    "ConvLift",
    "ConvStep",
    "DenseLift",
    "DenseStep",
    "softmax_cross_entropy",
    "softmax_cross_entropy_adjoint",
    # transformer and GRU layers
    "MLP",
    "DecoderStep",
    "EncoderStep",
    "GRUCell",
    "GRUSequence",
    "LayerNorm",
    "LMHead",
    "MultiheadAttention",
    "PooledClassifier",
    "TokenClassifier",
    "TokenEmbedding",
    "sinusoidal_positions",
    "token_cross_entropy",
    "token_cross_entropy_adjoint",
    # 3-D conv, batch norm, transitions between stages
    "BatchNorm",
    "BatchStats",
    "ChannelWiden",
    "Conv3dLift",
    "Conv3dStep",
    "ConvBNStep",
    "Pool",
    "StridedConv",
    "init_running_stats",
    "update_running_stats",
]
