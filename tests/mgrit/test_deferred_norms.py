"""Norms reduced at the end of the solve (refbraid/mgrit/norms.py).

Oracle: the norms the record would hold if each were reduced on its own — the square root of
the rank-order sum of every rank's Σ r² of the kept residual vectors — and the number of
collectives the trace records. Deferring changes when a norm is reduced, never its value.
"""

import math

import numpy as np
import pytest

from refbraid.mgrit import MGRITDiverged, MGRITSettings, Problem, solve
from refbraid.mgrit.norms import PendingNorms
from refbraid.mgrit.problems import dahlquist, nonlinear_ode
from refbraid.parallel import SerialComm, run_ranks
from refbraid.parallel.comm import allreduce_sums
from refbraid.parallel.trace import Recorder, recording

SETTINGS = {
    "torchbraid": MGRITSettings.torchbraid(abs_tol=None),
    "fcf-fine": MGRITSettings(levels=3, cfactor=2, relax="FCF", max_iter=3, abs_tol=None),
    "two-level": MGRITSettings(levels=2, cfactor=4, max_iter=2, abs_tol=None),
    "fmg": MGRITSettings(levels=3, cfactor=2, fmg=True, max_iter=1, abs_tol=None),
}


def _allreduces(fn) -> int:
    rec = Recorder()
    with recording(rec):
        fn()
    return sum(e.kind == "allreduce" for e in rec.trace())


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_every_recorded_norm_is_its_residual_reduced_in_rank_order(name, ranks):
    problem = nonlinear_ode(64, T=1.0, dim=3)
    settings = SETTINGS[name].replace(keep_residuals=True)
    results = run_ranks(ranks, lambda comm: solve(problem, settings, comm=comm))

    def reduced(vectors):  # rank order, as allreduce_sum adds: 0 + s_0 + s_1 + ...
        return math.sqrt(float(sum(float(np.sum(v * v)) for v in vectors)))

    records = [res.records for res in results]
    for k, rec in enumerate(records[0]):
        assert rec.norm == reduced([r[k].visits[0].residual for r in records])
        assert rec.norm == rec.visits[0].norm
        for j, visit in enumerate(rec.visits):
            assert visit.norm == reduced([r[k].visits[j].residual for r in records])
            assert all(r[k].visits[j].norm == visit.norm for r in records)
        assert math.isfinite(rec.post_cycle_norm)


def test_a_solve_reduces_once_per_decision_and_once_at_the_end():
    """TorchBraid's settings, 2 iterations: the first norm decides (tolerance), the last
    one, the coarse visit's and the finiteness flag share the end-of-solve reduction."""
    problem = nonlinear_ode(64, T=2.0, dim=2)
    s = MGRITSettings.torchbraid()  # max_iter 1: iterations 0 and 1
    assert _allreduces(lambda: solve(problem, s)) == 2
    assert _allreduces(lambda: solve(problem, s.replace(max_iter=0))) == 1
    assert _allreduces(lambda: solve(problem, s.replace(max_iter=3, abs_tol=None))) == 4
    # the final FC relaxation must know the status first: the last norm is reduced on its own
    assert _allreduces(lambda: solve(problem, s.replace(final_fc_relax=True))) == 3


class _OneByOne:
    """SerialComm without allreduce_sums: the fallback path."""

    rank, size, position = 0, 1, 0

    def __init__(self):
        self.calls = 0
        self._serial = SerialComm()

    def reverted(self):
        return self

    def send_next(self, value):
        return None

    def recv_prev(self):
        return None

    def allreduce_sum(self, value):
        self.calls += 1
        return float(value)

    def gather(self, value, root=0):
        return [value]


def test_a_communicator_without_allreduce_sums_gets_the_same_record():
    problem = nonlinear_ode(64, T=2.0, dim=2)
    s = MGRITSettings.torchbraid(abs_tol=None, max_iter=2)
    comm = _OneByOne()
    a, b = solve(problem, s, comm=comm), solve(problem, s)
    assert comm.calls > 2
    np.testing.assert_array_equal(a.norms, b.norms)
    assert [v.norm for r in a.records for v in r.visits] == \
        [v.norm for r in b.records for v in r.visits]
    assert a.solution.tobytes() == b.solution.tobytes()


