"""``--bias-control`` under MPI: the same measurements, the same decisions and the
same trained parameters as the controller in one process.

Launched like every file here (``mpiexec -n N python -m mpi4py -m pytest tests/mpi``, N = 1..4).
The exact and micro-batch gradients are computed serially on world rank 0 from gathered
parameters, the numbers broadcast, and every rank applies the rule to them
(refbraid/distributed/bias_control.py). With pure layer parallelism everything is
bit-identical to one process (the bias and noise, the decisions, the parameters; the MGRIT
residual norms logged beside them sum squares over ranks, so they differ by round-off); with
data parallelism the gradients differ by round-off, so the numbers do too, and the threshold
is set far below the measured ratios so that the decisions cannot flip.
"""

import dataclasses

import numpy as np
import pytest

from refbraid.layer_parallel import relative_gradient_error
from refbraid.training.config import TrainConfig
from refbraid.training.gradients import controlled_gradient, mpi_gradient
from refbraid.training.run import setup
from refbraid.training.trainer import fit, layer_parallel_settings

CASES = {
    "resnet": dict(model="resnet", layers=16, width=4, samples=60),
    "gpt-untied": dict(model="gpt-untied", layers=8, width=8, samples=48),
    "gru": dict(model="gru", data="seq-memory", width=6, samples=48),
}


def _config(name, mode, **kw):
    return TrainConfig(**CASES[name], levels=2, cfactor=2, fwd_iters=1, bwd_iters=1, epochs=1,
                       batch_size=16, seed=5, quiet=True, bias_control=mode, bias_every=1,
                       bias_threshold=1e-4, bias_micro=2, bias_max_iters=2, **kw)


def _largest_divisor(n):
    return max(d for d in range(1, n + 1) if n % d == 0)


def _numbers(decision):
    return {k: v for k, v in decision.items() if isinstance(v, float)}


@pytest.mark.parametrize("name,mode,split", [
    ("resnet", "iterations", "layers"), ("resnet", "serial", "layers"),
    ("gpt-untied", "serial", "layers"), ("gru", "iterations", "layers"),
    ("resnet", "iterations", "data"), ("gpt-untied", "serial", "data"),
    ("resnet", "residual", "layers"),  # the proxy: no measurement, rank 0's residual decides
    ("gru", "measure", "data"),  # measure and log only
])
def test_controller_over_mpi_decides_and_trains_as_in_one_process(world, name, mode, split):
    D = 1 if split == "layers" else _largest_divisor(world.size)
    proxy = dict(bias_signal="residual", bias_residual=1e-12) if mode == "residual" else {}
    config = _config(name, "iterations" if proxy else mode, data_parallel=D, **proxy)
    settings = layer_parallel_settings(config)
    net, data, state, bk = setup(config)
    one = controlled_gradient(net, settings, bk, config)
    serial = fit(net, state, data, one, epochs=1, batch_size=config.batch_size, bk=bk,
                 quiet=True)
    net, data, state, bk = setup(config)
    label, grad = mpi_gradient(config, net, settings, bk)
    assert label.endswith("-bias-control")
    result = fit(net, state, data, grad, epochs=1, batch_size=config.batch_size, bk=bk,
                 quiet=True)
    mine, want = grad.summary(), one.summary()
    assert [d["action"] for d in mine["decisions"]] == [d["action"] for d in want["decisions"]]
    assert [d["step"] for d in mine["decisions"]] == [d["step"] for d in want["decisions"]]
    assert bool(want["decisions"]) == (mode != "measure"), "decisions to compare, or none"
    assert len(mine["measurements"]) == len(want["measurements"])
    assert mine["serial"] == want["serial"] and mine["final_iters"] == want["final_iters"]
    assert mine["step_applications"] == want["step_applications"]
    for a, b in zip(mine["measurements"], want["measurements"], strict=True):
        measured = ("bias", "noise", "bias_ratio", "rel_bias")  # on rank 0, from gathered θ
        if D == 1:
            assert [a[k] for k in measured] == [b[k] for k in measured]
        else:
            assert [a[k] for k in measured] == pytest.approx([b[k] for k in measured], rel=1e-8)
        # MGRIT's residual norm over ranks sums the squares in another order: round-off
        assert _numbers(a) == pytest.approx(_numbers(b), rel=1e-10)
    everyone = world.allgather(grad.summary()["decisions"])
    assert all(d == everyone[0] for d in everyone)  # every rank took the same decisions
    if grad.is_root:  # the trained parameters, gathered on rank 0
        err = relative_gradient_error(result.state.params, serial.state.params)
        assert err == 0.0 if D == 1 else err <= 1e-12
        if D == 1:
            for k, v in serial.state.params.items():
                np.testing.assert_array_equal(result.state.params[k], v, err_msg=k)
        assert result.final["val_acc"] == serial.final["val_acc"]


def test_controller_over_mpi_prints_its_decisions_once(world, capsys):
    config = dataclasses.replace(_config("resnet", "serial"), quiet=False)
    net, data, state, bk = setup(config)
    _, grad = mpi_gradient(config, net, layer_parallel_settings(config), bk)
    fit(net, state, data, grad, epochs=1, batch_size=config.batch_size, bk=bk, quiet=True)
    said = capsys.readouterr().out.count("bias control at step")
    assert world.allgather(said) == [1] + [0] * (world.size - 1)
