"""Batch norm inside the layer-parallel section: BN conv steps in the stages and a
BN transition between them. Converged MGRIT gives sequential backprop's gradient; the running
statistics are updated once per training step from the final fine forward sweep (TorchBraid's
rule), so with converged MGRIT they equal serial training's, and an inexact run still updates
them once per step, from its final sweep only."""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.mgrit import MGRITSettings
from refbraid.mgrit.transfer import SpatialCoarsening
from refbraid.network import group, layer_params
from refbraid.stages import batchnorm as stage_bn
from refbraid.stages.model import ConvStagesModel
from refbraid.training.gradients import mgrit_gradient, sequential_gradient


def _model(shape=(1, 8, 8), transition="pool", layers=8):
    return ConvStagesModel(shape, 3, layers, 2, 1.0, "tanh", batch_norm=True,
                           transition=transition)


def _batch(shape=(1, 8, 8), seed=0, n=4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *shape)), rng.integers(0, 3, n)


def _settings(max_iter, spatial=None, levels=3, relax="FCF"):
    ms = MGRITSettings(levels=levels, cfactor=2, relax=relax, max_iter=max_iter,
                       abs_tol=1e-13, rel_tol=None, min_coarse=1)
    return LayerParallelSettings(ms, ms, spatial=SpatialCoarsening(spatial) if spatial else None)


@pytest.mark.parametrize("shape,transition,spatial", [
    ((1, 8, 8), "pool", None), ((1, 8, 8), "strided", (1,)), ((1, 8, 8), "pool", (1, 2)),
    ((1, 4, 4, 4), "pool", (1,))])
def test_converged_layer_parallel_gradient_equals_backprop(shape, transition, spatial):
    model, (x, labels) = _model(shape, transition), _batch(shape)
    params = model.init_params(np.random.default_rng(1))
    loss_ref, ref, _ = model.backprop(params, x, labels)
    loss, grads, info = model.layer_parallel_gradient(params, x, labels,
                                                      _settings(15, spatial))
    assert info.forward.status == info.backward.status == "converged"
    assert relative_gradient_error(grads, ref) <= 1e-10
    assert abs(loss - loss_ref) <= 1e-12
    assert not any(k.startswith(("stage0.running", "transition0")) and "running" in k
                   for k in grads)  # running statistics are data, not weights


def _train(model, gradient, params, steps=4, lr=0.1):
    for step in range(steps):
        x, labels = _batch(seed=10 + step)
        _, grads, _ = gradient(params, x, labels)
        params = {k: v - lr * grads[k] for k, v in params.items()}
    return params


def test_running_statistics_of_converged_layer_parallel_training_equal_serial():
    serial, parallel = _model(), _model()
    params = serial.init_params(np.random.default_rng(2))
    p_serial = _train(serial, sequential_gradient(serial), params)
    p_parallel = _train(parallel, mgrit_gradient(parallel, _settings(15, (1,))), params)
    assert serial.updates == parallel.updates == 4
    assert set(serial.running) == {"stage0.running_mean", "stage0.running_var",
                                   "stage1.running_mean", "stage1.running_var",
                                   "transition0.2_running_mean", "transition0.2_running_var"}
    for k, v in serial.running.items():
        np.testing.assert_allclose(parallel.running[k], v, rtol=0, atol=1e-10, err_msg=k)
        assert not np.allclose(v, stage_bn.init_running(serial.net)[k])  # they moved
    for k in params:
        np.testing.assert_allclose(p_parallel[k], p_serial[k], rtol=0, atol=1e-10, err_msg=k)
    # evaluation uses the running statistics: a sample's logits do not depend on its batch
    x, _ = _batch(seed=99)
    both = serial.logits(p_serial, x)
    np.testing.assert_allclose(serial.logits(p_serial, x[:1]), both[:1], atol=1e-13)


