"""The fused cycle (MGRITSettings.fused, refbraid.mgrit.fused) against the textbook one.

Oracle: the same solve with ``fused=False`` (cycle.py step by step). The fused path only
reorders per-row work and writes results into their destinations, never changes an
operation, so every comparison is exact: the bytes of the solution, of every recorded
residual vector and iterate, every norm, and the step counts per level. Backends: numpy,
numba, the cuda kernels in Numba's simulator, and the cupy code path on the strict device
stand-in; one rank, thread ranks (2 and 3, uneven blocks), and MPI (tests/mpi/test_fused_mpi.py).
"""

import contextlib

import numpy as np
import pytest
from conftest import BACKEND_PARAMS, backend_or_skip

from refbraid.backends import get_backend
from refbraid.backends.host import to_host
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.mgrit import GradientWorkspace, MGRITSettings, Problem, Workspace, solve
from refbraid.mgrit.coarse import correct, fas_rhs
from refbraid.mgrit.fused import (
    Correction,
    FiniteWatch,
    c_relax_rows,
    first_residual_row,
    restrict_fas,
    sweep_residual,
)
from refbraid.mgrit.problem import CountingStep
from refbraid.mgrit.problems import LinearODE, dahlquist, heat_1d, nonlinear_ode
from refbraid.mgrit.relax import c_relax, c_residual, f_relax, propagate_at
from refbraid.models import build_network
from refbraid.network import init_params, to_backend
from refbraid.parallel import run_ranks

SETTINGS = {
    "FMG-FCF": MGRITSettings(levels=3, cfactor=4, relax="FCF", fmg=True, abs_tol=1e-10),
    "V-F": MGRITSettings(levels=3, cfactor=2, relax="F", abs_tol=None, max_iter=3,
                         min_coarse=1),
    "F-cycle-final-FC": MGRITSettings(levels=4, cfactor=2, relax="FCF", cycle="F",
                                      abs_tol=None, max_iter=2, min_coarse=1,
                                      final_fc_relax=True),
    "torchbraid": MGRITSettings.torchbraid(max_iter=1),
    "one-level": MGRITSettings(levels=1),
    "FCF2-iterates": MGRITSettings(levels=2, cfactor=3, relax="FCF", cf_sweeps=2,
                                   abs_tol=None, max_iter=3, keep_iterates=True),
    "FCF-fine-skip": MGRITSettings(levels=3, cfactor=(3, 2), relax=("FCF", "F"),
                                   skip_first_down=True, abs_tol=None, max_iter=2,
                                   min_coarse=1, keep_iterates=True),
}


def _bits(x):
    if x is None:
        return None
    x = np.asarray(to_host(x))
    return x.dtype.str, x.shape, x.tobytes()


def record_bits(res) -> list:
    """Everything a solve returns, as bytes: solution, counts, every norm, residual, iterate."""
    out = [_bits(res.solution), tuple(res.step_counts), res.status, res.iterations]
    for r in res.records:
        out.append((r.norm, r.post_cycle_norm, r.step_counts, _bits(r.post_cycle_iterate)))
        out += [(v.level, v.norm, _bits(v.residual), _bits(v.iterate)) for v in r.visits]
    return out


def assert_same(a, b):
    ra, rb = record_bits(a), record_bits(b)
    assert len(ra) == len(rb)
    for i, (x, y) in enumerate(zip(ra, rb, strict=True)):
        assert x == y, f"record entry {i} differs"


def textbook(settings: MGRITSettings) -> MGRITSettings:
    return settings.replace(fused=False)


def _per_point(p: Problem) -> Problem:
    """The same problem without its batched step (the per-point sweeps)."""
    return Problem(p.step, p.u0, p.n_steps, g=p.g, t=p.t, direction=p.direction)


class _OutStep:
    """A step that writes into ``out=`` (as the layer-parallel propagators do)."""

    def __init__(self, problem):
        self.inner = problem.step

    def __call__(self, u, start, stop, out=None):
        val = self.inner(u, start, stop)
        if out is None:
            return val
        out[...] = val
        return out


def _with_out(p: Problem) -> Problem:
    return Problem(_OutStep(p), p.u0, p.n_steps, g=p.g, t=p.t, direction=p.direction)


def _forced_adjoint(n=33):
    g = np.random.default_rng(5).standard_normal((n + 1, 3)) / 10
    return LinearODE(n, dim=3).adjoint_problem(np.ones(3), g=g)


