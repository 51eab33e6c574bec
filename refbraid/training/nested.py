"""``refbraid train --nested-init K``: nested initialisation in depth before training.

For a run with N layers (models ``resnet``, ``conv`` and ``conv-stages``) train the
N/2^K-layer network (same [0, T], step 2^K·h; conv-stages: every stage 2^K times shallower)
for ``--nested-epochs`` epochs, interpolate its weights in t to twice the depth
(:func:`refbraid.training.multilevel.prolong_weights`, ``--nested-interp`` constant or
linear; per stage for conv-stages, transitions, opening and closing copied), train, … and
start the N-layer run from the result (Cyr, Günther, Schroder 2019; docs/coarsening.md §5)::

    θ_K = init(N/2^K);   for k = K, …, 1:  θ_k ← train(N/2^k, θ_k, E epochs);  θ_{k-1} = P θ_k

Each shallow network trains with the run's gradient (layer-parallel MGRIT with the run's
settings, or ``--serial``), its own fresh optimizer, and sequential backprop where the MGRIT
hierarchy does not fit its depth (said in the progress line).

Batch norm (conv-stages ``--batch-norm``): the BN weights (γ, β of every step) are step weights
and are interpolated like the others. The running statistics of each shallow network are
interpolated in t the same way (per stage; the transitions' copied) and start the next depth,
and the N-layer run; with the interpolation a convex combination, means stay means and
variances stay positive. The update count carries on.
"""

from __future__ import annotations

import sys
from typing import TextIO

import numpy as np

from ..backends import Backend
from ..data import Dataset
from ..models import initial_params
from ..network import Network, to_backend
from .buffers import has_buffers
from .config import TrainConfig
from .gradients import depth_gradient, select_gradient
from .multilevel import coarser_network, prolong_weights
from .optim import make_optimizer
from .trainer import TrainState, fit

NESTED_SEED = 12  # the shallow runs shuffle with SeedSequence([seed, NESTED_SEED])


def nested_initial_weights(config: TrainConfig, net: Network, data: Dataset, bk: Backend,
                           stream: TextIO | None = None) -> dict:
    """Weights for the N-layer ``net`` after nested training of its shallow versions."""
    if not isinstance(net, Network) and not hasattr(net, "net"):
        raise ValueError(f"`--nested-init` needs model resnet, conv or conv-stages, got "
                         f"`--model {config.model}`.")
    stream = stream or sys.stdout
    select_gradient(config, net, bk, multilevel=False)  # an unfit full-depth run fails first
    depths = [coarser_network(net, 2**k) for k in range(config.nested_init, 0, -1)]
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, NESTED_SEED]))
    params = initial_params(depths[0], rng, np.dtype(config.dtype))
    for i, shallow in enumerate(depths):
        name, gradient = depth_gradient(config, shallow, bk)
        if not config.quiet:
            print(f"nested init: {shallow.n_layers} layers, {config.nested_epochs} epoch(s), "
                  f"{name} gradient", file=stream, flush=True)
        state = TrainState(to_backend(params, bk), make_optimizer(config.optimizer, config.lr,
                                                                  config.momentum), rng)
        fit(shallow, state, data, gradient, epochs=config.nested_epochs,
            batch_size=config.batch_size, bk=bk, quiet=config.quiet, stream=stream)
        params = {k: bk.to_numpy(v) for k, v in state.params.items()}
        deeper = depths[i + 1] if i + 1 < len(depths) else net
        params = prolong_weights(params, deeper.n_layers, config.nested_interp)
        if has_buffers(shallow):  # running statistics: interpolated in t like the weights
            deeper.running = prolong_weights(shallow.running, deeper.n_layers,
                                             config.nested_interp)
            deeper.updates = shallow.updates
    return params
