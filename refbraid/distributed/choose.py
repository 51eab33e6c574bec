"""Which distributed gradient trains a model under ``mpiexec``: the one place that chooses.

Training turns its flags into an :class:`MPIRun` (plain values: nothing here imports
:mod:`refbraid.training`) and asks :func:`mpi_gradient` for ``(name, gradient)``::

    --space-parallel S > 1            data × space × depth             (:mod:`.space`)
    --dp-groups / --global-sync-every DASO over data-parallel ranks    (:mod:`.daso`)
    otherwise                         the model family's adapter       (:func:`family_gradient`)
                                      sharded where its parameters are a Network's steps
                                      (:mod:`.sharded`), ``--bias-control`` around it
                                      (:mod:`.bias_control`)

:func:`mpi_backend` says where the arrays live: on the backend's device for the plain
networks (:func:`device_resident`), on the host for every other family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..backends import Backend, with_host_arrays
from ..errors import CollectiveError
from ..layer_parallel import LayerParallelSettings
from ..network import Network
from ..parallel.mpi import MPIComm, split_world, world_size
from ..sequence.gpt_model import GPTModel
from ..sequence.gru_model import GRUModel
from ..sequence.seq2seq_model import Seq2SeqModel
from .bias_control import MPIControlledGradient
from .chained import Seq2SeqGradient, TiedGPTGradient
from .daso import DasoSchedule, daso_gradient
from .engine import DEVICE_RESIDENT_MPI, host_backend
from .gru import SequenceParallelGRU
from .network import DistributedGradient
from .sharded import ShardedGradient
from .space import space_depth_gradient
from .stages import StagedDistributedGradient, staged_network_of


@dataclass(frozen=True)
class MPIRun:
    """The ``refbraid train`` flags that choose an MPI gradient."""

    model: str  # --model, as the messages name it
    data_parallel: int = 1  # D groups
    space_parallel: int = 1  # S space ranks
    dp_groups: int = 1  # DASO's nodes
    global_sync_every: int = 1  # DASO's k_max
    epochs: int = 1  # DASO's phases are by epoch
    bias_control: bool = False  # --bias-control is on
    mgopt: bool = False  # --mgopt-levels: MG/Opt's levels run these gradients

    @property
    def daso(self) -> bool:
        return self.dp_groups > 1 or self.global_sync_every > 1

    def distributed(self) -> bool:
        """Whether this run's gradient is one of :mod:`refbraid.distributed`'s: split over
        space, DASO, data-parallel groups, or launched on more than one rank."""
        return self.space_parallel > 1 or self.daso or self.data_parallel > 1 \
            or world_size() > 1


def family(model) -> str | None:
    """The adapter that distributes ``model``: "staged" (:mod:`.stages`), "gru" (:mod:`.gru`),
    "tied" or "seq2seq" (:mod:`.chained`), "network" (:mod:`.network`: a Network, or a
    sequence model's ``mpi_network``: transformer, untied GPT); None where none does."""
    if staged_network_of(model) is not None:
        return "staged"
    if isinstance(model, GRUModel):
        return "gru"
    if isinstance(model, GPTModel) and model.tied:
        return "tied"
    if isinstance(model, Seq2SeqModel):
        return "seq2seq"
    return "network" if isinstance(mpi_block(model), Network) else None


def mpi_block(model) -> Network | None:
    """The Network whose layers :class:`~.network.DistributedGradient` distributes."""
    return model if isinstance(model, Network) else getattr(model, "mpi_network", None)


def device_resident(run: MPIRun, model) -> bool:
    """Whether the run keeps its arrays on the device: a Network (or ``mpi_network``) trained
    by the plain (sharded) DistributedGradient, with none of the host-only policies."""
    return (family(model) == "network" and run.space_parallel == 1 and not run.daso
            and not run.bias_control and not run.mgopt)


def mpi_backend(run: MPIRun, model, bk: Backend, say=None) -> Backend:
    """``bk`` itself where the run is device-resident; otherwise ``bk`` on host arrays — the
    ``cuda`` backend's kernels then copy in and out on every call, which ``say`` (world rank
    0's warning) names. A ``cupy`` backend stays as it is and the host-only gradient refuses
    it, naming what is device-resident."""
    if device_resident(run, model):
        return bk
    host = with_host_arrays(bk)
    if host is not bk and say is not None:
        say(f"under mpiexec `--model {run.model}` (with these flags) trains on host "
            f"arrays: the cuda kernels copy their inputs in and outputs out on every call. "
            f"Device-resident MPI training covers {DEVICE_RESIDENT_MPI}.")
    return host


def family_gradient(model, settings: LayerParallelSettings | None = None,
                    bk: Backend | str = "numpy", data_parallel: int = 1, world=None):
    """The engine adapter of ``model``'s :func:`family` over ``COMM_WORLD`` (or ``world``) split
    into ``data_parallel`` groups; the same CollectiveError on every rank for a model no adapter
    distributes. Collective."""
    kind = family(model)
    if kind is None:
        raise CollectiveError(f"training over MPI has no adapter for {type(model).__name__}; "
                              "train this model in one process.")
    if kind in ("tied", "seq2seq"):
        host_backend(bk, "the chained/tied sequence MPI gradient")
    topology = split_world(data_parallel, world)
    if kind == "network":
        return DistributedGradient(mpi_block(model), topology, settings, bk)
    adapter = {"staged": StagedDistributedGradient, "gru": SequenceParallelGRU,
               "tied": TiedGPTGradient, "seq2seq": Seq2SeqGradient}[kind]
    return adapter(model, topology, settings, bk)


def mpi_gradient(run: MPIRun, model, settings: LayerParallelSettings, bk: Backend,
                 controlled: Callable[[], Any] | None = None) -> tuple[str, Any]:
    """(name, gradient) for ``refbraid train`` under mpiexec (module docstring).
    ``controlled()`` makes the one-process bias controller (its rule and bookkeeping) that
    ``--bias-control`` runs around the gradient. Collective: every rank calls it."""
    kind = family(model)
    if kind == "staged" and (run.space_parallel > 1 or run.daso):
        raise CollectiveError("`--model conv-stages` over MPI trains with layer and data "
                              "parallelism only; `--space-parallel` and DASO (`--dp-groups`, "
                              "`--global-sync-every`) are not built for it.")
    if run.space_parallel > 1:
        if run.daso:
            raise CollectiveError("`--space-parallel` with DASO (`--dp-groups`, "
                                  "`--global-sync-every`) is not built; use one or the other.")
        return "space-depth-mpi", space_depth_gradient(model, settings, bk, run.data_parallel,
                                                       run.space_parallel)
    if run.daso:
        if run.data_parallel != world_size():
            raise CollectiveError(f"`--dp-groups`/`--global-sync-every` (DASO) need every rank "
                                  f"to be a data-parallel rank: run mpiexec -n "
                                  f"{run.data_parallel} with `--data-parallel "
                                  f"{run.data_parallel}`, or `--data-parallel "
                                  f"{world_size()}`.")
        schedule = DasoSchedule(groups=run.dp_groups, max_global_skips=run.global_sync_every)
        return "daso-mpi", daso_gradient(model, schedule, run.epochs, settings, bk)
    if run.bias_control and kind in ("staged", "tied", "seq2seq"):  # tested on the others
        raise CollectiveError(f"`--bias-control` with `--model {run.model}` runs in one "
                              "process only (not under mpiexec); drop one of them.")
    name = "sequence-parallel-mpi" if kind == "gru" else "layer-parallel-mpi"

    def build(s: LayerParallelSettings):  # each rank its own layers where they are steps
        inner = family_gradient(model, s, bk, run.data_parallel)
        return inner if kind in ("staged", "gru") else ShardedGradient(inner)

    if not run.bias_control:
        return name, build(settings)
    return name + "-bias-control", MPIControlledGradient(controlled(), build, MPIComm.world())
