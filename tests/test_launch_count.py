"""Launch counts without a GPU (refbraid.backends.launch_model, standin_array, launch_count).

The oracle for the model is hand-built event sequences whose critical path is known; for the
networks, the invariants that make batched sweeps the GPU default
(refbraid.backends.device_batching): counts are deterministic, batched sweeps issue fewer
launches than per-step sweeps for every step type, the layer-parallel critical path is below
serial backprop's at N = 64 (dense, conv), the fused kernels cut launches, and the counted run
computes the NumPy gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import launch_count
from refbraid.backends.cupy_fused import fused
from refbraid.backends.cupy_standin import module
from refbraid.backends.cupy_standin import ndarray as DeviceArray
from refbraid.backends.launch_model import Tracker, tracking

xp = module()  # the CuPy-like stand-in, which counts under a tracker


# ----------------------------------------------------------------------------- the model
def test_a_chain_of_dependent_launches_is_as_deep_as_it_is_long():
    t, a = Tracker(), np.zeros(8)
    for _ in range(5):
        t.launch([a], [a])
    assert (t.tally.launches, t.tally.critical_path) == (5, 5)


def test_each_launch_is_charged_the_bytes_of_what_it_reads_and_writes_once():
    """``bytes_moved``: every array a launch reads or writes, once, at the smaller of its
    elements' bytes and the span of memory it views — rows of a stack their own bytes, a
    strided view of every other row its elements (not the rows between), an overlapping
    window view (im2col's) its base's bytes once, a broadcast row its one row."""
    t, u = Tracker(), np.zeros((4, 8))  # float64 rows of 64 bytes
    t.launch([u[0]], [u[1]], "copy")
    assert t.tally.bytes_moved == 2 * 64
    t.launch([u[::2]], [np.zeros((2, 8))], "gather")
    assert t.tally.bytes_moved == 128 + 2 * 128
    x = np.zeros(10)
    windows = np.lib.stride_tricks.as_strided(x, shape=(8, 3), strides=(8, 8))
    t.launch([windows], [], "windows")
    assert t.tally.bytes_moved == 384 + 80
    t.launch([np.broadcast_to(u[0], (4, 8))], [], "broadcast")
    assert t.tally.bytes_moved == 464 + 64
    assert t.tally.bytes_by_name == {"copy": 128, "gather": 256, "windows": 80, "broadcast": 64}
    assert t.tally.bytes_moved == 528


def test_launches_on_disjoint_rows_are_independent_and_a_row_reader_waits_for_its_writer():
    t, u = Tracker(), np.zeros((4, 8))
    for i in range(4):  # four intervals, three steps each: rows never read each other
        for _ in range(3):
            t.launch([u[i]], [u[i]])
    assert (t.tally.launches, t.tally.critical_path) == (12, 3)
    t.launch([u[1:3]], [np.zeros(3)])  # reads two rows: after both of their chains
    assert t.tally.critical_path == 4


def test_a_write_waits_for_earlier_readers_and_a_sync_orders_what_follows():
    t, a, b, c = Tracker(), np.zeros(4), np.zeros(4), np.zeros(4)
    t.launch([a], [b])
    t.launch([a], [b])  # writes b again: output dependence
    assert t.tally.critical_path == 2
    t.launch([c], [a])  # overwrites a, read by both: anti-dependence
    assert t.tally.critical_path == 3
    t.to_host(a)  # the host waits for a (depth 3): what it issues next comes after
    t.launch([], [np.zeros(2)])
    assert t.tally.critical_path == 4 and (t.tally.d2h, t.tally.syncs) == (1, 1)


def test_new_memory_carries_no_history():
    t, a = Tracker(), np.zeros(4)
    t.launch([a], [a])
    t.launch([a], [a])
    t.fresh(a)  # an allocator handing the same address back
    t.launch([a], [a])
    assert t.tally.critical_path == 2


def test_the_cupy_standin_counts_operations_as_cupy_launches_them_under_a_tracker():
    with tracking() as t:
        x = xp.asarray(np.arange(6.0).reshape(2, 3))  # host data: a copy, no launch
        y = xp.reshape(x, (3, 2))  # a view: nothing
        z = xp.tanh(x) * 2.0 + x  # three launches
        s = xp.sum(z)  # one reduction, a 0-d device array
        x[0, :] = z[1, :]  # one launch
        r = x[np.array([1, 0])]  # a host index: copied over, then one gather launch
        value = float(s)  # a copy to the host and a synchronisation
    assert isinstance(s, DeviceArray) and s.ndim == 0 and isinstance(y, DeviceArray)
    assert (t.tally.launches, t.tally.h2d, t.tally.d2h, t.tally.syncs) == (6, 2, 1, 1)
    assert value == pytest.approx(float(np.sum(np.tanh(np.arange(6.0)) * 2 + np.arange(6.0))))
    assert r.shape == (2, 3)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(x)


def test_matmul_counts_the_operand_copies_cupy_makes_before_its_gemm():
    """CuPy's batched matmul copies an operand that is not C-contiguous first; its 2-D
    product reads C- and F-ordered operands in place and copies any other. The product's
    values are NumPy's on the operands as given, bit for bit."""
    from refbraid.backends.cupy_standin import install
    from refbraid.backends.device_batching import gathers_cached, transposed_once

    rng = np.random.default_rng(0)
    Y, W = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 6, 5))
    A, B = rng.standard_normal((4, 5)), rng.standard_normal((6, 5))
    Yd, Wd, Ad, Bd = (xp.asarray(a) for a in (Y, W, A, B))
    cases = [  # (product, ascontiguousarray launches, NumPy's product)
        (lambda: Yd @ xp.permute_dims(Wd, (0, 2, 1)), 1, Y @ np.transpose(W, (0, 2, 1))),
        (lambda: xp.matmul(Yd, xp.permute_dims(Wd, (0, 2, 1))), 1,
         Y @ np.transpose(W, (0, 2, 1))),
        (lambda: Ad @ Bd.T, 0, A @ B.T),  # 2-D: the transposed view is F-ordered
        (lambda: Ad[:, ::2] @ Bd[:3, :2], 2, A[:, ::2] @ B[:3, :2]),  # neither order: copied
    ]
    for product, copies, want in cases:
        with tracking() as t:
            got = product()
        assert t.tally.by_name == ({"ascontiguousarray": copies, "matmul": 1} if copies
                                   else {"matmul": 1})
        np.testing.assert_array_equal(got.get(), want)
    with install(), gathers_cached(), tracking() as t:  # a weight read transposed: copied once
        for _ in range(3):
            got = xp.matmul(Yd, transposed_once(Wd))
    assert t.tally.by_name == {"ascontiguousarray": 1, "matmul": 3}
    np.testing.assert_array_equal(got.get(), Y @ np.transpose(W, (0, 2, 1)))


