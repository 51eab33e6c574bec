"""``refbraid train --model conv-stages``: a TorchBraid-shaped conv network as a training model.

::

    ConvLift(C_in → C) → stage 0: n conv ODE steps on H×W → AveragePool → WidenChannels(2C)
                       → stage 1: n conv ODE steps on H/2×W/2 → Classifier

(``layers`` split evenly between the two stages; pooling + widening is one more fine step).
It has the duck type the training loop uses for models that are not a plain
:class:`~refbraid.network.Network` (as :mod:`refbraid.sequence`'s models): ``init_params``,
``backprop``, ``logits``, ``mgrit_logits``, ``layer_parallel_gradient``, ``n_layers``, ``T``,
``h``, ``step``, ``opening``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..layer_parallel import LayerParallelSettings, as_settings
from ..layers import Classifier, ConvLift, ConvStep
from ..mgrit import MGRITSettings, Problem, solve
from ..network import group
from . import network as staged
from .layer_parallel import StagedForward, stage_guesses, staged_layer_parallel_gradient
from .packing import PackedTransfer, Packing
from .transitions import AveragePool, Chain, WidenChannels


class ConvStagesModel:
    """Two conv stages separated by pooling and channel widening (module docstring)."""

    def __init__(self, data_shape: tuple[int, ...], n_classes: int, layers: int, width: int,
                 T: float, activation: str = "tanh"):
        if len(data_shape) == 2:
            data_shape = (1, *data_shape)
        if len(data_shape) != 3 or data_shape[1] % 2 or data_shape[2] % 2:
            raise ValueError(f"model 'conv-stages' needs images (channels, height, width) with "
                             f"even height and width; the data has samples of shape "
                             f"{tuple(data_shape)}.")
        if layers < 2:
            raise ValueError(f"`--layers` must be at least 2 for 'conv-stages' (two stages), "
                             f"got {layers}.")
        c_in, H, W = data_shape
        n0 = layers // 2
        self.net = staged.StagedNetwork(
            ConvLift(c_in, width, H, W, activation),
            (staged.Stage(ConvStep(width, H, W, activation), n0),
             staged.Stage(ConvStep(2 * width, H // 2, W // 2, activation), layers - n0)),
            (Chain((AveragePool(), WidenChannels(2 * width))),),
            Classifier((2 * width, H // 2, W // 2), n_classes),
            T=T,
        )
        self.layers = layers

    # what the training loop reads ---------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.layers

    @property
    def T(self) -> float:
        return self.net.T

    @property
    def h(self) -> float:
        return self.net.h(0)

    @property
    def step(self):
        return self.net.stages[0].step

    @property
    def opening(self):
        return self.net.opening

    def init_params(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, Any]:
        return staged.init_params(self.net, rng, dtype)

    def logits(self, params, x, bk: Backend | str = "numpy"):
        return staged.forward(self.net, params, x, get_backend(bk))[0]

    def backprop(self, params, x, labels, bk: Backend | str = "numpy"):
        return staged.backprop(self.net, params, x, labels, get_backend(bk))

    def mgrit_logits(self, params, x, settings: MGRITSettings, bk: Backend | str = "numpy",
                     spatial=None):
        """logits from the MGRIT forward solve (the forward a layer-parallel run trains)."""
        bk = get_backend(bk)
        pk = Packing.build(self.net.state_shapes, x.shape[0], settings.levels, spatial)
        transfer = PackedTransfer(pk, spatial) if spatial is not None else None
        y0, _ = self.net.opening.forward(group(params, "opening"), x, bk)
        y_guess, _ = stage_guesses(self.net, params, y0, bk)
        fwd = solve(Problem(StagedForward(self.net, params, pk, bk), pk.pack(y0, 0),
                            self.net.n_steps, transfer=transfer,
                            guess=lambda i: pk.pack(y_guess(i), 0)), settings)
        y_N = pk.unpack(fwd.solution[-1], 0, self.net.n_steps)
        return self.net.closing.forward(group(params, "closing"), y_N, bk)[0]

    def layer_parallel_gradient(self, params, x, labels,
                                settings: LayerParallelSettings | None = None,
                                bk: Backend | str = "numpy"):
        return staged_layer_parallel_gradient(self.net, params, x, labels, as_settings(settings),
                                              get_backend(bk))
