"""Mixed networks: stages of ODE steps separated by shape-changing transitions, solved by
MGRIT through states of changing shape.

==================  ==================================================================
module              job
==================  ==================================================================
transitions.py      transitions (layers of refbraid.layers) on coarse maps; Chain
network.py          StagedNetwork, the fine grid and coarse-step rule, sequential backprop
packing.py          states of changing shape as flat MGRIT rows; spatial transfer on them
layer_parallel.py   MGRIT forward/adjoint solves and the layer-parallel gradient
batchnorm.py        BN layers inside: running statistics from the final fine sweep, eval net
model.py            ``refbraid train --model conv-stages`` (the TorchBraid-shaped conv net)
==================  ==================================================================
"""

from .layer_parallel import staged_layer_parallel_gradient
from .network import Stage, StagedNetwork, backprop, forward, init_params
from .transitions import Chain, transition_at

__all__ = ["Chain", "Stage", "StagedNetwork", "backprop", "forward", "init_params",
           "staged_layer_parallel_gradient", "transition_at"]
