"""The 3-D conv, batch-norm and transition layers beyond the catalogue checks of
test_layers_adjoint.py (which proves every adjoint on every backend and against PyTorch):
batch norm's running statistics against torch's, its modes and errors, the transitions' shapes
and errors, whole 3-D and batch-normalised networks (sequential backprop checked, and MGRIT
converged to it), and the generated voxel data set.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.data import load_dataset
from refbraid.data.voxels import CLASSES, generate_voxels, load_voxels, random_rotation
from refbraid.layer_parallel import (
    LayerParallelSettings,
    layer_parallel_gradient,
    relative_gradient_error,
)
from refbraid.layers import (
    BatchNorm,
    ChannelWiden,
    Classifier,
    Conv3dLift,
    Conv3dStep,
    ConvBNStep,
    ConvLift,
    Pool,
    StridedConv,
    init_running_stats,
    update_running_stats,
)
from refbraid.mgrit import MGRITSettings
from refbraid.models import build_network
from refbraid.network import Network, backprop, init_params
from refbraid.training.config import TrainConfig
from refbraid.training.run import train
from refbraid.verify import check_network


def _failures(results) -> str:
    return "\n".join(str(r) for r in results if not r.passed)


# ----------------------------------------------------------------------------- batch norm
@pytest.mark.parametrize("spatial", [(4, 5), (3, 2, 4)])
def test_running_statistics_follow_torch_over_several_steps(spatial):
    torch = pytest.importorskip("torch")
    bk = get_backend("numpy")
    rng = np.random.default_rng(0)
    layer = BatchNorm(3, spatial)
    params = layer.init(rng)
    tbn = (torch.nn.BatchNorm2d if len(spatial) == 2 else torch.nn.BatchNorm3d)(
        3, dtype=torch.float64)
    running = init_running_stats(3)
    for step in range(3):  # three training steps, each with a new batch
        x = 2.0 + 1.5 * rng.standard_normal((4, 3, *spatial))
        _, cache = layer.forward(params, x, bk)
        running = update_running_stats(running, layer.batch_stats(cache, bk))
        tbn(torch.from_numpy(x))
        np.testing.assert_allclose(running["running_mean"], tbn.running_mean.numpy(),
                                   rtol=1e-13, err_msg=f"step {step}")
        np.testing.assert_allclose(running["running_var"], tbn.running_var.numpy(),
                                   rtol=1e-13, err_msg=f"step {step}")
    # evaluation with those statistics is torch's eval mode
    tbn.eval()
    x = rng.standard_normal((2, 3, *spatial))
    ours, _ = layer.evaluation().forward({**params, **running}, x, bk)
    np.testing.assert_allclose(ours, tbn(torch.from_numpy(x)).detach().numpy(), rtol=1e-12,
                               atol=1e-13)


def test_conv_bn_step_reports_the_statistics_of_its_convolution():
    bk = get_backend("numba")
    step = ConvBNStep(2, (3, 3, 3))
    rng = np.random.default_rng(1)
    params = step.init(rng)
    y = rng.standard_normal((3, *step.state_shape))
    _, cache = step.forward(params, y, 0.5, bk)
    stats = step.batch_stats(cache, bk)
    z = bk.conv3d(y, params["W"], None)
    np.testing.assert_allclose(stats.mean, z.mean(axis=(0, 2, 3, 4)), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(stats.var, z.var(axis=(0, 2, 3, 4)), rtol=1e-12)
    assert stats.count == 3 * 27


def test_batch_norm_modes_and_errors():
    layer = BatchNorm(2, (4, 4))
    assert layer.data_entries == () and set(layer.init(np.random.default_rng(0))) == {
        "gamma", "beta"}
    ev = layer.evaluation()
    assert ev.mode == "eval" and ev.training() == layer
    assert ev.constant_entries == ("running_mean", "running_var")
    with pytest.raises(ValueError, match="`batch_stats` needs a layer in mode 'train'"):
        ev.batch_stats(None, get_backend("numpy"))
    with pytest.raises(ValueError, match="`mode` must be one of"):
        BatchNorm(2, (4, 4), mode="inference")
    with pytest.raises(ValueError, match="`spatial` must be a tuple of 2"):
        ConvBNStep(2, (4,))
    with pytest.raises(ValueError, match="`momentum`"):
        update_running_stats(init_running_stats(2), None, momentum=1.5)
    with pytest.raises(ValueError, match="`x` must have shape"):
        layer.forward(layer.init(np.random.default_rng(0)), np.zeros((2, 3, 4, 4)),
                      get_backend("numpy"))


# ----------------------------------------------------------------------------- transitions
def test_transition_shapes_and_errors():
    assert Pool(2, (5, 7)).out_shape == (2, 2, 3)  # an odd trailing row is dropped
    assert Pool(2, (4, 6, 8), "max").out_shape == (2, 2, 3, 4)
    assert StridedConv(2, 4, (5, 8)).out_shape == (4, 3, 4)  # ⌈n/2⌉, as torch's stride 2
    assert ChannelWiden(2, 5, (3, 3, 3), "zeros").out_shape == (5, 3, 3, 3)
    with pytest.raises(ValueError, match="`spatial` must be at least 2"):
        Pool(2, (1, 4))
    with pytest.raises(ValueError, match="`kind` must be one of"):
        Pool(2, (4, 4), "median")
    with pytest.raises(ValueError, match="`out_channels` must be ≥ in_channels"):
        ChannelWiden(4, 2, (3, 3), "zeros")
    with pytest.raises(ValueError, match=r"`spatial\[1\]` must be a positive integer"):
        StridedConv(2, 2, (3, 0))
    with pytest.raises(ValueError, match="`dout` must have the shape"):
        bk = get_backend("numpy")
        pool = Pool(1, (4, 4))
        _, cache = pool.forward({}, np.zeros((2, 1, 4, 4)), bk)
        pool.adjoint({}, cache, np.zeros((2, 1, 4, 4)), bk)


def test_zero_widening_keeps_the_input_and_adds_zero_channels():
    bk = get_backend("numpy")
    x = np.random.default_rng(0).standard_normal((2, 2, 3, 3))
    out, _ = ChannelWiden(2, 3, (3, 3), "zeros").forward({}, x, bk)
    np.testing.assert_array_equal(out[:, :2], x)
    assert not out[:, 2].any()


# ----------------------------------------------------------------------------- networks
def _conv3d_net(n_layers=4):
    return Network(Conv3dLift(1, 2, 4, 4, 4), Conv3dStep(2, 4, 4, 4, "tanh"),
                   Classifier((2, 4, 4, 4), 4), n_layers=n_layers)


def _bn_net(n_layers=4, mode="train"):
    return Network(ConvLift(1, 3, 4, 4), ConvBNStep(3, (4, 4), "tanh", mode=mode),
                   Classifier((3, 4, 4), 4), n_layers=n_layers)


def _bn_eval_net(n_layers=4):
    return _bn_net(n_layers, "eval")


@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
@pytest.mark.parametrize("make", [_conv3d_net, _bn_net, _bn_eval_net],
                         ids=["conv3d_net", "bn_net", "bn_eval_net"])
def test_whole_networks_pass_the_gradient_checks(make, backend_name):
    results = check_network(make(3), backend_name, name=make.__name__)
    assert not _failures(results), _failures(results)
    assert not any("running" in r.check for r in results)  # eval statistics: data, not checked


@pytest.mark.parametrize("make", [_conv3d_net, _bn_net], ids=["conv3d_net", "bn_net"])
def test_converged_mgrit_gradient_equals_sequential_backprop(make):
    """Two levels, iterated to convergence: the layer-parallel gradient of a 3-D conv and a
    batch-normalised (training-mode) network is sequential backprop's to ≤ 1e-10."""
    net = make(8)
    bk = get_backend("numba")
    rng = np.random.default_rng(3)
    params = init_params(net, rng)
    x = rng.standard_normal((4, *net.opening.in_shape))
    labels = np.arange(4) % 4
    _, ref, _ = backprop(net, params, x, labels, bk)
    mg = MGRITSettings(levels=2, cfactor=2, max_iter=30, abs_tol=1e-13, rel_tol=None)
    _, grads, info = layer_parallel_gradient(net, params, x, labels,
                                             LayerParallelSettings(mg, mg), bk)
    assert relative_gradient_error(grads, ref) <= 1e-10
    assert info.forward.iterations >= 2 and info.backward.iterations >= 2  # MGRIT did iterate


