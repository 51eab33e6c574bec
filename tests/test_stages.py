"""Mixed (staged) networks: transitions' adjoints, sequential backprop against finite
differences and PyTorch, and layer-parallel gradients through shape-changing states equal
sequential backprop (time-only and spatially coarsened MGRIT levels)."""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.layers import (
    BatchNorm,
    ChannelWiden,
    Classifier,
    ConvLift,
    ConvStep,
    Pool,
    StridedConv,
)
from refbraid.mgrit import MGRITSettings
from refbraid.mgrit.transfer import SpatialCoarsening
from refbraid.stages import (
    Chain,
    Stage,
    StagedNetwork,
    backprop,
    init_params,
    staged_layer_parallel_gradient,
)
from refbraid.stages.packing import Packing
from refbraid.stages.transitions import transition_at

ACT = "tanh"


def _net(layers=(4, 5, 3)):
    return StagedNetwork(
        ConvLift(1, 2, 8, 8, ACT),
        (Stage(ConvStep(2, 8, 8, ACT), layers[0]), Stage(ConvStep(2, 4, 4, ACT), layers[1]),
         Stage(ConvStep(3, 4, 4, ACT), layers[2])),
        (Pool(2, (8, 8)), ChannelWiden(2, 3, (4, 4), "zeros")),
        Classifier((3, 4, 4), 3),
    )


def _batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2, 1, 8, 8)), rng.integers(0, 3, 2)


@pytest.mark.parametrize("transition,coarse", [
    (Pool(2, (8, 8)), (4, 4)), (Pool(2, (4, 8, 4), "max"), (2, 4, 2)),
    (StridedConv(2, 3, (8, 8), ACT), (4, 4)), (ChannelWiden(2, 3, (8, 8), "zeros"), (4, 4)),
    (BatchNorm(2, (4, 4, 4)), (2, 2, 2)),
    (Chain((Pool(2, (8, 8)), ChannelWiden(2, 4, (4, 4), "zeros"), BatchNorm(4, (4, 4)))),
     (4, 4))])
def test_a_transition_on_coarse_maps_computes_its_shape_from_its_input(transition, coarse):
    """On a level coarsened in space the transition gets smaller maps: rebuilt by
    ``transition_at``, it keeps its parameters and halves (or keeps) the maps it is given,
    and its adjoint passes the dot-product test there."""
    rng, bk = np.random.default_rng(1), get_backend("numpy")
    small = transition_at(transition, (transition.in_shape[0], *coarse))
    fine_out, small_out = transition.out_shape, small.out_shape
    assert small_out[0] == fine_out[0]
    assert all(2 * c == f for c, f in zip(small_out[1:], fine_out[1:], strict=True))
    params = transition.init(rng)
    y = rng.standard_normal((3, *small.in_shape))
    out, cache = small.forward(params, y, bk)
    w = rng.standard_normal(out.shape)
    dy, _ = small.adjoint(params, cache, w, bk)
    v, eps = rng.standard_normal(y.shape), 1e-6  # ⟨w, T'(y) v⟩ = ⟨T'(y)ᵀ w, v⟩
    up, down = small.forward(params, y + eps * v, bk)[0], small.forward(params, y - eps * v, bk)[0]
    assert abs(np.vdot(w, (up - down) / (2 * eps)) - np.vdot(dy, v)) <= 1e-7 * np.abs(dy).sum()
    with pytest.raises(ValueError, match="cannot take states of shape"):
        transition_at(transition, (transition.in_shape[0] + 1, *coarse))


def test_grid_and_shapes():
    net = _net()
    assert net.n_steps == 4 + 1 + 5 + 1 + 3
    assert net.state_shapes[4] == (2, 8, 8) and net.state_shapes[5] == (2, 4, 4)
    assert net.state_shapes[-1] == (3, 4, 4)
    # a coarse interval straddling the transition: ODE run, transition, ODE run
    kinds = [(fs.kind, fs.stage, fs.layer, k) for fs, k in net.segments(2, 8)]
    assert kinds == [("ode", 0, 2, 2), ("transition", 0, 0, 1), ("ode", 1, 0, 3)]


