"""Gradients replayed from CUDA graphs (refbraid.training.captured_gradient).

Without a GPU the CuPy stand-in records by running the gradient again under the capture's
contract: no device→host read, no host→device copy, no host-made address table — each of
which it refuses — and the replayed gradient must equal the eager one on new inputs. What it
cannot see (CuPy's kernels recording, the replayed addresses being sound) the ``gpu`` test
at the end checks on a real GPU: replays with changing parameters and batches equal eager
gradients.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from refbraid.backends import launch_count
from refbraid.backends.capture_state import (
    HostReadDeferred,
    host_reads_deferred,
    recording_graph,
)
from refbraid.backends.device_batching import sweeps_batched
from refbraid.backends.graphs import record
from refbraid.backends.host import host_float, to_host
from refbraid.backends.portable import stack_rows
from refbraid.backends.standin_rules import CaptureViolation
from refbraid.layer_parallel import LayerParallelSettings, place_batched_runs, strided_runs
from refbraid.mgrit import MGRITSettings, Problem, solve
from refbraid.network import to_backend
from refbraid.training.captured_gradient import captured_gradient
from refbraid.training.gradients import mgrit_gradient, sequential_gradient

MODES = ("serial", "lp-per-step", "lp-batched")


def _compare(bk, model: str, mode: str, settings, n_layers: int = 16, calls: int = 3,
             rtol: float = 0.0):
    """Eager and captured gradients of ``model`` on ``calls`` different (params, batch)."""
    net, params, x, labels = launch_count.build_model(model, n_layers, np.random.default_rng(0))
    with sweeps_batched(mode == "lp-batched"):
        eager = sequential_gradient(net, bk) if mode == "serial" else \
            mgrit_gradient(net, settings, bk)
        replayed = captured_gradient(net, bk, "serial" if mode == "serial" else settings)
        for call in range(calls):
            rng = np.random.default_rng(call)
            p = to_backend({k: v * (1.0 + 0.1 * call) for k, v in params.items()}, bk)
            xb = bk.asarray(x + 0.1 * rng.standard_normal(x.shape))
            yb = bk.asarray(rng.permutation(labels))
            loss, grads, stats = eager(p, xb, yb)
            loss_r, grads_r, stats_r = replayed(p, xb, yb)
            assert math.isclose(loss_r, loss, rel_tol=rtol, abs_tol=0.0)
            for k in grads:
                np.testing.assert_allclose(to_host(grads_r[k]), to_host(grads[k]), rtol=rtol,
                                           atol=0.0, err_msg=f"{model} {mode} call {call} {k}")
            assert stats_r.keys() == stats.keys()
            for k in stats:
                assert math.isclose(stats_r[k], stats[k], rel_tol=max(rtol, 1e-12)), k
    assert len(replayed.recordings) == 1  # one shape: recorded once, replayed every call


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", ["dense", "conv"])
def test_a_replayed_gradient_equals_the_eager_one_on_new_inputs(cupylike, model, mode):
    _compare(cupylike, model, mode, LayerParallelSettings())


def test_a_new_batch_shape_gets_its_own_recording(cupylike):
    net, params, x, labels = launch_count.build_model("dense", 8, np.random.default_rng(0))
    g = captured_gradient(net, cupylike, "serial")
    p = to_backend(params, cupylike)
    g(p, cupylike.asarray(x), cupylike.asarray(labels))
    loss, _, _ = g(p, cupylike.asarray(x[:3]), cupylike.asarray(labels[:3]))
    want, _, _ = sequential_gradient(net, cupylike)(p, cupylike.asarray(x[:3]),
                                                    cupylike.asarray(labels[:3]))
    assert len(g.recordings) == 2 and loss == want


def test_inputs_are_checked_before_each_replay(cupylike):
    net, params, x, labels = launch_count.build_model("dense", 16, np.random.default_rng(0))
    g = captured_gradient(net, cupylike, None)
    p = to_backend(params, cupylike)
    g(p, cupylike.asarray(x), cupylike.asarray(labels))
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="`x` must be finite"):
        g(p, cupylike.asarray(bad), cupylike.asarray(labels))
    with pytest.raises(ValueError, match="`labels` must lie in"):
        g(p, cupylike.asarray(x), cupylike.asarray(labels + 10))


def test_what_a_capture_cannot_do_is_refused(cupylike):
    a = cupylike.asarray(np.arange(4.0))
    with pytest.raises(HostReadDeferred, match="host_reads_deferred"):
        record(lambda: host_float(a.sum()), cupylike.xp)
    with host_reads_deferred():  # a warm-up may copy over (filling caches); a recording not
        cupylike.asarray(np.ones(2))
    with recording_graph(), pytest.raises(CaptureViolation):
        cupylike.asarray(np.ones(2))
    rows = [a * k for k in range(9)]
    with recording_graph():
        with pytest.raises(CaptureViolation, match="address"):
            cupylike.xp.stack(rows)
        stacked = stack_rows(rows)  # one row assignment each while recording
    np.testing.assert_array_equal(to_host(stacked), to_host(cupylike.xp.stack(rows)))


def test_only_the_cupy_backend_records():
    net, _, _, _ = launch_count.build_model("dense", 8, np.random.default_rng(0))
    with pytest.raises(ValueError, match="cupy"):
        g = captured_gradient(net, "numpy", "serial")
        params = {k: v for k, v in launch_count.build_model("dense", 8,
                                                            np.random.default_rng(0))[1].items()}
        x = np.zeros((4, 2))
        g(params, x, np.zeros(4, dtype=np.int64))


def test_networks_a_graph_cannot_hold_are_refused_by_name():
    net, _, _, _ = launch_count.build_model("gru", 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="`net` must be a refbraid Network"):
        captured_gradient(net, "numpy")


def _heat(n_steps=16):
    """u[i] = a·u[i-1]: a scalar decay, the smallest MGRIT problem."""
    return Problem(step=lambda u, s, t: 0.9 * u, u0=np.ones(3), n_steps=n_steps)


def test_a_deferred_solve_decides_its_status_when_settled():
    settings = MGRITSettings(levels=2, cfactor=4, max_iter=3, abs_tol=None, rel_tol=None)
    eager = solve(_heat(), settings)
    with host_reads_deferred():
        pending = solve(_heat(), settings)
    assert pending.status == "pending" and all(math.isnan(n) for n in pending.norms)
    assert pending.settle() is pending
    assert pending.status == eager.status == "max_iter"
    np.testing.assert_array_equal(pending.norms, eager.norms)
    np.testing.assert_array_equal(pending.solution, eager.solution)


def test_a_deferred_solve_runs_every_cycle_and_reports_where_it_converged():
    settings = MGRITSettings(levels=2, cfactor=4, max_iter=6, abs_tol=1e-8, rel_tol=None)
    eager = solve(_heat(), settings)
    assert eager.status == "converged" and eager.iterations < 6
    with host_reads_deferred():
        deferred = solve(_heat(), settings)
    deferred.settle()
    assert deferred.status == "converged" and deferred.iterations == 6
    np.testing.assert_array_equal(deferred.norms[: len(eager.norms)], eager.norms)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", ["dense", "conv"])
def test_a_cuda_graph_replays_the_eager_gradient_on_a_gpu(model, mode):
    from conftest import backend_or_skip

    bk = backend_or_skip("cupy")
    # a graph replays the recorded kernels with their arguments: cuBLAS may pick another
    # algorithm under capture, hence the round-off tolerance (float64)
    _compare(bk, model, mode, LayerParallelSettings(), n_layers=32, calls=3, rtol=1e-10)


@pytest.mark.parametrize("serial", [False, True])
def test_training_with_cuda_graphs_equals_eager_training(cupylike, tmp_path, serial):
    """``--cuda-graphs``: two epochs of Adam (a partial last batch: a second recording) end
    on the eager run's parameters and losses."""
    from refbraid.training import TrainConfig, select_gradient
    from refbraid.training.run import setup
    from refbraid.training.trainer import fit

    results = {}
    for graphs in (False, True):
        cfg = TrainConfig(data="peaks", samples=46, layers=4, width=4, epochs=2, batch_size=8,
                          levels=2, cfactor=2, quiet=True, serial=serial, cuda_graphs=graphs)
        net, data, state, _ = setup(cfg)
        state.params = to_backend(state.params, cupylike)
        name, gradient = select_gradient(cfg, net, cupylike)
        assert name.endswith("cuda-graph") == graphs
        results[graphs] = fit(net, state, data, gradient, epochs=2, batch_size=8, bk=cupylike,
                              out_dir=tmp_path / str(graphs), quiet=True).state
        if graphs:
            assert len(gradient.recordings) == 2  # the full batches and the last one
    for k, v in results[False].params.items():
        np.testing.assert_array_equal(to_host(results[True].params[k]), to_host(v), err_msg=k)
    assert results[True].history[-1]["train_loss"] == results[False].history[-1]["train_loss"]