def test_inexact_mgrit_updates_once_per_step_from_the_final_fine_sweep(monkeypatch):
    model = _model(layers=16)
    params = model.init_params(np.random.default_rng(3))
    counted = []
    real = stage_bn.update_running_stats

    def counting(running, batch, momentum):
        counted.append(batch)
        return real(running, batch, momentum)

    monkeypatch.setattr(stage_bn, "update_running_stats", counting)
    settings = _settings(1, relax="F")  # one cycle: far from converged
    gradient = mgrit_gradient(model, settings)
    n_bn = 16 + 1  # 16 BN conv steps and one BN transition
    x, labels = _batch(seed=5)
    _, _, info = model.layer_parallel_gradient(params, x, labels, settings)
    assert info.forward.status != "converged"
    for step in range(3):
        gradient(params, *_batch(seed=20 + step))
        assert model.updates == step + 1 and len(counted) == n_bn * (step + 1)
    # the statistics are those of the final fine sweep: a step starting at an F-point ran
    # on the returned fine state (coarse levels never write the fine-step caches)
    bk, net, pk = get_backend("numpy"), model.net, info.packing
    checked = 0
    for prefix, row, stats in info.batch_stats:
        if row is None:
            continue
        stage = int(prefix[len("stage"):-1])
        i = row + (0 if stage == 0 else net.stages[0].n_layers + 1)  # fine index of the step
        if i % 2 == 0:  # C-point start: its state changed in the final C-relaxation
            continue
        y = pk.unpack(info.forward.solution[i], 0, i)
        step_layer = net.stages[stage].step
        theta = layer_params(group(params, f"stage{stage}"), row)
        _, cache = step_layer.forward(theta, y, net.h(stage), bk)
        again = step_layer.batch_stats(cache, bk)
        np.testing.assert_allclose(stats.mean, again.mean, atol=1e-14)
        np.testing.assert_allclose(stats.var, again.var, atol=1e-14)
        checked += 1
    assert checked >= 3
    # and they differ from the converged (sequential) statistics: taken from this sweep
    exact = stage_bn.final_sweep_stats(net, model.backprop(params, x, labels)[2]["caches"], bk)
    assert max(float(np.abs(a[2].mean - b[2].mean).max())
               for a, b in zip(info.batch_stats, exact, strict=True)) > 1e-8


def test_sequential_bn_network_and_running_statistics_against_torch():
    """The BN staged network (pool + zero channels + BN transition) and one running-statistics
    update against torch autograd and torch's BN buffers."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    model, (x, labels) = _model(layers=4), _batch()
    params = model.init_params(np.random.default_rng(4))
    params = {k: v + (0.1 if k.endswith(("gamma", "beta")) else 0.0) for k, v in params.items()}
    loss, grads, info = model.backprop(params, x, labels)
    model.record_batch_stats(info)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    buffers = {k: torch.tensor(v) for k, v in stage_bn.init_running(model.net).items()}

    def bn(z, prefix, gamma, beta, row=None):
        mean, var = buffers[f"{prefix}running_mean"], buffers[f"{prefix}running_var"]
        if row is not None:
            mean, var = mean[row], var[row]  # views: torch updates the rows in place
        return F.batch_norm(z, mean, var, gamma, beta, training=True, momentum=0.1, eps=1e-5)

    y = torch.tanh(F.conv2d(torch.tensor(x), tp["opening.W"], tp["opening.b"], padding=1))
    for s, stage in enumerate(model.net.stages):
        h = model.net.h(s)
        for j in range(stage.n_layers):
            z = F.conv2d(y, tp[f"stage{s}.W"][j], None, padding=1)
            y = y + h * torch.tanh(bn(z, f"stage{s}.", tp[f"stage{s}.gamma"][j],
                                      tp[f"stage{s}.beta"][j], j))
        if s == 0:
            y = F.avg_pool2d(y, 2)
            y = torch.cat([y, torch.zeros_like(y)], 1)
            y = bn(y, "transition0.2_", tp["transition0.2_gamma"], tp["transition0.2_beta"])
    logits = y.reshape(y.shape[0], -1) @ tp["closing.W"].T + tp["closing.b"]
    tloss = F.cross_entropy(logits, torch.tensor(labels))
    tloss.backward()
    assert abs(float(tloss.detach()) - loss) <= 1e-12
    for k in params:
        np.testing.assert_allclose(grads[k], tp[k].grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=k)
    for k, v in buffers.items():
        np.testing.assert_allclose(model.running[k], v.numpy(), rtol=0, atol=1e-14, err_msg=k)