@pytest.mark.parametrize("ranks", [1, 3])
def test_allreduce_sums_equals_one_allreduce_sum_per_value(ranks):
    def body(comm):
        values = [0.1 * (comm.rank + 1), 1e-17 * comm.rank, 3.0]
        return allreduce_sums(comm, values), [comm.allreduce_sum(v) for v in values]

    for many, one_by_one in run_ranks(ranks, body):
        assert many == one_by_one


def test_pending_norms_store_the_square_roots_and_say_whether_every_block_is_finite():
    got = {}
    pending = PendingNorms()
    pending.add(9.0, lambda n: got.setdefault("a", n))
    pending.add(2.0, lambda n: got.setdefault("b", n))
    assert len(pending) == 2
    assert pending.resolve(SerialComm(), finite=True) is True
    assert got == {"a": 3.0, "b": math.sqrt(2.0)} and len(pending) == 0
    assert PendingNorms().resolve(SerialComm(), finite=False) is False


@pytest.mark.parametrize("max_iter", [0, 1])
def test_a_last_iteration_that_diverges_is_still_reported(max_iter):
    """The deferred last norm still decides the status: NaN from the first relaxation on
    (max_iter 0, the only iteration is the last) and NaN from late steps both raise
    MGRITDiverged, and 'flag' returns the status."""
    def step(u, a, b):
        return u * np.nan if a >= 30 else 0.9 * u

    problem = Problem(step, np.ones(2), 40)
    s = MGRITSettings(levels=2, cfactor=4, max_iter=max_iter, abs_tol=None)
    with pytest.raises(MGRITDiverged, match="NaN|nan") as info:
        solve(problem, s)
    assert info.value.result.status == "diverged"
    assert not math.isfinite(info.value.result.records[-1].norm)
    assert solve(problem, s.replace(on_divergence="flag")).status == "diverged"


def test_growth_in_the_last_iteration_is_divergence():
    """test_mgrit_solver's unstable coarse step with max_iter 1: the growth is measured by
    the last iteration's (deferred) norm."""
    problem = dahlquist(-50.0, 64, scheme="forward")
    s = MGRITSettings(levels=2, cfactor=8, abs_tol=None, max_growth=10.0, on_divergence="flag")
    grows = [solve(problem, s.replace(max_iter=k)) for k in range(1, 6)]
    last = next(res for res in grows if res.status == "diverged")
    assert "max_growth" in last.message and last.norms[-1] > 10 * last.norms[0]
    assert all(res.status == "max_iter" for res in grows[: grows.index(last)])


def test_device_sums_and_the_finiteness_flag_cross_to_the_host_in_one_transfer():
    """Sums left on a device (the CuPy stand-in, counting under a tracker) and a boolean flag
    are stacked where they live and copied once: one synchronisation, the same floats."""
    from refbraid.backends import launch_count
    from refbraid.backends.launch_model import tracking

    rng = np.random.default_rng(0)
    host = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(3)]
    want = [float(np.sum(b ** 2)) for b in host]
    got = {}
    pending = PendingNorms()
    # inside counting(): the stand-in is `cupy` while array_api_compat looks at its arrays
    with launch_count.counting("cupy") as cbk, tracking() as t:
        xp = cbk.xp
        blocks = [cbk.asarray(b) for b in host]
        sums = [xp.sum(xp.abs(b) ** 2) for b in blocks]
        for k, s in enumerate(sums):
            pending.add(s, lambda n, k=k: got.setdefault(k, n))
        flag = xp.all(xp.isfinite(blocks[0]))
        syncs, d2h = t.tally.syncs, t.tally.d2h
        finite = pending.resolve(SerialComm(), finite=flag)
        assert (t.tally.syncs - syncs, t.tally.d2h - d2h) == (1, 1)
    assert finite is True
    assert [got[k] for k in range(3)] == [math.sqrt(w) for w in want]


