"""``--model conv-stages`` over MPI against one process (float64): a mixed network whose state
changes shape at a pooling or strided transition, with and without batch norm and spatial
coarsening.

Oracles, computed on every rank in-process: the single-process
:meth:`ConvStagesModel.layer_parallel_gradient` (same MGRIT settings) and its running
statistics. Pure layer parallelism must give the SAME BITS (gradient, loss, running
statistics, trained parameters) at every world size 1..4 — with N = 16 fine steps the 3-level
grid's 4 coarsest intervals and the 2-level grid's 8 are split unevenly over 3 ranks, and the
transition (fine step 7 → 8) crosses a block boundary at 2 and 4 ranks. Data parallelism
matches to round-off, with BN through synchronised (full-batch) statistics.
"""

import numpy as np
import pytest

from refbraid.distributed.choose import family_gradient
from refbraid.distributed.stages import StagedDistributedGradient
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.mgrit import MGRITSettings
from refbraid.mgrit.transfer import SpatialCoarsening
from refbraid.stages.model import ConvStagesModel
from refbraid.training.optim import make_optimizer

TOL = 1e-12
_FCF3 = MGRITSettings(levels=3, cfactor=2, relax="FCF", cycle="F", max_iter=2, abs_tol=None,
                      min_coarse=1)
_FCF2 = MGRITSettings(levels=2, cfactor=2, relax="FCF", max_iter=1, abs_tol=None, min_coarse=1)
SETTINGS = {
    "fcf-3-levels": LayerParallelSettings(forward=_FCF3, backward=_FCF2),
    "spatial": LayerParallelSettings(forward=_FCF3, backward=_FCF3,
                                     spatial=SpatialCoarsening((1,))),
    "exact": LayerParallelSettings.exact(),  # one level: sequential backprop over the ranks
}


def _model(batch_norm: bool, transition: str) -> ConvStagesModel:
    """lift → 7 ODE steps on 8×8 → transition → 8 ODE steps on 4×4 → classifier: N = 16."""
    return ConvStagesModel((1, 8, 8), 3, 15, 2, 1.0, "tanh", batch_norm, transition)


def _batch(B=5, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, 1, 8, 8)), rng.integers(0, 3, B)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _assert_same_bits(got, want, what):
    assert set(got) == set(want), what
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{what}: {k}")


@pytest.mark.parametrize("batch_norm,transition,name", [
    (True, "pool", "fcf-3-levels"), (True, "strided", "spatial"), (False, "pool", "spatial"),
    (False, "strided", "fcf-3-levels"), (True, "pool", "exact")])
def test_layer_parallel_gradient_is_bit_identical_to_one_process(world, batch_norm,
                                                                  transition, name):
    settings = SETTINGS[name]
    serial, model = _model(batch_norm, transition), _model(batch_norm, transition)
    params = serial.init_params(np.random.default_rng(0))
    x, y = _batch()
    loss0, g0, info0 = serial.layer_parallel_gradient(params, x, y, settings)
    serial.record_batch_stats(info0)
    grad = family_gradient(model, settings)
    loss, g, stats = grad(params, x, y)
    assert loss == loss0
    _assert_same_bits(g, g0, f"gradient, {world.size} ranks")
    _assert_same_bits(model.running, serial.running, "running statistics")
    assert model.updates == serial.updates == (1 if batch_norm else 0)
    assert stats["phi_calls"] == info0.stats()["phi_calls"]  # the work is split, not repeated
    assert stats["fwd_res"] == pytest.approx(info0.stats()["fwd_res"], rel=1e-13)


def test_batch_norm_training_matches_one_process(world, opt="adam"):
    """Three steps: parameters and running statistics bit-identical to serial training."""
    settings = SETTINGS["fcf-3-levels"]
    serial, model = _model(True, "pool"), _model(True, "pool")
    start = serial.init_params(np.random.default_rng(3))
    p0 = {k: v.copy() for k, v in start.items()}
    p1 = {k: v.copy() for k, v in start.items()}
    opt0, opt1 = make_optimizer(opt, 1e-2, momentum=0.9), make_optimizer(opt, 1e-2, momentum=0.9)
    grad = family_gradient(model, settings)
    for seed in range(3):
        x, y = _batch(B=6, seed=seed)
        _, g0, info = serial.layer_parallel_gradient(p0, x, y, settings)
        serial.record_batch_stats(info)
        opt0.step(p0, g0)
        _, g1, _ = grad(p1, x, y)
        opt1.step(p1, g1)
    _assert_same_bits(p1, p0, "parameters after 3 steps")
    _assert_same_bits(model.running, serial.running, "running statistics after 3 steps")
    assert model.updates == 3
    x, _ = _batch(B=4, seed=9)  # evaluation mode reads the running statistics
    np.testing.assert_array_equal(grad.logits(p1, x), serial.mgrit_logits(p0, x,
                                                                          settings.forward))


@pytest.mark.parametrize("batch_norm,transition", [(False, "pool"), (True, "strided")])
def test_data_parallel_splits_equal_the_full_batch(world, batch_norm, transition):
    """D groups of P/D layer ranks; with BN every group normalises with the full batch's
    statistics (synchronised BN), so gradient and running statistics match to round-off."""
    settings = SETTINGS["fcf-3-levels"]
    serial = _model(batch_norm, transition)
    params = serial.init_params(np.random.default_rng(1))
    x, y = _batch(B=11)  # shards of unequal size for D = 2, 3, 4
    loss0, g0, info = serial.layer_parallel_gradient(params, x, y, settings)
    serial.record_batch_stats(info)
    for D in divisors(world.size):
        model = _model(batch_norm, transition)
        grad = family_gradient(model, settings, data_parallel=D)
        assert grad.topo.n_groups == D and grad.topo.layer.size == world.size // D
        assert grad.sync_bn == (batch_norm and D > 1)
        loss, g, _ = grad(params, x, y)
        err = relative_gradient_error(g, g0)
        assert err <= TOL, f"D={D}: relative gradient error {err:.2e}"
        assert loss == pytest.approx(loss0, rel=TOL)
        for k, v in serial.running.items():
            np.testing.assert_allclose(model.running[k], v, rtol=TOL, atol=TOL,
                                       err_msg=f"D={D}: {k}")
        others = world.allgather(g["stage0.W"])
        for other in others:  # the same gradient on every rank
            np.testing.assert_array_equal(other, others[0])


def test_bad_arguments_name_themselves(world):
    from refbraid.models import build_network
    from refbraid.parallel.mpi import split_world

    topo = split_world(1, world)
    with pytest.raises(TypeError, match="`model` must be a StagedNetwork"):
        StagedDistributedGradient(build_network("resnet", (2,), 2, 8, 4, 1.0), topo)
    with pytest.raises(TypeError, match="`topology` must be"):
        StagedDistributedGradient(_model(False, "pool"), "world")


def test_a_bare_staged_network_gives_sequential_backprop(world):
    """A StagedNetwork (no model around it) with one MGRIT level: sequential backprop's
    gradient, and the sequential forward pass as its logits."""
    from refbraid.stages import backprop, forward

    net = _model(False, "strided").net
    params = _model(False, "strided").init_params(np.random.default_rng(4))
    x, y = _batch(seed=4)
    loss0, g0, _ = backprop(net, params, x, y)
    grad = family_gradient(net, SETTINGS["exact"])
    loss, g, _ = grad(params, x, y)
    assert loss == pytest.approx(loss0, rel=TOL)
    assert relative_gradient_error(g, g0) <= TOL
    np.testing.assert_array_equal(grad.logits(params, x), forward(net, params, x)[0])
