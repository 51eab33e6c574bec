"""``refbraid train --model conv-stages``: a TorchBraid-shaped conv network as a training model.

::

    lift(C_in → C) → stage 0: n ODE steps on S → down-sampling T → stage 1: n ODE steps on S/2
                   → Classifier

with S = H×W (images) or D×H×W (volumes), ``layers`` split evenly between the two stages and
the transition ONE more fine step::

    transition "pool"      T = ChannelWiden(C → 2C, zeros) ∘ Pool(avg)          (2×2(×2) mean)
    transition "strided"   T = StridedConv(C → 2C, stride 2)
    batch_norm             ODE step y + h σ(BN(W * y)) (ConvBNStep) instead of y + h σ(W * y + b),
                           and T followed by a BatchNorm transition (``Chain``)

With batch norm the model keeps the running statistics (``self.running``): the training loop
calls :meth:`record_batch_stats` once per step with the gradient's info (final fine sweep,
:mod:`refbraid.stages.batchnorm`), and evaluation (``logits``, ``mgrit_logits``) runs the
network in evaluation mode on them.
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
from ..layers import (
    BatchNorm,
    ChannelWiden,
    Classifier,
    Conv3dLift,
    Conv3dStep,
    ConvBNStep,
    ConvLift,
    ConvStep,
    Pool,
    StridedConv,
)
from ..layers.spatial import strided_shape
from ..mgrit import MGRITSettings, Problem, solve
from ..network import group
from . import network as staged
from .batchnorm import evaluation_network, final_sweep_stats, init_running, updated_running
from .layer_parallel import StagedForward, stage_guesses, staged_layer_parallel_gradient
from .packing import PackedTransfer, Packing
from .transitions import Chain

TRANSITIONS = ("pool", "strided")


def _ode_step(channels: int, spatial: tuple[int, ...], activation: str, batch_norm: bool):
    if batch_norm:
        return ConvBNStep(channels, spatial, activation)
    if len(spatial) == 3:
        return Conv3dStep(channels, *spatial, activation)
    return ConvStep(channels, *spatial, activation)


def _transition(kind: str, width: int, spatial: tuple[int, ...], activation: str,
                batch_norm: bool):
    if kind == "pool":
        pool = Pool(width, spatial)
        parts = [pool, ChannelWiden(width, 2 * width, pool.out_shape[1:], "zeros")]
    else:
        parts = [StridedConv(width, 2 * width, spatial, activation)]
    if batch_norm:
        parts.append(BatchNorm(2 * width, parts[-1].out_shape[1:]))
    return Chain(tuple(parts))


class ConvStagesModel:
    """Two conv stages separated by a down-sampling transition (module docstring)."""

    def __init__(self, data_shape: tuple[int, ...], n_classes: int, layers: int, width: int,
                 T: float, activation: str = "tanh", batch_norm: bool = False,
                 transition: str = "pool"):
        if len(data_shape) == 2:
            data_shape = (1, *data_shape)
        if len(data_shape) not in (3, 4) or any(n % 2 for n in data_shape[1:]):
            raise ValueError(f"model 'conv-stages' needs images (channels, height, width) or "
                             f"volumes (channels, depth, height, width) with even sizes; the "
                             f"data has samples of shape {tuple(data_shape)}.")
        if layers < 2:
            raise ValueError(f"`--layers` must be at least 2 for 'conv-stages' (two stages), "
                             f"got {layers}.")
        if transition not in TRANSITIONS:
            raise ValueError(f"`--transition` must be one of {TRANSITIONS}, got "
                             f"{transition!r}.")
        c_in, *spatial = data_shape
        spatial = tuple(spatial)
        small = strided_shape(spatial)  # = S/2 for even sizes (pooling and stride 2 alike)
        lift = (Conv3dLift(c_in, width, *spatial, activation) if len(spatial) == 3
                else ConvLift(c_in, width, *spatial, activation))
        n0 = layers // 2
        self.net = staged.StagedNetwork(
            lift,
            (staged.Stage(_ode_step(width, spatial, activation, batch_norm), n0),
             staged.Stage(_ode_step(2 * width, small, activation, batch_norm), layers - n0)),
            (_transition(transition, width, spatial, activation, batch_norm),),
            Classifier((2 * width, *small), n_classes),
            T=T,
        )
        self.eval_net = evaluation_network(self.net) if batch_norm else self.net
        self.running = init_running(self.net)
        self.updates = 0  # running-statistics updates (training steps with BN)
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

    def _eval_params(self, params, bk: Backend):
        return {**params, **{k: bk.asarray(v) for k, v in self.running.items()}}

    def logits(self, params, x, bk: Backend | str = "numpy"):
        """Sequential forward pass in evaluation mode (running statistics with BN)."""
        bk = get_backend(bk)
        return staged.forward(self.eval_net, self._eval_params(params, bk), x, bk)[0]

    def backprop(self, params, x, labels, bk: Backend | str = "numpy"):
        """Sequential backprop in training mode (batch statistics); changes no state."""
        return staged.backprop(self.net, params, x, labels, get_backend(bk))

    def record_batch_stats(self, info, bk: Backend | str = "numpy") -> None:
        """Fold one training step's batch statistics into ``self.running`` (TorchBraid's
        rule): ``info`` from :meth:`backprop` (its forward caches) or from
        :meth:`layer_parallel_gradient` (the final fine sweep). No-op without BN."""
        if not self.running:
            return
        if isinstance(info, dict):
            stats = final_sweep_stats(self.net, info["caches"], get_backend(bk))
        else:
            stats = info.batch_stats
        self.running = updated_running(self.running, stats)
        self.updates += 1

    def mgrit_logits(self, params, x, settings: MGRITSettings, bk: Backend | str = "numpy",
                     spatial=None):
        """logits from the MGRIT forward solve (the forward a layer-parallel run trains), in
        evaluation mode (running statistics with BN)."""
        bk = get_backend(bk)
        net, params = self.eval_net, self._eval_params(params, bk)
        pk = Packing.build(net.state_shapes, x.shape[0], settings.levels, spatial)
        transfer = PackedTransfer(pk, spatial) if spatial is not None else None
        y0, _ = net.opening.forward(group(params, "opening"), x, bk)
        y_guess, _ = stage_guesses(net, params, y0, bk)
        fwd = solve(Problem(StagedForward(net, params, pk, bk), pk.pack(y0, 0),
                            net.n_steps, transfer=transfer,
                            guess=lambda i: pk.pack(y_guess(i), 0)), settings)
        y_N = pk.unpack(fwd.solution[-1], 0, net.n_steps)
        return net.closing.forward(group(params, "closing"), y_N, bk)[0]

    def layer_parallel_gradient(self, params, x, labels,
                                settings: LayerParallelSettings | None = None,
                                bk: Backend | str = "numpy"):
        return staged_layer_parallel_gradient(self.net, params, x, labels, as_settings(settings),
                                              get_backend(bk))
