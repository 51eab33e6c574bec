"""The gradient under ``mpiexec`` once :func:`~refbraid.training.gradients.select_gradient`
has checked the model: which distributed gradient, and the bias controller around it.

* a GRU model (MGRIT over the sequence positions): the replicated
  :class:`~refbraid.training.distributed_gru.SequenceParallelGRU`;
* ``--model conv-stages``: the replicated staged gradient
  (:func:`~refbraid.training.distributed_stages.staged_distributed_gradient`);
* a tied GPT or an encoder–decoder: owned shards of its blocks
  (:func:`~refbraid.training.distributed_seq.sequence_distributed_gradient`);
* every other model: owned shards of its block
  (:class:`~refbraid.training.sharded.ShardedGradient` over
  :class:`~refbraid.training.distributed.DistributedGradient`);
* with ``--bias-control``: either one inside
  :class:`~refbraid.training.bias_control_mpi.MPIControlledGradient`, which rebuilds it when
  the controller raises the MGRIT cycles.
"""

from __future__ import annotations

from typing import Any

from ..backends import Backend, with_host_arrays
from ..layer_parallel import LayerParallelSettings
from ..network import Network
from ..sequence.gru_model import GRUModel
from .config import TrainConfig
from .mpi_common import DEVICE_RESIDENT_MPI


def device_resident_mpi(config: TrainConfig, net) -> bool:
    """Whether ``refbraid train`` under mpiexec keeps this run's arrays on the device: a
    :class:`~refbraid.network.Network` (or a sequence model's ``mpi_network``: transformer,
    untied GPT) trained by the plain (sharded) DistributedGradient."""
    block = net if isinstance(net, Network) else getattr(net, "mpi_network", None)
    return (isinstance(block, Network) and config.model != "conv-stages"
            and config.space_parallel == 1 and config.dp_groups == 1
            and config.global_sync_every == 1 and config.bias_control == "off"
            and not config.mgopt_levels)


def mpi_backend(config: TrainConfig, net, bk: Backend, say=None) -> Backend:
    """The backend of a run under mpiexec: ``bk`` itself where the run is device-resident
    (:func:`device_resident_mpi`); otherwise ``bk`` on host arrays — the ``cuda`` backend's
    kernels then copy in and out on every call, which ``say`` (world rank 0's warning) names.
    A ``cupy`` backend stays as it is and the host-only gradient refuses it, naming what is
    device-resident."""
    if device_resident_mpi(config, net):
        return bk
    host = with_host_arrays(bk)
    if host is not bk and say is not None:
        say(f"under mpiexec `--model {config.model}` (with these flags) trains on host "
            f"arrays: the cuda kernels copy their inputs in and outputs out on every call. "
            f"Device-resident MPI training covers {DEVICE_RESIDENT_MPI}.")
    return host


def sequence_parallel(net: Any) -> bool:
    """Whether ``net`` runs MGRIT over its sequence positions (the GRU models)."""
    return isinstance(net, GRUModel)


def mpi_gradient(config: TrainConfig, net, block, settings: LayerParallelSettings,
                 bk: Backend) -> tuple[str, Any]:
    """(name, gradient) for ``refbraid train`` under mpiexec; ``block`` is the network whose
    layers are distributed (None for a GRU). Collective: every rank calls it."""
    from .distributed import distributed_gradient
    from .distributed_gru import sequence_parallel_gradient
    from .distributed_seq import sequence_distributed_gradient
    from .sharded import ShardedGradient

    D = config.data_parallel
    staged = config.model == "conv-stages"
    tested = not staged and (block is not None or sequence_parallel(net))
    if config.bias_control != "off" and not tested:  # bias control is tested on the others
        from ..errors import CollectiveError

        raise CollectiveError(f"`--bias-control` with `--model {config.model}` runs in one "
                              "process only (not under mpiexec); drop one of them.")
    if staged:  # a staged network (training/distributed_stages.py)
        from .distributed_stages import staged_distributed_gradient

        return "layer-parallel-mpi", staged_distributed_gradient(net, settings, bk, D)
    if sequence_parallel(net):
        name = "sequence-parallel-mpi"

        def build(s: LayerParallelSettings):
            return sequence_parallel_gradient(net, s, bk, D)
    else:
        name = "layer-parallel-mpi"

        def build(s: LayerParallelSettings):  # each rank steps its own layers
            if block is None:  # a tied GPT or an encoder–decoder
                return ShardedGradient(sequence_distributed_gradient(net, s, bk, D))
            return ShardedGradient(distributed_gradient(block, s, bk, D))

    if config.bias_control == "off":
        return name, build(settings)
    from ..parallel.mpi import MPIComm
    from .bias_control_mpi import MPIControlledGradient
    from .gradients import controlled_gradient

    core = controlled_gradient(net, settings, bk, config)  # the rule and its bookkeeping
    return name + "-bias-control", MPIControlledGradient(core, build, MPIComm.world())