def test_while_a_graph_is_recorded_matmul_copies_only_what_strides_cannot_describe():
    """A recorded product is refbraid's strided-batched GEMM (cupy_blas.gemm_plan): a
    transposed batch, evenly spaced rows of a stack and a 2-D weight broadcast over a batch
    are read in place; an operand whose batch axes do not collapse to one stride is copied.
    The values are NumPy's either way."""
    from refbraid.backends.capture_state import recording_graph

    rng = np.random.default_rng(1)
    Y, W = rng.standard_normal((6, 4, 5)), rng.standard_normal((3, 6, 5))
    V = rng.standard_normal((2, 2, 5, 3))
    Yd, Wd, Vd = xp.asarray(Y), xp.asarray(W), xp.asarray(V)
    cases = [  # (product, copies eager, copies recorded, NumPy's product)
        (lambda: xp.matmul(Yd[::2], xp.permute_dims(Wd, (0, 2, 1))), 2, 0,
         Y[::2] @ np.transpose(W, (0, 2, 1))),
        (lambda: xp.matmul(Yd, Wd[0].T), 1, 0, Y @ W[0].T),
        (lambda: xp.matmul(xp.reshape(Yd, (2, 3, 4, 5))[:, :2], Vd), 1, 1,
         Y.reshape(2, 3, 4, 5)[:, :2] @ V),
    ]
    for product, eager, recorded, want in cases:
        for recording, copies in ((False, eager), (True, recorded)):
            with tracking() as t:
                if recording:
                    with recording_graph():
                        got = product()
                else:
                    got = product()
            assert t.tally.by_name.get("ascontiguousarray", 0) == copies, (recording, want.shape)
            np.testing.assert_array_equal(got.get(), want)


def test_the_standin_counts_only_under_a_tracker_and_names_a_foreign_device():
    x = xp.asarray(np.arange(4.0))
    with tracking() as t:
        y = xp.tanh(x)
    np.testing.assert_array_equal(xp.tanh(y).get(), np.tanh(np.tanh(np.arange(4.0))))
    assert (t.tally.launches, t.tally.h2d, t.tally.d2h) == (1, 0, 0)  # the rest ran untracked
    with pytest.raises(ValueError, match="`device`"):
        xp.asarray(np.zeros(2), device="cpu")