# ----------------------------------------------------------------------------- voxels
def test_voxels_are_deterministic_balanced_and_in_range():
    x, y = generate_voxels(12, 16, seed=5)
    x2, y2 = generate_voxels(12, 16, seed=5)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(generate_voxels(12, 16, seed=6)[0], x)
    assert x.shape == (12, 1, 16, 16, 16) and np.bincount(y).tolist() == [3, 3, 3, 3]
    clean, _ = generate_voxels(12, 16, seed=5, noise=0.0)
    assert clean.min() >= 0.0 and clean.max() == 1.0
    filled = clean.mean(axis=(1, 2, 3, 4))
    assert np.all((filled > 0.005) & (filled < 0.6))  # every shape visible, none fills the box


def test_voxel_shapes_are_the_same_solid_at_every_resolution():
    coarse, _ = generate_voxels(4, 16, seed=2, noise=0.0)
    fine, _ = generate_voxels(4, 32, seed=2, noise=0.0)
    pooled = fine.reshape(4, 1, 16, 2, 16, 2, 16, 2).mean(axis=(3, 5, 7))
    assert np.abs(pooled - coarse).mean() < 0.05  # same pose and scale: only the aliasing differs


def test_random_rotations_are_rotations():
    q = random_rotation(np.random.default_rng(0))
    np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-14)
    assert np.isclose(np.linalg.det(q), 1.0)


