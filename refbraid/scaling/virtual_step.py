"""A layer-parallel gradient on the virtual cluster: one training step's solves, timed.

Every virtual rank runs the same program, the layer-parallel gradient of
:mod:`refbraid.layer_parallel` with the network's layers split over the ranks as in
:mod:`refbraid.distributed.network` (:class:`~refbraid.distributed.ownership.BlockPlan`: the
same forward and adjoint layouts), parameters replicated on every rank::

    y[0] = opening(x)                      every rank (replicated; not charged)
    MGRIT forward solve                    rank q holds y[i], i in its forward block
    λ[N] = closing'ᵀ ∂L/∂logits            last rank;  bcast to every rank
    state rows for the adjoint             point-to-point: rank q receives the y[a] its
                                           adjoint steps a+m → a linearise at and does not
                                           hold (none when the blocks mirror: each step is
                                           made where it starts, by its layer's owner)
    MGRIT adjoint solve (reversed grid)    rank q holds λ[i], i in its backward block; its fine
                                           adjoint steps a+1 → a yield ∂L/∂θ_a (captured)
    ∂L/∂θ_open = opening'ᵀ λ[0]            rank 0 (not charged)

Not simulated: moving the gradient rows to where the optimizer needs them (one sum over the
ranks in the replicated mode; in the sharded mode none when the blocks mirror, else the rows
of layers computed on another rank) and the optimizer step. :func:`assemble_gradient` puts
the ranks' rows together outside the simulation; the result equals
:func:`refbraid.layer_parallel.layer_parallel_gradient` bit for bit (the same steps on the
same values; only the norms' summation order differs, and with a fixed number of cycles
nothing depends on it).

Cost-only mode (:func:`simulate_gradient_schedule`) runs the same program with the stand-in
problem of :mod:`refbraid.scaling.schedule` in both solves and 1-element states everywhere,
charging ``state_bytes`` per state in every message: the same events and clocks, for
N and P far beyond what arithmetic allows.

Step costs (``costs(level, direction)``) are what the simulation charges per step
application: a fine adjoint step reuses the forward cache, and so does a coarse one where the
layer's cache does not depend on h (the dense and conv steps: ``StepCosts(forward=t,
backward=t_adj)``); otherwise a coarse adjoint step recomputes the forward pass
(``StepCosts(forward=t, backward=(t_adj, t + t_adj))``).

Where it sits: above :mod:`refbraid.layer_parallel` and :mod:`refbraid.distributed.ownership`
(it uses networks) and :mod:`refbraid.parallel.virtual` (the clocks); nothing below imports it.

Shape legend: N layers, P ranks, B batch, S state shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..distributed.ownership import BlockPlan
from ..input_checks import check_inputs
from ..layer_parallel import LayerParallelSettings, as_settings
from ..mgrit import Problem, solve
from ..network import Network, Params, group
from ..parallel.virtual import CostModel, VirtualComm, VirtualRun, simulate
from ..propagators import CachingForward, CapturingAdjoint
from .schedule import cost_only_problem, replay_settings, state_sizeof


def _wanted(plan: BlockPlan, p: int) -> set[int]:
    """Rows a of y that rank p's adjoint steps a+m → a linearise at and p does not hold."""
    lo, hi = plan.forward_layout.bounds(p)
    return {int(a) for a in plan.backward_rows(p) if not lo <= a < hi}


def _exchange_rows(comm: VirtualComm, plan: BlockPlan, states: dict[int, Any]) -> dict[int, Any]:
    """Send every rank the forward states its adjoint needs and does not hold; return the
    rows this rank receives. The plan tells every rank who needs what: no metadata moves.

    A rank p's adjoint steps start in its backward block and end at most one coarsest
    interval M past it, so p can only want rows of its backward block or the M rows below
    it: rank q sends to the (few) ranks whose backward blocks, so extended, overlap its
    forward block [lo, hi).
    """
    q, P, N = comm.rank, comm.size, plan.n_layers
    lo, hi = plan.forward_layout.bounds(q)
    back = plan.backward_layout  # solver order s = N - i; position pos lives on rank P-1-pos
    coarsest = plan.backward_hierarchy.coarsest.points
    M = int(np.max(np.diff(coarsest))) if len(coarsest) > 1 else N
    first, last = back.owner(max(N - (hi - 1) - M, 0)), back.owner(N - lo)
    for p in sorted(P - 1 - pos for pos in range(first, last + 1)):  # sends do not block
        rows = sorted(a for a in _wanted(plan, p) if lo <= a < hi) if p != q else []
        if rows:
            comm.send_to(p, {a: states[a] for a in rows})
    got: dict[int, Any] = {}
    for p in sorted({plan.forward_layout.owner(a) for a in _wanted(plan, q)}):
        got.update(comm.recv_from(p))
    return got


def _rank_program(comm: VirtualComm, plan: BlockPlan, settings: LayerParallelSettings,
                  work) -> dict[str, Any]:
    """The per-rank program (module docstring); ``work`` supplies the values."""
    N, q, last = plan.n_layers, comm.rank, comm.size - 1
    y0 = work.opening()
    fwd = solve(work.forward_problem(y0), settings.forward, comm=comm,
                layout=plan.forward_layout)
    states = dict(zip((int(i) for i in fwd.fine_indices), fwd.solution, strict=True))
    lam_N = comm.bcast(work.closing(states[N]) if q == last else None, root=last)
    states.update(_exchange_rows(comm, plan, states))
    bwd = solve(work.adjoint_problem(states, lam_N), settings.backward, comm=comm,
                layout=plan.backward_layout)
    return work.finish(q, plan, fwd, bwd)


