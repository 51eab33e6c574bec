"""Model parallelism inside a layer (refbraid/space): feature maps split by rows over the ranks.

Distributed dot-product tests ⟨A x, y⟩ = ⟨x, Aᵀ y⟩ (summed over ranks, ≤ 1e-12) for the halo
exchange, the split convolution and the column-split classifier; every layer and the whole
network equal the single-process layer/backprop to round-off (≤ 1e-12), for an even split and
an uneven one, at whatever world size this runs under (1..4).
"""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layers.conv import ConvLift, ConvStep
from refbraid.models import build_network
from refbraid.network import backprop, init_params
from refbraid.parallel.ops import LinearOperator, adjoint_mismatch, relative_error
from refbraid.space import (
    RowSplit,
    SpatialClassifier,
    SpatialConvLift,
    SpatialConvStep,
    SpatialHalo,
    SpatialNetwork,
)
from refbraid.space.layers import SpatialConv

TOL = 1e-12
BK = get_backend("numpy")
B, C, W = 2, 3, 4


def _splits(size):
    """An even split and an uneven one (rank p gets p + 1 rows)."""
    return {"even": RowSplit.even(2 * size + 1, size),
            "uneven": RowSplit(tuple(p + 1 for p in range(size)))}


@pytest.fixture(params=["even", "uneven"])
def split(world, request):
    return _splits(world.size)[request.param]


def _rng(world, salt):
    return np.random.default_rng(100 * salt + world.rank)


def _local_rows(world, split, shape_tail=(B, C), W_=W, salt=0):
    lo, hi = split.bounds(world.rank)
    return _rng(world, salt).standard_normal((*shape_tail, hi - lo, W_))


def _same_everywhere(world, a):
    return world.bcast(a, root=0)


def test_halo_exchange_adjoint(world, split):
    halo = SpatialHalo(world)
    x = _local_rows(world, split, salt=1)
    y = _rng(world, 2).standard_normal((B, C, x.shape[2] + 2, W))
    assert adjoint_mismatch(halo, x, y) <= TOL
    full = world.allgather(x)
    got = halo.forward(x)
    stacked = np.concatenate(full, axis=2)
    lo, hi = split.bounds(world.rank)
    padded = np.pad(stacked, ((0, 0), (0, 0), (1, 1), (0, 0)))
    np.testing.assert_array_equal(got, padded[:, :, lo : hi + 2])


def test_split_convolution_adjoint(world, split):
    Wt = _same_everywhere(world, np.random.default_rng(5).standard_normal((C, C, 3, 3)))
    op = SpatialConv(world, Wt, BK)
    x = _local_rows(world, split, salt=3)
    y = _local_rows(world, split, salt=4)
    assert adjoint_mismatch(op, x, y) <= TOL


class _ClassifierOp(LinearOperator):
    """x_p ↦ logits on the root (bias zero): the classifier as a linear operator."""

    def __init__(self, comm, layer, params):
        super().__init__(comm)
        self.layer, self.params = layer, params
        self.shape = None

    def forward(self, x):
        self.shape = x.shape
        logits, self.cache = self.layer.forward(self.params, x, BK)
        return logits

    def adjoint(self, d):
        return self.layer.adjoint(self.params, self.cache, d, BK)[0]


def test_column_split_classifier_adjoint_and_gradient(world, split):
    from refbraid.layers.heads import Classifier

    head = Classifier((C, split.rows, W), 5)
    params = {k: _same_everywhere(world, v) for k, v in
              head.init(np.random.default_rng(6)).items()}
    params["b"] = np.zeros_like(params["b"])
    layer = SpatialClassifier(head, world, split)
    x = _local_rows(world, split, salt=7)
    d = np.random.default_rng(8).standard_normal((B, 5)) if world.rank == 0 else None
    assert adjoint_mismatch(_ClassifierOp(world, layer, params), x, d) <= TOL
    # against one process: gather x, run the plain classifier
    x_full = np.concatenate(world.allgather(x), axis=2)
    d_all = world.bcast(d, root=0)
    logits, cache = head.forward(params, x_full, BK)
    dx_full, g_full = head.adjoint(params, cache, d_all, BK)
    got, c = layer.forward(params, x, BK)
    dx, g = layer.adjoint(params, c, d, BK)
    if world.rank == 0:
        np.testing.assert_allclose(got, logits, rtol=TOL, atol=TOL)
    lo, hi = split.bounds(world.rank)
    np.testing.assert_allclose(dx, dx_full[:, :, lo:hi], rtol=TOL, atol=TOL)
    np.testing.assert_allclose(sum(world.allgather(g["W"])), g_full["W"], rtol=TOL, atol=TOL)
    np.testing.assert_allclose(sum(world.allgather(g["b"])), g_full["b"], rtol=TOL, atol=TOL)


