"""MGRIT solves, the layer-parallel gradient, the sequence models, the optimizers and a short
training loop on the device stand-ins (strict, CuPy-like), each against the same computation
on NumPy.

Oracle: the NumPy run in the same test (same seeds, same settings): solutions, residual
records, gradients and trained parameters agree to round-off, and every array the solver or
the trainer hands back lives on the stand-in's device.
"""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.backends.host import COUNTS, to_host
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.mgrit import MGRITSettings, Problem, solve
from refbraid.models import build_network
from refbraid.network import init_params, to_backend
from refbraid.sequence import GRUModel, Seq2SeqModel, TransformerModel
from refbraid.training import TrainConfig
from refbraid.training.optim import make_optimizer
from refbraid.training.run import setup
from refbraid.training.trainer import fit, select_gradient

from .devices import on_device

NUMPY = get_backend("numpy")
TWO_CYCLES = LayerParallelSettings.with_iterations(2, 2, levels=2, cfactor=2, min_coarse=1)


def _close(got, want, rtol=1e-12, what=""):
    assert on_device(got), what
    np.testing.assert_allclose(to_host(got), want, rtol=rtol, atol=1e-14, err_msg=what)


def _ode(bk, direction="forward", n_steps=17):
    """u[i] = u[i∓1] + h tanh(u Wᵀ) with a forcing g: a small nonlinear problem."""
    rng = np.random.default_rng(3)
    W = bk.asarray(rng.standard_normal((3, 3)) / 2)
    g = bk.asarray(rng.standard_normal((n_steps + 1, 2, 3)) / 10)
    xp, h = bk.xp, 1.0 / n_steps

    def step(u, start, stop):
        return u + abs(stop - start) * h * xp.tanh(u @ W.T)

    return Problem(step, bk.asarray(rng.standard_normal((2, 3))), n_steps, g=g,
                   direction=direction)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("settings", [
    MGRITSettings(levels=3, cfactor=2, relax="FCF", abs_tol=None, max_iter=3, min_coarse=1),
    MGRITSettings(levels=2, cfactor=4, cycle="F", abs_tol=1e-10, max_iter=20, fmg=True),
    MGRITSettings(levels=2, cfactor=2, abs_tol=None, max_iter=2, min_coarse=1,
                  final_fc_relax=True),
], ids=["V-FCF", "F-cycle-FMG", "final-FC"])
def test_mgrit_solve_and_record_equal_numpy(standin, direction, settings):
    want = solve(_ode(NUMPY, direction), settings)
    got = solve(_ode(standin, direction), settings)
    _close(got.solution, want.solution, what="solution")
    assert got.status == want.status and got.iterations == want.iterations
    np.testing.assert_allclose(got.norms, want.norms, rtol=1e-11, atol=1e-300)
    for level in range(len(want.hierarchy)):
        np.testing.assert_allclose(got.level_norms(level), want.level_norms(level),
                                   rtol=1e-11, atol=1e-300)
    assert got.step_counts == want.step_counts


@pytest.mark.parametrize("model", ["resnet", "conv"])
def test_layer_parallel_gradient_equals_numpy(standin, model):
    shape = (2,) if model == "resnet" else (1, 4, 4)
    net = build_network(model, shape, 3, 4, 3, 1.0)
    params = init_params(net, 0)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((3, *shape)), np.array([0, 2, 1])
    loss, grads, info = layer_parallel_gradient(net, params, x, y, TWO_CYCLES)
    dloss, dgrads, dinfo = layer_parallel_gradient(
        net, to_backend(params, standin), standin.asarray(x), standin.asarray(y), TWO_CYCLES,
        standin)
    assert abs(dloss - loss) <= 1e-13 * abs(loss)
    for k in grads:
        _close(dgrads[k], grads[k], 1e-11, k)
    # a residual at round-off level is round-off: compared relative to the first norm (the
    # cupy stand-in's convolutions are GEMM-summed, equal to NumPy's to round-off)
    for got_norms, want_norms in ((dinfo.forward.norms, info.forward.norms),
                                  (dinfo.backward.norms, info.backward.norms)):
        np.testing.assert_allclose(got_norms, want_norms, rtol=1e-11,
                                   atol=1e-13 * abs(want_norms[0]))
    floor = {"fwd_res": 1e-13 * abs(info.forward.norms[0]),
             "bwd_res": 1e-13 * abs(info.backward.norms[0])}
    got_stats = dinfo.stats()
    for key, want_value in info.stats().items():
        assert got_stats[key] == pytest.approx(want_value, rel=1e-10, abs=floor.get(key, 0.0)), key


