"""Every catalogued layer, the loss and the two small networks on the strict device stand-in:
forward and adjoint equal the NumPy reference to round-off, and pass the dot-product and
finite-difference tests (refbraid.verify's checks, run on the ``strict`` backend)."""

import numpy as np
import pytest

from refbraid.backends.host import to_host
from refbraid.backends.strict_device import DEVICE, HostConversionError
from refbraid.layers import Classifier, ConvLift, ConvStep, DenseLift, DenseStep
from refbraid.network import Network, backprop, init_params, to_backend
from refbraid.verify.checks import check_network
from refbraid.verify.suite import catalog, check_entry, default_networks

CATALOG = catalog()
NETWORKS = default_networks()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,layer", CATALOG, ids=[n for n, _ in CATALOG])
def test_layer_forward_and_adjoint_on_the_strict_device(strict, name, layer, dtype):
    results = check_entry(name, layer, strict, dtype)
    assert results and any(r.check.startswith("numpy:") for r in results)
    failed = [str(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("name,net", NETWORKS, ids=[n for n, _ in NETWORKS])
def test_network_gradient_on_the_strict_device(strict, name, net):
    failed = [str(r) for r in check_network(net, strict, np.float64, name=name) if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("model", ["dense", "conv"])
def test_sequential_backprop_equals_numpy(strict, model):
    if model == "dense":
        net = Network(DenseLift(2, 4, "tanh"), DenseStep(4, "tanh"), Classifier((4,), 3),
                      n_layers=5)
        x = np.random.default_rng(1).standard_normal((4, 2))
    else:
        net = Network(ConvLift(1, 2, 4, 4, "relu"), ConvStep(2, 4, 4, "relu"),
                      Classifier((2, 4, 4), 3), n_layers=3)
        x = np.random.default_rng(1).standard_normal((3, 1, 4, 4))
    params = init_params(net, 0)
    labels = np.arange(x.shape[0]) % 3
    loss, grads, info = backprop(net, params, x, labels)
    dloss, dgrads, dinfo = backprop(net, to_backend(params, strict), strict.asarray(x),
                                    strict.asarray(labels), strict)
    assert isinstance(dloss, float) and abs(dloss - loss) <= 1e-14 * abs(loss)
    for k, g in grads.items():
        assert dgrads[k].device == DEVICE, k
        np.testing.assert_allclose(to_host(dgrads[k]), g, rtol=1e-12, atol=1e-15, err_msg=k)
    for got, want in zip(dinfo["adjoints"], info["adjoints"], strict=True):
        np.testing.assert_allclose(to_host(got), want, rtol=1e-12, atol=1e-15)


def test_the_guard_refuses_every_implicit_host_conversion(strict):
    import pickle

    a = strict.asarray(np.arange(3.0))
    s = strict.xp.sum(a)
    for convert in (float, int, bool, complex, lambda v: f"{v:.3f}", pickle.dumps):
        with pytest.raises(HostConversionError):
            convert(s)
    with pytest.raises(RuntimeError):  # array-api-strict refuses this one itself
        np.asarray(a)
    with pytest.raises(ValueError, match="different devices"):  # host data mixed in
        a + strict.xp.asarray(np.ones(3))
    np.testing.assert_array_equal(to_host(a), np.arange(3.0))  # the documented door
    assert to_host(s).shape == ()