class _Arithmetic:
    """The network's values: opening, propagators, closing and loss, captured gradients."""

    def __init__(self, net: Network, params: Params, x, labels, bk: Backend):
        self.net, self.params, self.x, self.labels, self.bk = net, params, x, labels, bk
        self.steps = group(params, "steps")
        self.forward = CachingForward(net, self.steps, bk)

    def opening(self):
        y0, self.open_cache = self.net.opening.forward(group(self.params, "opening"), self.x,
                                                       self.bk)
        return y0

    def forward_problem(self, y0) -> Problem:
        return Problem(self.forward, y0, self.net.n_layers)

    def closing(self, y_N):
        bk, closing = self.bk, group(self.params, "closing")
        logits, close_cache = self.net.closing.forward(closing, y_N, bk)
        loss, probs = bk.softmax_cross_entropy(logits, self.labels)
        dlogits = bk.softmax_cross_entropy_adjoint(probs, self.labels, 1.0)
        lam_N, self.dclose = self.net.closing.adjoint(closing, close_cache, dlogits, bk)
        self.loss = float(loss)
        return lam_N

    def adjoint_problem(self, states: dict[int, Any], lam_N) -> Problem:
        self.adjoint = CapturingAdjoint(self.net, self.steps, states, self.forward.caches,
                                        self.bk)
        return Problem(self.adjoint, lam_N, self.net.n_layers, direction="backward")

    def finish(self, q: int, plan: BlockPlan, fwd, bwd) -> dict[str, Any]:
        rows = {int(a): self.adjoint.grads[int(a)] for a in plan.gradient_rows(q)}
        out: dict[str, Any] = {"forward": fwd, "backward": bwd, "rows": rows}
        if 0 in bwd.fine_indices:
            lam0 = bwd.solution[list(bwd.fine_indices).index(0)]
            _, dopen = self.net.opening.adjoint(group(self.params, "opening"),
                                                self.open_cache, lam0, self.bk)
            out["opening"] = dopen
        if hasattr(self, "loss"):
            out["loss"], out["closing"] = self.loss, self.dclose
        return out


class _CostOnly:
    """Stand-in values: 1-element states, identity steps (:mod:`refbraid.scaling.schedule`)."""

    def __init__(self, n_layers: int):
        self.n_layers = n_layers

    def opening(self):
        return np.zeros(1)

    def forward_problem(self, y0) -> Problem:
        return cost_only_problem(self.n_layers, "forward")

    def closing(self, y_N):
        return np.zeros(1)

    def adjoint_problem(self, states, lam_N) -> Problem:
        return cost_only_problem(self.n_layers, "backward")

    def finish(self, q: int, plan: BlockPlan, fwd, bwd) -> dict[str, Any]:
        return {"forward": fwd, "backward": bwd}


def simulate_gradient(net: Network, params: Params, x, labels, size: int,
                      settings: LayerParallelSettings | None = None, costs: CostModel = 1.0,
                      alpha: float = 0.0, beta: float = 0.0,
                      bk: Backend | str = "numpy") -> VirtualRun:
    """The layer-parallel gradient of ``net`` on ``size`` virtual ranks (arithmetic mode).

    ``results[q]`` is rank q's dict: ``forward``/``backward`` (its MGRIT results), ``rows``
    ({layer a: ∂L/∂θ_a} it captured), ``opening`` (rank 0) and ``loss``, ``closing`` (last
    rank). :func:`assemble_gradient` turns them into ``(loss, grads)``.
    """
    bk = get_backend(bk)
    settings = as_settings(settings)
    check_inputs(net, params, x, labels)
    plan = BlockPlan.build(net.n_layers, settings, size)
    return simulate(
        lambda comm: _rank_program(comm, plan, settings, _Arithmetic(net, params, x, labels, bk)),
        size, costs, alpha, beta)


def assemble_gradient(run: VirtualRun, params: Params) -> tuple[float, Params]:
    """``(loss, grads keyed like params)`` from a :func:`simulate_gradient` run."""
    out = run.results
    grads: dict[str, Any] = {}
    dsteps = {k: np.zeros_like(v) for k, v in group(params, "steps").items()}
    for res in out:
        for a, row in res["rows"].items():
            for k, v in row.items():
                dsteps[k][a] = v
    grads.update({f"opening.{k}": v for k, v in out[0]["opening"].items()})
    grads.update({f"steps.{k}": v for k, v in dsteps.items()})
    grads.update({f"closing.{k}": v for k, v in out[-1]["closing"].items()})
    return out[-1]["loss"], {k: grads[k] for k in params}


def simulate_gradient_schedule(n_layers: int, state_bytes: int, size: int,
                               settings: LayerParallelSettings | None = None,
                               costs: CostModel = 1.0, alpha: float = 0.0, beta: float = 0.0,
                               iterations: tuple[int | None, int | None] = (None, None),
                               ) -> VirtualRun:
    """Cost-only layer-parallel gradient (module docstring): the events and clocks of
    :func:`simulate_gradient` for ``n_layers`` layers whose states are ``state_bytes`` bytes
    (e.g. ``B · prod(S) · 8``), without arithmetic.

    ``iterations`` = (forward, backward) cycles to replay (None: the settings' ``max_iter``;
    pass the real solves' ``iterations`` when their tolerances stop them earlier).
    """
    settings = as_settings(settings)
    if not isinstance(iterations, tuple) or len(iterations) != 2:
        raise ValueError(f"`iterations` must be a pair (forward, backward), got {iterations!r}.")
    replay = LayerParallelSettings(forward=replay_settings(settings.forward, iterations[0]),
                                   backward=replay_settings(settings.backward, iterations[1]))
    plan = BlockPlan.build(n_layers, replay, size)
    return simulate(lambda comm: _rank_program(comm, plan, replay, _CostOnly(n_layers)),
                    size, costs, alpha, beta, sizeof=state_sizeof(state_bytes))