def _sequence_case(name, rng):
    if name == "gru":
        m = GRUModel(4, 3, 4, 3, "classic")
        return m, rng.standard_normal((2, 4, 3)), rng.integers(0, 3, 2)
    if name == "transformer":
        m = TransformerModel(7, 4, 3, 8, 4, 2, 12, 2.0)
        return m, rng.integers(0, 7, (2, 4)), rng.integers(0, 3, 2)
    m = Seq2SeqModel(7, 4, 7, 4, 8, 2, 4, 2.0)
    return m, rng.integers(0, 7, (2, 4)), rng.integers(0, 7, (2, 4))


@pytest.mark.parametrize("name", ["gru", "transformer", "seq2seq"])
def test_sequence_model_gradients_equal_numpy(standin, name):
    rng = np.random.default_rng(4)
    m, x, y = _sequence_case(name, rng)
    params = m.init_params(rng)
    settings = LayerParallelSettings.with_iterations(1, 1, levels=2, cfactor=2, min_coarse=1)
    for method in ("backprop", "layer_parallel_gradient"):
        args = (settings,) if method != "backprop" else ()
        loss, grads, _ = getattr(m, method)(params, x, y, *args, NUMPY)
        dloss, dgrads, _ = getattr(m, method)(to_backend(params, standin), standin.asarray(x),
                                              standin.asarray(y), *args, standin)
        assert abs(dloss - loss) <= 1e-12 * abs(loss), method
        for k in grads:
            _close(dgrads[k], grads[k], 1e-10, f"{method} {k}")


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_optimizers_equal_numpy(standin, name):
    rng = np.random.default_rng(5)
    params = {"W": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(3)]
    kw = {"momentum": 0.9} if name == "sgd" else {}
    host, dev = dict(params), to_backend(params, standin)
    opt_host, opt_dev = make_optimizer(name, 0.1, **kw), make_optimizer(name, 0.1, **kw)
    for g in grads:
        opt_host.step(host, g)
        opt_dev.step(dev, to_backend(g, standin))
    for k in params:
        _close(dev[k], host[k], 1e-13, k)
    state = opt_dev.state_dict()  # host copies, through to_host (checkpoints need them)
    assert all(isinstance(v, np.ndarray) for v in state.values())


def test_short_training_run_with_checkpoints_equals_numpy(standin, tmp_path):
    """Two epochs of layer-parallel Adam on tiny Peaks: evaluation, log, checkpoints and the
    loss curve all take host values through to_host; the parameters equal NumPy's."""
    cfg = TrainConfig(data="peaks", samples=40, layers=4, width=4, epochs=2, batch_size=8,
                      levels=2, cfactor=2, quiet=True)
    results = {}
    for bk in (NUMPY, standin):
        net, data, state, _ = setup(cfg)
        state.params = to_backend(state.params, bk)
        _, gradient = select_gradient(cfg, net, bk)
        before = COUNTS["to_host"]
        results[bk.name] = fit(net, state, data, gradient, epochs=2, batch_size=8, bk=bk,
                               out_dir=tmp_path / bk.name, checkpoint_every=1, quiet=True)
        copies = COUNTS["to_host"] - before
    ref, dev = results["numpy"].state, results[standin.name].state
    assert (tmp_path / standin.name / "checkpoint.npz").is_file()
    for k, v in ref.params.items():
        _close(dev.params[k], v, 1e-10, k)
    assert dev.history[-1]["train_loss"] == pytest.approx(ref.history[-1]["train_loss"],
                                                          rel=1e-12)
    assert copies > 0  # the stand-in run's host values all came through the one door
