"""Every catalogued layer's adjoint on every backend (refbraid.verify), the complex-step rules of
the reference kernels the dot-product test stands on, and the optional PyTorch cross-check.

The catalogue is refbraid.layers.catalog.verification_catalog() plus the loss; the backends
are numpy, numba, cuda (Numba's simulator under tests/conftest.py) and cupy (GPU only).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BACKEND_PARAMS, backend_or_skip

from refbraid.backends import reference as R
from refbraid.layers import Classifier, ConvLift, ConvStep, DenseLift, DenseStep
from refbraid.verify import SoftmaxCrossEntropyLayer, catalog, check_layer, check_step
from refbraid.verify.probes import COMPLEX_STEP, FD_STEP, complex_step_tangent
from refbraid.verify.suite import check_entry

CATALOG = catalog()
#: layer kinds that must have a PyTorch equivalent
CORE_KINDS = (DenseStep, ConvStep, DenseLift, ConvLift, Classifier, SoftmaxCrossEntropyLayer)
IDS = [name for name, _ in CATALOG]


def _failures(results) -> str:
    return "\n".join(str(r) for r in results if not r.passed)


def _arguments(layer) -> set[str]:
    """The input and every parameter but those the layer holds fixed (``constant_entries``)."""
    params = layer.init(np.random.default_rng(0))
    own_input = "y" if hasattr(layer, "state_shape") else "x"
    fixed = set(getattr(layer, "constant_entries", ()))
    return {own_input, *params} - fixed


# ----------------------------------------------------------------------------- catalogue
@pytest.mark.parametrize("backend_name", BACKEND_PARAMS)
@pytest.mark.parametrize(("name", "layer"), CATALOG, ids=IDS)
def test_every_layer_passes_every_check_in_float64(name, layer, backend_name):
    bk = backend_or_skip(backend_name)
    results = check_entry(name, layer, bk, np.float64)
    assert not _failures(results), _failures(results)  # each line: layer, check, argument, index
    checks = {r.check for r in results}
    for arg in _arguments(layer):  # the input and every parameter: dot product and FD
        assert {f"dot:{arg}", f"fd:{arg}"} <= checks
        if bk.name != "numpy":
            assert f"numpy:d{arg}" in checks
    assert all(r.backend == bk.name and r.dtype == "float64" for r in results)


@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
@pytest.mark.parametrize(("name", "layer"), CATALOG, ids=IDS)
def test_every_layer_passes_in_float32(name, layer, backend_name):
    results = check_entry(name, layer, backend_name, np.float32)
    assert not _failures(results), _failures(results)
    assert not any(r.check.startswith("fd:") for r in results)  # FD runs in float64 only
    assert all(r.tol == 1e-5 for r in results)


def test_step_checks_include_the_state_only_adjoint():
    results = check_step(DenseStep(4, "tanh"), name="dense")
    nograd = [r for r in results if r.check == "nograd:dy"]
    assert len(nograd) == 1 and nograd[0].passed


# ----------------------------------------------------------------------------- discrete input
class _TokenTable:
    """out[b] = W[tokens[b]]: a plain layer with integer input (like a token embedding)."""

    discrete_input = True
    in_shape = (2,)
    out_shape = (2, 3)

    def init(self, rng, dtype=np.float64):
        return {"W": rng.standard_normal((5, 3)).astype(dtype)}

    def example_input(self, rng, batch):
        return rng.integers(0, 5, size=(batch, 2))

    def forward(self, params, tokens, bk):
        return params["W"][tokens], tokens

    def adjoint(self, params, tokens, dout, bk):
        dW = np.zeros_like(params["W"])
        np.add.at(dW, tokens.reshape(-1), dout.reshape(-1, 3))
        return None, {"W": dW}


def test_a_layer_with_integer_input_skips_the_input_checks():
    results = check_layer(_TokenTable(), name="tokens")
    assert not _failures(results), _failures(results)
    assert {r.check for r in results} == {"dot:W", "fd:W"}


# ----------------------------------------------------------------------------- relu kinks
class _Relu:
    """out = relu(x), with inputs of which half sit within a finite-difference step of 0."""

    in_shape = (4,)
    out_shape = (4,)

    def init(self, rng, dtype=np.float64):
        return {}

    def example_input(self, rng, batch):
        return np.tile([1e-7, -3e-6, 0.8, -0.6], (batch, 1))

    def forward(self, params, x, bk):
        return bk.activation(x, "relu"), x

    def adjoint(self, params, x, dout, bk):
        return bk.activation_adjoint(x, dout, "relu"), {}


def test_finite_differences_step_around_relu_kinks():
    from refbraid.verify.probes import central_difference

    layer = _Relu()
    x = layer.example_input(None, 1)
    f = lambda a: layer.forward({}, a["x"], R)[0]
    w = np.ones_like(x)
    at_kink = central_difference(f, {"x": x}, "x", (0, 0), w, f({"x": x}))
    # relu(1e-7 ± δ): the difference is (1e-7 + δ)/2δ, neither slope 0 nor slope 1, and the
    # kink indicator |relu(x+δ) − 2 relu(x) + relu(x−δ)|/2δ = (δ − 1e-7)/2δ is its error
    delta = FD_STEP
    assert at_kink.value == pytest.approx((1e-7 + delta) / (2 * delta), rel=1e-9)
    assert at_kink.kink == pytest.approx((delta - 1e-7) / (2 * delta), rel=1e-9)
    results = check_layer(layer, batch=2, n_fd=8, name="relu")  # visits every entry
    assert not _failures(results), _failures(results)  # the kink samples were replaced


# ----------------------------------------------------------------------------- complex step
@pytest.mark.parametrize("act", R.ACTIVATIONS)
def test_complex_activation_is_the_dual_number_rule(act):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(50), rng.standard_normal(50)
    z = a + 1j * COMPLEX_STEP * b
    slope = R.activation_adjoint(a, np.ones_like(a), act)
    out = R.activation(z, act)
    np.testing.assert_array_equal(out.real, R.activation(a, act))
    np.testing.assert_allclose(out.imag / COMPLEX_STEP, b * slope, rtol=1e-15, atol=1e-300)
    # σ'(a + iεb) = σ'(a) + iεb σ''(a); σ'' checked against central differences of σ'
    d = R.activation_adjoint(z, np.ones_like(z), act)
    step = 1e-5
    curvature = (R.activation_adjoint(a + step, np.ones_like(a), act)
                 - R.activation_adjoint(a - step, np.ones_like(a), act)) / (2 * step)
    np.testing.assert_allclose(d.imag / COMPLEX_STEP, b * curvature, rtol=1e-8, atol=1e-9)


def test_complex_step_of_the_loss_matches_its_adjoint():
    rng = np.random.default_rng(2)
    logits, labels = rng.standard_normal((5, 4)) * 3, np.array([0, 3, 1, 1, 2])
    direction = rng.standard_normal((5, 4))
    tangent = complex_step_tangent(lambda a: R.softmax_cross_entropy(a["z"], labels)[0],
                                   {"z": logits}, "z", direction)
    _, probs = R.softmax_cross_entropy(logits, labels)
    dlogits = R.softmax_cross_entropy_adjoint(probs, labels)
    assert tangent == pytest.approx(np.sum(dlogits * direction), rel=1e-14)


def test_unknown_activation_is_rejected_for_complex_input_too():
    with pytest.raises(ValueError, match="`activation` must be one of"):
        R.activation(np.ones(3, dtype=complex), "swish")
    with pytest.raises(ValueError, match="`activation` must be one of"):
        R.activation_adjoint(np.ones(3, dtype=complex), np.ones(3), "swish")


# ----------------------------------------------------------------------------- bad arguments
def test_check_step_rejects_bad_arguments():
    with pytest.raises(TypeError, match="`step` must be an ODE step"):
        check_step(object())
    with pytest.raises(ValueError, match="`h` must be a positive finite number, got -1"):
        check_step(DenseStep(3), h=-1)
    with pytest.raises(ValueError, match="`batch` must be a positive integer, got 0"):
        check_step(DenseStep(3), batch=0)
    with pytest.raises(ValueError, match="`dtype` must be one of"):
        check_step(DenseStep(3), dtype=np.float16)
    with pytest.raises(ValueError, match="`backend` must be one of"):
        check_step(DenseStep(3), backend="tpu")
    with pytest.raises(TypeError, match="`layer` must be a plain layer"):
        check_layer(DenseStep(3))


# ----------------------------------------------------------------------------- PyTorch
@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
@pytest.mark.parametrize(("name", "layer"), CATALOG, ids=IDS)
def test_layers_match_pytorch_autograd(name, layer, backend_name):
    pytest.importorskip("torch")
    from refbraid.verify.torch_reference import torch_checks

    results = torch_checks(name, layer, backend_name)
    if not results:  # the layers of the brief all have one; a later kind may not yet
        assert not isinstance(layer, CORE_KINDS), f"{name} lost its torch equivalent"
        pytest.skip(f"{type(layer).__name__} has no builder in TORCH_EQUIVALENTS")
    assert not _failures(results), _failures(results)
    assert {"torch:out"} | {f"torch:d{a}" for a in _arguments(layer)} == {r.check for r in results}
