"""Small instances of every layer, for the verification harness and the tests.

Each entry is ``(name, layer)``; ODE steps have ``state_shape`` and plain layers
``in_shape``/``out_shape``. Add an entry here when you add a layer, so that
``refbraid verify`` and the test catalogue cover it.
"""

from __future__ import annotations

from .attention import MultiheadAttention
from .batchnorm import BatchNorm
from .conv import ConvLift, ConvStep
from .conv3d import Conv3dLift, Conv3dStep
from .conv_bn import ConvBNStep
from .dense import DenseLift, DenseStep
from .gru import GRUCell
from .heads import Classifier
from .layernorm import LayerNorm
from .lm_head import LMHead
from .mlp import MLP
from .transformer import DecoderStep, EncoderStep, PooledClassifier, TokenClassifier
from .transitions import ChannelWiden, Pool, StridedConv


def verification_catalog() -> list[tuple[str, object]]:
    """Every layer at a size small enough for finite differences and the CUDA simulator."""
    return [
        ("dense_step[tanh]", DenseStep(6, "tanh")),
        ("dense_step[relu]", DenseStep(6, "relu")),
        ("dense_step[gelu]", DenseStep(6, "gelu")),
        ("conv_step[relu]", ConvStep(3, 5, 5, "relu")),
        ("conv_step[tanh]", ConvStep(3, 5, 5, "tanh")),
        ("dense_lift", DenseLift(2, 6, "tanh")),
        ("conv_lift", ConvLift(1, 3, 5, 5, "relu")),
        ("classifier", Classifier((3, 5, 5), 4)),
        # transformer and GRU pieces (the integer-input token embedding and the masks are
        # verified in tests/test_transformer_layers.py)
        ("layernorm", LayerNorm(4, 3)),
        ("mlp", MLP(4, 6, 3)),
        ("self_attention[causal]", MultiheadAttention(4, 2, 3, causal=True)),
        ("cross_attention", MultiheadAttention(4, 2, 3, memory_len=2)),
        ("encoder_step", EncoderStep(4, 2, 6, 3)),
        ("causal_step", EncoderStep(4, 2, 6, 3, causal=True)),
        ("decoder_step", DecoderStep(4, 2, 6, 3, 2)),
        ("gru_cell[classic]", GRUCell(3, 4)),
        ("gru_cell[implicit]", GRUCell(3, 4, "implicit")),
        ("pooled_classifier", PooledClassifier(3, 4, 3)),
        ("token_classifier", TokenClassifier(3, 4, 3)),
        # 3-D conv, batch norm and the shape-changing transitions (sizes ≤ 32 per axis and
        # small volumes: the CUDA simulator runs one Python thread per output)
        *spatial_catalog(),
        ("lm_head", LMHead(3, 4, 5)),
    ]


def spatial_catalog() -> list[tuple[str, object]]:
    """The 3-D conv layers, batch norm (training and evaluation) and the transitions."""
    return [
        ("conv3d_step[relu]", Conv3dStep(2, 3, 3, 4, "relu")),
        ("conv3d_step[tanh]", Conv3dStep(2, 3, 4, 3, "tanh")),
        ("conv3d_lift", Conv3dLift(1, 2, 3, 3, 4, "relu")),
        ("batchnorm2d[train]", BatchNorm(3, (4, 5))),
        ("batchnorm2d[eval]", BatchNorm(3, (4, 5), mode="eval")),
        ("batchnorm3d[train]", BatchNorm(2, (3, 3, 2))),
        ("batchnorm3d[eval]", BatchNorm(2, (3, 3, 2), mode="eval")),
        ("conv_bn_step2d[train]", ConvBNStep(3, (4, 4), "relu")),
        ("conv_bn_step2d[eval]", ConvBNStep(3, (4, 4), "tanh", mode="eval")),
        ("conv_bn_step3d[train]", ConvBNStep(2, (3, 3, 3), "tanh")),
        ("conv_bn_step3d[eval]", ConvBNStep(2, (3, 3, 3), "relu", mode="eval")),
        ("avgpool2d", Pool(2, (4, 5), "avg")),
        ("maxpool2d", Pool(2, (4, 5), "max")),
        ("avgpool3d", Pool(2, (4, 3, 4), "avg")),
        ("maxpool3d", Pool(2, (4, 3, 4), "max")),
        ("strided_conv2d", StridedConv(2, 3, (5, 4), "relu")),
        ("strided_conv3d", StridedConv(2, 3, (3, 4, 3), "tanh")),
        ("widen2d[conv1x1]", ChannelWiden(2, 4, (3, 4))),
        ("widen2d[zeros]", ChannelWiden(2, 4, (3, 4), "zeros")),
        ("widen3d[conv1x1]", ChannelWiden(2, 3, (2, 3, 2))),
        ("widen3d[zeros]", ChannelWiden(2, 3, (2, 3, 2), "zeros")),
    ]
