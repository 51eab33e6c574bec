"""Distributed gradients: one layer-parallel gradient, its work split over MPI ranks.

Same mathematics as one process (:mod:`refbraid.layer_parallel`); only the ownership and the
communicator change. :mod:`.engine` says how, once; each model family adds only what is its
own (docs/architecture.md shows the protocol and a worked adapter).

=================  ==============================================================
module             job
=================  ==============================================================
engine.py          the shared engine: batch shares, ownership of blocks, ghost rows in,
                   gradient rows home, replicated and sharded modes, packing, stats
ownership.py       BlockPlan: which rank owns which layers, ghosts and gradient rows
network.py         a Network's layers over ranks (resnet, conv, transformer, untied GPT)
chained.py         blocks tied together: the tied GPT, the encoder–decoders
stages.py          a staged network (states change shape; batch norm)
sync_batchnorm.py  batch norm over the data-parallel groups (full-batch statistics)
gru.py             MGRIT over a GRU's sequence positions (one shared weight)
space.py           data × space × depth: every feature map split over space ranks
sharded.py         owned parameter shards: the optimizer step local to each rank
daso.py            DASO: hierarchical data parallelism with stale global averages
bias_control.py    ``--bias-control`` over ranks (the rule measured on rank 0)
choose.py          which of them trains a run under mpiexec (``MPIRun``: its flags)
=================  ==============================================================

Nothing here imports :mod:`refbraid.training`: training hands :mod:`.choose` its flags as an
:class:`~.choose.MPIRun` (:func:`refbraid.training.gradients.select_gradient`) and drives the
gradient it gets.
"""

from .network import DistributedGradient, distributed_gradient
from .ownership import BlockPlan

__all__ = ["BlockPlan", "DistributedGradient", "distributed_gradient"]
