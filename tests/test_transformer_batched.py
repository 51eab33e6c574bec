"""The transformer encoder step's batched calls (one call per MGRIT sweep) equal per-step ones.

Oracles: k per-step calls of :class:`EncoderStep` (``forward``, ``adjoint``: row j of a batched
call must have their bits, since every product is ``matmul`` of the stacks, the per-step 2-D
GEMM per row, and the rest is row-wise), the whole layer-parallel gradient of the
``transformer`` and ``gpt`` models with the batched path off (``batched_sweeps_pay`` patched
to False), and, in float64, central differences of the batched forward in the dot-product
form <J v, w> = <v, Jᵀ w> (states and weights).
"""

import sys

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layer_parallel import AdjointPropagator, ForwardPropagator, LayerParallelSettings
from refbraid.layers import EncoderStep
from refbraid.network import group
from refbraid.parallel import run_ranks
from refbraid.sequence import GPTModel, Seq2SeqModel, TransformerModel
from refbraid.sequence.block_gradient import for_batch

transformer_module = sys.modules["refbraid.layers.transformer"]
batched_module = sys.modules["refbraid.layers.transformer_batched"]


def _stack(rng, step, k=4, B=3, dtype=np.float64):
    """k layers' weights (perturbed away from torch's γ = 1, β = 0, zero biases), stacked."""
    layers = []
    for _ in range(k):
        p = step.init(rng, dtype)
        layers.append({n: (v + 0.1 * rng.standard_normal(v.shape)).astype(dtype)
                       for n, v in p.items()})
    stacked = {n: np.stack([p[n] for p in layers]) for n in layers[0]}
    Y = rng.standard_normal((k, B, step.seq_len, step.dim)).astype(dtype)
    return layers, stacked, Y


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mask", ["none", "causal", "padding"])
def test_rows_are_the_per_step_bits(backend, dtype, mask):
    bk = get_backend(backend)
    rng = np.random.default_rng(3)
    step = EncoderStep(8, 2, 12, 5, causal=mask == "causal")
    layers, P, Y = _stack(rng, step, dtype=dtype)
    if mask == "padding":  # per layer (B, T) masks, stacked as the propagators stack params
        kpm = rng.random((3, 5)) < 0.3
        kpm[:, 0] = False
        for p in layers:
            p["key_padding_mask"] = kpm
        P["key_padding_mask"] = np.stack([kpm] * 4)
    h = np.array([0.25, 0.5, 0.25, 0.75])
    dY = rng.standard_normal(Y.shape).astype(dtype)
    Y_next, Z = step.forward_batched(P, Y, h, bk)
    dYs, dP = step.adjoint_batched(P, Y, Z, dY, h, bk, grads=True)
    dYs_only, none = step.adjoint_batched(P, Y, Z, dY, h, bk, grads=False)
    assert none is None
    for j in range(4):
        y_next, cache = step.forward(layers[j], Y[j], float(h[j]), bk)
        assert np.array_equal(Y_next[j], y_next)
        dy, dp = step.adjoint(layers[j], cache, dY[j], float(h[j]), bk)
        assert np.array_equal(dYs[j], dy) and np.array_equal(dYs_only[j], dy)
        assert set(dP) == set(dp)
        # the packed row (Y[j], Z[j]) is a cache the per-step adjoint accepts, with equal bits
        dy_packed, dp_packed = step.adjoint(layers[j], (Y[j], Z[j]), dY[j], float(h[j]), bk)
        assert np.array_equal(dy_packed, dy)
        for name in dp:
            assert np.array_equal(dP[name][j], dp[name]), name
            assert np.array_equal(dp_packed[name], dp[name]), name


