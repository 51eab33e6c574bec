"""Multilevel training in depth: transfers of weights, the gradient restriction, MG/Opt's
first-order coherence (exact), and a cycle that lowers the loss."""

import numpy as np
import pytest

from refbraid.layer_parallel import LayerParallelSettings
from refbraid.models import build_network
from refbraid.network import backprop, init_params
from refbraid.training.gradients import mgrit_gradient, sequential_gradient
from refbraid.training.multilevel import (
    MGOpt,
    MGOptSettings,
    coarser_network,
    corrected_objective,
    interpolation_matrix,
    prolong_weights,
    restrict_gradient,
    restrict_weights,
    restriction_matrix,
)


def _case(n_layers=8, seed=0):
    net = build_network("resnet", (2,), 3, n_layers, 4, 1.0, "tanh")
    rng = np.random.default_rng(seed)
    return net, init_params(net, seed), rng.standard_normal((6, 2)), rng.integers(0, 3, 6)


def test_depth_transfer_matrices():
    P, R = interpolation_matrix(4, 12, "constant"), restriction_matrix(12, 4)
    np.testing.assert_allclose(R @ P, np.eye(4))
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    PL = interpolation_matrix(4, 12, "linear")
    np.testing.assert_allclose(PL.sum(axis=1), 1.0)
    coarse = 2.0 + 0.5 * np.arange(4)  # linear in t: θ_c[j] = a + b j
    np.testing.assert_allclose((PL @ coarse)[:9], 2.0 + 0.5 * np.arange(9) / 3)
    with pytest.raises(ValueError, match="`n_layers`"):
        interpolation_matrix(3, 8)
    with pytest.raises(ValueError, match="`interpolation`"):
        interpolation_matrix(2, 4, "cubic")


@pytest.mark.parametrize("kind", ["constant", "linear"])
def test_restricted_gradient_is_the_gradient_through_interpolation(kind):
    """Pᵀ ∇f(P θ_c) against central differences of θ_c ↦ f(P θ_c)."""
    fine, params, x, y = _case(8)
    coarse_params = restrict_weights(params, 4)
    _, g, _ = backprop(fine, prolong_weights(coarse_params, 8, kind), x, y)
    gc = restrict_gradient(g, 4, kind)
    eps = 1e-6
    for idx in [(0, 1, 2), (3, 0, 0), (2, 3, 1)]:
        plus = {k: v.copy() for k, v in coarse_params.items()}
        minus = {k: v.copy() for k, v in coarse_params.items()}
        plus["steps.W"][idx] += eps
        minus["steps.W"][idx] -= eps
        fp = backprop(fine, prolong_weights(plus, 8, kind), x, y)[0]
        fm = backprop(fine, prolong_weights(minus, 8, kind), x, y)[0]
        assert abs((fp - fm) / (2 * eps) - gc["steps.W"][idx]) <= 1e-8


@pytest.mark.parametrize("kind", ["constant", "linear"])
@pytest.mark.parametrize("layer_parallel", [False, True])
def test_first_order_coherence_is_exact(kind, layer_parallel):
    """∇ψ_{ℓ+1}(R θ) = Pᵀ ∇ψ_ℓ(θ) on every level of a 3-level hierarchy."""
    net, params, x, y = _case(8)
    settings = MGOptSettings(levels=3, factor=2, interpolation=kind)

    def make(n):
        if layer_parallel:
            return mgrit_gradient(n, LayerParallelSettings.with_iterations(
                1, 1, levels=2, cfactor=2, min_coarse=1))
        return sequential_gradient(n)

    mg = MGOpt.build(net, make, settings)
    v, theta = None, params
    for level in range(2):
        _, g, _ = corrected_objective(mg.gradients[level], v)(theta, x, y)
        theta_c, v = mg.coarse_correction_term(level, theta, g, x, y)
        _, g_c, _ = corrected_objective(mg.gradients[level + 1], v)(theta_c, x, y)
        want = restrict_gradient(g, mg.nets[level + 1].n_layers, kind)
        for k in g_c:
            np.testing.assert_allclose(g_c[k], want[k], rtol=1e-12, atol=1e-15, err_msg=k)
        theta = theta_c


