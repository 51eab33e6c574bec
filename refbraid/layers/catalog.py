"""Small instances of every layer, for the verification harness and the tests.

Each entry is ``(name, layer)``; ODE steps have ``state_shape`` and plain layers
``in_shape``/``out_shape``. Add an entry here when you add a layer, so that
``refbraid verify`` and the test catalogue cover it.
"""

from __future__ import annotations

from .attention import MultiheadAttention
from .conv import ConvLift, ConvStep
from .dense import DenseLift, DenseStep
from .gru import GRUCell
from .heads import Classifier
from .layernorm import LayerNorm
from .lm_head import LMHead
from .mlp import MLP
from .transformer import DecoderStep, EncoderStep, PooledClassifier, TokenClassifier


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
        ("lm_head", LMHead(3, 4, 5)),
    ]