def test_cuda_graphs_name_what_they_cannot_be_combined_with():
    from refbraid.backends import get_backend
    from refbraid.training import TrainConfig, select_gradient
    from refbraid.training.run import setup

    with pytest.raises(ValueError, match="--bias-control, --check-gradient-every"):
        TrainConfig(cuda_graphs=True, bias_control="measure", check_gradient_every=2)
    cfg = TrainConfig(data="peaks", samples=40, layers=4, width=4, levels=2, cfactor=2,
                      cuda_graphs=True)
    net, _, _, _ = setup(cfg)
    with pytest.raises(ValueError, match="`--cuda-graphs` needs `--backend cupy`"):
        select_gradient(cfg, net, get_backend("numpy"))


def test_a_recording_that_fails_says_so_and_names_the_eager_way(cupylike, monkeypatch):
    from refbraid.training import captured_gradient as module

    def refuse(fn, xp, warmups=1):
        raise NotImplementedError("calling cuBLAS API during stream capture is unsupported")

    monkeypatch.setattr(module, "record", refuse)
    net, params, x, labels = launch_count.build_model("dense", 8, np.random.default_rng(0))
    g = captured_gradient(net, cupylike, "serial")
    with pytest.raises(RuntimeError, match="as a CUDA graph failed .*NotImplementedError.*"
                                           "without --cuda-graphs"):
        g(to_backend(params, cupylike), cupylike.asarray(x), cupylike.asarray(labels))