def test_batched_adjoint_matches_finite_differences():
    bk = get_backend("numpy")
    rng = np.random.default_rng(7)
    step = EncoderStep(8, 2, 12, 4, causal=True)
    _, P, Y = _stack(rng, step, k=3, B=2)
    h, eps = np.array([0.3, 0.6, 0.9]), 1e-6
    v = rng.standard_normal(Y.shape)
    V = {n: rng.standard_normal(a.shape) for n, a in P.items()}
    w = rng.standard_normal(Y.shape)
    _, Z = step.forward_batched(P, Y, h, bk)
    JTw, dP = step.adjoint_batched(P, Y, Z, w, h, bk)

    def F(Y_, P_):
        return step.forward_batched(P_, Y_, h, bk)[0]

    # states: <(F(Y + εv) − F(Y − εv)) / 2ε, w> = <v, Jᵀ w>
    Jv = (F(Y + eps * v, P) - F(Y - eps * v, P)) / (2 * eps)
    lhs, rhs = np.vdot(Jv, w), np.vdot(v, JTw)
    assert abs(lhs - rhs) <= 1e-7 * max(abs(lhs), 1.0)
    # weights, every row's at once: <∂F/∂θ V, w> = Σ_name <V[name], dP[name]>
    Jt = (F(Y, {n: P[n] + eps * V[n] for n in P}) - F(Y, {n: P[n] - eps * V[n] for n in P}))
    lhs = np.vdot(Jt / (2 * eps), w)
    rhs = sum(np.vdot(V[n], dP[n]) for n in P)
    assert abs(lhs - rhs) <= 1e-7 * max(abs(lhs), 1.0)
    # linearity of the adjoint in w (the dot-product test's premise)
    w2 = rng.standard_normal(Y.shape)
    both = step.adjoint_batched(P, Y, Z, 3.0 * w + w2, h, bk, grads=False)[0]
    assert np.allclose(both, 3.0 * JTw + step.adjoint_batched(P, Y, Z, w2, h, bk, False)[0],
                       rtol=1e-13, atol=1e-13)


def test_mixed_intervals_give_the_per_interval_steps():
    """One propagator call over intervals of different lengths (a level's shorter last
    interval, coarse step sizes): row j is the per-interval Φ / Ψ."""
    model = TransformerModel(7, 4, 3, 11, 8, 2, 12, 2.0)
    bk = get_backend("numpy")
    rng = np.random.default_rng(2)
    steps = group(model.init_params(rng), "steps")
    states = rng.standard_normal((12, 3, 4, 8))
    net = for_batch(model.net, 3)
    fwd = ForwardPropagator(net, steps, bk)
    adj = AdjointPropagator(net, steps, states, bk)
    starts, stops = np.array([0, 4, 8, 9]), np.array([4, 8, 9, 11])
    U = rng.standard_normal((4, 3, 4, 8))
    out = fwd.batched_step(U, starts, stops)
    back = adj.batched_step(U, stops, starts)
    for j in range(4):
        assert np.array_equal(out[j], fwd.step(U[j], starts[j], stops[j]))
        assert np.array_equal(back[j], adj.step(U[j], stops[j], starts[j]))


SETTINGS = [
    LayerParallelSettings(),  # TorchBraid's defaults
    LayerParallelSettings.with_iterations(3, 2, levels=3, cfactor=2, skip_first_down=True),
]


def _model(kind, dtype):
    rng = np.random.default_rng(1)
    if kind == "transformer":
        m = TransformerModel(7, 4, 3, 19, 8, 2, 12, 2.0)
        y = rng.integers(0, 3, 5)
    elif kind == "seq2seq":  # the encoder block batched, the decoder's steps per step
        m = Seq2SeqModel(7, 4, 6, 19, 8, 2, 12, 2.0)
        y = rng.integers(0, 6, (5, 4))
    else:
        m = GPTModel(9, 5, 19, 8, 2, 12, 2.0)
        y = rng.integers(0, 9, (5, 5))
    params = m.init_params(rng, dtype)
    return m, params, rng.integers(0, m.vocab_size, (5, m.seq_len)), y


@pytest.mark.parametrize("settings", SETTINGS, ids=["torchbraid", "L3-m2"])
@pytest.mark.parametrize("kind,dtype,backend", [
    ("transformer", np.float64, "numpy"), ("gpt", np.float64, "numpy"),
    ("seq2seq", np.float64, "numpy"),
    ("transformer", np.float32, "numpy"), ("gpt", np.float64, "numba"),
    ("transformer", np.float32, "numba")])
def test_gradient_is_bit_identical_to_per_step(monkeypatch, settings, kind, dtype, backend):
    m, params, x, y = _model(kind, dtype)
    calls = []
    spy = transformer_module.forward_batched
    monkeypatch.setattr(transformer_module, "forward_batched",
                        lambda *a: calls.append(1) or spy(*a))
    loss_b, g_b, info_b = m.layer_parallel_gradient(params, x, y, settings, backend)
    assert calls, "the batched path was not taken"
    monkeypatch.setattr(transformer_module, "batched_pays", lambda B, T: False)
    n_calls = len(calls)
    loss_p, g_p, info_p = m.layer_parallel_gradient(params, x, y, settings, backend)
    assert len(calls) == n_calls  # the per-step run made no batched call
    assert loss_b == loss_p
    for name in g_p:
        assert np.array_equal(g_b[name], g_p[name]), name
    blocks = ((info_b.encoder, info_p.encoder), (info_b.decoder, info_p.decoder)) \
        if kind == "seq2seq" else ((info_b, info_p),)
    for b, p in blocks:
        assert np.array_equal(b.states, p.states)
        assert np.array_equal(b.adjoints, p.adjoints)
    assert info_b.stats()["phi_calls"] == info_p.stats()["phi_calls"]