PROBLEMS = {
    "dahlquist-batched": lambda: dahlquist(-1.0, 64),
    "heat-batched": lambda: heat_1d(16, 64),
    "heat-per-point": lambda: _per_point(heat_1d(12, 61)),
    "nonlinear": lambda: nonlinear_ode(33, T=1.0, dim=3),
    "nonlinear-out": lambda: _with_out(nonlinear_ode(35, T=1.0, dim=3)),
    "forced-adjoint": _forced_adjoint,
    "forced-adjoint-out": lambda: _with_out(_forced_adjoint(37)),
}


@pytest.mark.parametrize("settings", list(SETTINGS.values()), ids=list(SETTINGS))
@pytest.mark.parametrize("make", list(PROBLEMS.values()), ids=list(PROBLEMS))
def test_fused_solve_is_bit_identical_to_the_textbook_cycle(settings, make):
    problem = make()
    assert_same(solve(problem, settings), solve(problem, textbook(settings)))


@pytest.mark.parametrize("settings", [SETTINGS["FMG-FCF"], SETTINGS["torchbraid"],
                                      SETTINGS["F-cycle-final-FC"]])
def test_fused_solve_with_a_scribbled_workspace_is_bit_identical(settings):
    problem = _with_out(_forced_adjoint())
    want = solve(problem, textbook(settings))
    ws = Workspace()
    solve(problem, settings, workspace=ws)
    made = ws.allocations
    for _ in range(2):
        ws.scribble()  # NaN wherever a solve must write before it reads
        assert_same(solve(problem, settings, workspace=ws), want)
    assert ws.allocations == made


class _Halve:
    """A spatial transfer on 1-D states: pairwise mean down, repeat up (not a refbraid one,
    so that the test does not lean on refbraid.mgrit.spatial)."""

    def coarsens(self, level):
        return True

    def restrict(self, u, level, index):
        return 0.5 * (u[0::2] + u[1::2])

    def interpolate(self, v, level, index):
        return np.repeat(v, 2)


@pytest.mark.parametrize("settings", [
    MGRITSettings(levels=3, cfactor=2, relax="FCF", abs_tol=None, max_iter=3, min_coarse=1),
    MGRITSettings(levels=2, cfactor=4, relax="FCF", fmg=True, abs_tol=None, max_iter=2),
])
def test_fused_solve_with_a_spatial_transfer_is_bit_identical(settings):
    rng = np.random.default_rng(0)
    A = -np.eye(8) + rng.standard_normal((8, 8)) / 8

    def step(u, start, stop):  # u ↦ u + dt A' u, A' cut to u's size (coarse levels: 4, 2)
        n = u.shape[0]
        return u + (stop - start) / 40 * (A[:n, :n] @ u)

    problem = Problem(step, rng.standard_normal(8), 40, transfer=_Halve())
    assert_same(solve(problem, settings), solve(problem, textbook(settings)))


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("name", ["V-F", "FCF2-iterates", "torchbraid", "F-cycle-final-FC"])
def test_fused_on_thread_ranks_equals_the_textbook_on_the_same_ranks(size, name):
    settings = SETTINGS[name]
    problems = [nonlinear_ode(70, T=1.0, dim=3), _with_out(_forced_adjoint(71)),
                dahlquist(-1.0, 73)]  # 71 to 74 points over 2 or 3 ranks: uneven blocks

    def body(comm):
        return [(solve(p, settings, comm=comm), solve(p, textbook(settings), comm=comm))
                for p in problems]

    for per_rank in run_ranks(size, body):
        for fused, plain in per_rank:
            assert_same(fused, plain)


# ----------------------------------------------------------------------------- the pieces
def _block(seed=0, n=11, direction="forward"):
    """A level-0 block of a forced problem (points 0..n-1 with C every 3rd) and its step."""
    p = _forced_adjoint(40) if direction == "backward" else nonlinear_ode(40, T=1.0, dim=3)
    rng = np.random.default_rng(seed)
    u, g = rng.standard_normal((n, 3)), rng.standard_normal((n, 3))
    return u, g, np.arange(n), np.arange(0, n, 3), CountingStep(_with_out(p))


