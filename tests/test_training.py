"""Optimizers (closed forms, an independent transcription of torch's algorithms, and torch
itself when importable), network builders and the training loop (accuracy, pluggable
gradient and its stats, divergence, files, backends, dtypes)."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from refbraid.models import as_network_input
from refbraid.network import backprop, init_params
from refbraid.training import (
    SGD,
    Adam,
    TrainConfig,
    TrainingDiverged,
    build_network,
    make_optimizer,
    sequential_gradient,
    train,
)
from refbraid.training.run import setup
from refbraid.training.trainer import fit, select_gradient


def _params(rng, shapes=((3, 2), (4,))):
    return {f"p{i}": rng.normal(size=s) for i, s in enumerate(shapes)}


# ----------------------------------------------------------------------------- SGD
@pytest.mark.parametrize("mu", [0.0, 0.5, 0.9])
def test_sgd_constant_gradient_closed_form(mu):
    """b_k = g Σ_{j<k} μ^j, so θ_k = θ_0 − η g Σ_{i=1..k} (1 − μ^i)/(1 − μ)."""
    rng = np.random.default_rng(0)
    p = _params(rng)
    p0 = {k: v.copy() for k, v in p.items()}
    g = {k: rng.normal(size=v.shape) for k, v in p.items()}
    opt, lr, K = SGD(0.1, momentum=mu), 0.1, 7
    for _ in range(K):
        opt.step(p, g)
    factor = sum((1 - mu**i) / (1 - mu) for i in range(1, K + 1))
    for k in p:
        np.testing.assert_allclose(p[k], p0[k] - lr * g[k] * factor, rtol=1e-13, atol=1e-14)
    assert opt.t == K


def _sgd_reference(theta, grads, lr, mu, tau, wd, nesterov):
    """torch.optim.SGD's documented algorithm, one scalar at a time."""
    theta = list(theta)
    b = [None] * len(theta)
    for g_t in grads:
        for i in range(len(theta)):
            g = g_t[i] + wd * theta[i]
            if mu != 0:
                b[i] = g if b[i] is None else mu * b[i] + (1 - tau) * g
                g = g + mu * b[i] if nesterov else b[i]
            theta[i] = theta[i] - lr * g
    return np.array(theta)


@pytest.mark.parametrize("kw", [dict(momentum=0.9), dict(momentum=0.8, dampening=0.3),
                                dict(momentum=0.9, nesterov=True, weight_decay=0.01),
                                dict(weight_decay=0.1)])
def test_sgd_matches_torch_algorithm_on_random_gradients(kw):
    rng = np.random.default_rng(1)
    theta0 = rng.normal(size=6)
    grads = [rng.normal(size=6) for _ in range(5)]
    p = {"w": theta0.copy()}
    opt = SGD(0.05, **kw)
    for g in grads:
        opt.step(p, {"w": g})
    ref = _sgd_reference(theta0, grads, 0.05, kw.get("momentum", 0.0), kw.get("dampening", 0.0),
                         kw.get("weight_decay", 0.0), kw.get("nesterov", False))
    np.testing.assert_allclose(p["w"], ref, rtol=1e-14, atol=1e-15)


# ----------------------------------------------------------------------------- Adam
def test_adam_constant_gradient_closed_form():
    """With g constant, m̂ = g and v̂ = g², so every step moves θ by −η g/(|g| + ε)."""
    rng = np.random.default_rng(2)
    p = _params(rng)
    p0 = {k: v.copy() for k, v in p.items()}
    g = {k: rng.normal(size=v.shape) for k, v in p.items()}
    lr, eps, K = 0.01, 1e-8, 9
    opt = Adam(lr, eps=eps)
    for _ in range(K):
        opt.step(p, g)
    for k in p:
        np.testing.assert_allclose(p[k], p0[k] - K * lr * g[k] / (np.abs(g[k]) + eps),
                                   rtol=1e-12, atol=1e-14)


