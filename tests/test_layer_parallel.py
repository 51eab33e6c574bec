"""Layer-parallel gradients (MGRIT forward + adjoint) against sequential backprop, and
layer-parallel training: exactness, decay with iterations, checkpoints, outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refbraid import Network, backprop, init_params
from refbraid.gradient_error import format_gradient_error_table, gradient_error_study
from refbraid.layer_parallel import (
    LayerParallelSettings,
    adjoint_problem,
    layer_parallel_gradient,
    relative_gradient_error,
)
from refbraid.layers import Classifier, ConvLift, ConvStep, DenseLift, DenseStep
from refbraid.mgrit import MGRITSettings, sequential_solve
from refbraid.network import group
from refbraid.training import TrainConfig, train

RNG = np.random.default_rng(7)


def dense_net(n_layers=16, T=2.0):
    return Network(DenseLift(2, 6), DenseStep(6, "tanh"), Classifier((6,), 5), n_layers, T)


def conv_net(n_layers=8):
    return Network(ConvLift(1, 2, 5, 5), ConvStep(2, 5, 5, "relu"), Classifier((2, 5, 5), 3),
                   n_layers, 1.0)


def batch(net, B=5):
    x = RNG.standard_normal((B, *net.opening.in_shape))
    return x, RNG.integers(0, net.closing.out_shape[0], B)


@pytest.mark.parametrize("make", [dense_net, conv_net], ids=["dense", "conv"])
def test_one_level_equals_sequential_backprop(make):
    net = make()
    params = init_params(net, 1)
    x, y = batch(net)
    loss, g, _ = backprop(net, params, x, y)
    loss_lp, g_lp, info = layer_parallel_gradient(net, params, x, y,
                                                  LayerParallelSettings.exact())
    assert loss_lp == pytest.approx(loss, rel=1e-14)
    err = relative_gradient_error(g_lp, g)
    assert err <= 1e-12, f"1-level layer-parallel gradient differs by {err:.2e}"
    for k in params:
        np.testing.assert_allclose(g_lp[k], g[k], rtol=1e-12, atol=1e-14, err_msg=k)


def test_adjoint_problem_is_the_backprop_recurrence():
    """λ from the adjoint Problem solved sequentially equals backprop's adjoints."""
    net = dense_net(8)
    params = init_params(net, 2)
    x, y = batch(net)
    _, _, info = backprop(net, params, x, y)
    states = np.stack(info["states"])
    lam = sequential_solve(adjoint_problem(net, group(params, "steps"), states,
                                           info["adjoints"][-1], get_numpy()))
    np.testing.assert_allclose(lam, np.stack(info["adjoints"]), rtol=1e-13, atol=1e-15)


def get_numpy():
    from refbraid.backends import get_backend

    return get_backend("numpy")


