"""The autoregressive encoder–decoder (Seq2SeqModel with ``teacher_forcing``; model
``transformer-seq2seq``): teacher-forced gradient, token-by-token decoding.

Oracles: central differences; sequential backprop for the converged layer-parallel gradient;
the causal mask (labels at t and later never change the logits up to t); the teacher-forced
forward fed the decoder's own predictions reproduces the decoded logits exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.network import forward
from refbraid.sequence import Seq2SeqModel
from refbraid.sequence.seq2seq_model import _sub

BK = get_backend("numpy")


def _case(seed=0):
    rng = np.random.default_rng(seed)
    m = Seq2SeqModel(7, 4, 6, 4, 8, 2, 12, 2.0, teacher_forcing=True)
    return m, m.init_params(rng), rng.integers(0, 7, (3, 4)), rng.integers(0, 6, (3, 4))


def _teacher_forced_logits(m, p, x, y):
    memory = forward(m.encoder, _sub(p, "encoder"), x, BK, keep=False)[0]
    dec = m._with_memory(_sub(p, "decoder"), memory, m.layers, BK)
    return forward(m.decoder, dec, m.decoder_input(x, y, BK), BK, keep=False)[0]


def test_teacher_forced_gradient_matches_central_differences():
    m, p, x, y = _case()
    assert "decoder.opening.W" in p and p["decoder.opening.W"].shape[0] == 6 + 1  # + BOS
    _, g, _ = m.backprop(p, x, y)
    rng = np.random.default_rng(3)
    for key in p:
        idx = tuple(int(rng.integers(0, s)) for s in p[key].shape)
        plus = {k: v.copy() for k, v in p.items()}
        minus = {k: v.copy() for k, v in p.items()}
        plus[key][idx] += 1e-6
        minus[key][idx] -= 1e-6
        fd = (m.backprop(plus, x, y)[0] - m.backprop(minus, x, y)[0]) / 2e-6
        assert fd == pytest.approx(g[key][idx], rel=1e-6, abs=1e-9), key


def test_converged_layer_parallel_gradient_equals_backprop():
    m, p, x, y = _case()
    loss, g, _ = m.backprop(p, x, y)
    one = m.layer_parallel_gradient(p, x, y, LayerParallelSettings.with_iterations(
        0, 0, levels=2, cfactor=2))[1]
    lp_loss, lp, _ = m.layer_parallel_gradient(p, x, y, LayerParallelSettings.with_iterations(
        2, 2, levels=2, cfactor=2))
    assert relative_gradient_error(one, g, "numpy") > 1e-6
    assert relative_gradient_error(lp, g, "numpy") <= 1e-10 and abs(lp_loss - loss) <= 1e-12


def test_teacher_forcing_is_causal_and_decoding_feeds_back_its_own_argmax():
    m, p, x, y = _case()
    z = _teacher_forced_logits(m, p, x, y)
    y2 = y.copy()
    y2[:, 2:] = (y2[:, 2:] + 1) % 6
    np.testing.assert_array_equal(_teacher_forced_logits(m, p, x, y2)[:, :3], z[:, :3])
    decoded = m.logits(p, x)  # token by token, no labels
    fed = _teacher_forced_logits(m, p, x, decoded.argmax(axis=2))
    np.testing.assert_allclose(fed, decoded, rtol=1e-13, atol=1e-13)
    settings = LayerParallelSettings.exact().forward
    np.testing.assert_allclose(m.mgrit_logits(p, x, settings), decoded, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="teacher_forcing"):
        Seq2SeqModel(7, 4, 6, 4, 8, 2, 12, teacher_forcing=1)
