"""Transformer layers (layer norm, attention, MLP, encoder/decoder ODE steps, embedding, heads)
and their kernels (softmax, layer norm, batched matmul, embedding scatter) on every backend.

What proves what:

* kernels: the numba and cuda versions against the NumPy reference (≤1e-12 float64, ≤1e-5
  float32), masks and fully masked rows included; the reference softmax and layer norm are
  complex-step safe (their complex-step derivative equals their adjoint);
* layers on numpy and numba: refbraid.verify's check_layer / check_step (complex-step
  dot-product test ≤1e-12 and central differences ≤1e-7 for the input and every parameter,
  backend against NumPy ≤1e-12), with masks and full-batch memories;
* layers on cuda (Numba's CUDA simulator, one Python thread per GPU thread, so a forward
  pass costs seconds): :func:`simulator_check` — the dot-product test of every argument,
  backend against NumPy for the output and every adjoint, and one central difference along a
  random direction through all arguments at once (2 forward passes instead of 2 per entry);
* semantics: causal and padding masks hide exactly what they should, a fully masked query
  gives ``b_out`` and no NaN, a batch-1 memory broadcasts;
* PyTorch (optional, ``pytest.importorskip("torch")``): nn.LayerNorm, nn.MultiheadAttention,
  the MLP, nn.TransformerEncoderLayer / DecoderLayer (norm_first, h = 1), nn.Embedding and
  cross_entropy on copied weights, forward and every gradient, ≤1e-12 in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import BACKEND_PARAMS, backend_or_skip

from refbraid.backends import get_backend
from refbraid.backends import numba_cuda_attention as cuda_attention
from refbraid.backends import reference as R
from refbraid.layers import (
    MLP,
    DecoderStep,
    EncoderStep,
    LayerNorm,
    MultiheadAttention,
    PooledClassifier,
    TokenClassifier,
    TokenEmbedding,
    sinusoidal_positions,
    token_cross_entropy,
    token_cross_entropy_adjoint,
)
from refbraid.network import Network
from refbraid.verify import check_layer, check_network, check_step

TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}  # kernels / backends vs numpy
TOL_DOT, TOL_FD = 1e-12, 1e-7  # float64 adjoint checks
FD_STEP = float(np.finfo(np.float64).eps ** (1 / 3))  # balances truncation and round-off
COMPLEX_STEP = 1e-30

BATCH = 2
H = 0.3  # step size of the ODE-step checks
CPU_BACKENDS = ["numpy", "numba"]
FAST_BACKENDS = ["numba", "cuda"]  # kernels compared with the reference


def _failures(results) -> str:
    return "\n".join(str(r) for r in results if not r.passed)


def _assert_pass(results) -> None:
    assert results and not _failures(results), _failures(results)


def _rel(a, ref) -> float:
    """Normwise relative error max|a − ref| / max|ref| (inf on a shape mismatch or NaN)."""
    a, ref = np.asarray(a, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if a.shape != ref.shape or not np.all(np.isfinite(a)):
        return np.inf
    return float(np.abs(a - ref).max(initial=0.0)) / max(float(np.abs(ref).max(initial=0.0)),
                                                          1e-300)


def _dot_rel(lhs_terms, rhs_terms) -> float:
    """|Σ lhs − Σ rhs| relative to the sizes of the terms summed (Cauchy–Schwarz scale)."""
    scale = max(np.abs(lhs_terms).sum(), np.abs(rhs_terms).sum(), 1e-300)
    return float(abs(lhs_terms.sum() - rhs_terms.sum()) / scale)


# ----------------------------------------------------------------------------- helpers
class WithData:
    """``inner`` with fixed data entries (masks) merged into its params on every call, so the
    harness differentiates the weights while the masks stay constant."""

    def __init__(self, inner, **data):
        self.inner = inner
        self.data = data

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, params, y, *args):  # args end with the backend
        return self.inner.forward({**params, **_on(args[-1], self.data)}, y, *args)

    def adjoint(self, params, cache, d, *args, **kwargs):
        return self.inner.adjoint({**params, **_on(args[-1], self.data)}, cache, d, *args,
                                  **kwargs)


def _on(bk, tree):
    """NumPy arrays of ``tree`` (a dict or an array) moved to backend ``bk``'s device (the
    ``cuda`` backend keeps its arrays there; numpy and numba leave them as they are)."""
    if isinstance(tree, dict):
        return {k: _on(bk, v) for k, v in tree.items()}
    return get_backend(bk).asarray(tree) if isinstance(tree, np.ndarray) else tree


class FullBatchMemory(WithData):
    """A cross-attention layer or decoder step whose memory has the full batch (B, S, E)."""

    def init(self, rng, dtype=np.float64):
        params = self.inner.init(rng, dtype)
        _, S, E = params["memory"].shape
        params["memory"] = rng.standard_normal((BATCH, S, E)).astype(dtype)
        return params


def simulator_check(layer, backend: str, *, seed: int = 0) -> list[str]:
    """The checks affordable in the CUDA simulator, in float64; returns the failures.

    For out = f(θ, x) (an ODE step at h = H, or a plain layer) and a random cotangent w:
    the backend's output and adjoints against the NumPy reference (≤1e-12 normwise); the
    dot-product test <J_a u, w> = <u, J_aᵀ w> for every argument a (J_a u by the complex step
    on the reference, J_aᵀ w from the backend, ≤1e-12); and one central difference of <f, w>
    on the backend along a random direction u through all arguments at once, ≤1e-7 relative
    to Σ_i |u_i (Jᵀw)_i| (the size of the terms it sums, as the dot-product test: a random
    direction's derivative can cancel to far below them, a wrong adjoint term cannot).
    """
    step = hasattr(layer, "state_shape")
    x_name = "y" if step else "x"
    rng = np.random.default_rng(seed)
    params = layer.init(rng, np.float64)
    if hasattr(layer, "example_input"):
        x = layer.example_input(rng, BATCH)
    else:
        x = rng.standard_normal((BATCH, *(layer.state_shape if step else layer.in_shape)))
    discrete = getattr(layer, "discrete_input", False)

    def forward(bk, a):  # host arrays in and out; on the backend's device in between
        a = _on(bk, a)
        p = {k: a[k] for k in params}
        out, cache = (layer.forward(p, a[x_name], H, bk) if step else
                      layer.forward(p, a[x_name], bk))
        return bk.to_numpy(out), cache

    def adjoint(bk, cache, w):
        on = _on(bk, params)
        if step:
            dx, dp = layer.adjoint(on, cache, _on(bk, w), H, bk)
        else:
            dx, dp = layer.adjoint(on, cache, _on(bk, w), bk)
        grads = dp if discrete else {**dp, x_name: dx}
        return {k: bk.to_numpy(g) for k, g in grads.items()}

    bk, ref = get_backend(backend), get_backend("numpy")
    args = {**params, x_name: x}
    out, cache = forward(bk, args)
    w = rng.standard_normal(out.shape)
    grads = adjoint(bk, cache, w)
    out_r, cache_r = forward(ref, args)
    grads_r = adjoint(ref, cache_r, w)
    failures = []
    errors = {"numpy:out": _rel(out, out_r)}
    errors.update({f"numpy:d{k}": _rel(grads.get(k), g) for k, g in grads_r.items()})
    failures += [f"{k}: {e:.2e}" for k, e in errors.items() if not e <= TOL[out.dtype]]
    for k, g in grads.items():  # dot-product test
        u = rng.standard_normal(g.shape)
        z = {n: (v.astype(complex) if v.dtype.kind == "f" else v) for n, v in args.items()}
        z[k] = z[k] + 1j * COMPLEX_STEP * u
        tangent = np.imag(forward(ref, z)[0]) / COMPLEX_STEP
        err = _dot_rel(tangent * w, u * g)
        if not err <= TOL_DOT:
            failures.append(f"dot:{k}: {err:.2e}")
    u = {k: rng.standard_normal(g.shape) for k, g in grads.items()}  # one direction for all
    plus = forward(bk, {**args, **{k: args[k] + FD_STEP * u[k] for k in u}})[0]
    minus = forward(bk, {**args, **{k: args[k] - FD_STEP * u[k] for k in u}})[0]
    fd = float(np.sum((plus - minus) * w)) / (2 * FD_STEP)
    terms = np.concatenate([(u[k] * grads[k]).ravel() for k in grads])  # <u, Jᵀw> by entry
    adj, scale = float(terms.sum()), float(np.abs(terms).sum())
    if not abs(fd - adj) <= TOL_FD * max(abs(fd), scale):
        failures.append(f"fd:direction: fd {fd!r} vs adjoint {adj!r} (scale {scale:.3g})")
    return failures


# ----------------------------------------------------------------------------- kernels
def _random_mask(rng, shape):
    mask = rng.random(shape) < 0.4
    mask[0, 0, :] = True  # one fully masked row
    mask[-1, -1, :] = False  # one row with nothing masked
    return mask


@pytest.mark.parametrize("backend_name", FAST_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_softmax_kernels_match_the_reference(backend_name, dtype):
    bk = get_backend(backend_name)
    tol = TOL[np.dtype(dtype)]
    rng = np.random.default_rng(1)
    x = (3 * rng.standard_normal((3, 4, 5))).astype(dtype)  # G,T,S
    dp = rng.standard_normal(x.shape).astype(dtype)
    for mask in (None, _random_mask(rng, x.shape)):
        p, p_ref = bk.softmax(x, mask), R.softmax(x, mask)
        assert p.dtype == dtype and p.shape == x.shape
        assert _rel(p, p_ref) <= tol
        assert _rel(bk.softmax_adjoint(p_ref, dp), R.softmax_adjoint(p_ref, dp)) <= tol
    assert np.all(p[0, 0] == 0) and np.all(np.isfinite(p))  # fully masked row: zeros


@pytest.mark.parametrize("backend_name", FAST_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layernorm_kernels_match_the_reference(backend_name, dtype):
    bk = get_backend(backend_name)
    tol = TOL[np.dtype(dtype)]
    rng = np.random.default_rng(2)
    x = (1 + 2 * rng.standard_normal((2, 3, 5))).astype(dtype)
    gamma, beta, dy = (rng.standard_normal(s).astype(dtype) for s in (5, 5, x.shape))
    out, ref = bk.layernorm(x, gamma, beta, 1e-5), R.layernorm(x, gamma, beta, 1e-5)
    for a, r in zip(out, ref, strict=True):
        assert a.dtype == dtype and a.shape == r.shape and _rel(a, r) <= tol
    _, mean, rstd = ref
    adj, adj_ref = (k(x, mean, rstd, gamma, dy) for k in (bk.layernorm_adjoint,
                                                          R.layernorm_adjoint))
    for a, r in zip(adj, adj_ref, strict=True):
        assert a.dtype == dtype and a.shape == r.shape and _rel(a, r) <= tol


@pytest.mark.parametrize("backend_name", FAST_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bmm_and_embedding_kernels_match_the_reference(backend_name, dtype):
    bk = get_backend(backend_name)
    tol = TOL[np.dtype(dtype)]
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4, 5)).astype(dtype)  # G,M,K
    b = rng.standard_normal((3, 5, 2)).astype(dtype)  # G,K,N
    c = bk.bmm(a, b)
    assert c.dtype == dtype and _rel(c, a @ b) <= tol
    assert _rel(bk.bmm(a, np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1)),
                a @ b) <= tol  # non-contiguous operand
    tokens = rng.integers(0, 6, size=(2, 5))
    dout = rng.standard_normal((2, 5, 3)).astype(dtype)
    dW = bk.embedding_adjoint(tokens, dout, 6)
    assert dW.dtype == dtype and _rel(dW, R.embedding_adjoint(tokens, dout, 6)) <= tol
    assert _rel(bk.embedding(tokens, dW), dW[tokens]) == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cuda_tiled_bmm_matches_the_reference(monkeypatch, dtype):
    """The shared-memory tiled path (used when both output sides reach TILE), with a 4×4 tile
    so that the simulator covers several tiles, ragged edges and two K-slabs cheaply."""
    monkeypatch.setattr(cuda_attention, "TILE", 4)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 9, 7)).astype(dtype)  # G,M,K: 3 row tiles, 2 K-slabs
    b = rng.standard_normal((2, 7, 6)).astype(dtype)  # G,K,N: 2 column tiles
    c = get_backend("cuda").bmm(a, b)
    assert c.dtype == dtype and _rel(c, a @ b) <= TOL[np.dtype(dtype)]


def test_reference_softmax_and_layernorm_are_complex_step_safe():
    """Im f(x + iεv)/ε equals the Jacobian-vector product the adjoints imply (masked too)."""
    rng = np.random.default_rng(5)
    eps = 1e-30
    x, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    mask = _random_mask(rng, x.shape)
    p = R.softmax(x, mask)
    jvp = np.imag(R.softmax(x + 1j * eps * v, mask)) / eps
    assert _rel(jvp, R.softmax_adjoint(p, v)) <= 1e-14  # the softmax Jacobian is symmetric
    assert np.all(jvp[mask] == 0)
    gamma, beta, w = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(x.shape)
    _, mean, rstd = R.layernorm(x, gamma, beta, 1e-5)
    jvp = np.imag(R.layernorm(x + 1j * eps * v, gamma, beta, 1e-5)[0]) / eps
    dx, _, _ = R.layernorm_adjoint(x, mean, rstd, gamma, w)
    assert _dot_rel(jvp * w, v * dx) <= 1e-13


def test_kernels_reject_bad_arguments():
    nb = get_backend("numba")
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match="`mask`"):
        nb.softmax(x, np.zeros((2, 2), dtype=bool))
    with pytest.raises(ValueError, match="`gamma`"):
        nb.layernorm(x, np.ones(2), np.zeros(3), 1e-5)
    with pytest.raises(ValueError, match="`b`"):
        get_backend("cuda").bmm(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="`tokens`"):
        nb.embedding_adjoint(np.array([0, 7]), np.zeros((2, 3)), 5)


# ----------------------------------------------------------------------------- layers
E, NH, T, S, F = 8, 2, 4, 3, 12  # numpy/numba sizes
E_SIM, T_SIM, S_SIM, F_SIM = 4, 3, 2, 6  # cuda-simulator sizes


def _padding(B: int, L: int, pad_last: int) -> np.ndarray:
    """(B, L) key-padding mask: sample 0 pads its last ``pad_last`` tokens, the others none."""
    mask = np.zeros((B, L), dtype=bool)
    mask[0, L - pad_last :] = True
    return mask


def layer_cases(E=E, T=T, S=S, F=F):
    """(name, layer) pairs: every transformer layer, with masks and full-batch memories."""
    return [
        ("layernorm", LayerNorm(E, T)),
        ("mlp", MLP(E, F, T)),
        ("self_attention", MultiheadAttention(E, NH, T)),
        ("self_attention[causal+padding]", WithData(MultiheadAttention(E, NH, T, causal=True),
                                                    key_padding_mask=_padding(BATCH, T, 1))),
        ("cross_attention[memory 1,S,E]", MultiheadAttention(E, NH, T, memory_len=S)),
        ("cross_attention[memory B,S,E + padding]",
         FullBatchMemory(MultiheadAttention(E, NH, T, memory_len=S),
                         key_padding_mask=_padding(BATCH, S, 1))),
        ("encoder_step", EncoderStep(E, NH, F, T)),
        ("encoder_step[causal+padding]", WithData(EncoderStep(E, NH, F, T, causal=True),
                                                  key_padding_mask=_padding(BATCH, T, 2))),
        ("decoder_step[memory 1,S,E]", DecoderStep(E, NH, F, T, S)),
        ("decoder_step[memory B,S,E + padding]",
         FullBatchMemory(DecoderStep(E, NH, F, T, S), key_padding_mask=_padding(BATCH, T, 1),
                         memory_padding_mask=_padding(BATCH, S, 1))),
        ("token_embedding[sinusoidal]", TokenEmbedding(7, E, T)),
        ("token_embedding[learned]", TokenEmbedding(7, E, T, "learned")),
        ("pooled_classifier", PooledClassifier(T, E, 3)),
        ("token_classifier", TokenClassifier(T, E, 3)),
    ]


CASES = layer_cases()
SIM_CASES = [c for c in layer_cases(E_SIM, T_SIM, S_SIM, F_SIM)
             if c[0] in ("mlp", "self_attention[causal+padding]",
                         "cross_attention[memory B,S,E + padding]", "encoder_step",
                         "decoder_step[memory B,S,E + padding]", "token_embedding[learned]")]


def _check(layer, backend, dtype=np.float64):
    run = check_step if hasattr(layer, "state_shape") else check_layer
    return run(layer, backend, dtype, batch=BATCH, h=H) if run is check_step else \
        run(layer, backend, dtype, batch=BATCH)


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
@pytest.mark.parametrize(("name", "layer"), CASES, ids=[c[0] for c in CASES])
def test_layer_passes_the_dot_product_and_fd_checks(name, layer, backend_name):
    results = _check(layer, backend_name)
    _assert_pass(results)
    checks = {r.check for r in results}
    params = layer.init(np.random.default_rng(0))
    for arg in params:  # every weight (and memory) is checked by both methods
        assert {f"dot:{arg}", f"fd:{arg}"} <= checks
    if not getattr(layer, "discrete_input", False):
        own = "y" if hasattr(layer, "state_shape") else "x"
        assert {f"dot:{own}", f"fd:{own}"} <= checks


@pytest.mark.parametrize(("name", "layer"), [c for c in CASES if "step" in c[0]],
                         ids=[c[0] for c in CASES if "step" in c[0]])
def test_steps_pass_in_float32_on_numba(name, layer):
    _assert_pass(_check(layer, "numba", np.float32))


@pytest.mark.parametrize("backend_name", [p for p in BACKEND_PARAMS if p.values[0] == "cuda"])
@pytest.mark.parametrize(("name", "layer"), SIM_CASES, ids=[c[0] for c in SIM_CASES])
def test_layer_passes_on_cuda(name, layer, backend_name):
    backend_or_skip(backend_name)
    failures = simulator_check(layer, backend_name)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
def test_a_transformer_network_backprops_exactly(backend_name):
    """Embedding → 2 encoder steps → pooled head: refbraid.network's sequential backprop of
    the loss against the complex step and central differences, every parameter."""
    net = Network(TokenEmbedding(7, E, T), EncoderStep(E, NH, F, T), PooledClassifier(T, E, 3),
                  n_layers=2)
    _assert_pass(check_network(net, backend_name, batch=BATCH))


# ----------------------------------------------------------------------------- semantics
def _forward(layer, params, y, bk="numpy"):
    bk = get_backend(bk)
    if hasattr(layer, "state_shape"):
        return layer.forward(params, y, H, bk)[0]
    return layer.forward(params, y, bk)[0]


def test_causal_mask_hides_later_tokens():
    step = EncoderStep(E, NH, F, T, causal=True)
    rng = np.random.default_rng(6)
    params, y = step.init(rng), rng.standard_normal((BATCH, T, E))
    moved = y.copy()
    moved[:, -1] += rng.standard_normal((BATCH, E))
    a, b = _forward(step, params, y), _forward(step, params, moved)
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], rtol=0, atol=1e-14)
    assert np.abs(a[:, -1] - b[:, -1]).max() > 1e-3


def test_key_padding_hides_padded_keys_and_a_fully_masked_query_gives_the_bias():
    layer = MultiheadAttention(E, NH, T)
    rng = np.random.default_rng(7)
    params, x = layer.init(rng), rng.standard_normal((BATCH, T, E))
    params["b_out"] = rng.standard_normal(E)
    pad = _padding(BATCH, T, 2)
    moved = x.copy()
    moved[0, -2:] += 1.0  # change the padded tokens of sample 0
    a = _forward(layer, {**params, "key_padding_mask": pad}, x)
    b = _forward(layer, {**params, "key_padding_mask": pad}, moved)
    np.testing.assert_allclose(a[0, :-2], b[0, :-2], rtol=0, atol=1e-14)  # unpadded queries
    np.testing.assert_array_equal(a[1], b[1])
    everything = np.ones((BATCH, T), dtype=bool)
    for backend in ("numpy", "numba", "cuda"):
        bk = get_backend(backend)
        on = _on(bk, params)
        out, cache = layer.forward({**on, "key_padding_mask": bk.asarray(everything)},
                                   bk.asarray(x), bk)
        out = bk.to_numpy(out)
        np.testing.assert_allclose(out, np.broadcast_to(params["b_out"], out.shape), atol=1e-15)
        dx, dparams = layer.adjoint(on, cache, bk.asarray(np.ones_like(out)), bk)
        dx, dparams = bk.to_numpy(dx), {k: bk.to_numpy(v) for k, v in dparams.items()}
        assert np.all(np.isfinite(dx)) and all(np.all(np.isfinite(v)) for v in dparams.values())


def test_a_batch_one_memory_broadcasts_and_its_adjoint_is_summed():
    step = DecoderStep(E, NH, F, T, S)
    rng = np.random.default_rng(8)
    params, y = step.init(rng), rng.standard_normal((BATCH, T, E))
    full = {**params, "memory": np.repeat(params["memory"], BATCH, axis=0)}
    bk = get_backend("numpy")
    out1, cache1 = step.forward(params, y, H, bk)
    outB, cacheB = step.forward(full, y, H, bk)
    assert _rel(out1, outB) <= 1e-15
    w = rng.standard_normal(y.shape)
    _, d1 = step.adjoint(params, cache1, w, H, bk)
    _, dB = step.adjoint(full, cacheB, w, H, bk)
    assert d1["memory"].shape == (1, S, E) and dB["memory"].shape == (BATCH, S, E)
    assert _rel(d1["memory"], dB["memory"].sum(axis=0, keepdims=True)) <= 1e-14


def test_h_one_step_is_the_pre_norm_block_and_grads_false_skips_weights():
    step = EncoderStep(E, NH, F, T)
    rng = np.random.default_rng(9)
    params, y = step.init(rng), rng.standard_normal((BATCH, T, E))
    bk = get_backend("numpy")
    parts = step.parts()
    sub = {name: {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(name + ".")}
           for name in parts}
    a = parts["sa"].forward(sub["sa"], parts["ln1"].forward(sub["ln1"], y, bk)[0], bk)[0]
    x1 = y + a
    x2 = x1 + parts["mlp"].forward(sub["mlp"], parts["ln2"].forward(sub["ln2"], x1, bk)[0], bk)[0]
    out, cache = step.forward(params, y, 1.0, bk)
    assert _rel(out, x2) <= 1e-15
    dy, none = step.adjoint(params, cache, np.ones_like(y), 1.0, bk, grads=False)
    assert none is None and dy.shape == y.shape


def test_sinusoidal_positions_follow_the_formula():
    P = sinusoidal_positions(6, 5)
    for t in range(6):
        for i in range(5):
            angle = t / 10000 ** (2 * (i // 2) / 5)
            assert P[t, i] == pytest.approx(math.sin(angle) if i % 2 == 0 else math.cos(angle),
                                            abs=1e-15)
    emb = TokenEmbedding(7, 5, 6)
    params = emb.init(np.random.default_rng(0), np.float32)
    tokens = emb.example_input(np.random.default_rng(1), 3)
    out = emb.forward(params, tokens, get_backend("numpy"))[0]
    assert out.dtype == np.float32 and out.shape == (3, 6, 5)
    np.testing.assert_allclose(out, params["W"][tokens] + P.astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
def test_token_cross_entropy_adjoint_matches_the_complex_step(backend_name):
    bk = get_backend(backend_name)
    rng = np.random.default_rng(10)
    logits, labels = rng.standard_normal((BATCH, T, 5)), rng.integers(0, 5, size=(BATCH, T))
    loss, probs = token_cross_entropy(logits, labels, bk)
    dlogits = token_cross_entropy_adjoint(probs, labels, bk, 2.0)
    v = rng.standard_normal(logits.shape)
    tangent = np.imag(token_cross_entropy(logits + 1e-30j * v, labels,
                                          get_backend("numpy"))[0]) / 1e-30
    assert _dot_rel(2.0 * tangent, v * dlogits) <= 1e-12
    flat = -np.log(probs.reshape(-1, 5)[np.arange(BATCH * T), labels.reshape(-1)]).mean()
    assert float(loss) == pytest.approx(flat, rel=1e-14)


def test_layers_reject_bad_arguments():
    with pytest.raises(ValueError, match="`dim`"):
        MultiheadAttention(6, 4)
    with pytest.raises(ValueError, match="`causal`"):
        MultiheadAttention(4, 2, 3, causal=True, memory_len=2)
    with pytest.raises(ValueError, match="`eps`"):
        LayerNorm(4, eps=0.0)
    with pytest.raises(ValueError, match="`positional`"):
        TokenEmbedding(5, 4, 3, "rotary")
    with pytest.raises(ValueError, match="`hidden`"):
        EncoderStep(4, 2, 0, 3)
    bk = get_backend("numpy")
    rng = np.random.default_rng(0)
    layer = MultiheadAttention(4, 2, 3)
    params, x = layer.init(rng), rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match="`key_padding_mask`"):
        layer.forward({**params, "key_padding_mask": np.zeros((2, 3))}, x, bk)
    with pytest.raises(ValueError, match="`x`"):
        layer.forward(params, x[..., :3], bk)
    dec = DecoderStep(4, 2, 6, 3, 2)
    p = dec.init(rng)
    with pytest.raises(ValueError, match="`memory`"):
        dec.forward({k: v for k, v in p.items() if k != "memory"}, x, H, bk)
    with pytest.raises(ValueError, match="`y`"):
        dec.forward(p, x[:, :2], H, bk)
    emb = TokenEmbedding(5, 4, 3)
    with pytest.raises(TypeError, match="`x`"):
        emb.forward(emb.init(rng), np.zeros((2, 3)), bk)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        emb.forward(emb.init(rng), np.full((2, 3), 5), bk)
    with pytest.raises(ValueError, match="`labels`"):
        token_cross_entropy(np.zeros((2, 3, 4)), np.zeros((2, 2), dtype=int), bk)


# ----------------------------------------------------------------------------- PyTorch
def _torch():
    torch = pytest.importorskip("torch")
    return torch


def _t(torch, a, grad=True):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=grad)


def _copy_into(torch, module, mapping: dict, params: dict) -> None:
    """module.<torch name> ← params[<refbraid name>] for each pair of ``mapping``."""
    with torch.no_grad():
        named = dict(module.named_parameters())
        for torch_name, ours in mapping.items():
            named[torch_name].copy_(torch.from_numpy(np.asarray(params[ours])))


def _attention_map(prefix: str, torch_prefix: str) -> dict:
    return {f"{torch_prefix}in_proj_weight": f"{prefix}W_in",
            f"{torch_prefix}in_proj_bias": f"{prefix}b_in",
            f"{torch_prefix}out_proj.weight": f"{prefix}W_out",
            f"{torch_prefix}out_proj.bias": f"{prefix}b_out"}


def _randomise(params, rng):
    """Non-trivial values for every weight (torch's zero biases and unit γ would hide bugs)."""
    return {k: (v + 0.3 * rng.standard_normal(v.shape) if v.dtype.kind == "f" else v)
            for k, v in params.items()}


def _compare_with_torch(torch, ours_out, ours_grads, out_t, inputs_t, module, mapping):
    """refbraid's output and adjoints against torch's output and autograd gradients."""
    assert _rel(ours_out, out_t.detach().numpy()) <= 1e-12
    named = dict(module.named_parameters())
    for torch_name, ours in mapping.items():
        assert _rel(ours_grads[ours], named[torch_name].grad.numpy()) <= 1e-12, ours
    for ours, t in inputs_t.items():
        assert _rel(ours_grads[ours], t.grad.numpy()) <= 1e-12, ours


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
def test_layernorm_and_mlp_match_torch(backend_name):
    torch = _torch()
    bk = get_backend(backend_name)
    rng = np.random.default_rng(11)
    x, w = rng.standard_normal((BATCH, T, E)), rng.standard_normal((BATCH, T, E))
    for layer, module, mapping in [
        (LayerNorm(E, T), torch.nn.LayerNorm(E, dtype=torch.float64),
         {"weight": "gamma", "bias": "beta"}),
        (MLP(E, F, T), torch.nn.Sequential(torch.nn.Linear(E, F), torch.nn.GELU(),
                                           torch.nn.Linear(F, E)).double(),
         {"0.weight": "W1", "0.bias": "b1", "2.weight": "W2", "2.bias": "b2"}),
    ]:
        params = _randomise(layer.init(rng), rng)
        _copy_into(torch, module, mapping, params)
        out, cache = layer.forward(params, x, bk)
        dx, dparams = layer.adjoint(params, cache, w, bk)
        xt = _t(torch, x)
        out_t = module(xt)
        out_t.backward(_t(torch, w, False))
        _compare_with_torch(torch, out, {**dparams, "x": dx}, out_t, {"x": xt}, module, mapping)


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_attention_matches_torch_multihead_attention(backend_name, cross):
    torch = _torch()
    bk = get_backend(backend_name)
    rng = np.random.default_rng(12)
    layer = MultiheadAttention(E, NH, T, causal=not cross, memory_len=S if cross else None)
    params = _randomise(layer.init(rng), rng)
    x, w = rng.standard_normal((BATCH, T, E)), rng.standard_normal((BATCH, T, E))
    L = S if cross else T
    if cross:
        params["memory"] = rng.standard_normal((BATCH, S, E))
    pad = _padding(BATCH, L, 1)
    module = torch.nn.MultiheadAttention(E, NH, batch_first=True, dtype=torch.float64)
    mapping = _attention_map("", "")
    _copy_into(torch, module, mapping, params)
    out, cache = layer.forward({**params, "key_padding_mask": pad}, x, bk)
    dx, dparams = layer.adjoint(params, cache, w, bk)
    xt = _t(torch, x)
    kv = _t(torch, params["memory"]) if cross else xt
    causal = None if cross else torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    out_t, _ = module(xt, kv, kv, key_padding_mask=torch.from_numpy(pad), attn_mask=causal,
                      need_weights=False)
    out_t.backward(_t(torch, w, False))
    inputs = {"x": xt, **({"memory": kv} if cross else {})}
    _compare_with_torch(torch, out, {**dparams, "x": dx}, out_t, inputs, module, mapping)


def _block_map(decoder: bool) -> dict:
    mapping = {"norm1.weight": "ln1.gamma", "norm1.bias": "ln1.beta",
               "linear1.weight": "mlp.W1", "linear1.bias": "mlp.b1",
               "linear2.weight": "mlp.W2", "linear2.bias": "mlp.b2",
               **_attention_map("sa.", "self_attn.")}
    mlp_norm = "norm3" if decoder else "norm2"
    mapping.update({f"{mlp_norm}.weight": "ln2.gamma", f"{mlp_norm}.bias": "ln2.beta"})
    if decoder:
        mapping.update({"norm2.weight": "ln3.gamma", "norm2.bias": "ln3.beta",
                        **_attention_map("ca.", "multihead_attn.")})
    return mapping


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
def test_h_one_steps_match_torch_pre_norm_transformer_layers(backend_name, decoder):
    """X + F(X) at h = 1 is nn.TransformerEncoderLayer / DecoderLayer(norm_first=True)."""
    torch = _torch()
    bk = get_backend(backend_name)
    rng = np.random.default_rng(13)
    kw = {"dim_feedforward": F, "dropout": 0.0, "activation": "gelu", "batch_first": True,
          "norm_first": True, "dtype": torch.float64}
    if decoder:
        step = DecoderStep(E, NH, F, T, S)
        module = torch.nn.TransformerDecoderLayer(E, NH, **kw)
    else:
        step = EncoderStep(E, NH, F, T, causal=True)
        module = torch.nn.TransformerEncoderLayer(E, NH, **kw)
    params = _randomise(step.init(rng), rng)
    if decoder:
        params["memory"] = rng.standard_normal((BATCH, S, E))
    mapping = _block_map(decoder)
    _copy_into(torch, module, mapping, params)
    y, w = rng.standard_normal((BATCH, T, E)), rng.standard_normal((BATCH, T, E))
    pad = _padding(BATCH, T, 1)
    data = {"key_padding_mask": pad}
    if decoder:
        data["memory_padding_mask"] = _padding(BATCH, S, 1)
    out, cache = step.forward({**params, **data}, y, 1.0, bk)
    dy, dparams = step.adjoint(params, cache, w, 1.0, bk)
    yt = _t(torch, y)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    if decoder:
        mt = _t(torch, params["memory"])
        out_t = module(yt, mt, tgt_mask=causal, tgt_key_padding_mask=torch.from_numpy(pad),
                       memory_key_padding_mask=torch.from_numpy(data["memory_padding_mask"]))
        inputs = {"y": yt, "memory": mt}
    else:
        out_t = module(yt, src_mask=causal, src_key_padding_mask=torch.from_numpy(pad))
        inputs = {"y": yt}
    out_t.backward(_t(torch, w, False))
    _compare_with_torch(torch, out, {**dparams, "y": dy}, out_t, inputs, module, mapping)


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
def test_embedding_heads_and_token_loss_match_torch(backend_name):
    torch = _torch()
    bk = get_backend(backend_name)
    rng = np.random.default_rng(14)
    emb = TokenEmbedding(7, E, T, "learned")
    params = emb.init(rng)
    tokens = emb.example_input(rng, BATCH)
    w = rng.standard_normal((BATCH, T, E))
    out, cache = emb.forward(params, tokens, bk)
    _, dparams = emb.adjoint(params, cache, w, bk)
    Wt, Pt = _t(torch, params["W"]), _t(torch, params["pos"])
    out_t = torch.nn.functional.embedding(torch.from_numpy(tokens), Wt) + Pt
    out_t.backward(_t(torch, w, False))
    assert _rel(out, out_t.detach().numpy()) <= 1e-15
    assert _rel(dparams["W"], Wt.grad.numpy()) <= 1e-12
    assert _rel(dparams["pos"], Pt.grad.numpy()) <= 1e-12

    x = rng.standard_normal((BATCH, T, E))
    labels = rng.integers(0, 3, size=(BATCH, T))
    head = TokenClassifier(T, E, 3)
    hp = head.init(rng)
    logits, hcache = head.forward(hp, x, bk)
    loss, probs = token_cross_entropy(logits, labels, bk)
    dx, dhp = head.adjoint(hp, hcache, token_cross_entropy_adjoint(probs, labels, bk), bk)
    xt, Wt, bt = _t(torch, x), _t(torch, hp["W"]), _t(torch, hp["b"])
    logits_t = xt @ Wt.T + bt
    loss_t = torch.nn.functional.cross_entropy(logits_t.reshape(-1, 3),
                                               torch.from_numpy(labels).reshape(-1))
    loss_t.backward()
    assert float(loss) == pytest.approx(loss_t.item(), rel=1e-14)
    for ours, t in ((dx, xt), (dhp["W"], Wt), (dhp["b"], bt)):
        assert _rel(ours, t.grad.numpy()) <= 1e-12

    pool = PooledClassifier(T, E, 3)
    pp = pool.init(rng)
    g = rng.standard_normal((BATCH, 3))
    plog, pcache = pool.forward(pp, x, bk)
    dx, dpp = pool.adjoint(pp, pcache, g, bk)
    xt, Wt, bt = _t(torch, x), _t(torch, pp["W"]), _t(torch, pp["b"])
    plog_t = xt.mean(dim=1) @ Wt.T + bt
    plog_t.backward(_t(torch, g, False))
    assert _rel(plog, plog_t.detach().numpy()) <= 1e-12
    for ours, t in ((dx, xt), (dpp["W"], Wt), (dpp["b"], bt)):
        assert _rel(ours, t.grad.numpy()) <= 1e-12
