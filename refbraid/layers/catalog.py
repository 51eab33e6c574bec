"""Small instances of every layer, for the verification harness and the tests.

Each entry is ``(name, layer)``; ODE steps have ``state_shape`` and plain layers
``in_shape``/``out_shape``. Add an entry here when you add a layer, so that
``refbraid verify`` and the test catalogue cover it.
"""

from __future__ import annotations

from .conv import ConvLift, ConvStep
from .dense import DenseLift, DenseStep
from .heads import Classifier
from .layernorm import LayerNorm
from .transformer import PooledClassifier, TokenClassifier


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
        # transformer pieces cheap enough for the CUDA simulator; attention, the encoder and
        # decoder steps, the token embedding and the GRU cells are verified on every backend
        # in tests/test_transformer_layers.py and tests/test_gru_layers.py
        ("layernorm", LayerNorm(4, 3)),
        ("pooled_classifier", PooledClassifier(3, 4, 3)),
        ("token_classifier", TokenClassifier(3, 4, 3)),
    ]