@pytest.mark.parametrize("start", [0, 6])  # the initial block, or a later one (ghost)
def test_sweep_residual_equals_f_relax_then_c_residual_after_correct(start):
    u, g, points, c_pos, step = _block()
    points = points + start
    f_pos = np.setdiff1d(np.arange(len(u)), c_pos)
    ghost = None if start == 0 else np.full(3, 0.3)
    w = np.random.default_rng(9).standard_normal((len(c_pos), 3))
    want = correct(u, c_pos, w, u[c_pos])
    want = f_relax(want, g, points, f_pos, step)
    r_want = c_residual(want, g, points, c_pos, step, ghost, start - 1 if start else None)
    got = u.copy()
    r = sweep_residual(got, g, g, points, c_pos, step, Correction(w, got[c_pos].copy()))
    r = first_residual_row(r, got, g, points, step, ghost, start - 1 if start else None)
    assert got.tobytes() == want.tobytes() and r.tobytes() == r_want.tobytes()


def test_finite_watch_sees_every_f_row_the_sweep_writes():
    u, g, points, c_pos, step = _block(3)
    want = f_relax(u, g, points, np.setdiff1d(np.arange(len(u)), c_pos), step)
    watch = FiniteWatch()
    got = u.copy()
    sweep_residual(got, g, g, points, c_pos, step, watch=watch)
    assert got.tobytes() == want.tobytes()  # watching changes no value
    assert watch.ok and watch.rows == len(u) - len(c_pos)
    for bad in (np.nan, np.inf, -np.inf):
        g_bad = g.copy()
        g_bad[len(u) - 1, 1] = bad  # the last F-row only
        watch = FiniteWatch()
        sweep_residual(u.copy(), g_bad, g_bad, points, c_pos, step, watch=watch)
        assert not watch.ok and watch.rows == len(u) - len(c_pos)
    for dtype, big in (("float32", 1e30), ("float64", 1e300)):  # Σ r² overflows: still finite
        for bad, finite in ((big, True), (np.nan, False), (-np.inf, False)):
            row = np.ones((2, 3), dtype)
            row[1, 2] = bad
            watch = FiniteWatch()
            watch.see(row)
            assert watch.ok is finite, (dtype, bad)


def test_a_carried_watch_reads_only_the_last_f_row_of_each_interval():
    """``carried`` (Φ keeps non-finite values): the last F-row of each interval stands for the
    interval; rows are still counted, and a NaN the steps carry is still found."""
    u, g, points, c_pos, step = _block(3)
    last = {int(c) - 1 for c in c_pos[1:]} | {len(u) - 1}
    read = []
    watch = FiniteWatch(carried=True)
    inner = watch.see

    def see(row, is_last=True):
        read.append(is_last)
        inner(row, is_last)

    watch.see = see
    sweep_residual(u.copy(), g, g, points, c_pos, step, watch=watch)
    assert watch.ok and watch.rows == len(u) - len(c_pos)
    assert sum(read) == len(last) < len(read)
    # a NaN in an interior F-row: an Euler-like step (u + …) carries it to the last row
    k = int(c_pos[0]) + 1
    for bad in (np.nan, np.inf):
        g_bad = np.zeros_like(g)
        g_bad[k, 0] = bad
        watch = FiniteWatch(carried=True)
        sweep_residual(u.copy(), g_bad, g_bad, points, c_pos, step, watch=watch)
        assert not watch.ok
    row = np.array([np.nan, 1.0])
    watch = FiniteWatch(carried=True)
    watch.see(row, last=False)  # not read: it stands for its interval's last row
    assert watch.ok and watch.rows == 1
    watch.see(row, last=True)
    assert not watch.ok


@pytest.mark.parametrize("carries", [True, False])
def test_a_nan_inside_an_interval_is_found_with_or_without_carries_nonfinite(carries,
                                                                           monkeypatch):
    """A step that writes a NaN at an interior F-point of the grid's last interval (rows no
    residual reads) of a u + h F(u) problem: the solve is 'diverged' whether the check
    reads every F-row or, with ``carries_nonfinite``, only the interval's last row (the step
    carries the NaN there)."""
    import refbraid.mgrit.fused_cycle as fused_cycle_module

    monkeypatch.setattr(fused_cycle_module, "WATCH_MIN_ROW", 1)
    p = nonlinear_ode(43, T=1.0, dim=3)

    def step(u, a, b):
        v = p.step(u, a, b)
        if b == 42:  # cfactor 4: F-rows 41, 42, 43 after the last C-point, 40
            v = v.copy()
            v[1] = np.nan
        return v

    settings = MGRITSettings(levels=2, cfactor=4, abs_tol=None, max_iter=2,
                             on_divergence="flag")
    got = solve(Problem(step, p.u0, 43, carries_nonfinite=carries), settings)
    assert got.status == "diverged" and "non-finite values in the solution" in got.message
    assert solve(Problem(p.step, p.u0, 43, carries_nonfinite=carries),
                 settings).status != "diverged"