@pytest.mark.parametrize("levels,cfactor", [(2, 4), (3, 2), (3, 4)])
def test_gradient_error_decays_to_round_off(levels, cfactor):
    net = dense_net(16, T=3.0)
    params = init_params(net, 3)
    x, y = batch(net, 8)
    rows = gradient_error_study(net, params, x, y, range(0, 9), levels=levels, cfactor=cfactor,
                                relax="F")
    table = format_gradient_error_table(rows)
    assert rows[0].grad_error <= 1e-12, table  # one level
    errors = np.array([r.grad_error for r in rows if r.label.endswith("cycles")])
    assert errors[0] > 1e-4, table  # the cold start is genuinely inexact
    assert errors[-1] <= 1e-10, table  # converged: backprop's gradient to round-off
    # decays: each error below the largest one before it (allowing round-off wiggles)
    running_max = np.maximum.accumulate(errors)
    assert np.all(errors <= running_max * (1 + 1e-9) + 1e-14), table
    assert errors[len(errors) // 2] < errors[0], table


def test_default_settings_are_torchbraids():
    s = LayerParallelSettings()
    for m in (s.forward, s.backward):
        assert (m.levels, m.cfactors, m.skip_first_down) == (3, (4, 4), True)
        assert (m.relax_on(0), m.relax_on(1)) == ("F", "FCF")
    # TorchBraid counts the skipped down-cycle: its 2 forward / 1 backward iterations
    assert (s.forward.max_iter, s.backward.max_iter) == (1, 0)


def test_layer_parallel_gradient_reports_solver_stats():
    net = dense_net(16)
    params = init_params(net, 4)
    x, y = batch(net)
    loss, grads, info = layer_parallel_gradient(net, params, x, y)
    stats = info.stats()
    assert set(stats) == {"fwd_res", "fwd_iters", "bwd_res", "bwd_iters", "phi_calls"}
    assert np.isfinite(loss) and all(np.all(np.isfinite(g)) for g in grads.values())
    assert info.forward.settings == LayerParallelSettings().forward


SMALL_LP = dict(samples=300, layers=8, width=6, T=1.5, batch_size=25, lr=1e-2, quiet=True,
                levels=2, cfactor=2)


def test_layer_parallel_checkpoint_resume_is_bit_identical(tmp_path):
    full = train(TrainConfig(**SMALL_LP, epochs=4, out=str(tmp_path / "full")))
    train(TrainConfig(**SMALL_LP, epochs=2, checkpoint_every=1, out=str(tmp_path / "part")))
    resumed = train(TrainConfig(**SMALL_LP, epochs=4, resume=str(tmp_path / "part"),
                                out=str(tmp_path / "resumed")))
    for k, v in full.state.params.items():
        assert np.array_equal(resumed.state.params[k], v), k
    timeless = [[{k: v for k, v in r.items() if k != "time_s"} for r in run.state.history]
                for run in (full, resumed)]
    assert timeless[0] == timeless[1]


def test_layer_parallel_run_logs_solver_stats_and_writes_plots(tmp_path):
    result = train(TrainConfig(**SMALL_LP, epochs=2, check_gradient_every=2, out=str(tmp_path)))
    log = json.loads((tmp_path / "log.json").read_text())
    assert log["gradient"] == "layer-parallel"
    last = log["history"][-1]
    assert {"fwd_res", "bwd_res", "grad_error"} <= set(last["stats"])
    assert 0.0 <= last["val_acc_sequential_forward"] <= 1.0
    for name in ("curves.png", "mgrit.png", "gradient_error.png", "gradient_error.json"):
        assert (tmp_path / name).is_file(), name
    assert result.final["epoch"] == 2


def test_exact_layer_parallel_training_equals_serial_training(tmp_path):
    """One MGRIT level: the whole training run reproduces serial training to round-off."""
    serial = train(TrainConfig(**{**SMALL_LP, "levels": 1}, epochs=2, serial=True,
                               out=str(tmp_path / "serial")))
    lp = train(TrainConfig(**{**SMALL_LP, "levels": 1}, epochs=2, out=str(tmp_path / "lp")))
    for k, v in serial.state.params.items():
        np.testing.assert_allclose(lp.state.params[k], v, rtol=1e-11, atol=1e-13, err_msg=k)


def test_too_many_levels_for_the_depth_names_the_flags(tmp_path):
    with pytest.raises(ValueError, match="--levels 3.*--cfactor 4.*--layers 4"):
        train(TrainConfig(samples=100, layers=4, epochs=1, quiet=True, out=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()  # refused before any work: no empty folder left


def test_mgrit_settings_reach_the_solves():
    from refbraid.training.trainer import layer_parallel_settings

    s = layer_parallel_settings(TrainConfig(levels=4, cfactor=2, fwd_iters=3, bwd_iters=2,
                                            relax="FCF,F", cycle="F"))
    assert isinstance(s.forward, MGRITSettings)
    assert (s.forward.levels, s.forward.max_iter, s.backward.max_iter) == (4, 3, 2)
    assert [s.forward.relax_on(i) for i in range(3)] == ["FCF", "F", "F"]
    assert s.forward.cycle == "F"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point of the test
def test_diverging_mgrit_stops_training_with_a_clear_error_and_keeps_the_log(tmp_path):
    from refbraid.training import TrainingDiverged

    cfg = TrainConfig(**{**SMALL_LP, "lr": 1e8, "optimizer": "sgd", "activation": "relu"},
                      epochs=3, out=str(tmp_path))
    with pytest.raises(TrainingDiverged, match="MGRIT diverged.*--lr"):
        train(cfg)
    log = json.loads((tmp_path / "log.json").read_text())
    assert log["status"] == "diverged" and "MGRIT" in log["error"]