def test_voxels_in_the_data_registry():
    d = load_dataset("voxels", n_samples=20, seed=1)
    assert d.input_shape == (1, 16, 16, 16) and d.n_classes == len(CLASSES) == 4
    assert d.n_train + d.n_val == 20 and d.info["classes"] == CLASSES
    with pytest.raises(ValueError, match="`size` must be an integer from 16 to 32"):
        load_voxels(10, size=64)
    with pytest.raises(ValueError, match="`n_samples` must be an integer ≥ 2"):
        load_voxels(1)
    with pytest.raises(ValueError, match="`noise`"):
        generate_voxels(4, noise=-1.0)


def test_model_conv_on_volumes_is_the_3d_conv_network():
    net = build_network("conv", (1, 16, 16, 16), 4, 3, 2, 1.0, "relu")
    assert isinstance(net.opening, Conv3dLift) and isinstance(net.step, Conv3dStep)
    assert net.step.state_shape == (2, 16, 16, 16) and net.closing.in_shape == (2, 16, 16, 16)
    with pytest.raises(ValueError, match="volumes"):
        build_network("conv", (2, 3, 4, 5, 6), 4, 3, 2, 1.0)


@pytest.mark.slow
def test_layer_parallel_training_runs_on_voxels(tmp_path):
    """`refbraid train --model conv --data voxels` end to end, layer-parallel (tiny sizes; most
    of the time goes to the run folder's figures and final gradient-error study)."""
    config = TrainConfig(model="conv", data="voxels", samples=16, layers=4, width=2, epochs=1,
                         batch_size=8, lr=1e-3, backend="numba", levels=2, cfactor=2,
                         quiet=True, out=str(tmp_path))
    result = train(config)
    assert result.state.history[-1]["epoch"] == 1
    assert np.isfinite(result.state.history[-1]["train_loss"])
    assert (tmp_path / "log.json").is_file()
