"""The execution trace: opt-in, changes nothing, records exactly what the solver counts.

Oracles: the solver's own counters (``CountingStep``), the untraced run of the same solve,
and the rules every trace must obey (messages matched in order, collectives in step).
"""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from refbraid.mgrit import MGRITSettings, solve
from refbraid.mgrit.problems import LinearODE, nonlinear_ode
from refbraid.parallel import SerialComm, run_ranks
from refbraid.parallel.comm import run_traced
from refbraid.parallel.plots import plot_timeline
from refbraid.parallel.trace import (
    RECV,
    SEND,
    STEP,
    Event,
    Recorder,
    Trace,
    active_recorder,
    critical_path,
    path_breakdown,
    payload_bytes,
    recording,
    traced,
)

SETTINGS = MGRITSettings(levels=3, cfactor=2, relax=("F", "FCF"), abs_tol=None, max_iter=2,
                         min_coarse=1)


def _problems():
    ode = LinearODE(45, dim=2)
    g = np.random.default_rng(0).standard_normal((46, 2))
    return [nonlinear_ode(50, T=1.0, dim=3), ode.adjoint_problem(np.ones(2), g=g)]


def test_tracing_is_off_unless_activated():
    assert active_recorder() is None
    outer, inner = Recorder(0), Recorder(1)
    with recording(outer):
        assert active_recorder() is outer
        with recording(inner):
            assert active_recorder() is inner
        assert active_recorder() is outer
    assert active_recorder() is None
    seen = []
    with recording(outer):  # a new thread does not inherit the recorder
        t = threading.Thread(target=lambda: seen.append(active_recorder()))
        t.start()
        t.join()
    assert seen == [None]
    with pytest.raises(TypeError, match="`recorder`"):
        with recording("on"):
            pass


@pytest.mark.parametrize("which", [0, 1], ids=["forward", "adjoint"])
def test_serial_trace_records_exactly_the_counted_steps(which):
    problem = _problems()[which]
    plain = solve(problem, SETTINGS)
    with recording(Recorder()) as rec:
        res = solve(problem, SETTINGS)
    np.testing.assert_array_equal(res.solution, plain.solution)  # tracing changes nothing
    assert res.step_counts == plain.step_counts
    tr = rec.trace()
    counts = tr.step_counts()
    assert tuple(counts.get((0, ell), 0) for ell in range(3)) == res.step_counts
    want = "forward" if which == 0 else "backward"
    assert {e.direction for e in tr.of_kind(STEP)} == {want}
    n = problem.n_steps
    for e in tr.of_kind(STEP):  # fine indices, one step of the level's spacing
        assert 0 <= min(e.start, e.stop) < max(e.start, e.stop) <= n
        assert abs(e.stop - e.start) in (1, 2, 4)
        assert 0 <= e.t0 <= e.t1
    # SerialComm: no messages; every norm is an allreduce
    assert not tr.of_kind(SEND, RECV)
    assert len(tr.of_kind("allreduce")) >= res.iterations + 1


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("which", [0, 1], ids=["forward", "adjoint"])
def test_thread_ranks_trace_steps_messages_and_reductions(size, which):
    problem = _problems()[which]
    plain = run_ranks(size, lambda comm: solve(problem, SETTINGS, comm=comm))
    results, tr = run_traced(size, lambda comm: solve(problem, SETTINGS, comm=comm))
    for q in range(size):
        np.testing.assert_array_equal(results[q].solution, plain[q].solution)
        counts = tuple(tr.step_counts().get((q, ell), 0) for ell in range(3))
        assert counts == results[q].step_counts == plain[q].step_counts
    pairs = tr.message_pairs()
    assert pairs and all(recv is not None for _, recv in pairs)
    for send, recv in pairs:
        assert abs(send.rank - recv.rank) == 1 and send.nbytes == recv.nbytes > 0
        assert recv.t1 >= send.t0  # one time axis: received after it was sent
    assert len(pairs) == len(tr.of_kind(RECV))
    for q in range(size):  # every rank takes part in the same collectives, in the same order
        kinds = [(e.seq, e.kind) for e in tr.on_rank(q) if e.is_collective]
        assert kinds == [(e.seq, e.kind) for e in tr.on_rank(0) if e.is_collective]
    path = critical_path(tr, tol=1e-3)  # a reading of measured clocks: check causality only
    assert path and all(b.t1 >= a.t0 for a, b in zip(path, path[1:], strict=False))


