"""The GRU's batched steps (MGRIT over the sequence, one call per sweep) equal the per-step ones.

Oracles: k per-step calls of :class:`GRUCell` (``forward``, ``adjoint``: row j of a batched
call must have their bits, since ``matmul`` of the stack runs the per-step 2-D GEMM per row and
the gate algebra is element-wise), and the whole MGRIT-over-the-sequence gradient with the
batched path off (``GRUCell.batched_sweeps_pay`` patched to False). The batched adjoint is
also checked on its own in float64: against a central difference of the batched forward
(the finite-difference check) in the dot-product form <J v, w> = <v, Jᵀ w>.
"""

import sys

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.layers import GRUCell
from refbraid.parallel import run_ranks
from refbraid.sequence import GRUModel

gru_model_module = sys.modules["refbraid.sequence.gru_model"]


def _stack(rng, k=5, B=3, H=6, I=4, dtype=np.float64, x_rows=None):
    cell_params = {name: v.astype(dtype) for name, v in
                   GRUCell(I, H).init(rng, dtype).items() if name != "x"}
    Hs = rng.standard_normal((k, B, H)).astype(dtype)
    X = rng.standard_normal((k, x_rows or B, I)).astype(dtype)
    return cell_params, Hs, X


@pytest.mark.parametrize("scheme", ["classic", "implicit"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("x_rows", [None, 1], ids=["x-batch", "x-broadcast"])
def test_rows_are_the_per_step_bits(scheme, dtype, backend, x_rows):
    bk = get_backend(backend)
    rng = np.random.default_rng(3)
    cell = GRUCell(4, 6, scheme)
    params, Hs, X = _stack(rng, dtype=dtype, x_rows=x_rows)
    dt = 2.0
    H_new, cache = cell.forward_batched({**params, "x": X}, Hs, dt, bk)
    lam = rng.standard_normal(Hs.shape).astype(dtype)
    dH = cell.adjoint_batched(params, cache, lam, dt, bk)
    dW = cell.weight_gradients_batched(params, cache, lam, dt, bk) if x_rows is None else None
    for j in range(Hs.shape[0]):
        h_j, c_j = cell.forward({**params, "x": X[j]}, Hs[j], dt, bk)
        d_j, _ = cell.adjoint(params, c_j, lam[j], dt, bk, grads=False)
        assert H_new.dtype == h_j.dtype and np.array_equal(H_new[j], h_j)
        assert np.array_equal(dH[j], d_j)
        if dW is not None:  # the weight gradients of row j: the per-step adjoint's bits
            _, g_j = cell.adjoint(params, c_j, lam[j], dt, bk)
            for name in dW:
                assert np.array_equal(dW[name][j], g_j[name]), name


@pytest.mark.parametrize("scheme", ["classic", "implicit"])
def test_batched_adjoint_matches_finite_differences(scheme):
    bk = get_backend("numpy")
    rng = np.random.default_rng(7)
    cell = GRUCell(4, 6, scheme)
    params, Hs, X = _stack(rng)
    p = {**params, "x": X}
    dt, eps = 0.7, 1e-6
    v = rng.standard_normal(Hs.shape)
    w = rng.standard_normal(Hs.shape)
    _, cache = cell.forward_batched(p, Hs, dt, bk)
    JTw = cell.adjoint_batched(params, cache, w, dt, bk)
    Jv = (cell.forward_batched(p, Hs + eps * v, dt, bk)[0]
          - cell.forward_batched(p, Hs - eps * v, dt, bk)[0]) / (2 * eps)
    lhs, rhs = np.vdot(Jv, w), np.vdot(v, JTw)
    assert abs(lhs - rhs) <= 1e-8 * max(abs(lhs), 1.0)
    # the adjoint is linear in w (the dot-product test's premise): Jᵀ(a w + w') = a Jᵀw + Jᵀw'
    w2 = rng.standard_normal(Hs.shape)
    JT_sum = cell.adjoint_batched(params, cache, 3.0 * w + w2, dt, bk)
    assert np.allclose(JT_sum, 3.0 * JTw + cell.adjoint_batched(params, cache, w2, dt, bk),
                       rtol=1e-13, atol=1e-13)


def test_mixed_spans_give_the_per_interval_steps():
    """A batched call whose intervals differ in length (a level's last, shorter interval):
    one cell call per span, each row the per-step Φ / Ψ (coarse spans use the implicit cell)."""
    model = GRUModel(23, 3, 5, 4)
    bk = get_backend("numpy")
    rng = np.random.default_rng(2)
    cell = {k[len("cell."):]: v for k, v in model.init_params(rng).items() if k.startswith("cell.")}
    x = rng.standard_normal((4, 23, 3))
    states = rng.standard_normal((24, 4, 5))
    fwd = gru_model_module.GRUForward(model, cell, x, bk)
    adj = gru_model_module.GRUAdjoint(model, cell, x, states, bk)
    starts, stops = np.array([0, 4, 8, 20]), np.array([4, 8, 9, 23])
    U = rng.standard_normal((4, 4, 5))
    out = fwd.batched_step(U, starts, stops)
    back = adj.batched_step(U, stops, starts)
    for j in range(4):
        assert np.array_equal(out[j], fwd.step(U[j], starts[j], stops[j]))
        assert np.array_equal(back[j], adj.step(U[j], stops[j], starts[j]))


SETTINGS = [
    LayerParallelSettings(),  # TorchBraid's defaults
    LayerParallelSettings.with_iterations(3, 2, levels=3, cfactor=2, skip_first_down=True),
]


def _case(scheme, dtype, L=37):
    model = GRUModel(L, 3, 6, 4, scheme=scheme)
    rng = np.random.default_rng(1)
    params = model.init_params(rng, dtype)
    x = rng.standard_normal((5, L, 3)).astype(dtype)
    return model, params, x, rng.integers(0, 4, 5)


@pytest.mark.parametrize("settings", SETTINGS, ids=["torchbraid", "L3-m2"])
@pytest.mark.parametrize("scheme,dtype,backend", [
    ("classic", np.float64, "numpy"), ("implicit", np.float64, "numpy"),
    ("classic", np.float32, "numpy"), ("classic", np.float64, "numba"),
    ("implicit", np.float32, "numba")])
def test_gradient_is_bit_identical_to_per_step(monkeypatch, settings, scheme, dtype, backend):
    model, params, x, y = _case(scheme, dtype)
    calls = []
    spy = gru_model_module._by_span
    monkeypatch.setattr(gru_model_module, "_by_span", lambda *a: calls.append(1) or spy(*a))
    loss_b, g_b, info_b = model.layer_parallel_gradient(params, x, y, settings, backend)
    assert calls, "the batched path was not taken"
    monkeypatch.setattr(GRUCell, "batched_sweeps_pay", False)
    n_calls = len(calls)
    loss_p, g_p, info_p = model.layer_parallel_gradient(params, x, y, settings, backend)
    assert len(calls) == n_calls  # the per-step run made no batched call
    assert loss_b == loss_p
    for name in g_p:
        assert np.array_equal(g_b[name], g_p[name]), name
    assert np.array_equal(info_b.states, info_p.states)
    assert np.array_equal(info_b.adjoints, info_p.adjoints)
    assert info_b.stats()["phi_calls"] == info_p.stats()["phi_calls"]


def test_thread_ranks_with_uneven_blocks_give_the_serial_trajectory():
    from refbraid.mgrit import gather_solution, solve

    model, params, x, _ = _case("classic", np.float64, L=38)
    bk = get_backend("numpy")
    cell = {k[len("cell."):]: v for k, v in params.items() if k.startswith("cell.")}
    settings = LayerParallelSettings.with_iterations(3, 2, levels=3, cfactor=2).forward

    def body(comm):
        return gather_solution(solve(model.forward_problem(cell, x, bk), settings, comm=comm),
                               comm)

    serial = solve(model.forward_problem(cell, x, bk), settings).solution
    for size in (1, 2, 3):
        np.testing.assert_array_equal(run_ranks(size, body)[0], serial)


@pytest.mark.parametrize("rows_per_call", [1, 10])
def test_chunked_calls_give_the_same_bits(monkeypatch, rows_per_call):
    """A sweep split into chunks of ROWS_PER_CALL // B intervals (at least one): same gradient,
    also where a chunk mixes nothing but one span and where spans differ."""
    model, params, x, y = _case("classic", np.float64, L=38)
    settings = SETTINGS[1]
    ref = model.layer_parallel_gradient(params, x, y, settings)[1]
    monkeypatch.setattr(gru_model_module, "ROWS_PER_CALL", rows_per_call)
    got = model.layer_parallel_gradient(params, x, y, settings)[1]
    for name in ref:
        assert np.array_equal(got[name], ref[name]), name
    test_mixed_spans_give_the_per_interval_steps()
