"""The layers of the GPU suite's per-layer table (benchmarks/gpu.py), which the counts suite
counts too (benchmarks/counts.py): each with its batch, and the operation the table times (a
forward, then an adjoint; an ODE step at step size :data:`H`).
"""

from __future__ import annotations

from refbraid.layers import (
    MLP,
    ConvStep,
    DenseStep,
    EncoderStep,
    GRUCell,
    LayerNorm,
    MultiheadAttention,
)
from refbraid.verify.ops import LayerOp, StepOp

H = 0.1  # Euler step size (any value: it does not change the cost)


def layers(tiny: bool) -> list[tuple[str, object, int]]:
    """(name, layer, batch): GPU-sized, or ``tiny`` for the simulator."""
    if tiny:
        return [("dense_step", DenseStep(4), 2), ("conv_step", ConvStep(2, 4, 4), 2),
                ("layernorm", LayerNorm(4, 3), 2), ("mlp", MLP(4, 8, 3), 2),
                ("attention", MultiheadAttention(4, 2, 3), 2),
                ("encoder_step", EncoderStep(4, 2, 8, 3), 2), ("gru_cell", GRUCell(4, 4), 2)]
    return [("dense_step", DenseStep(256), 1024), ("conv_step", ConvStep(16, 32, 32), 64),
            ("layernorm", LayerNorm(256, 64), 32), ("mlp", MLP(256, 1024, 64), 32),
            ("attention", MultiheadAttention(256, 4, 64), 32),
            ("encoder_step", EncoderStep(256, 4, 1024, 64), 32),
            ("gru_cell", GRUCell(256, 256), 256)]


def layer_op(layer):
    """The operation of ``layer`` the table times: its ODE step at step size H, or the layer."""
    return StepOp(layer, H) if hasattr(layer, "state_shape") else LayerOp(layer)