def test_bad_networks_name_the_argument():
    with pytest.raises(ValueError, match="`transitions`"):
        StagedNetwork(ConvLift(1, 2, 8, 8), (Stage(ConvStep(2, 8, 8), 2),),
                      (Pool(2, (8, 8)),), Classifier((2, 8, 8), 3))
    with pytest.raises(ValueError, match=r"`stages\[1\]`"):
        StagedNetwork(ConvLift(1, 2, 8, 8), (Stage(ConvStep(2, 8, 8), 2),
                                             Stage(ConvStep(2, 8, 8), 2)),
                      (Pool(2, (8, 8)),), Classifier((2, 4, 4), 3))
    with pytest.raises(ValueError, match=r"`transitions\[0\]` takes states of shape"):
        StagedNetwork(ConvLift(1, 2, 6, 6), (Stage(ConvStep(2, 6, 6), 1),
                                             Stage(ConvStep(2, 4, 4), 1)),
                      (Pool(2, (8, 8)),), Classifier((2, 4, 4), 3))
    with pytest.raises(ValueError, match="`spatial`"):
        Packing.build([(2, 6, 6), (2, 3, 3)], 2, 2, SpatialCoarsening((1,)))


def test_sequential_backprop_against_finite_differences():
    net, (x, labels) = _net((2, 2, 2)), _batch()
    params = init_params(net, 3)
    _, grads, _ = backprop(net, params, x, labels)
    rng = np.random.default_rng(5)
    eps = 1e-6
    for name in params:
        for _ in range(2):
            idx = tuple(int(rng.integers(n)) for n in params[name].shape)
            plus = {k: v.copy() for k, v in params.items()}
            minus = {k: v.copy() for k, v in params.items()}
            plus[name][idx] += eps
            minus[name][idx] -= eps
            up, down = backprop(net, plus, x, labels)[0], backprop(net, minus, x, labels)[0]
            fd = (up - down) / (2 * eps)
            assert abs(fd - grads[name][idx]) <= 1e-7 * max(1.0, abs(fd)), (name, idx)


def test_sequential_backprop_against_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    net, (x, labels) = _net(), _batch()
    params = init_params(net, 4)
    loss, grads, _ = backprop(net, params, x, labels)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    y = torch.tanh(F.conv2d(torch.tensor(x), tp["opening.W"], tp["opening.b"], padding=1))
    for s, stage in enumerate(net.stages):
        h = net.h(s)
        for j in range(stage.n_layers):
            y = y + h * torch.tanh(F.conv2d(y, tp[f"stage{s}.W"][j], tp[f"stage{s}.b"][j],
                                            padding=1))
        if s == 0:
            y = F.avg_pool2d(y, 2)
        elif s == 1:
            y = torch.cat([y, torch.zeros(y.shape[0], 1, *y.shape[2:], dtype=y.dtype)], 1)
    logits = y.reshape(y.shape[0], -1) @ tp["closing.W"].T + tp["closing.b"]
    tloss = F.cross_entropy(logits, torch.tensor(labels))
    tloss.backward()
    assert abs(float(tloss.detach()) - loss) <= 1e-12
    for k in params:
        np.testing.assert_allclose(grads[k], tp[k].grad.numpy(), rtol=1e-10, atol=1e-13,
                                   err_msg=k)


@pytest.mark.parametrize("levels,spatial", [(1, None), (3, None), (3, (1,)), (3, (1, 2)),
                                            (4, (2,))])
def test_converged_layer_parallel_gradient_equals_backprop(levels, spatial):
    net, (x, labels) = _net(), _batch()
    params = init_params(net, 1)
    loss_ref, ref, _ = backprop(net, params, x, labels)
    ms = MGRITSettings(levels=levels, cfactor=2, relax="FCF", max_iter=12, abs_tol=1e-13,
                       rel_tol=None, min_coarse=1)
    sc = SpatialCoarsening(spatial) if spatial else None
    loss, grads, info = staged_layer_parallel_gradient(
        net, params, x, labels, LayerParallelSettings(ms, ms, spatial=sc))
    assert info.forward.status == info.backward.status == "converged"
    assert relative_gradient_error(grads, ref) <= 1e-10
    assert abs(loss - loss_ref) <= 1e-12