def test_a_carried_check_reads_only_the_c_rows_no_f_row_follows(monkeypatch):
    """After a carried watch, a C-row followed by an F-row of the block was read through
    that interval's last row; only a C-row at the block's end (or before another C-row) is
    read — all of them when the final FC relaxation rewrote the C-rows after the sweep."""
    from types import SimpleNamespace

    import refbraid.mgrit.outcome as outcome_module

    u = np.ones((10, 3))
    c_pos = [0, 4, 8, 9]  # intervals 1-3 and 5-7; 8 is followed by the C-row 9, 9 ends
    read = []
    real = outcome_module.FiniteWatch.see
    monkeypatch.setattr(outcome_module.FiniteWatch, "see",
                        lambda self, row, last=True: read.append(row[0]) or real(self, row))
    u[:, 0] = np.arange(10)
    cycler = SimpleNamespace(f_rows_finite=(True, 10 - len(c_pos), True))
    assert outcome_module.block_finite(cycler, u, c_pos)
    assert read == [8, 9]
    read.clear()
    assert outcome_module.block_finite(cycler, u, c_pos, c_rows_rewritten=True)
    assert read == [0, 4, 8, 9]
    read.clear()
    u[9, 1] = np.nan  # the block's last C-row: no F-row carries it
    assert not outcome_module.block_finite(cycler, u, c_pos)
    read.clear()
    cycler.f_rows_finite = (True, 10 - len(c_pos), False)  # not carried: every C-row
    u[9, 1] = 1.0
    assert outcome_module.block_finite(cycler, u, c_pos) and read == [0, 4, 8, 9]


def test_carries_nonfinite_must_be_a_bool_and_defaults_to_the_steps_own():
    """None (the default) takes what the step object declares: the layer-parallel
    propagators (every Network step is y + h F) True, a plain function False."""
    from refbraid.layer_parallel import AdjointPropagator, ForwardPropagator

    p = nonlinear_ode(8, T=1.0, dim=3)
    with pytest.raises(TypeError, match="`carries_nonfinite` must be True or False"):
        Problem(p.step, p.u0, 8, carries_nonfinite="yes")
    assert Problem(p.step, p.u0, 8).carries_nonfinite is False
    net = build_network("resnet", (3,), 2, 8, 3, 1.0, "tanh")
    steps = {k[len("steps."):]: v for k, v in init_params(net, 0).items()
             if k.startswith("steps.")}
    bk = get_backend("numpy")
    fwd = Problem(ForwardPropagator(net, steps, bk), np.zeros((2, 3)), 8)
    assert fwd.carries_nonfinite is True
    states = np.zeros((9, 2, 3))
    adj = AdjointPropagator(net, steps, states, bk)
    assert Problem(adj, np.zeros((2, 3)), 8, direction="backward").carries_nonfinite is True
    assert Problem(adj, np.zeros((2, 3)), 8, direction="backward",
                   carries_nonfinite=False).carries_nonfinite is False


def _nan_in_the_last_f_row(n=41):
    """A step whose value at the grid's last point (an F-point no residual reads) is NaN:
    only the finiteness check of the solution can see it."""
    p = nonlinear_ode(n, T=1.0, dim=3)

    def step(u, a, b):
        return p.step(u, a, b) * (np.nan if b == n else 1.0)

    return Problem(step, p.u0, n)


