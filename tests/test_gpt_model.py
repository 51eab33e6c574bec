"""The decoder-only causal language model (refbraid.sequence.gpt_model), its generated language
(refbraid.data.language), generation and the scored cross-entropy.

Oracles: central differences of the loss; sequential backprop for the converged layer-parallel
gradient; PyTorch (``nn.TransformerEncoderLayer`` with a causal mask, pre-norm, GELU, a tied
``F.linear`` head and ``F.cross_entropy(ignore_index=-1)``) for the whole model at h = 1; the
causal mask itself (later tokens never change earlier logits); the NumPy reference for Numba.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.data import DATASETS, load_dataset
from refbraid.data.language import BOS, SEP, SYMBOLS, VOCAB, prompt_length, reverse_sequences
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.sequence import GPTModel, cross_entropy, exact_match, generate
from refbraid.sequence.losses import IGNORE

V, L, N, E, NH, F = 9, 6, 4, 8, 2, 12


def _case(tied=True, T=2.0, seed=0):
    rng = np.random.default_rng(seed)
    m = GPTModel(V, L, N, E, NH, F, T, tied=tied)
    x = rng.integers(0, V, size=(3, L))
    y = rng.integers(0, V, size=(3, L))
    y[:, :2] = IGNORE
    return m, m.init_params(rng), x, y


# ----------------------------------------------------------------------------- data
def test_language_set_is_registered_deterministic_and_follows_the_rule():
    assert "lm-reverse" in DATASETS
    a, b = load_dataset("lm-reverse", n_samples=40, seed=2), load_dataset("lm-reverse",
                                                                         n_samples=40, seed=2)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.info["vocab_size"] == VOCAB >= 16 and a.info["language_model"]
    P = prompt_length()
    x, y = a.x_train, a.y_train
    assert (x[:, 0] == BOS).all() and (x[:, P - 1] == SEP).all()
    assert (y[:, : P - 1] == IGNORE).all()
    np.testing.assert_array_equal(y[:, P - 1 :], x[:, 1 : P - 1][:, ::-1])  # the reversal
    np.testing.assert_array_equal(y[:, P - 1 : -1], x[:, P:])  # targets = inputs shifted
    s = reverse_sequences(5, np.random.default_rng(0))
    assert s.max() < VOCAB and s[:, 1:P - 1].max() < SYMBOLS


# ----------------------------------------------------------------------------- loss
def test_scored_cross_entropy_matches_torch_ignore_index():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((3, 4, 5))
    y = rng.integers(0, 5, size=(3, 4))
    y[0, :3] = IGNORE
    loss, dlogits = cross_entropy(logits, y, "numpy")
    lt = torch.tensor(logits, requires_grad=True)
    loss_t = torch.nn.functional.cross_entropy(lt.reshape(-1, 5), torch.from_numpy(y).reshape(-1),
                                               ignore_index=IGNORE)
    loss_t.backward()
    assert loss == pytest.approx(loss_t.item(), rel=1e-14)
    np.testing.assert_allclose(dlogits, lt.grad.numpy(), rtol=1e-12, atol=1e-15)
    assert (dlogits[0, :3] == 0).all()
    with pytest.raises(ValueError, match="at least one token"):
        cross_entropy(logits, np.full((3, 4), IGNORE), "numpy")


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_gradient_matches_central_differences(tied):
    m, p, x, y = _case(tied)
    _, g, _ = m.backprop(p, x, y)
    assert set(g) == set(p) and ("closing.W" in p) is not tied
    rng = np.random.default_rng(5)
    for key in p:
        idx = tuple(int(rng.integers(0, s)) for s in p[key].shape)
        eps = 1e-6
        plus = {k: v.copy() for k, v in p.items()}
        minus = {k: v.copy() for k, v in p.items()}
        plus[key][idx] += eps
        minus[key][idx] -= eps
        fd = (m.backprop(plus, x, y)[0] - m.backprop(minus, x, y)[0]) / (2 * eps)
        assert fd == pytest.approx(g[key][idx], rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_converged_layer_parallel_gradient_equals_backprop(tied):
    m, p, x, y = _case(tied)
    loss, g, _ = m.backprop(p, x, y)
    errors = []
    for k in (1, 2, 4):
        s = LayerParallelSettings.with_iterations(k, k, levels=2, cfactor=2)
        lp_loss, lp_g, info = m.layer_parallel_gradient(p, x, y, s)
        errors.append(relative_gradient_error(lp_g, g, "numpy"))
    assert errors[0] > 1e-6  # one cycle is inexact
    assert errors[-1] <= 1e-10 and abs(lp_loss - loss) <= 1e-12  # N/m = 2 cycles: exact
    exact = m.layer_parallel_gradient(p, x, y, LayerParallelSettings.exact())[1]
    assert relative_gradient_error(exact, g, "numpy") <= 1e-12


def test_numba_backend_matches_numpy():
    m, p, x, y = _case()
    loss, g, _ = m.backprop(p, x, y, "numpy")
    loss_n, g_n, _ = m.backprop(p, x, y, "numba")
    assert loss_n == pytest.approx(loss, rel=1e-12)
    assert relative_gradient_error(g_n, g, "numpy") <= 1e-12


def test_later_tokens_never_change_earlier_logits():
    m, p, x, _ = _case()
    z = m.logits(p, x)
    x2 = x.copy()
    x2[:, 3:] = (x2[:, 3:] + 1) % V
    z2 = m.logits(p, x2)
    np.testing.assert_array_equal(z[:, :3], z2[:, :3])
    assert np.abs(z[:, 3:] - z2[:, 3:]).max() > 1e-3


def test_h_one_model_matches_torch_causal_transformer():
    """Embedding (+ learned positions) → N × nn.TransformerEncoderLayer(norm_first, gelu,
    causal mask) → LayerNorm → tied F.linear head → F.cross_entropy(ignore_index=-1)."""
    torch = pytest.importorskip("torch")
    m, p, x, y = _case(tied=True, T=float(N))  # h = 1
    loss, g, _ = m.backprop(p, x, y)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    layers = []
    for n in range(N):
        layer = torch.nn.TransformerEncoderLayer(E, NH, F, dropout=0.0, activation="gelu",
                                                 batch_first=True, norm_first=True,
                                                 dtype=torch.float64)
        with torch.no_grad():
            for name, ours in (("norm1.weight", "ln1.gamma"), ("norm1.bias", "ln1.beta"),
                               ("norm2.weight", "ln2.gamma"), ("norm2.bias", "ln2.beta"),
                               ("self_attn.in_proj_weight", "sa.W_in"),
                               ("self_attn.in_proj_bias", "sa.b_in"),
                               ("self_attn.out_proj.weight", "sa.W_out"),
                               ("self_attn.out_proj.bias", "sa.b_out"),
                               ("linear1.weight", "mlp.W1"), ("linear1.bias", "mlp.b1"),
                               ("linear2.weight", "mlp.W2"), ("linear2.bias", "mlp.b2")):
                layer.get_parameter(name).copy_(torch.from_numpy(p[f"steps.{ours}"][n]))
        layers.append(layer)
    tok = torch.from_numpy(x)
    h = t["opening.W"][tok] + t["opening.pos"]
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    for layer in layers:
        h = layer(h, src_mask=mask, is_causal=True)
    z = torch.nn.functional.layer_norm(h, (E,), t["closing.ln.gamma"], t["closing.ln.beta"])
    logits = torch.nn.functional.linear(z, t["opening.W"], t["closing.b"])
    loss_t = torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                               torch.from_numpy(y).reshape(-1),
                                               ignore_index=IGNORE)
    loss_t.backward()
    assert loss == pytest.approx(loss_t.item(), rel=1e-12)
    for k in ("opening.W", "opening.pos", "closing.b", "closing.ln.gamma"):
        np.testing.assert_allclose(g[k], t[k].grad.numpy(), rtol=1e-9, atol=1e-12)
    for name, ours in (("self_attn.in_proj_weight", "sa.W_in"), ("linear2.weight", "mlp.W2")):
        want = np.stack([layer.get_parameter(name).grad.numpy() for layer in layers])
        np.testing.assert_allclose(g[f"steps.{ours}"], want, rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- generation
def test_greedy_generation_is_the_argmax_of_the_window_and_sampling_is_seeded():
    m, p, x, y = _case()
    prompt = x[:, :3]
    out = generate(m, p, prompt, 3)
    np.testing.assert_array_equal(out[:, :3], prompt)
    for j in range(3):  # every new token is the argmax at the last written position
        window = np.zeros((3, L), dtype=np.int64)
        window[:, : 3 + j] = out[:, : 3 + j]
        np.testing.assert_array_equal(out[:, 3 + j], m.logits(p, window)[:, 2 + j].argmax(1))
    a = generate(m, p, prompt, 3, temperature=1.0, rng=np.random.default_rng(0))
    b = generate(m, p, prompt, 3, temperature=1.0, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(a, b)
    cold = generate(m, p, prompt, 3, temperature=1e-9, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(cold, out)
    frac, seqs = exact_match(m, p, x, y, 3)
    assert 0.0 <= frac <= 1.0 and seqs.shape == (3, L + 1)


def test_bad_inputs_raise_naming_the_argument():
    m, p, x, y = _case()
    with pytest.raises(ValueError, match="n_new"):
        generate(m, p, x[:, :3], L)
    with pytest.raises(ValueError, match="temperature"):
        generate(m, p, x[:, :3], 2, temperature=-1.0)
    with pytest.raises(ValueError, match="rng"):
        generate(m, p, x[:, :3], 2, temperature=0.5)
    with pytest.raises(ValueError, match="prompt"):
        generate(m, p, x[:, :3].astype(float), 2)
    with pytest.raises(TypeError, match="tied"):
        GPTModel(V, L, N, E, NH, F, tied="yes")
    with pytest.raises(ValueError, match="x"):
        m.logits(p, x[:, :3])


# ----------------------------------------------------------------------------- buffer layers
def _to_buffered(p, b):
    """The buffer-free model's params laid out for ``b`` buffer steps at each end."""
    q = {k: v for k, v in p.items() if not k.startswith("steps.")}
    for k, v in p.items():
        if k.startswith("steps."):
            name = k[len("steps."):]
            q[f"opening.buffer.{name}"] = v[:b]
            q[k] = v[b:N - b]
            q[f"closing.buffer.{name}"] = v[N - b:]
    return q


def test_buffer_layers_are_the_same_network_and_converge_to_backprop():
    m, p, x, y = _case()
    mb = GPTModel(V, L, N, E, NH, F, 2.0, buffer=1)
    assert mb.n_layers == N - 2 and mb.h == m.h
    pb = _to_buffered(p, 1)
    assert set(pb) == set(mb.init_params(np.random.default_rng(0)))
    loss, g, _ = m.backprop(p, x, y)
    loss_b, g_b, _ = mb.backprop(pb, x, y)
    assert loss_b == pytest.approx(loss, rel=1e-13)
    want = _to_buffered(g, 1)
    for k in want:
        np.testing.assert_allclose(g_b[k], want[k], rtol=1e-10, atol=1e-14)
    s1 = LayerParallelSettings.with_iterations(1, 1, levels=2, cfactor=2)
    lp_b = mb.layer_parallel_gradient(pb, x, y, s1)[1]
    assert relative_gradient_error(lp_b, g_b, "numpy") <= 1e-10  # 2 MGRIT steps: exact
    with pytest.raises(ValueError, match="buffer"):
        GPTModel(V, L, N, E, NH, F, buffer=2)
