"""The distributed layer-parallel gradient against the single-process one (float64, ≤ 1e-12).

Oracles, computed on every rank in-process: :func:`layer_parallel_gradient` on the full batch
(same MGRIT settings) and, with one MGRIT level, sequential :func:`backprop`. Checked for the
world size this file runs under (1..4), for every data-parallel split D of it, in replicated
and sharded mode, through several training steps, and for bad splits (the same clear error on
every rank, before any work).
"""

import numpy as np
import pytest

from refbraid.distributed.network import DistributedGradient, distributed_gradient
from refbraid.distributed.sharded import ShardedTrainer
from refbraid.layer_parallel import (
    LayerParallelSettings,
    layer_parallel_gradient,
    relative_gradient_error,
)
from refbraid.mgrit import MGRITSettings
from refbraid.models import build_network
from refbraid.network import backprop, init_params
from refbraid.parallel.mpi import split_world
from refbraid.training.checkpoint import load_checkpoint, save_checkpoint
from refbraid.training.optim import make_optimizer

TOL = 1e-12


def _net(kind):
    if kind == "resnet":
        return build_network("resnet", (2,), 5, 64, 4, 3.0, "tanh")
    return build_network("conv", (1, 5, 5), 3, 64, 2, 1.0, "relu")


def _batch(net, B=10, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, *net.opening.in_shape))
    return x, rng.integers(0, net.closing.out_shape[0], B)


_FCF = MGRITSettings(levels=3, cfactor=2, relax="FCF", cycle="F", max_iter=2, abs_tol=None,
                     min_coarse=1)
