"""``--batch-norm`` with ``--bias-control``: the running statistics are updated once per step,
from the gradient that is taken; the measurement's exact backprops change nothing."""

from __future__ import annotations

import json

import numpy as np

from refbraid.backends import get_backend
from refbraid.cli import main
from refbraid.models import build_network
from refbraid.training import TrainConfig, train
from refbraid.training.checkpoint import load_checkpoint
from refbraid.training.gradients import controlled_gradient, layer_parallel_settings

BASE = dict(model="conv-stages", batch_norm=True, data="digits", samples=100, layers=4,
            width=2, batch_size=25, lr=1e-2, quiet=True, levels=2, epochs=1,
            checkpoint_every=1)


def test_measuring_changes_neither_weights_nor_running_statistics(tmp_path):
    plain = train(TrainConfig(**BASE, out=str(tmp_path / "plain")))
    measured = train(TrainConfig(**BASE, bias_control="measure", bias_every=1, bias_micro=2,
                                 out=str(tmp_path / "measured")))
    for k, v in plain.state.params.items():
        np.testing.assert_array_equal(measured.state.params[k], v, err_msg=k)
    a = load_checkpoint(tmp_path / "plain").buffers
    b = load_checkpoint(tmp_path / "measured").buffers
    for k in a:
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)
    steps = plain.state.history[-1]["steps"]
    assert int(b["updates"]) == steps  # once per step, not once per backprop
    summary = json.loads((tmp_path / "measured" / "bias_control.json").read_text())
    assert len(summary["measurements"]) == steps


def test_running_statistics_follow_the_step_taken_before_and_after_the_switch():
    """Mode 'serial' with a tiny threshold: step 1 is layer-parallel (measured, then the
    switch), step 2 serial backprop; each folds its own forward sweep's statistics in."""
    cfg = TrainConfig(**{**BASE, "layers": 8, "levels": 3, "relax": "F",  # inexact solves
                         "bias_control": "serial", "bias_every": 1, "bias_threshold": 1e-6,
                         "bias_micro": 2})
    model = build_network("conv-stages", (1, 8, 8), 10, 8, 2, 1.0, batch_norm=True)
    twin = build_network("conv-stages", (1, 8, 8), 10, 8, 2, 1.0, batch_norm=True)
    settings = layer_parallel_settings(cfg)
    gradient = controlled_gradient(model, settings, get_backend("numpy"), cfg)
    rng = np.random.default_rng(0)
    params = model.init_params(rng)
    x, y = rng.standard_normal((6, 1, 8, 8)), rng.integers(0, 10, 6)

    gradient(params, x, y)  # layer-parallel step, then the measurement and the switch
    assert gradient.serial and model.updates == 1
    twin.record_batch_stats(twin.layer_parallel_gradient(params, x, y, settings)[2])
    for k, v in twin.running.items():
        np.testing.assert_array_equal(model.running[k], v, err_msg=k)

    params2 = {k: 0.9 * v for k, v in params.items()}
    gradient(params2, x, y)  # serial backprop step
    assert model.updates == 2
    twin.record_batch_stats(twin.backprop(params2, x, y)[2])
    for k, v in twin.running.items():
        np.testing.assert_array_equal(model.running[k], v, err_msg=k)


def test_cli_accepts_batch_norm_with_bias_control(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", "conv-stages", "--batch-norm", "--bias-control",
                 "iterations", "--bias-every", "1", "--bias-micro", "2", "--samples", "80",
                 "--layers", "4", "--width", "2", "--levels", "2", "--epochs", "1",
                 "--spatial-levels", "1",
                 "--batch-size", "20", "--quiet", "--out", str(out)]) == 0
    assert json.loads((out / "bias_control.json").read_text())["measurements"]


def test_more_iterations_keeps_spatial_coarsening():
    from refbraid.bias_control import more_iterations

    s = layer_parallel_settings(TrainConfig(model="conv-stages", layers=8, levels=2,
                                            spatial_levels="1"))
    t = more_iterations(s, 8)
    assert t.spatial == s.spatial and t.spatial is not None
    assert (t.forward.max_iter, t.backward.max_iter) == (s.forward.max_iter + 1,
                                                         s.backward.max_iter + 1)