# ----------------------------------------------------------------------------- the networks
def test_counts_are_deterministic_and_batched_sweeps_shorten_the_dense_gradient():
    one = {m: launch_count.gradient_counts("cupy", "dense", 64, m) for m in launch_count.MODES}
    again = launch_count.gradient_counts("cupy", "dense", 64, "lp-batched")
    assert again.row() == one["lp-batched"].row() and again.by_name == one["lp-batched"].by_name
    serial, per_step, batched = (one[m] for m in launch_count.MODES)
    assert batched.launches < per_step.launches and batched.launches < serial.launches
    assert batched.critical_path < serial.critical_path
    assert per_step.critical_path < serial.critical_path
    assert serial.h2d == 0 and per_step.syncs == batched.syncs  # the same residual checks


def test_the_conv_gradient_critical_path_is_below_serial_backprop_at_64_layers():
    serial = launch_count.gradient_counts("cupy", "conv", 64, "serial")
    batched = launch_count.gradient_counts("cupy", "conv", 64, "lp-batched")
    assert batched.critical_path < serial.critical_path and batched.launches < serial.launches


STEP_OF = {"dense": "DenseStep", "conv": "ConvStep", "transformer": "EncoderStep",
           "gru": "GRUCell"}


@pytest.mark.parametrize("name,model", [("cupy", "dense"), ("cupy", "conv"),
                                        ("cupy", "transformer"), ("cupy", "gru"),
                                        ("cuda", "dense"), ("cuda", "conv")])
def test_batched_sweeps_are_on_exactly_where_they_issue_fewer_launches(name, model):
    """refbraid.backends.device_batching's switch follows the counts, per backend and step."""
    from refbraid.backends.device_batching import BATCHED_ON_DEVICE
    from refbraid.backends.numba_cuda import simulated

    if name == "cuda" and not simulated():
        pytest.skip("counts the simulator's launches (NUMBA_ENABLE_CUDASIM=1)")
    per_step = launch_count.gradient_counts(name, model, 16, "lp-per-step")
    batched = launch_count.gradient_counts(name, model, 16, "lp-batched")
    fewer = batched.launches < per_step.launches
    assert fewer == (STEP_OF[model] in BATCHED_ON_DEVICE[name]), (batched.row(), per_step.row())


def test_the_fused_kernels_cut_launches_and_the_counted_gradient_is_numpys():
    from refbraid.backends import get_backend
    from refbraid.backends.host import to_host
    from refbraid.network import to_backend
    from refbraid.training.gradients import sequential_gradient

    with fused(False):
        unfused = launch_count.gradient_counts("cupy", "dense", 16, "serial")
    fused_ = launch_count.gradient_counts("cupy", "dense", 16, "serial")
    assert fused_.launches < unfused.launches and fused_.critical_path < unfused.critical_path
    net, params, x, labels = launch_count.build_model("dense", 16, np.random.default_rng(0))
    loss, want, _ = sequential_gradient(net, get_backend("numpy"))(params, x, labels)
    with launch_count.counting("cupy") as bk:
        got_loss, got, _ = sequential_gradient(net, bk)(to_backend(params, bk), bk.asarray(x),
                                                        bk.asarray(labels))
        got = {k: to_host(v) for k, v in got.items()}
    assert got_loss == loss
    for k, v in want.items():  # the fused kernels' NumPy path is the reference's arithmetic
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_the_cuda_backend_counts_numba_launches_in_the_simulator():
    from refbraid.backends.numba_cuda import simulated

    if not simulated():
        pytest.skip("counts the simulator's launches (NUMBA_ENABLE_CUDASIM=1)")
    per_step = launch_count.gradient_counts("cuda", "dense", 16, "lp-per-step")
    batched = launch_count.gradient_counts("cuda", "dense", 16, "lp-batched")
    assert "_euler_act_kernel" in per_step.by_name  # the Numba kernels ran and were counted
    assert "_euler_rows_kernel" in batched.by_name  # the batched ones, device-resident
    assert batched.launches < per_step.launches