SETTINGS = {
    "torchbraid": LayerParallelSettings(),  # 3 levels, cfactor 4, 2 fwd / 1 bwd, abs_tol 1e-9
    "fixed-L2": LayerParallelSettings.with_iterations(2, 2, levels=2, cfactor=2),
    "FCF-Fcycle": LayerParallelSettings(forward=_FCF, backward=_FCF),  # FCF on the fine level
}


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize("kind", ["resnet", "conv"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_gradient_equals_single_process_layer_parallel(world, kind, name):
    net, settings = _net(kind), SETTINGS[name]
    params = init_params(net, 0)
    x, y = _batch(net)
    loss0, g0, info0 = layer_parallel_gradient(net, params, x, y, settings)
    grad = distributed_gradient(net, settings)
    loss, g, stats = grad(params, x, y)
    assert relative_gradient_error(g, g0) <= TOL
    assert loss == pytest.approx(loss0, rel=TOL)
    assert stats["phi_calls"] == info0.stats()["phi_calls"]  # work split, not repeated
    assert stats["fwd_res"] == pytest.approx(info0.stats()["fwd_res"], rel=1e-13)
    others = world.allgather((loss, g["steps.W"]))
    for other_loss, other_w in others:  # the same result on every rank
        assert other_loss == loss
        np.testing.assert_array_equal(other_w, g["steps.W"])


def test_one_level_gives_sequential_backprop(world):
    net = _net("resnet")
    params = init_params(net, 3)
    x, y = _batch(net, seed=4)
    loss0, g0, _ = backprop(net, params, x, y)
    for D in divisors(world.size):  # D = P: pure data parallelism, backprop per group
        grad = distributed_gradient(net, LayerParallelSettings.exact(), data_parallel=D)
        assert grad.sequential == (D == world.size)
        loss, g, _ = grad(params, x, y)
        assert relative_gradient_error(g, g0) <= TOL, f"D={D}"
        assert loss == pytest.approx(loss0, rel=TOL)
        shard = grad.shard(params)
        _, g_s, _ = grad.sharded(shard, x, y)
        full = grad.gather(g_s)
        if world.rank == 0:
            assert relative_gradient_error(full, g0) <= TOL, f"D={D}, sharded"


@pytest.mark.parametrize("kind", ["resnet", "conv"])
def test_data_parallel_splits_equal_the_full_batch(world, kind):
    net, settings = _net(kind), SETTINGS["torchbraid"]
    params = init_params(net, 1)
    x, y = _batch(net, B=11)  # shards of unequal size for D = 2, 3, 4
    loss0, g0, _ = layer_parallel_gradient(net, params, x, y, settings)
    for D in divisors(world.size):
        grad = distributed_gradient(net, settings, data_parallel=D)
        assert grad.topo.n_groups == D and grad.topo.layer.size == world.size // D
        loss, g, _ = grad(params, x, y)
        err = relative_gradient_error(g, g0)
        assert err <= TOL, f"D={D}: relative gradient error {err:.2e}"
        assert loss == pytest.approx(loss0, rel=TOL)


def test_sharded_gradient_equals_replicated(world):
    net = _net("resnet")
    params = init_params(net, 2)
    x, y = _batch(net)
    for D in divisors(world.size):
        grad = distributed_gradient(net, data_parallel=D)
        loss_r, g_r, _ = grad(params, x, y)
        shard = grad.shard(params)
        loss_s, g_s, _ = grad.sharded(shard, x, y)
        assert loss_s == loss_r
        full = grad.gather(g_s)
        if world.rank == 0:
            assert relative_gradient_error(full, g_r) <= TOL
        else:
            assert full is None


@pytest.mark.parametrize("opt", ["adam", "sgd"])
def test_sharded_training_matches_serial_training(world, opt):
    net = _net("resnet")
    settings = SETTINGS["torchbraid"]
    params = init_params(net, 5)
    batches = [_batch(net, B=9, seed=s) for s in range(3)]
    serial = {k: v.copy() for k, v in params.items()}
    serial_opt = make_optimizer(opt, 1e-2, momentum=0.9)
    for x, y in batches:
        _, g, _ = layer_parallel_gradient(net, serial, x, y, settings)
        serial_opt.step(serial, g)
    D = divisors(world.size)[-2] if world.size > 1 else 1  # a real mixed split when possible
    trainer = ShardedTrainer(distributed_gradient(net, settings, data_parallel=D), params,
                             make_optimizer(opt, 1e-2, momentum=0.9))
    for x, y in batches:
        trainer.step(x, y)
    full = trainer.gather_params()
    if world.rank == 0:
        assert relative_gradient_error(full, serial) <= TOL
    else:
        assert full is None
    state = trainer.gather_optimizer_state()
    if world.rank == 0:
        buffer = trainer.optimizer.buffers[0]
        assert int(state["step"]) == 3 and state[f"{buffer}/steps.W"].shape == (64, 4, 4)


def test_sharded_checkpoint_is_gathered_and_written_by_one_rank(world, shared_tmp):
    net = _net("resnet")
    params = init_params(net, 6)
    trainer = ShardedTrainer(distributed_gradient(net), params, make_optimizer("adam", 1e-3))
    x, y = _batch(net)
    trainer.step(x, y)
    full, optimizer = trainer.gather_state()
    assert (full is not None) == (optimizer is not None) == (world.rank == 0)
    if full is not None:  # world rank 0 writes
        save_checkpoint(shared_tmp / "checkpoint.npz", epoch=1, params=full,
                        optimizer=optimizer, rng=np.random.default_rng(0), config={},
                        history=[])
    world.barrier()
    ckpt = load_checkpoint(shared_tmp / "checkpoint.npz")
    mine = trainer.shard
    lo = int(trainer.gradient.owned[0])
    np.testing.assert_array_equal(ckpt.params["steps.W"][lo : lo + len(mine["steps.W"])],
                                  mine["steps.W"])
    assert int(ckpt.optimizer_state["step"]) == 1
    assert ckpt.optimizer_state["exp_avg/steps.W"].shape == params["steps.W"].shape


def test_data_parallel_not_dividing_the_world_fails_on_every_rank(world):
    with pytest.raises(ValueError, match=rf"= {world.size + 1} does not divide the {world.size}"):
        split_world(world.size + 1, world.mpi)
    with pytest.raises(ValueError, match="must be a positive integer"):
        split_world(0, world.mpi)


def test_more_layer_ranks_than_coarse_intervals_fails_on_every_rank(world):
    net = build_network("resnet", (2,), 3, 16, 4, 1.0)  # 3 levels, cfactor 4: 1 interval
    if world.size == 1:
        assert isinstance(distributed_gradient(net), DistributedGradient)
        return
    with pytest.raises(ValueError, match=rf"over {world.size} ranks with 16 layers.*exceed"):
        distributed_gradient(net)


def test_batch_smaller_than_the_groups_fails_on_every_rank(world):
    net = _net("resnet")
    grad = distributed_gradient(net, data_parallel=world.size)
    x, y = _batch(net, B=world.size)
    grad(init_params(net, 0), x, y)  # one sample per group works
    if world.size > 1:
        x, y = _batch(net, B=world.size - 1)
        with pytest.raises(ValueError, match="cannot be split over"):
            grad(init_params(net, 0), x, y)


def test_bad_arguments_name_themselves(world):
    net = _net("resnet")
    topo = split_world(1, world.mpi)
    with pytest.raises(TypeError, match="`topology` must be"):
        DistributedGradient(net, object())
    with pytest.raises(TypeError, match="`net` must be"):
        DistributedGradient("net", topo)


def test_spatially_coarsened_gradient_equals_single_process(world):
    """Spatial coarsening (coarse levels on 4×4 and 2×2 maps) on every world size, uneven
    blocks: the same gradient as one process, and converged, sequential backprop's."""
    from refbraid.mgrit.transfer import SpatialCoarsening

    net = build_network("conv", (1, 8, 8), 3, 38, 2, 1.0, "tanh")
    params = init_params(net, 0)
    x, y = _batch(net, B=4)
    fcf = MGRITSettings(levels=3, cfactor=2, relax="FCF", max_iter=2, abs_tol=None,
                        min_coarse=1)
    settings = LayerParallelSettings(fcf, fcf, spatial=SpatialCoarsening((1, 2)))
    loss0, g0, _ = layer_parallel_gradient(net, params, x, y, settings)
    loss, g, _ = distributed_gradient(net, settings)(params, x, y)
    assert relative_gradient_error(g, g0) <= TOL
    assert loss == pytest.approx(loss0, rel=TOL)
    exact = MGRITSettings(levels=3, cfactor=2, relax="FCF", max_iter=25, abs_tol=1e-13,
                          rel_tol=None, min_coarse=1)
    converged = LayerParallelSettings(exact, exact, spatial=SpatialCoarsening((1, 2)))
    _, g, _ = distributed_gradient(net, converged)(params, x, y)
    assert relative_gradient_error(g, backprop(net, params, x, y)[1]) <= 1e-10