def test_corrected_objective_value_matches_its_gradient():
    net, params, x, y = _case(4)
    rng = np.random.default_rng(3)
    v = {k: rng.standard_normal(p.shape) for k, p in params.items()}
    psi = corrected_objective(sequential_gradient(net), v)
    _, g, _ = psi(params, x, y)
    eps, idx = 1e-6, (1, 2, 0)
    plus = {k: a.copy() for k, a in params.items()}
    minus = {k: a.copy() for k, a in params.items()}
    plus["steps.W"][idx] += eps
    minus["steps.W"][idx] -= eps
    fd = (psi(plus, x, y)[0] - psi(minus, x, y)[0]) / (2 * eps)
    assert abs(fd - g["steps.W"][idx]) <= 1e-8


def test_mgopt_cycle_lowers_the_batch_loss():
    net, params, x, y = _case(8)
    mg = MGOpt.build(net, sequential_gradient, MGOptSettings(levels=3, lr=0.2))
    before = backprop(net, params, x, y)[0]
    new, info = mg.cycle(params, x, y)
    assert backprop(net, new, x, y)[0] < before
    assert info["gradient_calls"] > 0 and info["beta"] in (0.0, 0.25, 0.5, 1.0)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="`levels`"):
        MGOptSettings(levels=1)
    with pytest.raises(ValueError, match="`lr`"):
        MGOptSettings(lr=0.0)


def test_loss_only_line_search_gives_the_same_cycle():
    """With loss functions for the line search the cycle is the same, minus gradient calls."""
    from refbraid.network import loss_and_logits

    net, params, x, y = _case(8)
    s = MGOptSettings(levels=2, lr=0.2)
    a, ia = MGOpt.build(net, sequential_gradient, s).cycle(params, x, y)
    b, ib = MGOpt.build(net, sequential_gradient, s,
                        lambda n: lambda p, xx, yy: loss_and_logits(n, p, xx, yy)[0]
                        ).cycle(params, x, y)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-13, atol=1e-15)
    assert ib["loss_calls"] >= 1 and ib["gradient_calls"] < ia["gradient_calls"]


# ----------------------------------------------------------------------------- CLI: nested init
def _nested_config(**kw):
    from refbraid.training.config import TrainConfig

    base = dict(data="peaks", samples=200, layers=8, width=4, epochs=1, quiet=True, levels=2,
                nested_init=2, nested_epochs=1)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("interp", ["constant", "linear"])
def test_nested_init_trains_shallow_networks_then_interpolates_in_t(interp):
    from refbraid.training.nested import NESTED_SEED, nested_initial_weights
    from refbraid.training.run import setup

    config = _nested_config(nested_interp=interp)
    net, data, state, bk = setup(config)
    params = nested_initial_weights(config, net, data, bk)
    start = np.random.default_rng(np.random.SeedSequence([config.seed, NESTED_SEED]))
    fresh = init_params(coarser_network(net, 4), start)  # where the 2-layer training began
    W = params["steps.W"]
    assert W.shape[0] == 8
    if interp == "constant":  # θ[n] = θ_c[⌊n/2⌋]: pairs of equal layers
        np.testing.assert_array_equal(W[0::2], W[1::2])
    else:  # linear in t: interior layers halfway between their neighbours' coarse values
        np.testing.assert_allclose(W[1], 0.5 * (W[0] + W[2]), atol=1e-14)
    assert not np.allclose(params["closing.W"], fresh["closing.W"])  # it trained
    np.testing.assert_array_equal(state.params["steps.W"], W)  # the run starts there


