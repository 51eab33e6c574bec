"""F-sweeps that write a step's result into the iterate (``out=``) change memory, not numbers.

Oracle: the same computation returning a new array. Exact comparisons throughout.
"""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.backends.into import euler_act_into, writes_into
from refbraid.layers.forward_into import adjoint_into, forward_into
from refbraid.mgrit import Problem
from refbraid.mgrit.problem import CountingStep
from refbraid.mgrit.relax import f_relax
from refbraid.models import build_network
from refbraid.network import group, init_params, layer_params


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("act", ["tanh", "relu", "gelu"])
def test_euler_act_into_equals_a_new_array(backend, dtype, act):
    bk = get_backend(backend)
    rng = np.random.default_rng(0)
    y, z = (rng.standard_normal((3, 4, 5)).astype(dtype) for _ in range(2))
    want = bk.euler_act(y, z, 0.3, act)
    out = np.full_like(y, np.nan)
    got = euler_act_into(bk, y, z, 0.3, act, out)
    assert got is out and np.array_equal(out, want)
    # an out it cannot use (wrong dtype, overlapping y, strided): a new array, same numbers
    for bad in (np.empty(y.shape, np.float16), y, np.empty((3, 4, 10), dtype)[..., ::2]):
        assert not writes_into(bk, bad, y, z)
    strided = np.empty((3, 4, 10), dtype)[..., ::2]
    other = euler_act_into(bk, y, z, 0.3, act, strided)
    assert other is not strided and np.array_equal(other, want)


@pytest.mark.parametrize("model, shape", [("resnet", (3, 4)), ("conv", (2, 2, 5, 5))])
def test_step_forward_into_equals_forward(model, shape):
    bk = get_backend("numpy")
    net = build_network(model, (2,) if model == "resnet" else (1, 5, 5), 3, 2, shape[1], 1.0)
    layer, params = net.step, layer_params(group(init_params(net, 0), "steps"), 1)
    y = np.random.default_rng(1).standard_normal(shape)
    want, cache = layer.forward(params, y, 0.25, bk)
    out = np.empty_like(y)
    got, cache2 = forward_into(layer, params, y, 0.25, bk, out)
    assert got is out and np.array_equal(got, want)
    assert all(np.array_equal(a, b) for a, b in zip(cache, cache2, strict=True))


@pytest.mark.parametrize("forced", [False, True])
def test_f_relax_with_an_out_step_equals_the_copying_step(forced):
    rng = np.random.default_rng(2)
    M = rng.standard_normal((3, 3)) / 3
    g = rng.standard_normal((9, 3)) if forced else None

    def plain(u, a, b):
        return np.tanh(M @ u) * (b - a)

    def with_out(u, a, b, out=None):
        val = plain(u, a, b)
        if out is None:
            return val
        out[...] = val
        return out

    u = rng.standard_normal((9, 3))
    f_pos = [1, 2, 3, 5, 6, 7]
    results = []
    for fn in (plain, with_out):
        step = CountingStep(Problem(fn, u[0], 8))
        assert step.takes_out == (fn is with_out)
        results.append(f_relax(u, g, np.arange(9), f_pos, step))
    assert np.array_equal(results[0], results[1])


@pytest.mark.parametrize("model, shape", [("resnet", (3, 4)), ("conv", (2, 2, 5, 5))])
@pytest.mark.parametrize("grads", [True, False])
def test_step_adjoint_into_equals_adjoint(model, shape, grads):
    bk = get_backend("numpy")
    net = build_network(model, (2,) if model == "resnet" else (1, 5, 5), 3, 2, shape[1], 1.0)
    layer, params = net.step, layer_params(group(init_params(net, 0), "steps"), 1)
    rng = np.random.default_rng(4)
    y, lam = rng.standard_normal(shape), rng.standard_normal(shape)
    _, cache = layer.forward(params, y, 0.25, bk)
    want, dw = layer.adjoint(params, cache, lam, 0.25, bk, grads=grads)
    out = np.full_like(y, np.nan)
    got, dg = adjoint_into(layer, params, cache, lam, 0.25, bk, grads, out)
    assert got is out and np.array_equal(got, want)
    assert (dw is None) == (dg is None) and (dw is None or all(
        np.array_equal(dw[k], dg[k]) for k in dw))
    # out overlapping dy_next: refused, a new array with the same numbers
    same, _ = adjoint_into(layer, params, cache, lam, 0.25, bk, grads, lam)
    assert same is not lam and np.array_equal(same, want)


def test_batched_forced_sweeps_add_into_the_iterate():
    from refbraid.mgrit import batched
    from refbraid.mgrit.problems import dahlquist

    problem = dahlquist(-1.0, 16)
    rng = np.random.default_rng(5)
    u, g = rng.standard_normal((17, *problem.state_shape)), rng.standard_normal(
        (17, *problem.state_shape))
    f_pos = [k for k in range(17) if k % 4]
    want = f_relax(u, g, np.arange(17), f_pos, CountingStep(problem))
    got = batched.f_relax(u, g, np.arange(17), batched.f_sweeps(f_pos), CountingStep(problem))
    assert np.array_equal(got, want)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("model, shape", [("resnet", (3, 4)), ("conv", (2, 2, 5, 5))])
def test_a_coarse_adjoint_step_writes_into_out(backend, model, shape):
    """The adjoint propagator's coarse step Ψ(λ; b → a), b − a = 2, writes λ[a] into ``out``
    where the layer can, with the numbers of the step that returns a new array."""
    from refbraid.layer_parallel import AdjointPropagator

    bk = get_backend(backend)
    net = build_network(model, (2,) if model == "resnet" else (1, 5, 5), 3, 4, shape[1], 1.0)
    steps = group(init_params(net, 0), "steps")
    rng = np.random.default_rng(3)
    states = rng.standard_normal((5, *shape))
    prop = AdjointPropagator(net, steps, states, bk)
    lam = rng.standard_normal(shape)
    want = prop.step(lam, 3, 1)
    out = np.full_like(lam, np.nan)
    got = prop.step(lam, 3, 1, out=out)
    assert np.array_equal(got, want)
    assert got is out or backend == "numpy" and model == "resnet"  # DenseStep's adjoint: new