def _adam_reference(theta, grads, lr, b1, b2, eps, wd):
    """Kingma & Ba's Algorithm 1 with torch's weight decay, scalar by scalar."""
    theta = list(theta)
    m, v = [0.0] * len(theta), [0.0] * len(theta)
    for t, g_t in enumerate(grads, start=1):
        for i in range(len(theta)):
            g = g_t[i] + wd * theta[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat, v_hat = m[i] / (1 - b1**t), v[i] / (1 - b2**t)
            theta[i] = theta[i] - lr * m_hat / (math.sqrt(v_hat) + eps)
    return np.array(theta)


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adam_matches_the_algorithm_on_random_gradients(wd):
    rng = np.random.default_rng(3)
    theta0 = rng.normal(size=7)
    grads = [rng.normal(size=7) for _ in range(6)]
    p = {"w": theta0.copy()}
    opt = Adam(0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=wd)
    for g in grads:
        opt.step(p, {"w": g})
    np.testing.assert_allclose(p["w"], _adam_reference(theta0, grads, 0.02, 0.8, 0.99, 1e-6, wd),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_optimizers_match_torch(name):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    theta0 = rng.normal(size=(3, 4))
    grads = [rng.normal(size=(3, 4)) for _ in range(5)]
    w = torch.tensor(theta0.copy(), dtype=torch.float64, requires_grad=True)
    topt = (torch.optim.SGD([w], lr=0.05, momentum=0.9) if name == "sgd"
            else torch.optim.Adam([w], lr=0.05))
    p = {"w": theta0.copy()}
    opt = make_optimizer(name, 0.05, momentum=0.9)
    for g in grads:
        w.grad = torch.tensor(g)
        topt.step()
        opt.step(p, {"w": g})
    np.testing.assert_allclose(p["w"], w.detach().numpy(), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_optimizer_state_round_trip_continues_identically(name):
    rng = np.random.default_rng(5)
    p = _params(rng)
    grads = [{k: rng.normal(size=v.shape) for k, v in p.items()} for _ in range(4)]
    a = make_optimizer(name, 0.1, momentum=0.9)
    for g in grads[:2]:
        a.step(p, g)
    q = {k: v.copy() for k, v in p.items()}
    b = make_optimizer(name, 0.1, momentum=0.9)
    b.load_state_dict(a.state_dict(), q)
    for g in grads[2:]:
        a.step(p, g)
        b.step(q, g)
    for k in p:
        np.testing.assert_array_equal(p[k], q[k])


def test_optimizer_float32_stays_float32():
    p = {"w": np.ones(3, np.float32)}
    for name in ("sgd", "adam"):
        opt = make_optimizer(name, 0.1, momentum=0.9)
        opt.step(p, {"w": np.full(3, 0.5, np.float32)})
        opt.step(p, {"w": np.full(3, 0.5, np.float32)})
        assert p["w"].dtype == np.float32
        assert all(v.dtype == np.float32 for k, v in opt.state.items() if k != "step")


@pytest.mark.parametrize("make, match", [
    (lambda: SGD(0.0), "`lr`"), (lambda: SGD(-1.0), "`lr`"), (lambda: SGD(float("nan")), "`lr`"),
    (lambda: SGD(0.1, momentum=1.0), "`momentum`"), (lambda: SGD(0.1, nesterov=True), "nesterov"),
    (lambda: Adam(0.1, betas=(1.0, 0.9)), r"`betas\[0\]`"), (lambda: Adam(0.1, eps=0), "`eps`"),
    (lambda: Adam(0.1, betas=0.9), "`betas`"), (lambda: Adam(0.1, weight_decay=-1), "weight_decay"),
    (lambda: make_optimizer("rmsprop", 0.1), "`optimizer`"), (lambda: SGD(True), "`lr`"),
])
def test_optimizer_hyper_parameters_are_validated(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_optimizer_checks_grads_and_state():
    p = {"w": np.zeros(3)}
    opt = Adam(0.1)
    with pytest.raises(ValueError, match="missing"):
        opt.step(p, {"v": np.zeros(3)})
    with pytest.raises(ValueError, match=r"`grads\['w'\]` has shape"):
        opt.step(p, {"w": np.zeros(4)})
    with pytest.raises(ValueError, match="does not match"):
        opt.load_state_dict({"step": np.array(1), "momentum_buffer/w": np.zeros(3)}, p)
    with pytest.raises(ValueError, match="has shape"):
        opt.load_state_dict({"step": np.array(1), "exp_avg/w": np.zeros(2)}, p)


# ----------------------------------------------------------------------------- models
def test_build_network_shapes():
    net = build_network("resnet", (2,), 5, layers=4, width=8, T=2.0, activation="tanh")
    assert net.opening.in_shape == (2,) and net.step.state_shape == (8,) and net.h == 0.5
    img = build_network("resnet", (1, 8, 8), 10, 3, 6, 1.0)
    assert img.opening.in_shape == (64,)
    x = np.zeros((5, 1, 8, 8))
    assert as_network_input(img, x).shape == (5, 64)
    conv = build_network("conv", (1, 8, 8), 10, 3, 4, 1.0, "relu")
    assert conv.step.state_shape == (4, 8, 8) and conv.closing.in_shape == (4, 8, 8)
    assert build_network("conv", (6, 5), 3, 2, 2, 1.0).opening.in_shape == (1, 6, 5)


def test_build_network_errors():
    with pytest.raises(ValueError, match="`model` must be one of"):
        build_network("transformer9", (2,), 5, 4, 8, 1.0)
    with pytest.raises(ValueError, match="'conv' needs image data.*\\(2,\\)"):
        build_network("conv", (2,), 5, 4, 8, 1.0)
    with pytest.raises(ValueError, match="`n_layers`"):
        build_network("resnet", (2,), 5, 0, 8, 1.0)
    with pytest.raises(ValueError, match="`activation`"):
        build_network("resnet", (2,), 5, 2, 8, 1.0, "sigmoid")


# ----------------------------------------------------------------------------- trainer
SMALL = dict(samples=600, layers=4, width=8, T=2.0, epochs=8, batch_size=32, lr=1e-2,
             quiet=True, serial=True)
TINY_PEAKS = dict(samples=800, layers=4, width=12, T=2.0, epochs=20, batch_size=20, lr=1e-2,
                  quiet=True, serial=True)  # val acc 0.75-0.88 over seeds 0-4


def test_sequential_gradient_is_backprop():
    net = build_network("resnet", (2,), 5, 3, 4, 1.0)
    params = init_params(net, 0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(10, 2)), rng.integers(0, 5, 10)
    loss, grads, stats = sequential_gradient(net)(params, x, y)
    loss_ref, grads_ref, _ = backprop(net, params, x, y)
    assert loss == loss_ref and stats == {}
    for k in params:
        np.testing.assert_array_equal(grads[k], grads_ref[k])


def test_training_on_tiny_peaks_reaches_a_sensible_accuracy(tmp_path):
    result = train(TrainConfig(**TINY_PEAKS, out=str(tmp_path)))
    first, last = result.state.history[0], result.state.history[-1]
    assert last["epoch"] == 20 and len(result.state.history) == 20
    assert last["train_loss"] < 0.6 * first["train_loss"]
    assert last["val_acc"] >= 0.65, last  # 5 balanced classes: chance is 0.2
    assert (tmp_path / "log.json").is_file() and (tmp_path / "curves.png").is_file()
    log = json.loads((tmp_path / "log.json").read_text())
    assert log["status"] == "finished" and log["gradient"] == "sequential"
    assert log["config"]["layers"] == 4 and len(log["history"]) == 20
    assert log["data"]["n_train"] == 640 and log["data"]["n_val"] == 160
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary files left behind


def test_progress_lines_one_per_epoch_and_quiet(tmp_path):
    out = io.StringIO()
    train(TrainConfig(**{**SMALL, "epochs": 3, "quiet": False}, out=str(tmp_path)), stream=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("epoch 1/3") and "val acc" in lines[0]
    quiet = io.StringIO()
    cfg = TrainConfig(**{**SMALL, "epochs": 2})
    net, data, state, bk = setup(cfg)
    fit(net, state, data, select_gradient(cfg, net, bk)[1], epochs=2, batch_size=32,
        quiet=True, stream=quiet)
    assert quiet.getvalue() == ""


def test_gradient_is_pluggable_and_numeric_stats_are_averaged(tmp_path):
    cfg = TrainConfig(**{**SMALL, "epochs": 2}, out=str(tmp_path))
    net, data, state, bk = setup(cfg)
    base = sequential_gradient(net, bk)
    calls = []

    def mgrit_like(params, x, labels):
        loss, grads, _ = base(params, x, labels)
        k = len(calls)
        calls.append(k)
        stats = {"iterations": 2 + (k % 2), "residual": np.float64(10.0**-k),
                 "converged": k % 2 == 0, "zero_d": np.array(4.0), "solver": "fcf",
                 "history": [1.0, 0.1]}
        return loss, grads, stats

    out = io.StringIO()
    result = fit(net, state, data, mgrit_like, epochs=2, batch_size=32, out_dir=tmp_path,
                 stream=out)
    steps = math.ceil(480 / 32)
    assert len(calls) == 2 * steps
    s1 = result.state.history[0]["stats"]
    ks = range(steps)
    assert s1["iterations"] == pytest.approx(np.mean([2 + k % 2 for k in ks]))
    assert s1["residual"] == pytest.approx(np.mean([10.0**-k for k in ks]))
    assert s1["converged"] == pytest.approx(np.mean([k % 2 == 0 for k in ks]))
    assert s1["zero_d"] == 4.0 and "solver" not in s1 and "history" not in s1
    log = json.loads((tmp_path / "log.json").read_text())
    assert log["history"][1]["stats"]["iterations"] == pytest.approx(
        np.mean([2 + k % 2 for k in range(steps, 2 * steps)]))
    assert "iterations" in out.getvalue().splitlines()[0]


def test_nan_loss_stops_with_a_clear_error_and_keeps_the_log(tmp_path):
    cfg = TrainConfig(**{**SMALL, "epochs": 5}, out=str(tmp_path))
    net, data, state, bk = setup(cfg)
    base = sequential_gradient(net, bk)
    n_calls = [0]

    def breaks_in_epoch_3(params, x, labels):
        n_calls[0] += 1
        loss, grads, stats = base(params, x, labels)
        return (float("nan") if n_calls[0] > 2 * 15 + 4 else loss), grads, stats

    with pytest.raises(TrainingDiverged, match=r"became nan at epoch 3, batch 5.*`--lr`"):
        fit(net, state, data, breaks_in_epoch_3, epochs=5, batch_size=32, out_dir=tmp_path,
            quiet=True, meta={"config": cfg.to_dict()})
    log = json.loads((tmp_path / "log.json").read_text())
    assert log["status"] == "diverged" and "epoch 3" in log["error"]
    assert [r["epoch"] for r in log["history"]] == [1, 2]
    assert (tmp_path / "curves.png").is_file()


def test_divergence_with_a_huge_learning_rate_is_reported(tmp_path):
    cfg = TrainConfig(**{**SMALL, "lr": 1e12, "optimizer": "sgd", "activation": "relu"},
                      out=str(tmp_path))
    with pytest.raises(TrainingDiverged, match="training loss became"):
        with np.errstate(all="ignore"):
            train(cfg)


def test_float32_training_keeps_float32_and_tracks_float64(tmp_path):
    r64 = train(TrainConfig(**{**SMALL, "epochs": 2}, out=str(tmp_path / "f64")))
    r32 = train(TrainConfig(**{**SMALL, "epochs": 2, "dtype": "float32"},
                            out=str(tmp_path / "f32")))
    assert all(v.dtype == np.float32 for v in r32.state.params.values())
    h64, h32 = r64.state.history[-1], r32.state.history[-1]
    assert h32["train_loss"] == pytest.approx(h64["train_loss"], rel=1e-4)


def test_numba_backend_trains_like_numpy(tmp_path):
    pytest.importorskip("numba")
    cfg = dict(**{**SMALL, "epochs": 2, "samples": 200})
    ref = train(TrainConfig(**cfg, out=str(tmp_path / "numpy")))
    fast = train(TrainConfig(**cfg, backend="numba", out=str(tmp_path / "numba")))
    for k, v in ref.state.params.items():
        np.testing.assert_allclose(fast.state.params[k], v, rtol=1e-9, atol=1e-12)


def test_training_digits_with_the_conv_model(tmp_path):
    pytest.importorskip("sklearn")
    cfg = TrainConfig(data="digits", samples=200, model="conv", layers=2, width=2, T=1.0,
                      activation="relu", epochs=2, batch_size=50, lr=1e-2, quiet=True,
                      serial=True, out=str(tmp_path))
    result = train(cfg)
    assert result.state.history[-1]["val_acc"] > 0.3  # 10 classes: chance is 0.1


# ----------------------------------------------------------------------------- figures
def test_figures_script_writes_every_png(tmp_path):
    from matplotlib.figure import Figure

    from refbraid.figures import make_figures
    from refbraid.training.plots import plot_training_curves

    cfg = TrainConfig(**{**SMALL, "epochs": 2, "samples": 200, "layers": 16})
    files = make_figures(tmp_path, cfg)
    assert sorted(p.name for p in files.values()) == [
        "gradient_error.png", "mgrit_residuals.png", "training_curves.png"]
    for p in files.values():
        assert p.read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob(".*.tmp"))
    assert isinstance(plot_training_curves([{"epoch": 1, "train_loss": 1.0, "val_loss": 1.1,
                                             "train_acc": 0.5, "val_acc": 0.4}]), Figure)
