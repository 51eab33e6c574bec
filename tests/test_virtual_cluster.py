"""The virtual cluster: real MGRIT code on P simulated ranks with virtual clocks.

Oracles: the one-process solve / gradient (results must be bit-identical: the ranks run the
same arithmetic on the same values), a hand-computed critical path for a toy schedule, the
cost model's own rules checked event by event, and the arithmetic run of the same schedule
for the cost-only mode.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid import Network, init_params
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.mgrit import MGRITSettings, solve
from refbraid.mgrit.problems import LinearODE, nonlinear_ode
from refbraid.parallel.plots import plot_timeline
from refbraid.parallel.trace import RECV, SEND, STEP, path_breakdown
from refbraid.parallel.virtual import (
    DeadlockError,
    StepCosts,
    VirtualComm,
    as_cost,
    ceil_log2,
    collective_cost,
    simulate,
)
from refbraid.scaling import (
    assemble_gradient,
    simulate_gradient,
    simulate_gradient_schedule,
    simulate_schedule,
    simulate_solve,
    whole_solution,
)

TWO_LEVEL = MGRITSettings(levels=2, cfactor=2, relax="F", abs_tol=None, max_iter=3)
THREE_LEVEL_F = MGRITSettings(levels=3, cfactor=2, relax=("F", "FCF"), cycle="F", abs_tol=None,
                              max_iter=2, min_coarse=1)


# ----------------------------------------------------------------------------- bit-identical
@pytest.mark.parametrize("settings", [TWO_LEVEL, THREE_LEVEL_F], ids=["L2-V", "L3-F"])
def test_forward_solve_is_bit_identical_for_1_to_16_ranks(settings):
    problem = nonlinear_ode(67, T=1.0, dim=3)  # 33 (L2) / 16 (L3) coarsest intervals: uneven
    serial = solve(problem, settings)
    for size in range(1, 17):
        run = simulate_solve(problem, settings, size, costs=1.0, alpha=0.3, beta=1e-3)
        np.testing.assert_array_equal(whole_solution(run), serial.solution,
                                      err_msg=f"P = {size}")
        for res in run.results:
            np.testing.assert_allclose(res.norms, serial.norms, rtol=1e-13)
        assert sum(r.step_counts[0] for r in run.results) >= serial.step_counts[0]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 16])
def test_adjoint_solve_is_bit_identical(size):
    ode = LinearODE(45, dim=2)
    g = np.random.default_rng(0).standard_normal((46, 2))
    problem = ode.adjoint_problem(np.ones(2), g=g)
    serial = solve(problem, TWO_LEVEL)
    run = simulate_solve(problem, TWO_LEVEL, size, costs=StepCosts(1.0, 2.0), alpha=1.0)
    np.testing.assert_array_equal(whole_solution(run), serial.solution)


def _dense_net(n_layers: int) -> Network:
    return Network(DenseLift(2, 6), DenseStep(6, "tanh"), Classifier((6,), 5), n_layers, 2.0)


def _batch(seed: int = 3, B: int = 5):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, 2)), rng.integers(0, 5, B)


LP_SETTINGS = [
    pytest.param(45, LayerParallelSettings.with_iterations(2, 1, levels=2, cfactor=2),
                 [1, 2, 3, 5, 8, 16], id="N45-L2"),  # 45 not a multiple of 2: unmirrored
    pytest.param(64, LayerParallelSettings(), [1, 2, 3, 4], id="N64-torchbraid"),
]


@pytest.mark.parametrize("n_layers,settings,sizes", LP_SETTINGS)
def test_layer_parallel_gradient_is_bit_identical(n_layers, settings, sizes):
    net = _dense_net(n_layers)
    params = init_params(net, 1)
    x, y = _batch()
    loss, grads, _ = layer_parallel_gradient(net, params, x, y, settings)
    for size in sizes:
        run = simulate_gradient(net, params, x, y, size, settings, costs=1.0, alpha=0.5,
                                beta=1e-3)
        loss_v, grads_v = assemble_gradient(run, params)
        assert loss_v == loss, f"P = {size}"
        for k in params:
            np.testing.assert_array_equal(grads_v[k], grads[k], err_msg=f"{k}, P = {size}")


# ----------------------------------------------------------------------------- the clock rules
def _check_timeline(run, alpha: float, beta: float) -> None:
    """No rank does two things at once; messages and collectives follow the cost model."""
    tr = run.trace
    for r in tr.ranks:
        ev = tr.on_rank(r)
        assert ev[0].t0 == 0.0
        for a, b in zip(ev, ev[1:], strict=False):
            assert b.t0 == a.t1, f"rank {r}: {b} starts at {b.t0}, previous ended {a.t1}"
            assert b.t1 >= b.t0
        assert ev[-1].t1 == run.clocks[r]
    for send, recv in tr.message_pairs():
        assert recv is not None, f"unmatched {send}"
        arrival = send.t0 + alpha + beta * send.nbytes
        assert recv.nbytes == send.nbytes
        assert recv.t1 == max(recv.t0, arrival)  # waits exactly until the message is there
        assert recv.t1 >= arrival
    by_seq: dict[int, list] = {}
    for e in tr.events:
        if e.is_collective:
            by_seq.setdefault(e.seq, []).append(e)
    P = len(tr.ranks)
    for seq, copies in by_seq.items():
        assert len(copies) == P and len({c.kind for c in copies}) == 1, f"collective {seq}"
        cost = collective_cost(copies[0].kind, P, max(c.nbytes for c in copies), alpha, beta)
        assert {c.t1 for c in copies} == {max(c.t0 for c in copies) + cost}
    assert run.wall_time == max(run.clocks) == tr.end


@pytest.mark.parametrize("size", [1, 2, 4, 7])
def test_timeline_follows_the_cost_model(size):
    costs = StepCosts(forward=(1.0, 0.5, 0.25), backward=2.0)
    run = simulate_solve(nonlinear_ode(67, T=1.0, dim=2), THREE_LEVEL_F, size, costs,
                         alpha=0.75, beta=1e-3)
    _check_timeline(run, 0.75, 1e-3)
    for e in run.trace.of_kind(STEP):
        assert e.duration == pytest.approx(costs(e.level, e.direction), rel=1e-12)


def test_layer_parallel_timeline_and_trace_counts():
    net = _dense_net(45)
    params = init_params(net, 1)
    x, y = _batch()
    settings = LayerParallelSettings.with_iterations(2, 1, levels=2, cfactor=2)
    run = simulate_gradient(net, params, x, y, 5, settings, StepCosts(1.0, (1.0, 2.0)),
                            alpha=0.5, beta=1e-4)
    _check_timeline(run, 0.5, 1e-4)
    counts = run.trace.step_counts()
    for q, res in enumerate(run.results):  # every step went through CountingStep, and only them
        for ell in range(2):
            want = res["forward"].step_counts[ell] + res["backward"].step_counts[ell]
            assert counts.get((q, ell), 0) == want
    directions = {e.direction for e in run.trace.of_kind(STEP)}
    assert directions == {"forward", "backward"}


def test_critical_path_is_tight_and_adds_up_to_the_wall_time():
    run = simulate_gradient_schedule(256, 4096, 8, LayerParallelSettings(),
                                     StepCosts(1.0, (1.0, 2.0)), alpha=2.0, beta=1e-3)
    path = run.critical_path
    assert path[0].t0 == 0.0 and path[-1].t1 == run.wall_time
    for a, b in zip(path, path[1:], strict=False):
        if b.kind == RECV and a.kind == SEND and a.rank != b.rank:  # a late message
            assert (a.rank, a.peer, a.seq) == (b.peer, b.rank, b.seq)
            assert b.t1 == pytest.approx(a.t0 + 2.0 + 1e-3 * a.nbytes, abs=1e-9)
        else:
            assert b.t0 == a.t1
    assert sum(run.breakdown().values()) == pytest.approx(run.wall_time, rel=1e-12)


# ----------------------------------------------------------------------------- the toy case
TOY = MGRITSettings(levels=2, cfactor=2, relax="F", max_iter=1, abs_tol=None)


def test_toy_schedule_matches_the_hand_computed_critical_path():
    """N = 8, cfactor 2, 2 levels, F-relaxation, 1 iteration, P = 2, every step costs 1.

    Blocks (balanced over the 4 coarse intervals): rank 0 owns fine points 0..3 (coarse 0, 2),
    rank 1 owns 4..8 (coarse 4, 6, 8). Each step is made by the owner of its start point;
    a step across the boundary is sent on. Steps per phase (rank 0 | rank 1):

        iteration 0   F-relax (into F-points)          2 | 2   (0→1, 2→3 | 4→5, 6→7)
                      boundary step, sent              1 | 0   (3→4)
                      C-points, residual               1 | 2   (1→2 | 5→6, 7→8; 4 arrived)
                      FAS rhs A_Δ(v) on level 1        2 | 2   (2→4 sent, 0→2 | 4→6, 6→8)
                      coarsest solve (pipeline)        2 | 2   (0→2, 2→4 sent | 4→6, 6→8)
        iteration 1   F-relax, boundary, C-points      4 | 4   → stop (max_iter = 1)
        total                                         12 | 12

    α = β = 0: rank 0 sends 3→4 at 3, rank 1 needs it at 2 (after its F-sweep) and then makes
    its 2 C-steps (5); the norm's allreduce (5); rank 0's FAS boundary step (6), its 0→2 (7);
    rank 1's two FAS steps (6–8); rank 0's coarsest 0→2 (8) and boundary 2→4, sent at 9;
    rank 1's coarsest steps (9–11), F-relax (13), C-steps (15): wall time 15 (the XBraid
    convention, where rank 1 makes the boundary steps, took 16 with 8 | 16 steps).

    α = 1 (β = 0; a collective of 2 ranks costs ⌈log₂ 2⌉·α = 1): rank 0's first ghost leaves
    at 3 and arrives at 4, rank 1's 2 C-steps (6), the allreduce (7), rank 0's FAS boundary
    step (8), its A_Δ step and coarsest 0→2 (10), the coarsest boundary step sent at 11 and
    arriving at 12, rank 1's 2 coarsest steps (14), F-relax (16), 2 C-steps (18; the last
    ghost, sent at 14, arrived at 15), and one allreduce (19) for the last iteration's norm
    and the solver's final finiteness flag together. Path: 3 + 2 steps, 1 latency, 1
    allreduce, 1 + 3 + 6 steps, 1 latency, 1 allreduce: 15 steps + 2 latencies + 2
    collectives = 19.
    """
    problem = nonlinear_ode(8, T=1.0, dim=2)
    run = simulate_solve(problem, TOY, 2, costs=1.0)
    steps = run.trace.step_counts()
    assert steps[(0, 0)] + steps[(0, 1)] == 12
    assert steps[(1, 0)] + steps[(1, 1)] == 12
    assert run.wall_time == 15.0
    assert {e.rank for e in run.critical_path if e.kind == STEP} == {0, 1}
    assert sum(e.kind == STEP for e in run.critical_path) == 15

    run = simulate_solve(problem, TOY, 2, costs=1.0, alpha=1.0)
    assert run.wall_time == 19.0
    assert run.breakdown() == {"allreduce": 2.0, "messages": 2.0, "step L0 forward": 9.0,
                               "step L1 forward": 6.0}
    path_steps = [(e.rank, e.start, e.stop) for e in run.critical_path if e.kind == STEP]
    assert path_steps[:3] == [(0, 0, 1), (0, 2, 3), (0, 3, 4)]  # rank 0's sweep and the
    assert path_steps[-6:] == [(1, 4, 6), (1, 6, 8), (1, 4, 5), (1, 6, 7), (1, 5, 6),
                               (1, 7, 8)]  # boundary step start the path; rank 1 ends it
    assert path_breakdown(run.critical_path) == run.breakdown()


# ----------------------------------------------------------------------------- cost-only mode
@pytest.mark.parametrize("size", [1, 3, 6])
def test_cost_only_schedule_equals_the_arithmetic_run(size):
    problem = nonlinear_ode(67, T=1.0, dim=3)  # state: 3 float64 = 24 bytes
    costs = StepCosts(forward=(1.0, 0.5, 0.3))
    real = simulate_solve(problem, THREE_LEVEL_F, size, costs, alpha=0.5, beta=0.01)
    stand_in = simulate_schedule(67, THREE_LEVEL_F, size, costs, alpha=0.5, beta=0.01,
                                 state_bytes=24)
    assert stand_in.wall_time == real.wall_time
    assert stand_in.trace == real.trace  # the same events at the same virtual times


@pytest.mark.parametrize("size", [1, 4])
def test_cost_only_gradient_equals_the_arithmetic_run(size):
    net = _dense_net(64)
    params = init_params(net, 1)
    x, y = _batch(B=5)  # states (5, 6) float64: 240 bytes
    settings = LayerParallelSettings()
    real = simulate_gradient(net, params, x, y, size, settings, StepCosts(1.0, (1.0, 2.0)),
                             alpha=0.5, beta=1e-3)
    it = (real.results[0]["forward"].iterations, real.results[0]["backward"].iterations)
    stand_in = simulate_gradient_schedule(64, 240, size, settings, StepCosts(1.0, (1.0, 2.0)),
                                          alpha=0.5, beta=1e-3, iterations=it)
    assert stand_in.wall_time == real.wall_time
    assert stand_in.trace == real.trace


def test_cost_only_schedule_reaches_65536_steps_on_1024_ranks():
    N, P = 65536, 1024
    settings = LayerParallelSettings().forward  # 3 levels, cfactor 4: 4096 coarsest intervals
    run = simulate_schedule(N, settings, P, costs=1.0, alpha=1.0, beta=1e-6, state_bytes=4096)
    serial = simulate_schedule(N, settings, 1, costs=1.0)
    assert serial.wall_time == sum(serial.results[0].step_counts)  # one rank: steps only
    per_rank = [sum(r.step_counts) for r in run.results]
    assert min(per_rank) > 0
    assert max(per_rank) <= run.wall_time < serial.wall_time  # faster, yet never below the work
    steps = run.trace.step_counts()
    for ell in range(3):  # all fine work is split, none duplicated
        assert sum(steps.get((q, 0), 0) for q in range(P)) == serial.results[0].step_counts[0]
        assert sum(steps.get((q, ell), 0) for q in range(P)) >= serial.results[0].step_counts[ell]
    assert run.critical_path[-1].t1 == run.wall_time


@pytest.mark.slow
def test_cost_only_gradient_reaches_65536_layers_on_1024_ranks():
    run = simulate_gradient_schedule(65536, 4096, 1024, LayerParallelSettings(),
                                     StepCosts(1.0, (1.0, 2.0)), alpha=1.0, beta=1e-6)
    assert len(run.results) == 1024
    assert sum(run.breakdown().values()) == pytest.approx(run.wall_time, rel=1e-9)


# ----------------------------------------------------------------------------- the model's parts
def test_step_costs_per_level_and_direction():
    c = StepCosts(forward=(1.0, 0.5), backward=(3.0,))
    assert c(0, "forward") == 1.0 and c(1, "forward") == 0.5 and c(5, "forward") == 0.5
    assert c(0, "backward") == 3.0 and c(2, "backward") == 3.0
    assert StepCosts(2.0)(3, "backward") == 2.0  # backward None: the forward costs
    assert as_cost(0.5)(7, "forward") == 0.5
    assert as_cost(lambda level, d: level + (d == "backward"))(2, "backward") == 3
    for bad in (-1.0, float("nan"), (), ("a",), True):
        with pytest.raises(ValueError, match="`forward`"):
            StepCosts(forward=bad)
    with pytest.raises(TypeError, match="`costs`"):
        as_cost("fast")


def test_collective_costs():
    assert [ceil_log2(p) for p in (1, 2, 3, 4, 5, 1024)] == [0, 1, 2, 2, 3, 10]
    assert collective_cost("allreduce", 1, 8, 1.0, 1.0) == 0.0
    assert collective_cost("allreduce", 5, 8, 1.0, 0.5) == 3 * (1.0 + 4.0)
    assert collective_cost("gather", 5, 8, 1.0, 0.5) == 3 * 1.0 + 4 * 0.5 * 8


def test_collectives_and_point_to_point_values():
    def body(comm: VirtualComm):
        comm.send_to((comm.rank + 1) % comm.size, np.array([comm.rank]))
        got = int(comm.recv_from((comm.rank - 1) % comm.size)[0])
        total = comm.allreduce_sum(comm.rank + 1)
        b = comm.bcast({"x": np.arange(3)} if comm.rank == 2 else None, root=2)
        comm.barrier()
        return got, total, b["x"].sum(), comm.allgather(comm.rank), comm.gather(comm.rank, 1)

    run = simulate(body, 4, alpha=1.0)
    for r, (got, total, bsum, everyone, gathered) in enumerate(run.results):
        assert got == (r - 1) % 4 and total == 10.0 and bsum == 3
        assert everyone == [0, 1, 2, 3] and gathered == ([0, 1, 2, 3] if r == 1 else None)


def test_failures_are_raised_and_deadlocks_detected():
    def boom(comm):
        if comm.rank == 2:
            raise ValueError("boom on rank 2")
        return comm.allreduce_sum(1.0)

    with pytest.raises(ValueError, match="boom on rank 2"):
        simulate(boom, 4)
    with pytest.raises(DeadlockError, match="waits for a message from rank"):
        simulate(lambda c: c.recv_from((c.rank + 1) % c.size), 3)
    with pytest.raises(DeadlockError):  # rank 0 never joins the reduction
        simulate(lambda c: None if c.rank == 0 else c.allreduce_sum(1.0), 3)
    with pytest.raises(RuntimeError, match="same collectives"):
        simulate(lambda c: c.allreduce_sum(1.0) if c.rank else c.gather(1), 2)
    with pytest.raises(ValueError, match="`size`"):
        simulate(lambda c: None, 0)
    with pytest.raises(ValueError, match="`alpha`"):
        simulate(lambda c: None, 2, alpha=-1.0)


def test_timeline_figure_of_a_virtual_run():
    from matplotlib.figure import Figure

    run = simulate_gradient_schedule(64, 240, 4, LayerParallelSettings(),
                                     StepCosts(1.0, (1.0, 2.0)), alpha=1.0)
    fig = plot_timeline(run.trace, run.critical_path, time_unit="step costs")
    assert isinstance(fig, Figure)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "critical path" in labels and "waiting for a message" in labels
    assert "adjoint step, level 0" in labels and "collective (reduction)" in labels
    fig = plot_timeline(run.trace, ranks=[1, 3], t_range=(0.0, 10.0))
    assert fig.axes[0].get_xlim() == (0.0, 10.0)
    with pytest.raises(ValueError, match="`ranks`"):
        plot_timeline(run.trace, ranks=[9])
