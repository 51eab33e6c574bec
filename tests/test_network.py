"""The sequential network baseline (refbraid.network): whole-network backprop against the
complex-step derivative and central differences of the loss, on every backend; validation of
the network and of a batch; float32 support."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BACKEND_PARAMS, backend_or_skip

from refbraid.input_checks import check_batch
from refbraid.layers import Classifier, ConvLift, ConvStep, DenseLift, DenseStep
from refbraid.network import Network, backprop, init_params, loss_and_logits
from refbraid.verify import check_network, default_networks

NETWORKS = default_networks()


def _failures(results) -> str:
    return "\n".join(str(r) for r in results if not r.passed)


def _dense(n_layers=3, T=1.0) -> Network:
    return Network(DenseLift(2, 5, "tanh"), DenseStep(5, "tanh"), Classifier((5,), 3), n_layers, T)


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("backend_name", BACKEND_PARAMS)
@pytest.mark.parametrize(("name", "net"), NETWORKS, ids=[n for n, _ in NETWORKS])
def test_backprop_gradient_passes_dot_product_and_finite_differences(name, net, backend_name):
    bk = backend_or_skip(backend_name)
    results = check_network(net, bk, name=name)
    assert not _failures(results), _failures(results)
    params = init_params(net)
    for key in params:  # every parameter array is checked both ways
        assert {f"dot:{key}", f"fd:{key}"} <= {r.check for r in results}


def test_backprop_matches_a_hand_written_central_difference():
    # independent of refbraid.verify: one weight of the middle layer, plain central difference
    net = _dense()
    rng = np.random.default_rng(3)
    params = init_params(net, rng)
    x, labels = rng.standard_normal((4, 2)), np.array([0, 2, 1, 2])
    _, grads, info = backprop(net, params, x, labels)
    step = 1e-5
    for index in [(1, 2, 3), (0, 0, 0), (2, 4, 1)]:
        moved = {k: v.copy() for k, v in params.items()}
        moved["steps.W"][index] += step
        up = loss_and_logits(net, moved, x, labels)[0]
        moved["steps.W"][index] -= 2 * step
        down = loss_and_logits(net, moved, x, labels)[0]
        assert grads["steps.W"][index] == pytest.approx((up - down) / (2 * step), rel=1e-7)
    assert len(info["states"]) == len(info["adjoints"]) == net.n_layers + 1


def test_a_broken_step_adjoint_is_caught_at_network_level():
    class HalfBiasStep(DenseStep):  # returns half the bias gradient
        def adjoint(self, params, cache, dy_next, h, bk, grads=True):
            dy, d = super().adjoint(params, cache, dy_next, h, bk, grads)
            return dy, (None if d is None else {**d, "b": 0.5 * d["b"]})

    net = Network(DenseLift(2, 4), HalfBiasStep(4), Classifier((4,), 3), 2)
    failed = {r.check for r in check_network(net) if not r.passed}
    assert failed == {"dot:steps.b", "fd:steps.b"}


# ----------------------------------------------------------------------------- float32
@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
def test_float32_network_keeps_its_dtype_and_agrees_with_float64(backend_name):
    net = NETWORKS[1][1]  # the conv network
    p64 = init_params(net, 0, np.float64)
    p32 = {k: v.astype(np.float32) for k, v in p64.items()}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 1, 5, 5))
    labels = np.array([0, 3, 1])
    loss64, g64, _ = backprop(net, p64, x, labels, backend_name)
    loss32, g32, _ = backprop(net, p32, x.astype(np.float32), labels, backend_name)
    assert loss32 == pytest.approx(loss64, rel=1e-5)
    for key, g in g32.items():
        assert g.dtype == np.float32, key
        scale = np.abs(g64[key]).max()
        assert np.abs(g - g64[key]).max() <= 1e-4 * scale, key
    results = check_network(net, backend_name, np.float32, name="conv_net")
    assert not _failures(results), _failures(results)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("n_layers", [0, -2, 1.5, True, "3"])
def test_network_rejects_a_bad_number_of_layers(n_layers):
    with pytest.raises(ValueError, match="`n_layers` must be a positive integer"):
        _dense(n_layers=n_layers)


@pytest.mark.parametrize("T", [0.0, -1.0, float("nan"), float("inf")])
def test_network_rejects_a_bad_final_time(T):
    with pytest.raises(ValueError, match="`T` must be a positive finite number"):
        _dense(T=T)


def test_network_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"opening output shape \(6,\) does not match"):
        Network(DenseLift(2, 6), DenseStep(5), Classifier((5,), 3), 2)
    with pytest.raises(ValueError, match=r"closing input shape \(3, 5, 5\) does not match"):
        Network(DenseLift(2, 6), DenseStep(6), Classifier((3, 5, 5), 3), 2)
    with pytest.raises(ValueError, match="opening output shape"):
        Network(ConvLift(1, 3, 5, 5), ConvStep(3, 4, 4), Classifier((3, 4, 4), 2), 2)


def test_check_batch_rejects_bad_inputs():
    net = _dense()
    good = np.zeros((4, 2))
    labels = np.array([0, 1, 2, 0])
    check_batch(net, good, labels)  # fine
    with pytest.raises(ValueError, match=r"`x` must have shape \(batch, 2\), got \(4, 3\)"):
        check_batch(net, np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"`x` must have shape \(batch, 2\), got \(2,\)"):
        check_batch(net, np.zeros(2))
    with pytest.raises(ValueError, match="`x` must hold at least one sample"):
        check_batch(net, np.zeros((0, 2)))
    for bad in (np.nan, np.inf, -np.inf):
        x = good.copy()
        x[2, 1] = bad
        with pytest.raises(ValueError, match="`x` must be finite"):
            check_batch(net, x, labels)


def test_check_batch_rejects_bad_labels():
    net = _dense()
    x = np.zeros((4, 2))
    with pytest.raises(ValueError, match=r"`labels` must have shape \(4,\), got \(3,\)"):
        check_batch(net, x, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 3\), got range \[0, 3\]"):
        check_batch(net, x, np.array([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"got range \[-1, 2\]"):
        check_batch(net, x, np.array([0, -1, 2, 1]))
    with pytest.raises(TypeError, match="`labels` must be integer class indices, got dtype f"):
        check_batch(net, x, np.array([0.0, 1.0, 2.0, 1.5]))


def test_backprop_validates_its_batch():
    net = _dense()
    params = init_params(net)
    x = np.zeros((2, 2))
    x[0, 0] = np.nan
    with pytest.raises(ValueError, match="`x` must be finite"):
        backprop(net, params, x, np.array([0, 1]))


def test_stacked_gradients_stack_rows_in_the_parameters_dtype_and_zero_what_a_layer_lacks():
    """Serial backprop's weight gradients: layer n's in row n, one stack per parameter (as
    the row-by-row assignment into zeros it replaced: the same values and dtype), and a layer
    that gives no gradient for a parameter leaves its row zero."""
    from refbraid.backends import get_backend
    from refbraid.network import stacked_gradients

    bk = get_backend("numpy")
    steps = {"W": np.ones((3, 2, 2), np.float32), "b": np.ones((3, 2), np.float32)}
    layers = [{"W": np.full((2, 2), n, np.float64), "b": np.full(2, -n, np.float32)}
              for n in range(3)]
    got = stacked_gradients(steps, layers, bk)
    for k, v in steps.items():
        want = np.zeros_like(v)
        for n, d in enumerate(layers):
            want[n, ...] = d[k]
        assert got[k].dtype == v.dtype
        np.testing.assert_array_equal(got[k], want)
    del layers[1]["b"]
    got = stacked_gradients(steps, layers, bk)
    np.testing.assert_array_equal(got["b"], [[0, 0], [0, 0], [-2, -2]])
    np.testing.assert_array_equal(got["W"][2], np.full((2, 2), 2))