def test_a_cuda_kernel_given_strided_rows_is_charged_the_copy_a_gpu_makes_first():
    """On a GPU the ``cuda`` backend hands every kernel input over C-contiguous
    (``numba_cuda_memory.KernelCall.arg``: a copy of MGRIT's strided rows first); the counter
    charges that copy too (the simulator's kernels read the strided storage as it is)."""
    from refbraid.backends.numba_cuda import simulated

    if not simulated():
        pytest.skip("counts the simulator's launches (NUMBA_ENABLE_CUDASIM=1)")
    with launch_count.counting("cuda") as bk:
        z = bk.asarray(np.linspace(-1.0, 1.0, 24).reshape(6, 4))
        with tracking() as strided:
            bk.activation(z[::2], "tanh")
        with tracking() as contiguous:
            bk.activation(z, "tanh")
    assert strided.tally.by_name.get("ascontiguousarray") == 1, strided.tally.by_name
    assert "ascontiguousarray" not in contiguous.tally.by_name, contiguous.tally.by_name


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="`mode`"):
        launch_count.gradient_counts("cupy", "dense", 16, "fast")
    with pytest.raises(ValueError, match="`model`"):
        launch_count.build_model("lstm", 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="`name`"):
        launch_count.counting_backend("numpy")


@pytest.mark.parametrize("model", ["dense", "conv", "transformer", "gru"])
def test_the_batched_gradient_on_the_cupy_path_has_the_numpy_batched_bits(model):
    """The cupy backend's batched sweeps (switched on there; the fused kernels' NumPy path)
    compute the NumPy backend's batched layer-parallel gradient bit for bit; the conv
    network's to round-off (its convolutions are summed in another order on cupy,
    backends/cupy_conv)."""
    from refbraid.backends import get_backend
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.backends.host import to_host
    from refbraid.network import to_backend
    from refbraid.training.gradients import mgrit_gradient

    net, params, x, labels = launch_count.build_model(model, 16, np.random.default_rng(0))
    settings = launch_count.default_settings()
    with sweeps_batched(True):
        loss, want, _ = mgrit_gradient(net, settings, get_backend("numpy"))(params, x, labels)
    with launch_count.counting("cupy") as bk:
        got_loss, got, _ = mgrit_gradient(net, settings, bk)(to_backend(params, bk),
                                                             bk.asarray(x), bk.asarray(labels))
        got = {k: to_host(v) for k, v in got.items()}
    if model != "conv":
        assert got_loss == loss
        for k, v in want.items():
            np.testing.assert_array_equal(got[k], v, err_msg=k)
        return
    assert got_loss == pytest.approx(loss, rel=1e-13)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-12 * np.max(np.abs(v)), err_msg=k)


@pytest.mark.parametrize("model", ["dense", "conv"])
def test_the_f_sweeps_write_the_iterate_rows_in_the_step_kernel(model, monkeypatch):
    """On cupy an F-sweep's ``Φ + g`` is written into MGRIT's iterate by the step's own fused
    kernel (the batched step's ``out=``, ``add=``; forward and adjoint sweeps; the dense
    adjoint's sum ``(s W + dy_next) + g`` one ``sum_plus`` launch, or an ``add`` into the rows
    without g), and the C-point residual's rows by the step (batched.residual_at: no stacked
    block, no ``+ g`` on level 0; its ``− u[C]`` and Σ r² in one launch): the same gradient
    bit for bit as when the sweep copies (or adds) a new result into the rows, and one launch
    fewer per such sweep (per residual: the first row set, the concatenation and the ``+ g``
    gone, the subtraction, square and sum one launch)."""
    from refbraid.backends.host import to_host
    from refbraid.mgrit.problem import CountingStep
    from refbraid.network import to_backend
    from refbraid.training.gradients import mgrit_gradient

    net, params, x, labels = launch_count.build_model(model, 16, np.random.default_rng(0))
    settings = launch_count.default_settings()

    def gradient():
        with launch_count.counting("cupy") as bk, tracking() as t:
            loss, g, _ = mgrit_gradient(net, settings, bk)(to_backend(params, bk),
                                                           bk.asarray(x), bk.asarray(labels))
            return loss, {k: to_host(v) for k, v in g.items()}, t.tally

    into = gradient()
    plain_init = CountingStep.__init__

    def without_rows(self, *args, **kwargs):  # the F-sweeps as before: a new result copied
        plain_init(self, *args, **kwargs)
        self.batched_into = False

    monkeypatch.setattr(CountingStep, "__init__", without_rows)
    copied = gradient()
    assert into[0] == copied[0]
    for k, v in copied[1].items():
        np.testing.assert_array_equal(into[1][k], v, err_msg=k)
    fewer = copied[2].launches - into[2].launches
    # the launches that put a sweep's Φ (+ g) (and a residual's) in place
    sweeps = ("setitem", "add", "sum_plus", "concat", "zeros_like",
              "subtract", "square", "sum", "residual_sum_squares")
    assert fewer > 0 and fewer == sum(copied[2].by_name.get(n, 0) - into[2].by_name.get(n, 0)
                                      for n in sweeps), (into[2].by_name, copied[2].by_name)