@pytest.mark.parametrize("settings", [
    MGRITSettings(levels=2, cfactor=4, abs_tol=None, max_iter=2, on_divergence="flag"),
    MGRITSettings(levels=3, cfactor=4, relax="FCF", abs_tol=None, max_iter=1,
                  final_fc_relax=True, on_divergence="flag"),
    MGRITSettings(levels=2, cfactor=4, abs_tol=1.0, max_iter=5, on_divergence="flag"),
], ids=["watched", "watched-FCF-final-FC", "converged-early"])
@pytest.mark.parametrize("out", [False, True], ids=["plain", "out"])
@pytest.mark.parametrize("rows_watched", [True, False], ids=["row-by-row", "small-rows"])
def test_a_nan_only_in_the_solution_is_found_as_by_the_textbook(settings, out, rows_watched,
                                                                 monkeypatch):
    import refbraid.mgrit.fused_cycle as fused_cycle_module
    import refbraid.mgrit.outcome as outcome_module

    if rows_watched:  # these states have 3 values: watch them as if they were large
        monkeypatch.setattr(fused_cycle_module, "WATCH_MIN_ROW", 1)
    problem = _nan_in_the_last_f_row()
    problem = _with_out(problem) if out else problem
    clean = nonlinear_ode(41, T=1.0, dim=3)
    clean = _with_out(clean) if out else _per_point(clean)
    want = solve(problem, textbook(settings))
    checked = []  # rows of every block the solver's whole-array check reads
    inner = outcome_module.holds_only_finite
    monkeypatch.setattr(outcome_module, "holds_only_finite",
                        lambda a: checked.append(a.shape[0]) or inner(a))
    got = solve(problem, settings)
    assert got.status == "diverged" and "non-finite values in the solution" in got.message
    assert got.message == want.message
    assert_same(got, want)
    # the last relaxation is known in advance (max_iter): its sweep checks the rows
    watched = rows_watched and settings.abs_tol is None
    assert (42 not in checked) if watched else (42 in checked)  # the whole block
    checked.clear()
    assert solve(clean, settings).status != "diverged"
    assert checked == ([] if watched else [42])


def test_c_relax_rows_equals_propagate_then_c_relax():
    u, g, points, c_pos, step = _block(1)
    points = points + 3
    ghost = np.full(3, -0.2)
    pu = propagate_at(u, g, points, c_pos, step, ghost, 2)
    want, r_want = c_relax(u, pu, c_pos), pu - u[c_pos]
    for residual in (False, True):
        got = u.copy()
        r = c_relax_rows(got, g, points, c_pos, step, ghost, 2, residual=residual)
        assert got.tobytes() == want.tobytes()
        assert (r is None) if not residual else r.tobytes() == r_want.tobytes()


@pytest.mark.parametrize("start", [0, 4])
def test_restrict_fas_equals_a_copy_and_fas_rhs(start):
    u, g, _, _, step = _block(2, n=7)
    points = np.arange(7) * 4 + start  # a coarse level: steps over 4 fine intervals
    ghost, gp = (None, None) if start == 0 else (np.full(3, 0.1), start - 4)
    r = np.random.default_rng(4).standard_normal((7, 3))
    want = fas_rhs(r, u, points, step, ghost, gp)
    w, got = restrict_fas(u, r, points, step, ghost, gp)
    assert got.tobytes() == want.tobytes() and w.tobytes() == u.tobytes()
    assert not np.shares_memory(w, u)


# ----------------------------------------------------------------------------- networks
LP_SETTINGS = {
    "torchbraid": LayerParallelSettings(),
    "2level": LayerParallelSettings(
        forward=MGRITSettings.torchbraid(levels=2, cfactor=4, max_iter=1),
        backward=MGRITSettings.torchbraid(levels=2, cfactor=4, max_iter=0)),
    "FCF-final-FC": LayerParallelSettings.with_iterations(2, 2, relax="FCF",
                                                          final_fc_relax=True),
}


def _unfused(s: LayerParallelSettings) -> LayerParallelSettings:
    return LayerParallelSettings(forward=textbook(s.forward), backward=textbook(s.backward),
                                 spatial=s.spatial)


def _gradient_bits(net, params, x, y, settings, bk, workspace=None):
    loss, grads, info = layer_parallel_gradient(net, params, x, y, settings, bk, workspace)
    return (loss, [_bits(grads[k]) for k in sorted(grads)], _bits(info.states),
            _bits(info.adjoints), record_bits(info.forward), record_bits(info.backward))


def _network_case(model, bk, dtype, n_layers, batch=4):
    shape = (1, 6, 6) if model == "conv" else (3,)
    net = build_network(model, shape, 3, n_layers, 2 if model == "conv" else 4, 1.0, "relu")
    params = init_params(net, 0, np.dtype(dtype))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((batch, *shape)).astype(dtype), rng.integers(0, 3, batch)
    if bk.name != "numpy":
        params, x, y = to_backend(params, bk), bk.asarray(x), bk.asarray(y)
    return net, params, x, y


