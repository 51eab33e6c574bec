"""A whole distributed training-step gradient on the virtual cluster: the real MPI program.

:mod:`refbraid.scaling.virtual_step` re-enacts the two MGRIT solves of a layer-parallel
gradient. This module runs the distributed gradient itself,
:class:`~refbraid.distributed.network.DistributedGradient` (what ``mpiexec -n P refbraid
train`` runs), unchanged, on P virtual ranks (:func:`refbraid.parallel.virtual.simulate`)
split into D data-parallel groups of Q = P / D layer ranks
(:func:`~refbraid.parallel.virtual.virtual_topology`, as
:func:`~refbraid.parallel.mpi.split_world`). Every rank runs::

    build the gradient (message plans: allgather + alltoall)       setup, not timed
    barrier                                                        t0 = the common clock
    sharded:    fetch ghost weights (RowExchange: alltoall)
    y[0] = opening(x) on layer rank 0, bcast; MGRIT forward solve (neighbour messages, norms
    allreduced over the world); loss, λ[N] on the last layer rank, bcast; state rows
    (alltoall); MGRIT adjoint solve; loss allreduce; step counts allreduce
    sharded:    ∇θ rows home (RowExchange adjoint: alltoall); Σ over the D groups (sum_to_all,
                ring allreduce)           replicated: Σ of the whole gradient over the world
                                                                   t1 = this rank's clock
    sharded: gather the shards to world rank 0 (after t1, not timed)

``step_time = max_q t1 − t0``: the predicted seconds of one distributed gradient under the cost
model (step costs per level and direction; α + β·bytes per message; the collectives of
:mod:`refbraid.parallel.costs`, the gradient sums as ring allreduces, REFERENCES.md §4). What
is not a step application or communication (opening, closing, loss, copies, Python glue, the
optimizer) costs nothing here; :mod:`refbraid.scaling.predict` adds its calibrated ``extra``.

The arithmetic is the real one, so the gradient is that of the MPI run bit for bit (and of
:func:`~refbraid.layer_parallel.layer_parallel_gradient` in one process to round-off):
tests/test_virtual_training.py.

Shape legend: P ranks, D data-parallel groups, Q = P / D layer ranks, N layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..backends import Backend
from ..distributed.network import DistributedGradient
from ..layer_parallel import LayerParallelSettings, as_settings
from ..network import Network, Params
from ..parallel.virtual import CostModel, VirtualComm, VirtualRun, simulate, virtual_topology


@dataclass(frozen=True, eq=False)
class DistributedStepRun:
    """What :func:`simulate_distributed_gradient` returns.

    run        the virtual run (trace, timeline, critical path; ``results[w]`` rank w's dict)
    loss       the mean loss over the batch (the same float on every rank)
    grads      the full gradient, keyed like ``params`` (world rank 0's)
    step_time  predicted seconds of one distributed gradient (module docstring)
    t0         the common clock at the start of the timed part
    """

    run: VirtualRun
    loss: float
    grads: Params
    step_time: float
    t0: float

    @property
    def stats(self) -> dict[str, float]:
        """World rank 0's solve statistics (iterations, residuals, step counts)."""
        return self.run.results[0]["stats"]


def _rank_program(comm: VirtualComm, net: Network, params: Params, x, labels,
                  settings: LayerParallelSettings, bk, data_parallel: int,
                  sharded: bool) -> dict[str, Any]:
    grad = DistributedGradient(net, virtual_topology(comm, data_parallel), settings, bk)
    shard = grad.shard(params) if sharded else None
    comm.barrier()
    t0 = comm.clock
    if sharded:
        loss, g, stats = grad.sharded(shard, x, labels)
    else:
        loss, g, stats = grad(params, x, labels)
    t1 = comm.clock
    if sharded:
        g = grad.gather(g)  # world rank 0: the full gradient (untimed)
    return {"loss": loss, "grads": g, "stats": stats, "t0": t0, "t1": t1}


def simulate_distributed_gradient(net: Network, params: Params, x, labels, size: int,
                                  data_parallel: int = 1,
                                  settings: LayerParallelSettings | None = None,
                                  costs: CostModel = 1.0, alpha: float = 0.0,
                                  beta: float = 0.0, bk: Backend | str = "numpy",
                                  sharded: bool = True) -> DistributedStepRun:
    """:class:`DistributedGradient` on ``size`` virtual ranks in ``data_parallel`` groups.

    net, params, x, labels   the network, its full parameters, one batch (every rank gets it)
    size, data_parallel      P ranks, D groups (D must divide P; errors as under MPI)
    settings                 the MGRIT settings of both solves (default TorchBraid's)
    costs, alpha, beta       the cost model (:func:`refbraid.parallel.virtual.simulate`)
    sharded                  True: ``gradient.sharded`` (ShardedTrainer, what ``mpiexec ...
                             refbraid train`` runs); False: replicated parameters
    """
    settings = as_settings(settings)
    run = simulate(lambda comm: _rank_program(comm, net, params, x, labels, settings, bk,
                                              data_parallel, sharded),
                   size, costs, alpha, beta)
    first = run.results[0]
    t0 = first["t0"]
    step_time = max(r["t1"] for r in run.results) - t0
    return DistributedStepRun(run, first["loss"], first["grads"], step_time, t0)


# ----------------------------------------------------------------------------- predictions
@dataclass(frozen=True)
class StepPrediction:
    """Predicted seconds of one distributed training step on ``ranks`` = D × Q ranks.

    step       the virtual run's step time + the machine's ``extra`` and per-rank fixed cost
               (``per_rank_on``; scaled to the shard)
    comm       seconds of the timed critical path spent in messages and collectives
    solves     the solves-only prediction of :func:`refbraid.scaling.predict.predict` for the
               same split (the MGRIT schedule + extra + the groups' ring allreduce)
    """

    ranks: int
    groups: int  # D
    step: float
    comm: float
    solves: float | None
    run: DistributedStepRun | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """The numbers (not the run), for ``scaling.json``."""
        return {"ranks": self.ranks, "groups": self.groups, "step": self.step,
                "comm": self.comm, "solves": self.solves}


def predict_steps(machine, net: Network, params: Params, x, labels, bk,
                  max_ranks: int = 4) -> list[StepPrediction]:
    """:class:`StepPrediction` for every power-of-two split D × Q ≤ ``max_ranks`` that the
    network and the batch allow, from :func:`simulate_distributed_gradient` (sharded) with the
    machine's step costs (scaled to the shard's batch as :func:`~refbraid.scaling.predict.
    predict` does), α and β; ``machine`` is a :class:`~refbraid.scaling.predict.Machine`."""
    import math

    from ..parallel.trace import path_breakdown
    from .predict import _lp_virtual, _scaled, extra_on, per_rank_on, ring_allreduce

    B, full = machine.batch, machine.serial[max(machine.serial)]
    out, p = [], 1
    while p <= max_ranks:
        d = 1
        while d <= min(p, B):
            q = p // d
            b = math.ceil(B / d)
            scale = machine.serial.get(b, full * b / B) / full
            solves = _lp_virtual(machine, q, scale)  # None: no such split of the layers
            if solves is None:
                d *= 2
                continue
            res = simulate_distributed_gradient(net, params, x, labels, p, d, machine.settings,
                                                _scaled(machine.costs, scale), machine.alpha,
                                                machine.beta, bk)
            timed = [e for e in res.run.critical_path if e.t0 >= res.t0]  # not the setup
            comm = sum(v for k, v in path_breakdown(timed).items() if not k.startswith("step"))
            added = (extra_on(machine, q) + per_rank_on(machine, q)) * scale
            # as predict(): + extra (+ F), + the groups' ring allreduce
            solves += added + ring_allreduce(machine.grad_bytes / q, d, machine.alpha,
                                             machine.beta)
            out.append(StepPrediction(p, d, res.step_time + added, comm, solves, res))
            d *= 2
        p *= 2
    return out


def format_steps(rows: list[StepPrediction], serial: float) -> str:
    """The table ``refbraid scale`` prints under the scaling table."""
    lines = ["whole distributed training step (DistributedGradient, sharded, on the virtual "
             "cluster: ghost weights, both solves, λ[N] and y[0] broadcasts, state rows, "
             "gradient rows home, ring allreduce over the groups) + what it does not simulate",
             f"{'P':>5} {'D×Q':>6} {'step ms':>8} {'×serial':>8} {'comm ms':>8} "
             f"{'solves-only ms':>14}"]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        solves = "-" if r.solves is None else f"{1e3 * r.solves:.2f}"
        lines.append(f"{r.ranks:5d} {f'{r.groups}×{r.ranks // r.groups}':>6} "
                     f"{1e3 * r.step:8.2f} {serial / r.step:8.2f} {1e3 * r.comm:8.3f} "
                     f"{solves:>14}")
    return "\n".join(lines)