def test_trace_is_plain_data_that_merges():
    problem = _problems()[0]
    origin = 0.0
    out = run_ranks(3, traced(lambda comm: solve(problem, SETTINGS, comm=comm).status, origin))
    parts = [t for _, t in out]
    merged = Trace.merge(reversed(parts))  # any order of arrival, e.g. an MPI gather
    assert merged.ranks == [0, 1, 2]
    assert [e for e in merged if e.rank == 1] == list(parts[1].events)
    back = pickle.loads(pickle.dumps(merged))
    assert back == merged and isinstance(back.events[0], Event)
    s = merged.summary()
    assert set(s) == {0, 1, 2} and all(v["steps"] > 0 for v in s.values())


def test_serial_comm_records_reductions():
    comm = SerialComm()
    with recording(Recorder()) as rec:
        comm.send_next(np.ones(3))  # no neighbour: no message
        assert comm.recv_prev() is None
        comm.allreduce_sum(2.0)
        comm.gather("x")
    assert [e.kind for e in rec.events] == ["allreduce", "gather"]
    assert [e.seq for e in rec.events] == [0, 1]


def test_payload_bytes():
    a = np.zeros((3, 4))
    assert payload_bytes(a) == 96 and payload_bytes(None) == 0
    assert payload_bytes(1.5) == payload_bytes(3) == payload_bytes(np.float64(1)) == 8
    assert payload_bytes(np.float32(1)) == 4
    assert payload_bytes({1: a, 2: (a, 2.0)}) == 96 + 96 + 8
    assert payload_bytes([a[:1]], array_scale=10) == 320
    assert payload_bytes("text") == 0


def test_recorder_rejects_bad_arguments():
    with pytest.raises(ValueError, match="`rank`"):
        Recorder(-1)
    with pytest.raises(ValueError, match="`kind`"):
        Recorder().collective("reduce_scatter", 8, 0.0, 1.0)


def test_critical_path_of_a_hand_made_trace():
    """Rank 0 computes 0-3 and sends; rank 1 computes 0-1, waits until 4 for the message,
    computes 4-6; both reduce (rank 1 arrives last at 6, everyone leaves at 7)."""
    ev = [
        Event(STEP, 0, 0.0, 3.0, 0, 0, 1),
        Event(SEND, 0, 3.0, 3.0, peer=1, nbytes=8, seq=0),
        Event("allreduce", 0, 3.0, 7.0, nbytes=8, seq=0),
        Event(STEP, 1, 0.0, 1.0, 0, 2, 3),
        Event(RECV, 1, 1.0, 4.0, peer=0, nbytes=8, seq=0),
        Event(STEP, 1, 4.0, 6.0, 0, 3, 4),
        Event("allreduce", 1, 6.0, 7.0, nbytes=8, seq=0),
    ]
    path = critical_path(Trace(tuple(ev)))
    assert path == [ev[0], ev[1], ev[4], ev[5], ev[6]]
    assert path_breakdown(path) == {"allreduce": 1.0, "messages": 1.0,
                                    "step L0 forward": 5.0}
    assert critical_path(Trace()) == []


def test_timeline_figure_of_a_measured_trace():
    from matplotlib.figure import Figure

    _, tr = run_traced(2, lambda comm: solve(_problems()[1], SETTINGS, comm=comm))
    fig = plot_timeline(tr, critical_path(tr, tol=1e-3), title="measured")
    assert isinstance(fig, Figure) and fig.axes[0].get_title() == "measured"
    with pytest.raises(TypeError, match="`trace`"):
        plot_timeline(tr.events)
