"""The GPU suite's whole-gradient cases: the networks, sizes and MGRIT settings it times
(:mod:`benchmarks.gpu`), profiles (:mod:`benchmarks.gpu_profile`) and counts at full size
(:mod:`benchmarks.counts`, its ``traffic`` cases)."""

from __future__ import annotations

import numpy as np

from refbraid.layer_parallel import LayerParallelSettings
from refbraid.models import build_network
from refbraid.network import init_params

#: Whole-gradient cases: (model, N, width C, batch B, image side); dense: C features; conv: C
#: channels on side × side images (the ConvLift takes one input channel to C).
GRADIENT_CASES = [("dense", 64, 256, 1024, 0), ("dense", 256, 256, 1024, 0),
                  ("dense", 256, 32, 64, 0), ("dense", 1024, 32, 64, 0),
                  ("conv", 64, 16, 64, 16), ("conv", 256, 16, 64, 16)]
TINY_GRADIENT_CASES = [("dense", 8, 4, 4, 0), ("conv", 4, 2, 2, 4)]


def gradient_case(model, n_layers, width, batch, side, dtype):
    """(net, params, x, labels, size label) of one whole-gradient case."""
    rng = np.random.default_rng(0)
    if model == "dense":
        net = build_network("resnet", (2,), 5, n_layers, width, 3.0)
        x, size = rng.standard_normal((batch, 2)), f"dense N={n_layers} C={width} B={batch}"
    else:
        net = build_network("conv", (1, side, side), 5, n_layers, width, 3.0)
        x = rng.standard_normal((batch, 1, side, side))
        size = f"conv N={n_layers} C={width} B={batch} {side}x{side}"
    return (net, init_params(net, 0, dtype), np.asarray(x, dtype=dtype),
            rng.integers(0, 5, batch), size)


def gradient_settings(tiny: bool) -> LayerParallelSettings:
    """The MGRIT settings of the timed gradients: TorchBraid's; at tiny sizes one forward and
    one adjoint iteration on 2 levels, cfactor 2 (N = 8 has no third level)."""
    return LayerParallelSettings.with_iterations(1, 1, levels=2, cfactor=2) if tiny \
        else LayerParallelSettings()
