"""The decoder-only language model on the device stand-ins (strict, CuPy-like): the LM head, the
per-token loss over scored tokens only (IGNORE labels), buffer layers, sequential backprop and
the layer-parallel gradient, each against the same computation on NumPy."""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.backends.host import to_host
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.network import to_backend
from refbraid.sequence import GPTModel
from refbraid.sequence.losses import IGNORE, cross_entropy

from .devices import on_device

NUMPY = get_backend("numpy")
V, L, N, E, NH, F = 9, 6, 4, 8, 2, 12


def test_scored_token_loss_equals_numpy(standin):
    rng = np.random.default_rng(9)
    logits, labels = rng.standard_normal((3, 5, 4)), rng.integers(0, 4, (3, 5))
    labels[:, :2] = IGNORE
    loss, dlogits = cross_entropy(logits, labels, NUMPY)
    dloss, d_dlogits = cross_entropy(standin.asarray(logits), standin.asarray(labels), standin)
    assert dloss == pytest.approx(loss, rel=1e-14)
    assert on_device(d_dlogits)
    np.testing.assert_allclose(to_host(d_dlogits), dlogits, rtol=1e-13, atol=1e-16)
    assert not np.any(to_host(d_dlogits)[:, :2])  # unscored tokens get no gradient


@pytest.mark.parametrize("tied,buffer", [(True, 0), (False, 1)], ids=["tied", "buffered"])
def test_gpt_gradients_equal_numpy(standin, tied, buffer):
    rng = np.random.default_rng(0)
    m = GPTModel(V, L, N, E, NH, F, 2.0, tied=tied, buffer=buffer)
    params = m.init_params(rng)
    x, y = rng.integers(0, V, (3, L)), rng.integers(0, V, (3, L))
    y[:, :2] = IGNORE
    settings = LayerParallelSettings.with_iterations(1, 1, levels=2, cfactor=2, min_coarse=1)
    for method in ("backprop", "layer_parallel_gradient"):
        args = (settings,) if method != "backprop" else ()
        loss, grads, _ = getattr(m, method)(params, x, y, *args, NUMPY)
        dloss, dgrads, _ = getattr(m, method)(to_backend(params, standin), standin.asarray(x),
                                              standin.asarray(y), *args, standin)
        assert abs(dloss - loss) <= 1e-12 * abs(loss), method
        for k in grads:
            assert on_device(dgrads[k]), k
            np.testing.assert_allclose(to_host(dgrads[k]), grads[k], rtol=1e-10, atol=1e-14,
                                       err_msg=f"{method} {k}")


def test_greedy_generation_equals_numpy(standin):
    """Token by token from a prompt: each step's logits come to the host through to_host."""
    from refbraid.sequence import generate

    rng = np.random.default_rng(1)
    m = GPTModel(V, L, N, E, NH, F, 2.0)
    params, prompt = m.init_params(rng), rng.integers(0, V, (2, 3))
    want = generate(m, params, prompt, 3)
    np.testing.assert_array_equal(generate(m, to_backend(params, standin), prompt, 3, standin),
                                  want)


def test_autoregressive_seq2seq_equals_numpy(standin):
    """Teacher-forced gradients (backprop, layer-parallel) and greedy decoding token by token."""
    from refbraid.sequence import Seq2SeqModel

    rng = np.random.default_rng(2)
    m = Seq2SeqModel(7, 4, 6, 4, 8, 2, 12, 2.0, teacher_forcing=True)
    params, x, y = m.init_params(rng), rng.integers(0, 7, (3, 4)), rng.integers(0, 6, (3, 4))
    dparams, dx, dy = to_backend(params, standin), standin.asarray(x), standin.asarray(y)
    settings = LayerParallelSettings.with_iterations(1, 1, levels=2, cfactor=2, min_coarse=1)
    for method in ("backprop", "layer_parallel_gradient"):
        args = (settings,) if method != "backprop" else ()
        loss, grads, _ = getattr(m, method)(params, x, y, *args, NUMPY)
        dloss, dgrads, _ = getattr(m, method)(dparams, dx, dy, *args, standin)
        assert abs(dloss - loss) <= 1e-12 * abs(loss), method
        for k in grads:
            np.testing.assert_allclose(to_host(dgrads[k]), grads[k], rtol=1e-10, atol=1e-14,
                                       err_msg=f"{method} {k}")
    np.testing.assert_allclose(to_host(m.logits(dparams, dx, standin)), m.logits(params, x),
                               rtol=1e-12, atol=1e-14)