@pytest.mark.parametrize("mode", launch_count.GRAPH_MODES)
def test_a_replayed_gradient_issues_a_fixed_few_launches_whatever_the_depth(mode):
    """Counted on the stand-in: the replay is one launch; the call's checks and copies do not
    grow with N, while the eager gradient's launches do."""
    few = [launch_count.graph_counts("dense", n, mode) for n in (16, 32)]
    assert few[0].row() == few[1].row()
    eager = launch_count.gradient_counts("cupy", "dense", 32, mode)
    assert few[1].launches < eager.launches / 4 and few[1].h2d == 0


def test_strided_runs_cut_where_the_row_or_the_stride_breaks():
    pairs = [(0, 12), (1, 8), (2, 4), (3, 0), (5, 1), (6, 5), (7, 9), (8, 10)]
    assert strided_runs(pairs) == [[(0, 12), (1, 8), (2, 4), (3, 0)],
                                   [(5, 1), (6, 5), (7, 9)], [(8, 10)]]
    assert strided_runs([]) == []
    assert strided_runs([(0, 3), (1, 3)]) == [[(0, 3)], [(1, 3)]]  # no zero stride


@pytest.mark.parametrize("layers", [[1, 5, 9, 13], [13, 9, 5, 1], [0, 1, 2, 7], [6, 4, 2, 0]])
def test_batched_gradient_rows_are_placed_as_strided_blocks(layers):
    """place_batched_runs writes what the row-by-row placement writes, rows from a batch in
    one block per run (either direction), the rest left to the caller."""
    rng = np.random.default_rng(0)
    d = {"W": rng.standard_normal((len(layers), 2, 3)), "b": rng.standard_normal((len(layers), 2))}
    batches = {a: (d, j) for j, a in enumerate(layers)}
    rows = [*layers, 15]  # layer 15: a per-step gradient
    dsteps = {"W": np.zeros((16, 2, 3)), "b": np.zeros((16, 2))}
    rest = place_batched_runs(dsteps, rows, batches)
    want = {k: np.zeros_like(v) for k, v in dsteps.items()}
    for j, a in enumerate(layers):
        for k in want:
            want[k][a] = d[k][j]
    assert 15 in rest and all(a not in rest for a in layers[:3])
    for k in want:
        keep = [a for a in range(16) if a not in rest]
        np.testing.assert_array_equal(dsteps[k][keep], want[k][keep])


@pytest.mark.parametrize("model", ["dense", "conv"])
def test_a_recorded_batched_gradient_holds_no_more_kernels_than_the_eager_one_launches(model):
    """The graph's nodes (the recording's launches) stay at the eager gradient's count: the
    gradient rows of batched adjoint steps are placed as strided blocks, not one row
    assignment per layer and parameter (which doubled the nodes at N = 256)."""
    nodes = launch_count.graph_nodes(model, 32, "lp-batched")
    eager = launch_count.gradient_counts("cupy", model, 32, "lp-batched")
    assert 0 < nodes <= eager.launches


@pytest.mark.parametrize("layers", [list(range(8)), [6, 2, 5, 1]], ids=["all", "some"])
def test_captured_rows_start_from_zeros_only_where_some_rows_are_not_captured(layers):
    """layer_parallel.captured_gradient: every captured layer's gradient in its row, the
    other rows zero (an MPI rank's share); where every row is captured nothing is zeroed
    first (on a GPU a launch per weight fewer)."""
    from types import SimpleNamespace

    from refbraid.layer_parallel import captured_gradient as rows_of

    rng = np.random.default_rng(1)
    grads = {a: {"W": rng.standard_normal((2, 3)), "b": rng.standard_normal(2)}
             for a in layers}
    steps = {"W": np.ones((8, 2, 3)), "b": np.ones((8, 2))}
    with launch_count.counting("cupy") as bk:
        adjoint = SimpleNamespace(bk=bk, grad_batches={},
                                  grads={a: {k: bk.asarray(v) for k, v in g.items()}
                                         for a, g in grads.items()})
        dev = {k: bk.asarray(v) for k, v in steps.items()}
        counted = launch_count.count(lambda: rows_of(adjoint, dev, layers))
        got = {k: to_host(v) for k, v in rows_of(adjoint, dev, layers).items()}
    for k, v in got.items():
        want = np.zeros_like(steps[k])
        for a in layers:
            want[a] = grads[a][k]
        np.testing.assert_array_equal(v, want, err_msg=k)
    assert ("zeros_like" in counted.by_name) == (len(layers) < 8)