def test_nested_init_from_the_command_line(tmp_path, capsys):
    from refbraid.cli import main

    code = main(["train", "--data", "peaks", "--samples", "200", "--layers", "16", "--width",
                 "4", "--epochs", "1", "--nested-init", "1", "--nested-interp", "linear",
                 "--out", str(tmp_path / "r")])
    assert code == 0
    assert "nested init: 8 layers, 1 epoch(s)" in capsys.readouterr().out


@pytest.mark.parametrize("flags,match", [
    (["--model", "transformer", "--nested-init", "1"], "`--nested-init` needs `--model resnet`"),
    (["--model", "conv-stages", "--layers", "6", "--nested-init", "1"],
     "(two stages, each halved): the layers must be divisible by 4"),
    (["--layers", "6", "--nested-init", "2"], "divisible by 4"),
    (["--nested-init", "1", "--nested-interp", "cubic"], "`--nested-interp` must be one of"),
    (["--nested-init", "-1"], "`--nested-init`"),
])
def test_bad_nested_flags_name_the_flag(flags, match, capsys, tmp_path):
    from refbraid.cli import main

    assert main(["train", *flags, "--out", str(tmp_path / "r")]) == 2
    assert match in capsys.readouterr().err


# ----------------------------------------------------------------------------- CLI: MG/Opt
def test_mgopt_step_through_sgd_is_one_mgopt_cycle():
    from refbraid.training.gradients import select_gradient
    from refbraid.training.optim import make_optimizer
    from refbraid.training.run import setup

    config = _nested_config(nested_init=0, mgopt_levels=3, optimizer="sgd", momentum=0.0,
                            lr=0.2, layers=16)
    net, data, state, bk = setup(config)
    x, y = data.x_train[:32], data.y_train[:32]
    gradient = select_gradient(config, net, bk)[1]
    # 16, 8 and 4 layers all fit 2 MGRIT levels with cfactor 4: layer-parallel everywhere
    mg = MGOpt.build(net, lambda n: mgrit_gradient(n, _settings_of(config)),
                     MGOptSettings(3, 2, 0.2))
    expected, info = mg.cycle(state.params, x, y)
    params = {k: v.copy() for k, v in state.params.items()}
    _, d, stats = gradient(params, x, y)
    make_optimizer("sgd", 0.2).step(params, d)
    for k in params:
        np.testing.assert_allclose(params[k], expected[k], rtol=0, atol=1e-12, err_msg=k)
    assert stats["gradient_calls"] == info["gradient_calls"] + 1


def _settings_of(config):
    from refbraid.training.gradients import layer_parallel_settings

    return layer_parallel_settings(config)


def test_mgopt_from_the_command_line(tmp_path):
    import json

    from refbraid.cli import main

    out = tmp_path / "r"
    assert main(["train", "--data", "peaks", "--samples", "200", "--layers", "16", "--width",
                 "4", "--epochs", "1", "--mgopt-levels", "2", "--optimizer", "sgd",
                 "--momentum", "0", "--lr", "0.2", "--quiet", "--out", str(out)]) == 0
    log = json.loads((out / "log.json").read_text())
    assert log["history"][-1]["stats"]["gradient_calls"] >= 5


@pytest.mark.parametrize("flags,match", [
    (["--mgopt-levels", "2"], "use `--optimizer sgd --momentum 0`"),
    (["--mgopt-levels", "1"], "at least 2"),
    (["--layers", "6", "--mgopt-levels", "3", "--optimizer", "sgd", "--momentum", "0"],
     "divisible by 4"),
    (["--model", "gru", "--mgopt-levels", "2"], "`--mgopt-levels` needs"),
])
def test_bad_mgopt_flags_name_the_flag(flags, match, capsys, tmp_path):
    from refbraid.cli import main

    assert main(["train", *flags, "--out", str(tmp_path / "r")]) == 2
    assert match in capsys.readouterr().err
