"""``final_fc_relax`` (XBraid's final FC relaxation, TorchBraid's convention) on cases worked out
by hand, and what it changes (and does not change) in a layer-parallel gradient."""

from __future__ import annotations

import numpy as np
import pytest

from refbraid import Network, init_params
from refbraid.backends import get_backend
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.mgrit import MGRITSettings, Problem, solve
from refbraid.network import group, layer_params

A = 0.5  # Φ(u) = A·u


def _scalar(direction="forward"):
    return Problem(step=lambda u, s, t: A * u, u0=np.array([1.0]), n_steps=4,
                   direction=direction)


def test_two_level_f_relaxation_by_hand():
    """N = 4, cfactor 2, cold start, no cycle (max_iter 0). The initial iterate is 1 at every
    point; the F-sweep sets u[1] = A·u[0] = A and u[3] = A·u[2] = A, so the measurement leaves
    [1, A, 1, A, 1] with C-point residuals r[2] = r[4] = A² − 1. The final FC relaxation then
    overwrites the C-points with Φ(u[c−1]) = A·A: [1, A, A², A, A²]."""
    base = dict(levels=2, cfactor=2, max_iter=0, abs_tol=None)
    plain = solve(_scalar(), MGRITSettings(**base))
    final = solve(_scalar(), MGRITSettings(**base, final_fc_relax=True))
    assert np.array_equal(plain.solution[:, 0], [1, A, 1, A, 1])
    assert np.array_equal(final.solution[:, 0], [1, A, A * A, A, A * A])
    # the record is the same: the final relaxation is reported by neither XBraid nor refbraid
    assert plain.norms.tolist() == final.norms.tolist()
    np.testing.assert_allclose(plain.norms, [np.sqrt(2) * (1 - A * A)], rtol=1e-15)
    assert plain.step_counts == final.step_counts  # no step is applied again


def test_backward_direction_by_hand():
    """The same on the reversed grid: u[4] = 1 is the initial value, C-points 2 and 0."""
    s = MGRITSettings(levels=2, cfactor=2, max_iter=0, abs_tol=None, final_fc_relax=True)
    out = solve(_scalar("backward"), s)
    assert np.array_equal(out.solution[:, 0], [A * A, A, A * A, A, 1])


def test_converged_solve_is_unchanged():
    """At convergence the residual is ~0, so the overwrite changes nothing beyond round-off."""
    s = MGRITSettings(levels=2, cfactor=2, max_iter=10, abs_tol=1e-14)
    plain = solve(_scalar(), s)
    final = solve(_scalar(), s.replace(final_fc_relax=True))
    np.testing.assert_allclose(final.solution, plain.solution, rtol=0, atol=1e-14)
    np.testing.assert_allclose(plain.solution[:, 0], A ** np.arange(5), rtol=1e-13)


def test_one_level_ignores_it():
    s = MGRITSettings(levels=1, final_fc_relax=True)
    assert np.array_equal(solve(_scalar(), s).solution[:, 0], A ** np.arange(5))


def test_setting_is_validated():
    with pytest.raises(TypeError, match="final_fc_relax"):
        MGRITSettings(final_fc_relax=1)


def test_layer_parallel_gradient_by_hand():
    """What the convention does to a layer-parallel gradient, derived from the definitions:

    forward final FC: the loss is taken at y[N] = Φ_{N-1}(y[N-1]) with y[N-1] the plain
    solve's (an F-point, not overwritten); adjoint final FC: the step rows
    (∂Φ_n/∂θ_n)ᵀ λ[n+1] are those the last relaxation formed (unchanged), and only the
    opening gradient moves, because λ[0] = Φ_0'(y[0])ᵀ λ[1] overwrites the C-point λ[0].
    """
    bk = get_backend("numpy")
    net = Network(DenseLift(2, 5), DenseStep(5, "tanh"), Classifier((5,), 3), 16, 2.0)
    params = init_params(net, 3)
    rng = np.random.default_rng(0)
    x, labels = rng.standard_normal((6, 2)), rng.integers(0, 3, 6)
    base = dict(max_iter=0, abs_tol=None)
    fwd = MGRITSettings.torchbraid(**{**base, "max_iter": 1})
    bwd = MGRITSettings.torchbraid(**base)
    _, g_plain, i_plain = layer_parallel_gradient(net, params, x, labels,
                                                  LayerParallelSettings(fwd, bwd))
    # adjoint final FC only
    _, g_adj, i_adj = layer_parallel_gradient(
        net, params, x, labels,
        LayerParallelSettings(fwd, bwd.replace(final_fc_relax=True)))
    for k in g_plain:
        if not k.startswith("opening."):
            assert np.array_equal(g_adj[k], g_plain[k]), k
    steps = group(params, "steps")
    lam1 = i_plain.adjoints[1]
    _, cache = net.step.forward(layer_params(steps, 0), i_plain.states[0], net.h, bk)
    lam0, _ = net.step.adjoint(layer_params(steps, 0), cache, lam1, net.h, bk, grads=False)
    np.testing.assert_allclose(i_adj.adjoints[0], lam0, rtol=1e-14, atol=1e-15)
    assert not np.allclose(i_plain.adjoints[0], lam0)  # the convention matters here
    _, open_cache = net.opening.forward(group(params, "opening"), x, bk)
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, lam0, bk)
    for k, v in dopen.items():
        np.testing.assert_allclose(g_adj[f"opening.{k}"], v, rtol=1e-13, atol=1e-15)
    # forward final FC: logits at Φ_{N-1}(y[N-1])
    _, _, i_fwd = layer_parallel_gradient(
        net, params, x, labels, LayerParallelSettings(fwd.replace(final_fc_relax=True), bwd))
    N = net.n_layers
    yN, _ = net.step.forward(layer_params(steps, N - 1), i_plain.states[N - 1], net.h, bk)
    logits, _ = net.closing.forward(group(params, "closing"), yN, bk)
    np.testing.assert_allclose(i_fwd.logits, logits, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_several_ranks_are_bit_identical_to_one(size, direction):
    """The overwrite is local to each rank's block (its residual is there already): with
    uneven splits (N = 50) the gathered solution equals the serial one bit for bit."""
    from refbraid.mgrit import gather_solution
    from refbraid.mgrit.problems import LinearODE, nonlinear_ode
    from refbraid.parallel import run_ranks

    if direction == "forward":
        problem = nonlinear_ode(50, T=1.0, dim=3)
    else:
        g = np.random.default_rng(0).standard_normal((51, 2))
        problem = LinearODE(50, dim=2).adjoint_problem(np.ones(2), g=g)
    s = MGRITSettings.torchbraid(max_iter=1, abs_tol=None, final_fc_relax=True, cfactor=2)
    serial = solve(problem, s)
    assert not np.array_equal(serial.solution, solve(problem, s.replace(
        final_fc_relax=False)).solution)
    out = run_ranks(size, lambda comm: gather_solution(solve(problem, s, comm=comm), comm))
    np.testing.assert_array_equal(out[0], serial.solution)