@pytest.mark.parametrize("name", list(LP_SETTINGS))
@pytest.mark.parametrize("model", ["conv", "resnet"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("bk_name", ["numpy", "numba"])
def test_layer_parallel_gradient_fused_is_bit_identical(bk_name, dtype, model, name):
    bk = get_backend(bk_name)
    net, params, x, y = _network_case(model, bk, dtype, 16)
    s = LP_SETTINGS[name]
    want = _gradient_bits(net, params, x, y, _unfused(s), bk)
    assert _gradient_bits(net, params, x, y, s, bk) == want
    ws = GradientWorkspace()
    for _ in range(2):
        ws.scribble()
        assert _gradient_bits(net, params, x, y, s, bk, ws) == want


@pytest.mark.parametrize("bk_name", [p for p in BACKEND_PARAMS if p.id not in
                                     ("numpy", "numba")] + ["strict"])
@pytest.mark.parametrize("model", ["conv", "resnet"])
def test_layer_parallel_gradient_fused_on_device_arrays(bk_name, model):
    """The cuda kernels (simulator), cupy (GPU only) and the cupy path on the strict
    stand-in: array-API arrays, per-row fused code without NumPy's in-place writes."""
    guard = contextlib.nullcontext()
    if bk_name == "strict":
        pytest.importorskip("array_api_strict")
        from refbraid.backends.strict_device import forbid_host_conversions

        bk, guard = get_backend("strict"), forbid_host_conversions()
    else:
        bk = backend_or_skip(bk_name)
    net, params, x, y = _network_case(model, bk, "float64", 8, batch=2)
    s = LayerParallelSettings.with_iterations(1, 1, levels=2, cfactor=2, min_coarse=1,
                                              relax="FCF")
    with guard:  # strict: no implicit host conversion anywhere (to_host is the one door)
        fused = _gradient_bits(net, params, x, y, s, bk)
        assert fused == _gradient_bits(net, params, x, y, _unfused(s), bk)


@pytest.mark.parametrize("case", ["skip", "skip-FCF-fine", "skip-final-FC", "fmg-V", "2 ranks"])
def test_nested_iteration_writes_coarse_levels_into_the_c_rows_above(monkeypatch, case):
    """Without V-cycles on the way up (the skipped first down-cycle), F-relaxation on level 0
    and no final FC relaxation, each coarse iterate of the fused cycle is a view of the
    C-rows above it: nothing is injected, and the solution and norms are the textbook's bit
    for bit. Elsewhere the textbook's copies stay (a C-relaxation of level 0
    would change a coarse level's values under it)."""
    import refbraid.mgrit.cycle as cycle_module

    base = MGRITSettings.torchbraid(max_iter=1, abs_tol=None)
    settings, aliased = {
        "skip": (base, True),
        "skip-FCF-fine": (base.replace(relax="FCF"), False),
        "skip-final-FC": (base.replace(final_fc_relax=True), False),
        "fmg-V": (base.replace(skip_first_down=False, fmg=True), False),
        "2 ranks": (base, True),
    }[case]
    ode = nonlinear_ode(64, T=1.0, dim=3)
    problem = Problem(ode.step, ode.u0, ode.n_steps, t=ode.t)  # per-point sweeps (rows)
    copies = []

    def counting_inject_up(*args, **kwargs):
        copies.append(1)
        return inject_up(*args, **kwargs)

    inject_up = cycle_module.inject_up
    monkeypatch.setattr(cycle_module, "inject_up", counting_inject_up)
    textbook = solve(problem, settings.replace(fused=False))
    n_textbook = len(copies)
    copies.clear()
    if case == "2 ranks":
        parts = run_ranks(2, lambda comm: solve(problem, settings, comm=comm))
        solution = np.concatenate([p.solution for p in parts])
        norms = parts[0].norms
    else:
        fused = solve(problem, settings)
        solution, norms = fused.solution, fused.norms
    assert n_textbook > 0
    assert len(copies) == (0 if aliased else n_textbook * (2 if case == "2 ranks" else 1))
    np.testing.assert_array_equal(solution, textbook.solution)
    np.testing.assert_allclose(norms, textbook.norms, rtol=0 if case != "2 ranks" else 1e-13)
