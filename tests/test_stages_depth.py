"""Multilevel training in depth for the staged conv network (conv-stages): per-stage weight
transfers, the restricted gradient through interpolation (finite differences), MG/Opt's
first-order coherence (exact), batch norm's running statistics once per step, nested init."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.models import build_network
from refbraid.stages.depth import coarser_model
from refbraid.training.gradients import mgrit_gradient, sequential_gradient
from refbraid.training.multilevel import (
    MGOpt,
    MGOptSettings,
    coarser_network,
    corrected_objective,
    depth_groups,
    prolong_weights,
    restrict_gradient,
    restrict_weights,
)


def _case(layers=8, batch_norm=True, seed=0):
    model = build_network("conv-stages", (1, 8, 8), 4, layers, 2, 1.0, batch_norm=batch_norm)
    rng = np.random.default_rng(seed)
    params = model.init_params(rng)
    return model, params, rng.standard_normal((5, 1, 8, 8)), rng.integers(0, 4, 5)


def test_coarser_model_halves_every_stage_and_has_its_own_statistics():
    model, params, x, y = _case(8)
    coarse = coarser_network(model, 2)
    assert [st.n_layers for st in coarse.net.stages] == [2, 2] and coarse.n_layers == 4
    assert coarse.h == 2 * model.h and coarse.running["stage0.running_mean"].shape == (2, 2)
    model.record_batch_stats(model.backprop(params, x, y)[2])
    assert model.updates == 1 and coarse.updates == 0  # separate running statistics
    assert model.net.stages[0].n_layers == 4  # the fine model is unchanged
    with pytest.raises(ValueError, match=r"layers \[3, 3\] \(stages \[0, 1\]\) are not "
                       r"divisible by the depth factor 2"):
        coarser_model(build_network("conv-stages", (1, 8, 8), 4, 6, 2, 1.0), 2)


def test_weights_move_stage_by_stage():
    """Uneven stages (2 and 4 layers): each is interpolated on its own [0, T]."""
    rng = np.random.default_rng(0)
    coarse = {"stage0.W": rng.standard_normal((2, 3)), "stage1.W": rng.standard_normal((4, 3)),
              "stage1.running_var": rng.random((4, 3)), "transition0.W": rng.standard_normal(5),
              "opening.W": rng.standard_normal(2)}
    assert depth_groups(coarse) == {"stage0.": 2, "stage1.": 4}
    fine = prolong_weights(coarse, 12, "constant")
    assert fine["stage0.W"].shape == (4, 3) and fine["stage1.W"].shape == (8, 3)
    np.testing.assert_array_equal(fine["stage1.running_var"][1::2], coarse["stage1.running_var"])
    np.testing.assert_array_equal(fine["transition0.W"], coarse["transition0.W"])
    back = restrict_weights(fine, 6)  # R P = I for 'constant'
    for k, v in coarse.items():
        np.testing.assert_allclose(back[k], v, rtol=1e-15, err_msg=k)
    lin = prolong_weights(coarse, 12, "linear")["stage0.W"]
    np.testing.assert_allclose(lin[1], 0.5 * (coarse["stage0.W"][0] + coarse["stage0.W"][1]))
    with pytest.raises(ValueError, match="not multiples of each other"):
        prolong_weights(coarse, 9)


@pytest.mark.parametrize("kind", ["constant", "linear"])
def test_restricted_gradient_is_the_gradient_through_interpolation(kind):
    """Pᵀ ∇f(P θ_c) against central differences of θ_c ↦ f(P θ_c), for a conv weight, a
    BN scale of a step and a transition weight (training-mode BN, float64)."""
    model, params, x, y = _case(8)
    coarse = restrict_weights(params, 4)
    _, g, _ = model.backprop(prolong_weights(coarse, 8, kind), x, y)
    gc = restrict_gradient(g, 4, kind)
    eps = 1e-6
    picks = [(k, tuple(int(i) for i in np.unravel_index(j, coarse[k].shape)))
             for k, j in (("stage0.W", 5), ("stage1.W", 40), ("stage1.gamma", 3),
                          ("transition0.2_gamma", 1), ("stage0.beta", 0))]
    for key, idx in picks:
        plus = {k: v.copy() for k, v in coarse.items()}
        minus = {k: v.copy() for k, v in coarse.items()}
        plus[key][idx] += eps
        minus[key][idx] -= eps
        fp = model.backprop(prolong_weights(plus, 8, kind), x, y)[0]
        fm = model.backprop(prolong_weights(minus, 8, kind), x, y)[0]
        assert abs((fp - fm) / (2 * eps) - gc[key][idx]) <= 1e-8, key


@pytest.mark.parametrize("kind", ["constant", "linear"])
@pytest.mark.parametrize("layer_parallel", [False, True])
def test_first_order_coherence_is_exact_for_the_staged_network(kind, layer_parallel):
    """∇ψ_{ℓ+1}(R θ) = Pᵀ ∇ψ_ℓ(θ) on every level of a 3-level hierarchy (8, 4, 2 layers)."""
    model, params, x, y = _case(8)
    settings = MGOptSettings(levels=3, factor=2, interpolation=kind)

    def make(n):
        if layer_parallel and n.n_layers >= 4:
            return mgrit_gradient(n, LayerParallelSettings.with_iterations(
                1, 1, levels=2, cfactor=2, min_coarse=1))
        return sequential_gradient(n)

    mg = MGOpt.build(model, make, settings)
    assert [n.n_layers for n in mg.nets] == [8, 4, 2]
    v, theta = None, params
    for level in range(2):
        _, g, _ = corrected_objective(mg.gradients[level], v)(theta, x, y)
        theta_c, v = mg.coarse_correction_term(level, theta, g, x, y)
        _, g_c, _ = corrected_objective(mg.gradients[level + 1], v)(theta_c, x, y)
        want = restrict_gradient(g, mg.nets[level + 1].n_layers, kind)
        assert set(g_c) == set(want) == set(params)
        for k in g_c:
            np.testing.assert_allclose(g_c[k], want[k], rtol=1e-12, atol=1e-15, err_msg=k)
        theta = theta_c


def _config(**kw):
    from refbraid.training.config import TrainConfig

    base = dict(model="conv-stages", batch_norm=True, data="digits", samples=120, layers=8,
                width=2, batch_size=30, epochs=1, quiet=True, levels=2)
    return TrainConfig(**{**base, **kw})


def test_mgopt_step_updates_the_running_statistics_once_from_the_fine_gradient():
    from refbraid.training.gradients import select_gradient
    from refbraid.training.run import setup

    config = _config(mgopt_levels=2, optimizer="sgd", momentum=0.0, lr=0.1)
    model, data, state, bk = setup(config)
    twin, *_ = setup(config)
    x, y = data.x_train[:20], data.y_train[:20]
    gradient = select_gradient(config, model, bk)[1]
    loss, d, stats = gradient(state.params, x, y)
    assert model.updates == 1 and stats["gradient_calls"] >= 5
    fine = mgrit_gradient(twin, _lp_settings(config), get_backend("numpy"))
    assert fine(state.params, x, y)[0] == loss and twin.updates == 1
    for k, v in twin.running.items():
        np.testing.assert_array_equal(model.running[k], v, err_msg=k)


def _lp_settings(config):
    from refbraid.training.gradients import layer_parallel_settings

    return layer_parallel_settings(config)


def test_nested_init_interpolates_weights_and_running_statistics_per_stage():
    from refbraid.training.nested import nested_initial_weights
    from refbraid.training.run import setup

    config = _config(nested_init=1, nested_epochs=1)
    model, data, state, bk = setup(config)
    params = nested_initial_weights(config, model, data, bk)
    for key in ("stage0.W", "stage1.gamma"):  # 'constant': pairs of equal layers
        assert params[key].shape[0] == 4
        np.testing.assert_array_equal(params[key][0::2], params[key][1::2])
    var = model.running["stage1.running_var"]
    np.testing.assert_array_equal(var[0::2], var[1::2])
    assert model.updates > 0 and not np.allclose(var, 1.0)  # from the 4-layer training
    np.testing.assert_array_equal(state.params["stage0.W"], params["stage0.W"])


@pytest.mark.parametrize("flags", [
    ["--nested-init", "1", "--nested-interp", "linear"],
    ["--mgopt-levels", "2", "--optimizer", "sgd", "--momentum", "0", "--lr", "0.1"],
])
def test_conv_stages_multilevel_from_the_command_line(tmp_path, flags):
    from refbraid.cli import main

    out = tmp_path / "r"
    assert main(["train", "--model", "conv-stages", "--batch-norm", "--samples", "80",
                 "--layers", "8", "--width", "2", "--batch-size", "30", "--epochs", "1",
                 "--quiet", "--out", str(out), *flags]) == 0
    log = json.loads((out / "log.json").read_text())
    assert np.isfinite(log["history"][-1]["val_loss"])