def test_the_finiteness_count_holds_when_norms_reduce_over_a_larger_group():
    """A solve's communicator may reduce its norms over more ranks than it has (data-parallel
    groups: VirtualComm / MPIComm with a reduce group): the finiteness flag is reduced as the
    count of non-finite blocks, so a larger group of finite blocks still counts as finite."""

    class TwoGroups(SerialComm):
        def allreduce_sums(self, values):
            return [2.0 * float(v) for v in values]  # one more member with the same values

    assert PendingNorms().resolve(TwoGroups(), finite=True) is True
    assert PendingNorms().resolve(TwoGroups(), finite=False) is False


@pytest.mark.parametrize("case", ["finite", "nan", "inf", "overflowing sum"])
def test_a_device_block_is_finite_by_its_sum_and_rechecked_when_the_sum_is_not(case):
    """solution_finite's device answer is the block's sum (one read of the block, no block of
    flags): finite values give a finite sum; a NaN or inf makes it non-finite and the exact
    check confirms; finite values whose float32 sum overflows are rechecked and found finite.
    One transfer when the sum is finite, one more only to recheck."""
    from types import SimpleNamespace

    from refbraid.backends import launch_count
    from refbraid.backends.launch_model import tracking
    from refbraid.mgrit.norms import FiniteBySum
    from refbraid.mgrit.outcome import solution_finite

    block = np.ones((6, 5), np.float32)
    if case == "nan":
        block[3, 2] = np.nan
    elif case == "inf":
        block[5, 4] = -np.inf
    elif case == "overflowing sum":
        block[:] = 3e38
    cycler = SimpleNamespace(states=[SimpleNamespace(
        coarsest=False, step=SimpleNamespace(problem=SimpleNamespace(carries_nonfinite=False)))])
    # (the stand-in sums on the host: the overflowing float32 sum warns there)
    with launch_count.counting("cupy") as cbk, tracking() as t, np.errstate(over="ignore"):
        u = cbk.asarray(block)
        flag = solution_finite(cycler, u, np.arange(0, 6, 2))
        assert isinstance(flag, FiniteBySum)
        syncs = t.tally.syncs
        finite = PendingNorms().resolve(SerialComm(), finite=flag)
        rechecked = t.tally.syncs - syncs == 2
    assert finite is (case in ("finite", "overflowing sum"))
    assert rechecked is (case != "finite")


@pytest.mark.parametrize("n_steps", [43, 42], ids=["full last interval", "short last"])
@pytest.mark.parametrize("carries", [True, False], ids=["interval ends", "every row"])
@pytest.mark.parametrize("nan_at", [None, 21, 41, "end", 40])
def test_a_device_solution_holding_a_nan_is_diverged(carries, nan_at, n_steps):
    """A solve on device arrays (the CuPy stand-in) whose step makes a NaN at one point (21
    and 41 interior F-points, the grid's end the last interval's end, 40 a C-point):
    'diverged' with or without ``carries_nonfinite`` (where no residual reads the NaN, by the
    solution's finiteness check); with it the finiteness sum reads only
    the last row of each interval (11 of 43–44 rows: one strided view, and the last row
    apart when the last interval is shorter), without it every row."""
    from refbraid.backends import launch_count
    from refbraid.mgrit import Problem
    from refbraid.mgrit import outcome as outcome_module

    nan_at = n_steps if nan_at == "end" else nan_at
    read = []
    real = outcome_module.interval_ends

    def ends(c_pos, n):
        read.append(real(c_pos, n))
        return read[-1]

    settings = MGRITSettings(levels=2, cfactor=4, abs_tol=None, max_iter=2,
                             on_divergence="flag")
    with launch_count.counting("cupy") as bk, pytest.MonkeyPatch.context() as mp:
        mp.setattr(outcome_module, "interval_ends", ends)

        def step(u, a, b):
            return u * 0.9 + (np.nan if b == nan_at else 0.0)

        u0 = bk.asarray(np.ones(3))
        got = solve(Problem(step, u0, n_steps, carries_nonfinite=carries), settings)
    assert (got.status == "diverged") is (nan_at is not None), (nan_at, got.status)
    if nan_at in (41, n_steps):  # rows no residual reads: only the finiteness check sees it
        assert "non-finite values in the solution" in got.message
    want = [*range(3, 40, 4), n_steps]
    assert read == ([want] if carries else [])
