"""GRU cells (classic = torch.nn.GRUCell at dt = 1; implicit = Moon & Cyr 2022), their fused
kernels on every backend, and the sequence propagator Φ(h, start, stop) MGRIT will call.

What proves what: the numba/cuda gate kernels against the NumPy reference; refbraid.verify's
check_step (complex-step dot-product test and central differences for h, the input x and every
weight) on numpy and numba, the simulator checks of tests/test_transformer_layers.py on cuda;
torch.nn.GRUCell and torch.nn.GRU (optional) for the classic cell, forward and gradients, over
one step and over a sequence (backprop through time); the implicit update solves its defining
equation and stays bounded where the classic one overshoots.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BACKEND_PARAMS, backend_or_skip
from test_transformer_layers import TOL, _dot_rel, _rel, simulator_check

from refbraid.backends import get_backend
from refbraid.backends import reference as R
from refbraid.layers import GRUCell, GRUSequence
from refbraid.verify import check_step

BATCH, I, HID, L = 2, 3, 4, 5  # batch, input size, hidden size, sequence length
SCHEMES = ["classic", "implicit"]
DT = 0.7


class FullBatchInput:
    """A GRU cell whose input ``x`` has the full batch (B, I) instead of init's (1, I)."""

    def __init__(self, cell):
        self.inner = cell

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def init(self, rng, dtype=np.float64):
        params = self.inner.init(rng, dtype)
        params["x"] = rng.standard_normal((BATCH, self.inner.input_size)).astype(dtype)
        return params


def _failures(results) -> str:
    return "\n".join(str(r) for r in results if not r.passed)


