"""Gradient-bias control (refbraid.bias_control): the measurement, the controller's
decisions and the ``refbraid train --bias-control`` flags.

Oracles: the definitions (bias 0 for the exact gradient, the noise formula computed by hand from
micro-batch backprops), the MGRIT settings the controller leaves behind, and a short CLI run's
``bias_control.json``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.bias_control import (
    BiasControl,
    ControlledGradient,
    bias_and_noise,
    more_iterations,
)
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.sequence import GPTModel
from refbraid.sequence.losses import IGNORE
from refbraid.training.config import TrainConfig
from refbraid.training.run import train

BK = get_backend("numpy")


def _case(seed=0):
    rng = np.random.default_rng(seed)
    m = GPTModel(9, 6, 4, 8, 2, 12, 2.0)
    x = rng.integers(0, 9, size=(8, 6))
    y = rng.integers(0, 9, size=(8, 6))
    y[:, :2] = IGNORE
    return m, m.init_params(rng), x, y


def _backprop(m):
    return lambda p, x, y: m.backprop(p, x, y, BK)


def test_bias_is_zero_for_the_exact_gradient_and_noise_follows_its_formula():
    m, p, x, y = _case()
    _, g, _ = m.backprop(p, x, y)
    r = bias_and_noise(_backprop(m), p, x, y, g, 4, BK)
    assert r["bias"] == 0.0 and r["bias_ratio"] == 0.0 and r["micro_batches"] == 4
    keys = sorted(p)
    gs = np.stack([np.concatenate([m.backprop(p, x[i:i + 2], y[i:i + 2])[1][k].ravel()
                                   for k in keys]) for i in range(0, 8, 2)])
    want = np.sqrt(((gs - gs.mean(0)) ** 2).sum() / (4 * 3))
    assert r["noise"] == pytest.approx(want, rel=1e-12)
    lp = m.layer_parallel_gradient(p, x, y, LayerParallelSettings.with_iterations(
        1, 1, levels=2, cfactor=2))[1]
    r1 = bias_and_noise(_backprop(m), p, x, y, lp, 4, BK)
    assert r1["bias"] > 0 and r1["bias_ratio"] == pytest.approx(r1["bias"] / r1["noise"])


def _controlled(mode, threshold, max_iters=3):
    m, p, x, y = _case()
    settings = LayerParallelSettings.with_iterations(1, 0, levels=2, cfactor=2)
    said = []
    g = ControlledGradient(
        _backprop(m), lambda p_, x_, y_, s: m.layer_parallel_gradient(p_, x_, y_, s, BK),
        (lambda p_, x_: m.logits(p_, x_, BK), lambda p_, x_, s: m.mgrit_logits(p_, x_, s, BK)),
        settings, BiasControl(mode, every=1, threshold=threshold, micro=2, max_iters=max_iters),
        4, BK, say=said.append)
    return g, p, x, y, said


def test_iterations_mode_raises_the_cycles_up_to_the_cap_and_logs_each_decision():
    g, p, x, y, said = _controlled("iterations", 1e-12)
    g(p, x, y)  # 1/0 cycles: biased
    assert g.decisions[0]["action"].endswith("1/0 -> 2/1") and len(said) == 1
    assert {"bias", "noise", "bias_ratio", "fwd_res", "bwd_res"} <= set(g.decisions[0])
    assert (g.settings.forward.max_iter, g.settings.backward.max_iter) == (2, 1)
    capped, p, x, y, said = _controlled("iterations", 1e-12, max_iters=1)
    capped(p, x, y)
    capped(p, x, y)  # 1/1 cycles of N/m = 2 needed: still biased, and at the cap
    first, second = (d["action"] for d in capped.decisions)
    assert first.endswith("1/0 -> 1/1") and second.endswith("no change")
    assert more_iterations(capped.settings, 1).forward.max_iter == 1


def test_serial_mode_switches_to_backprop_and_the_sequential_forward():
    g, p, x, y, said = _controlled("serial", 1e-12)
    g(p, x, y)
    assert g.serial and len(g.decisions) == 1
    loss, grads, stats = g(p, x, y)
    exact = g.backprop(p, x, y)[1]
    assert all(np.array_equal(grads[k], exact[k]) for k in exact)
    assert stats["serial"] == 1.0 and stats["phi_calls"] == 8.0
    np.testing.assert_array_equal(g.logits(p, x), g.sequential_logits(p, x))


def test_measure_mode_and_a_high_threshold_change_nothing():
    for mode, threshold in (("measure", 1e-12), ("iterations", 1e12)):
        g, p, x, y, said = _controlled(mode, threshold)
        for _ in range(2):
            _, _, stats = g(p, x, y)
        assert not g.decisions and len(g.measurements) == 2 and "bias_ratio" in stats
        assert g.settings.forward.max_iter == 1 and not said


def test_bad_settings_raise_naming_the_flag():
    with pytest.raises(ValueError, match="--bias-control"):
        TrainConfig(model="gpt", bias_control="sometimes")
    with pytest.raises(ValueError, match="--bias-micro"):
        TrainConfig(model="gpt", bias_micro=1)
    with pytest.raises(ValueError, match="--bias-threshold"):
        TrainConfig(model="gpt", bias_threshold=0.0)
    with pytest.raises(ValueError, match="--bias-every"):
        BiasControl("measure", every=0)
    with pytest.raises(ValueError, match="--buffer` must be at most 3"):
        TrainConfig(model="gpt", buffer=4)
    with pytest.raises(ValueError, match="--buffer` applies"):
        TrainConfig(model="resnet", buffer=1)


def test_cli_run_writes_measurements_and_decisions(tmp_path):
    cfg = TrainConfig(model="gpt", width=8, layers=4, samples=60, epochs=1, batch_size=16,
                      bias_control="iterations", bias_every=1, bias_threshold=1e-9,
                      bias_micro=2, out=str(tmp_path / "run"), quiet=True)
    result = train(cfg)
    summary = json.loads((tmp_path / "run" / "bias_control.json").read_text())
    assert len(summary["measurements"]) == result.final["steps"] == 3
    assert summary["decisions"][0]["action"].endswith("2/1 -> 3/2")
    assert summary["final_iters"][0] >= 3
    assert (tmp_path / "run" / "language.json").exists()


def test_the_residual_proxy_acts_without_a_serial_pass():
    m, p, x, y = _case()
    calls = []

    def counting_backprop(p_, x_, y_):
        calls.append(1)
        return m.backprop(p_, x_, y_, BK)

    g = ControlledGradient(
        counting_backprop, lambda p_, x_, y_, s: m.layer_parallel_gradient(p_, x_, y_, s, BK),
        (None, None), LayerParallelSettings.with_iterations(1, 0, levels=2, cfactor=2),
        BiasControl("iterations", every=1, signal="residual", residual=1e-12), 4, BK,
        say=lambda *a: None)
    g(p, x, y)
    assert not calls and not g.measurements  # no backprop, nothing measured
    assert len(g.decisions) == 1 and g.decisions[0]["fwd_res"] > 1e-12
    assert g.settings.forward.max_iter == 2
    with pytest.raises(ValueError, match="--bias-signal"):
        TrainConfig(model="gpt", bias_signal="residual", bias_control="measure")
    with pytest.raises(ValueError, match="--bias-residual"):
        BiasControl("serial", signal="residual", residual=-1.0)