@pytest.mark.parametrize("kind", ["step", "lift"])
def test_split_layers_equal_one_process(world, split, kind):
    H = split.rows
    layer = ConvStep(C, H, W, "tanh") if kind == "step" else ConvLift(2, C, H, W, "tanh")
    dist = SpatialConvStep(layer, world) if kind == "step" else SpatialConvLift(layer, world)
    params = {k: _same_everywhere(world, v) for k, v in
              layer.init(np.random.default_rng(9)).items()}
    c_in = C if kind == "step" else 2
    rng = np.random.default_rng(10)
    y, dy = rng.standard_normal((B, c_in, H, W)), rng.standard_normal((B, C, H, W))
    lo, hi = split.bounds(world.rank)
    if kind == "step":
        out, cache = layer.forward(params, y, 0.3, BK)
        dy_full, g_full = layer.adjoint(params, cache, dy, 0.3, BK)
        out_p, cache_p = dist.forward(params, y[:, :, lo:hi], 0.3, BK)
        dy_p, g_p = dist.adjoint(params, cache_p, dy[:, :, lo:hi], 0.3, BK)
    else:
        out, cache = layer.forward(params, y, BK)
        dy_full, g_full = layer.adjoint(params, cache, dy, BK)
        out_p, cache_p = dist.forward(params, y[:, :, lo:hi], BK)
        dy_p, g_p = dist.adjoint(params, cache_p, dy[:, :, lo:hi], BK)
    np.testing.assert_allclose(out_p, out[:, :, lo:hi], rtol=TOL, atol=TOL)
    np.testing.assert_allclose(dy_p, dy_full[:, :, lo:hi], rtol=TOL, atol=TOL)
    for k in g_full:
        total = sum(world.allgather(g_p[k]))
        np.testing.assert_allclose(total, g_full[k], rtol=TOL, atol=TOL, err_msg=k)


def test_split_network_loss_and_gradient_equal_backprop(world, split):
    net = build_network("conv", (1, split.rows, W), 3, 3, 2, 1.0, "relu")
    params = init_params(net, 0)
    rng = np.random.default_rng(11)
    x, labels = rng.standard_normal((4, 1, split.rows, W)), rng.integers(0, 3, 4)
    loss, grads, _ = backprop(net, params, x, labels)
    spatial = SpatialNetwork(net, world, split)
    got_loss, got = spatial.backprop(params, spatial.local_input(x), labels)
    assert relative_error(got_loss, loss) <= TOL
    for k in grads:
        scale = max(float(np.abs(grads[k]).max()), 1e-300)
        assert float(np.abs(got[k] - grads[k]).max()) / scale <= TOL, k
    everyone = world.allgather(got["steps.W"])
    for other in everyone:
        np.testing.assert_array_equal(other, everyone[0])


def test_bad_splits_are_refused(world):
    with pytest.raises(ValueError, match="`rows`: an image of 1 rows cannot be split"):
        RowSplit.even(1, 2)
    with pytest.raises(ValueError, match="`counts` must be positive row counts"):
        RowSplit((2, 0))
    net = build_network("conv", (1, 6, 4), 3, 2, 2, 1.0, "relu")
    with pytest.raises(ValueError, match="`split` must give 6 rows"):
        SpatialNetwork(net, world, RowSplit((world.size + 6,)))


