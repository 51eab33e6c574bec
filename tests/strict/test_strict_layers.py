"""Every catalogued layer, the loss and the two small networks on the device stand-ins
(strict, CuPy-like): forward and adjoint equal the NumPy reference to round-off, and pass
the dot-product and finite-difference tests (refbraid.verify's checks, run on each
stand-in's backend)."""

import numpy as np
import pytest

from refbraid.backends.host import to_host
from refbraid.backends.strict_device import HostConversionError
from refbraid.layers import Classifier, ConvLift, ConvStep, DenseLift, DenseStep
from refbraid.network import Network, backprop, init_params, to_backend
from refbraid.verify.checks import check_network
from refbraid.verify.suite import catalog, check_entry, default_networks

from .devices import on_device

CATALOG = catalog()
NETWORKS = default_networks()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,layer", CATALOG, ids=[n for n, _ in CATALOG])
def test_layer_forward_and_adjoint_on_the_strict_device(standin, name, layer, dtype):
    results = check_entry(name, layer, standin, dtype)
    assert results and any(r.check.startswith("numpy:") for r in results)
    failed = [str(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("name,net", NETWORKS, ids=[n for n, _ in NETWORKS])
def test_network_gradient_on_the_strict_device(standin, name, net):
    failed = [str(r) for r in check_network(net, standin, np.float64, name=name) if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("model", ["dense", "conv"])
def test_sequential_backprop_equals_numpy(standin, model):
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
    dloss, dgrads, dinfo = backprop(net, to_backend(params, standin), standin.asarray(x),
                                    standin.asarray(labels), standin)
    assert isinstance(dloss, float) and abs(dloss - loss) <= 1e-14 * abs(loss)
    for k, g in grads.items():
        assert on_device(dgrads[k]), k
        np.testing.assert_allclose(to_host(dgrads[k]), g, rtol=1e-12, atol=1e-15, err_msg=k)
    for got, want in zip(dinfo["adjoints"], info["adjoints"], strict=True):
        np.testing.assert_allclose(to_host(got), want, rtol=1e-12, atol=1e-15)


def test_the_guard_refuses_every_implicit_host_conversion(standin):
    import pickle

    a = standin.asarray(np.arange(3.0))
    s = standin.xp.sum(a)
    for convert in (float, int, bool, complex, lambda v: f"{v:.3f}", pickle.dumps):
        with pytest.raises(HostConversionError):
            convert(s)
    np.testing.assert_array_equal(to_host(a), np.arange(3.0))  # the documented door
    assert to_host(s).shape == ()


def test_the_strict_device_refuses_host_arrays(strict):
    a = strict.asarray(np.arange(3.0))
    with pytest.raises(RuntimeError):  # array-api-strict refuses this one itself
        np.asarray(a)
    with pytest.raises(ValueError, match="different devices"):  # host data mixed in
        a + strict.xp.asarray(np.ones(3))


def test_the_cupy_standin_refuses_host_arrays_as_cupy_does():
    """CuPy 14's manners: no ``__array_namespace__`` (array-api-compat finds the namespace by
    type), ``numpy.asarray`` a TypeError, a host array in an operation a TypeError."""
    import array_api_compat

    from refbraid.backends import cupy_standin
    from refbraid.backends.portable import namespace

    if cupy_standin.real_cupy_imported():
        pytest.skip("a real CuPy is imported in this process (the GPU run tests CuPy itself)")
    with cupy_standin.standin_backend() as bk:
        a = bk.asarray(np.arange(3.0))
        assert not hasattr(a, "__array_namespace__")
        assert array_api_compat.is_cupy_array(a) and namespace(a) is bk.xp
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
            np.asarray(a)
        with pytest.raises(TypeError, match="Unsupported type"):
            a + np.ones(3)
        with pytest.raises(TypeError, match="Unsupported type"):
            np.ones(3) + a
        with pytest.raises(TypeError, match="Unsupported type"):
            bk.xp.stack([a, np.ones(3)])
        host = np.zeros(3)
        with pytest.raises(TypeError, match="Implicit conversion"):
            host[:] = a  # a device array written into a host array
        with pytest.raises(AttributeError):
            _ = bk.xp.row_stack  # NumPy-only: not in the stand-in's namespace
        np.testing.assert_array_equal(to_host(a * 2.0 + np.float64(1.0)), [1.0, 3.0, 5.0])