def test_thread_ranks_with_uneven_blocks_give_the_serial_trajectory():
    from refbraid.mgrit import Problem, gather_solution, solve

    m, params, x, _ = _model("gpt", np.float64)
    bk = get_backend("numpy")
    net = for_batch(m.net, x.shape[0])
    assert net.step.batched_sweeps_pay
    y0, _ = net.opening.forward(group(params, "opening"), x, bk)
    steps = group(params, "steps")
    settings = LayerParallelSettings.with_iterations(3, 2, levels=3, cfactor=2).forward

    def problem():
        return Problem(step=ForwardPropagator(net, steps, bk), u0=y0, n_steps=net.n_layers)

    serial = solve(problem(), settings).solution
    for size in (2, 3):
        got = run_ranks(size, lambda comm: gather_solution(solve(problem(), settings,
                                                                 comm=comm), comm))
        np.testing.assert_array_equal(got[0], serial)


def test_switched_on_for_small_batches_only():
    """Batched sweeps paid for B·T ≤ 64 tokens (docs/batched.md): the models switch them on
    per batch; the flag is not part of the step's identity."""
    step = EncoderStep(8, 2, 12, 16)
    assert not step.batched_sweeps_pay  # off unless a batch is known
    assert step.for_batch(4).batched_sweeps_pay and not step.for_batch(5).batched_sweeps_pay
    assert step.for_batch(4) == step
    assert for_batch(TransformerModel(7, 16, 3, 4, 8, 2, 12).net, 4).step.batched_sweeps_pay


def test_bad_stacks_are_named():
    bk = get_backend("numpy")
    step = EncoderStep(8, 2, 12, 5)
    _, P, Y = _stack(np.random.default_rng(0), step)
    with pytest.raises(ValueError, match="`Y` must have shape"):
        step.forward_batched(P, Y[0], np.ones(4), bk)
    with pytest.raises(ValueError, match="`h` must hold one step size per row"):
        step.forward_batched(P, Y, np.ones(3), bk)
    _, Z = step.forward_batched(P, Y, np.ones(4), bk)
    with pytest.raises(ValueError, match="`dY_next` must have shape"):
        step.adjoint_batched(P, Y, Z, Y[:2], np.ones(4), bk)


@pytest.mark.parametrize("token_rows", [1, 60], ids=["1-layer-chunks", "3-layer-chunks"])
def test_chunked_calls_give_the_same_bits(monkeypatch, token_rows):
    """Sweeps cut into chunks of TOKEN_ROWS_PER_CALL // (B·T) layers (B·T = 20 here; one
    layer: the per-step calls): the same gradient, also where the adjoint's rows come from
    several forward chunks."""
    m, params, x, y = _model("transformer", np.float64)
    ref = m.layer_parallel_gradient(params, x, y, SETTINGS[1])[1]
    monkeypatch.setattr(batched_module, "TOKEN_ROWS_PER_CALL", token_rows)
    monkeypatch.setattr(batched_module, "MIN_LAYERS_PER_CALL", 1)
    got = m.layer_parallel_gradient(params, x, y, SETTINGS[1])[1]
    for name in ref:
        assert np.array_equal(got[name], ref[name]), name
    step = m.net.step
    layers, P, Y = _stack(np.random.default_rng(4), step, k=7, B=5)
    h = np.linspace(0.1, 0.7, 7)
    Y_next, Z = step.forward_batched(P, Y, h, get_backend("numpy"))
    dY = np.random.default_rng(5).standard_normal(Y.shape)
    rows = [6, 4, 3, 2, 0]  # rows of two or three forward chunks, in reverse, uneven
    dYs, dP = step.adjoint_batched({n: v[rows] for n, v in P.items()}, Y[rows], Z[rows],
                                   dY[rows], h[rows], get_backend("numpy"))
    for i, j in enumerate(rows):
        y_next, cache = step.forward(layers[j], Y[j], float(h[j]), get_backend("numpy"))
        assert np.array_equal(Y_next[j], y_next)
        dy, dp = step.adjoint(layers[j], cache, dY[j], float(h[j]), get_backend("numpy"))
        assert np.array_equal(dYs[i], dy)
        for name in dp:
            assert np.array_equal(dP[name][i], dp[name]), name