# ----------------------------------------------------------------------------- dense layers
class _Wrap(LinearOperator):
    """A split dense layer as a linear operator in its input (bias zero)."""

    def __init__(self, comm, layer, params):
        super().__init__(comm)
        self.layer, self.params = layer, params

    def forward(self, x):
        z, self.cache = self.layer.forward(self.params, x)
        return z

    def adjoint(self, dz):
        return self.layer.adjoint(self.params, self.cache, dz)[0]


def _dense_params(world, k_out, k_in, seed):
    rng = np.random.default_rng(seed)
    return {"W": world.bcast(rng.standard_normal((k_out, k_in)), root=0),
            "b": np.zeros(k_out)}


@pytest.mark.parametrize("kind", ["row", "column"])
def test_split_dense_adjoint_and_one_process(world, split, kind):
    from refbraid.space import ColumnSplitDense, RowSplitDense

    K = split.rows  # the split feature count
    other = 3
    if kind == "row":
        params = _dense_params(world, K, other, 12)
        layer = RowSplitDense(world, split, K)
        x = np.random.default_rng(13).standard_normal((B, other)) if world.rank == 0 else None
        dz = _rng(world, 14).standard_normal((B, split.counts[world.rank]))
    else:
        params = _dense_params(world, other, K, 12)
        layer = ColumnSplitDense(world, split, K)
        x = _rng(world, 13).standard_normal((B, split.counts[world.rank]))
        dz = np.random.default_rng(14).standard_normal((B, other)) if world.rank == 0 else None
    assert adjoint_mismatch(_Wrap(world, layer, params), x, dz) <= TOL
    params["b"] = world.bcast(np.random.default_rng(15).standard_normal(params["b"].shape))
    z, cache = layer.forward(params, x)
    dx, g = layer.adjoint(params, cache, dz)
    lo, hi = split.bounds(world.rank)
    if kind == "row":
        x_all, dz_all = world.bcast(x, root=0), np.concatenate(world.allgather(dz), axis=1)
    else:
        x_all, dz_all = np.concatenate(world.allgather(x), axis=1), world.bcast(dz, root=0)
    z_full = x_all @ params["W"].T + params["b"]
    dx_full, dW_full = dz_all @ params["W"], dz_all.T @ x_all
    if kind == "row":
        np.testing.assert_allclose(z, z_full[:, lo:hi], rtol=TOL, atol=TOL)
        if world.rank == 0:
            np.testing.assert_allclose(dx, dx_full, rtol=TOL, atol=TOL)
    else:
        if world.rank == 0:
            np.testing.assert_allclose(z, z_full, rtol=TOL, atol=TOL)
        np.testing.assert_allclose(dx, dx_full[:, lo:hi], rtol=TOL, atol=TOL)
    np.testing.assert_allclose(sum(world.allgather(g["W"])), dW_full, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(sum(world.allgather(g["b"])), dz_all.sum(axis=0), rtol=TOL,
                               atol=TOL)


def test_split_network_gradient_against_finite_differences(world):
    """Central differences of the split network's loss along a random direction (float64)."""
    split = _splits(world.size)["uneven"]
    net = build_network("conv", (1, split.rows, W), 3, 2, 2, 1.0, "tanh")
    params = init_params(net, 0)
    rng = np.random.default_rng(16)
    x, labels = rng.standard_normal((3, 1, split.rows, W)), rng.integers(0, 3, 3)
    spatial = SpatialNetwork(net, world, split)
    xl = spatial.local_input(x)
    _, grads = spatial.backprop(params, xl, labels)
    v = {k: np.random.default_rng(17).standard_normal(p.shape) for k, p in params.items()}
    eps = 1e-6

    def loss_at(t):
        return spatial.backprop({k: params[k] + t * v[k] for k in params}, xl, labels)[0]

    fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    exact = sum(float(np.vdot(grads[k], v[k])) for k in params)
    assert abs(fd - exact) <= 1e-7 * max(1.0, abs(exact)), (fd, exact)