def _weights(cell, rng):
    return {k: v for k, v in cell.init(rng).items() if k != "x"}


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("backend_name", ["numba", "cuda"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_gru_kernels_match_the_reference(backend_name, dtype, scheme):
    bk = get_backend(backend_name)
    rng = np.random.default_rng(0)
    gx, gh = (rng.standard_normal((BATCH, 3 * HID)).astype(dtype) for _ in range(2))
    h, dh_new = (rng.standard_normal((BATCH, HID)).astype(dtype) for _ in range(2))
    implicit = scheme == "implicit"
    out, ref = bk.gru_cell(gx, gh, h, DT, implicit), R.gru_cell(gx, gh, h, DT, implicit)
    for a, r in zip(out, ref, strict=True):
        assert a.dtype == dtype and a.shape == r.shape and _rel(a, r) <= TOL[np.dtype(dtype)]
    gates = ref[1]
    adj = bk.gru_cell_adjoint(gates, gh, h, dh_new, DT, implicit)
    adj_ref = R.gru_cell_adjoint(gates, gh, h, dh_new, DT, implicit)
    for a, r in zip(adj, adj_ref, strict=True):
        assert a.dtype == dtype and a.shape == r.shape and _rel(a, r) <= TOL[np.dtype(dtype)]


def test_gru_kernels_reject_bad_shapes():
    for backend in ("numpy", "numba", "cuda"):
        bk = get_backend(backend)
        with pytest.raises(ValueError, match="`gh`"):
            bk.gru_cell(np.zeros((2, 6)), np.zeros((2, 5)), np.zeros((2, 2)), 1.0, False)
        with pytest.raises(ValueError, match="`dh_new`"):
            bk.gru_cell_adjoint(np.zeros((2, 6)), np.zeros((2, 6)), np.zeros((2, 2)),
                                np.zeros((2, 3)), 1.0, False)


# ----------------------------------------------------------------------------- the cell
CELLS = [(f"{scheme}[x {shape}]", cell)
         for scheme in SCHEMES
         for shape, cell in (("1,I", GRUCell(I, HID, scheme)),
                             ("B,I", FullBatchInput(GRUCell(I, HID, scheme))))]


@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
@pytest.mark.parametrize(("name", "cell"), CELLS, ids=[c[0] for c in CELLS])
def test_cell_passes_the_dot_product_and_fd_checks(name, cell, backend_name):
    results = check_step(cell, backend_name, batch=BATCH, h=DT)
    assert results and not _failures(results), _failures(results)
    checks = {r.check for r in results}
    for arg in ("y", "x", "W_ih", "W_hh", "b_ih", "b_hh"):  # h, the input and every weight
        assert {f"dot:{arg}", f"fd:{arg}"} <= checks
    assert "nograd:dy" in checks  # the state-only adjoint agrees


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cell_passes_in_float32_on_numba(scheme):
    results = check_step(FullBatchInput(GRUCell(I, HID, scheme)), "numba", np.float32,
                         batch=BATCH, h=DT)
    assert results and not _failures(results), _failures(results)


@pytest.mark.parametrize("backend_name", [p for p in BACKEND_PARAMS if p.values[0] == "cuda"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cell_passes_on_cuda(scheme, backend_name):
    backend_or_skip(backend_name)
    failures = simulator_check(FullBatchInput(GRUCell(I, HID, scheme)), backend_name)
    assert not failures, "\n".join(failures)


def test_implicit_update_solves_its_equation_and_stays_bounded():
    """(1 + dt(1−z)) h_new = h + dt(1−z) n: a convex combination of h and n, so |h_new| ≤
    max(|h|, 1) for any dt, while the classic (explicit) update overshoots for large dt."""
    rng = np.random.default_rng(1)
    bk = get_backend("numpy")
    params = _weights(GRUCell(I, HID), rng)
    h, x = 0.9 * np.tanh(rng.standard_normal((8, HID))), rng.standard_normal((8, I))
    for dt in (1e-3, 1.0, 50.0):
        h_new, (_, _, gh, gates) = GRUCell(I, HID, "implicit").step(params, h, dt, x, bk)
        z, n = gates[:, HID : 2 * HID], gates[:, 2 * HID :]
        q = dt * (1 - z)
        np.testing.assert_allclose((1 + q) * h_new, h + q * n, rtol=1e-13, atol=1e-15)
        assert np.all(np.abs(h_new) <= np.maximum(np.abs(h), 1.0))
    explicit, _ = GRUCell(I, HID, "classic").step(params, h, 50.0, x, bk)
    assert np.abs(explicit).max() > 1.0
    small, _ = GRUCell(I, HID, "implicit").step(params, h, 1e-9, x, bk)
    np.testing.assert_allclose(small, h, atol=1e-8)  # dt → 0: no change


def test_a_batch_one_input_broadcasts_and_its_adjoint_is_summed():
    rng = np.random.default_rng(2)
    bk = get_backend("numpy")
    cell = GRUCell(I, HID, "implicit")
    params = cell.init(rng)
    h, w = rng.standard_normal((BATCH, HID)), rng.standard_normal((BATCH, HID))
    out1, c1 = cell.forward(params, h, DT, bk)
    outB, cB = cell.forward({**params, "x": np.repeat(params["x"], BATCH, axis=0)}, h, DT, bk)
    assert _rel(out1, outB) <= 1e-15
    _, d1 = cell.adjoint(params, c1, w, DT, bk)
    _, dB = cell.adjoint(params, cB, w, DT, bk)
    assert d1["x"].shape == (1, I) and _rel(d1["x"], dB["x"].sum(axis=0, keepdims=True)) <= 1e-14


# ----------------------------------------------------------------------------- the sequence
@pytest.mark.parametrize("scheme", SCHEMES)
def test_phi_is_one_step_of_size_m_dt_with_the_input_at_its_start(scheme):
    rng = np.random.default_rng(3)
    bk = get_backend("numpy")
    seq = GRUSequence(GRUCell(I, HID, scheme), dt=0.25)
    params = _weights(seq.cell, rng)
    h0, xs = rng.standard_normal((BATCH, HID)), rng.standard_normal((BATCH, L, I))
    h, _ = seq.phi(params, h0, xs, 2, 5, bk)
    expected, _ = seq.cell.step(params, h0, 3 * 0.25, xs[:, 2], bk)
    np.testing.assert_array_equal(h, expected)
    for stride in (1, 2):  # a coarse level (stride m) steps m·dt with inputs at its C-points
        states, _ = seq.run(params, h0, xs, bk, stride=stride)
        assert len(states) == 1 + -(-L // stride)
        for k in range(len(states) - 1):
            step, _ = seq.phi(params, states[k], xs, k * stride, (k + 1) * stride, bk)
            np.testing.assert_array_equal(states[k + 1], step)


@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("stride", [1, 2])
def test_backprop_through_time_passes_the_dot_product_test(scheme, stride, backend_name):
    """L = Σ_k <h[k], w_k>: run_adjoint's (dh0, dxs, dweights) against the complex step."""
    rng = np.random.default_rng(4)
    seq = GRUSequence(GRUCell(I, HID, scheme), dt=0.5)
    params = _weights(seq.cell, rng)
    args = {**params, "h0": rng.standard_normal((BATCH, HID)),
            "xs": rng.standard_normal((BATCH, L, I))}
    K = -(-L // stride)
    ws = [rng.standard_normal((BATCH, HID)) for _ in range(K)]

    def states(a, bk):
        p = {k: a[k] for k in params}
        return seq.run(p, a["h0"], a["xs"], get_backend(bk), stride=stride)

    hs, tape = states(args, backend_name)
    dh0, dxs, dweights = seq.run_adjoint(params, tape, ws, get_backend(backend_name))
    grads = {**dweights, "h0": dh0, "xs": dxs}
    assert set(grads) == set(args)
    assert np.all(dxs[:, [t for t in range(L) if t % stride]] == 0)  # inputs off the grid
    for name, g in grads.items():
        u = rng.standard_normal(g.shape)
        z = {k: v.astype(complex) for k, v in args.items()}
        z[name] = z[name] + 1e-30j * u
        tangent = sum(np.imag(h) / 1e-30 * w for h, w in zip(states(z, "numpy")[0][1:], ws,
                                                              strict=True))
        assert _dot_rel(tangent, u * g) <= 1e-12, name


def test_sequence_rejects_bad_arguments():
    bk = get_backend("numpy")
    rng = np.random.default_rng(5)
    with pytest.raises(ValueError, match="`scheme`"):
        GRUCell(I, HID, "leapfrog")
    with pytest.raises(TypeError, match="`cell`"):
        GRUSequence("gru")
    with pytest.raises(ValueError, match="`dt`"):
        GRUSequence(GRUCell(I, HID), dt=0.0)
    cell = GRUCell(I, HID)
    params = cell.init(rng)
    h = np.zeros((BATCH, HID))
    with pytest.raises(ValueError, match="`dt`"):
        cell.forward(params, h, -1.0, bk)
    with pytest.raises(ValueError, match="`x`"):
        cell.forward({k: v for k, v in params.items() if k != "x"}, h, 1.0, bk)
    with pytest.raises(ValueError, match="`x`"):
        cell.step(params, h, 1.0, np.zeros((BATCH, I + 1)), bk)
    with pytest.raises(ValueError, match="`h`"):
        cell.forward(params, np.zeros((BATCH, HID + 1)), 1.0, bk)
    seq = GRUSequence(cell)
    xs = np.zeros((BATCH, L, I))
    with pytest.raises(ValueError, match="`start`"):
        seq.phi(params, h, xs, 3, 3, bk)
    with pytest.raises(ValueError, match="`xs`"):
        seq.phi(params, h, xs[..., :2], 0, 1, bk)
    with pytest.raises(ValueError, match="`stride`"):
        seq.run(params, h, xs, bk, stride=0)
    _, tape = seq.run(params, h, xs, bk)
    with pytest.raises(ValueError, match="`dstates`"):
        seq.run_adjoint(params, tape, [None], bk)


# ----------------------------------------------------------------------------- PyTorch
TORCH_NAMES = {"weight_ih": "W_ih", "weight_hh": "W_hh", "bias_ih": "b_ih", "bias_hh": "b_hh"}


@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
def test_classic_cell_at_dt_one_is_torch_gru_cell(backend_name):
    torch = pytest.importorskip("torch")
    bk = get_backend(backend_name)
    rng = np.random.default_rng(6)
    cell = GRUCell(I, HID)
    module = torch.nn.GRUCell(I, HID, dtype=torch.float64)
    params = {ours: getattr(module, t).detach().numpy().copy() for t, ours in TORCH_NAMES.items()}
    h, x, w = (rng.standard_normal(s) for s in ((BATCH, HID), (BATCH, I), (BATCH, HID)))
    out, cache = cell.step(params, h, 1.0, x, bk)
    dh, d = cell.adjoint({**params, "x": x}, cache, w, 1.0, bk)
    ht = torch.tensor(h, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    out_t = module(xt, ht)
    out_t.backward(torch.tensor(w))
    assert _rel(out, out_t.detach().numpy()) <= 1e-12
    assert _rel(dh, ht.grad.numpy()) <= 1e-12 and _rel(d["x"], xt.grad.numpy()) <= 1e-12
    for t, ours in TORCH_NAMES.items():
        assert _rel(d[ours], getattr(module, t).grad.numpy()) <= 1e-12, ours


@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
def test_classic_sequence_is_torch_gru_with_backprop_through_time(backend_name):
    torch = pytest.importorskip("torch")
    bk = get_backend(backend_name)
    rng = np.random.default_rng(7)
    seq = GRUSequence(GRUCell(I, HID), dt=1.0)
    module = torch.nn.GRU(I, HID, batch_first=True, dtype=torch.float64)
    params = {ours: getattr(module, f"{t}_l0").detach().numpy().copy()
              for t, ours in TORCH_NAMES.items()}
    h0, xs = rng.standard_normal((BATCH, HID)), rng.standard_normal((BATCH, L, I))
    ws = rng.standard_normal((BATCH, L, HID))
    states, tape = seq.run(params, h0, xs, bk)
    dh0, dxs, dweights = seq.run_adjoint(params, tape, [ws[:, t] for t in range(L)], bk)
    h0t, xst = torch.tensor(h0[None], requires_grad=True), torch.tensor(xs, requires_grad=True)
    out_t, _ = module(xst, h0t)  # B,L,H: h[1..L]
    out_t.backward(torch.tensor(ws))
    assert _rel(np.stack(states[1:], axis=1), out_t.detach().numpy()) <= 1e-12
    assert _rel(dh0, h0t.grad.numpy()[0]) <= 1e-12 and _rel(dxs, xst.grad.numpy()) <= 1e-12
    for t, ours in TORCH_NAMES.items():
        assert _rel(dweights[ours], getattr(module, f"{t}_l0").grad.numpy()) <= 1e-12, ours
