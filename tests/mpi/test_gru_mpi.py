"""The GRU models under MPI: MGRIT over the sequence positions split over ranks,
and data parallelism, as in one process.

Launched like every file here (``mpiexec -n N python -m mpi4py -m pytest tests/mpi``, N = 1..4).
seq-memory has L = 16 positions: two levels with cfactor 2 give 8 coarsest intervals (3 ranks
split them 3/3/2), three levels 4 (uneven backward blocks at 3 ranks). Oracles: the model's
single-process ``layer_parallel_gradient`` (bit-identical with pure sequence parallelism,
round-off with data parallelism) and ``fit`` in one process, checkpoints resumed across modes.
"""

import numpy as np
import pytest

from refbraid.distributed.choose import family_gradient
from refbraid.errors import CollectiveError
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.models import as_network_input
from refbraid.sequence.gru_model import GRUModel
from refbraid.training import trainer
from refbraid.training.checkpoint import load_checkpoint
from refbraid.training.config import TrainConfig
from refbraid.training.gradients import mgrit_gradient, select_gradient
from refbraid.training.run import setup
from refbraid.training.trainer import fit, layer_parallel_settings


def _config(model="gru", levels=2, **kw):
    base = dict(model=model, data="seq-memory", width=6, samples=60, levels=levels, cfactor=2,
                epochs=1, batch_size=16, seed=4, quiet=True, fwd_iters=1, bwd_iters=1)
    return TrainConfig(**{**base, **kw})


def _largest_divisor(n):
    return max(d for d in range(1, n + 1) if n % d == 0)


@pytest.mark.parametrize("model,levels", [("gru", 2), ("implicit-gru", 3)])
@pytest.mark.parametrize("split", ["sequence", "data"])
def test_gru_gradient_over_mpi_equals_one_process(world, model, levels, split):
    config = _config(model, levels)
    net, data, state, bk = setup(config)
    settings = layer_parallel_settings(config)
    x = as_network_input(net, data.x_train[:11])  # 11 samples: uneven data shards
    y = data.y_train[:11]
    loss, g, info = net.layer_parallel_gradient(state.params, x, y, settings, bk)
    D = 1 if split == "sequence" else _largest_divisor(world.size)
    grad = family_gradient(net, settings, bk, data_parallel=D)
    loss_mpi, g_mpi, stats = grad(state.params, x, y)
    assert set(g_mpi) == set(g)
    assert stats["phi_calls"] == info.stats()["phi_calls"]
    if D == 1:  # pure sequence parallelism: the same operations in the same order
        assert loss_mpi == loss
        for k in g:
            np.testing.assert_array_equal(g_mpi[k], g[k], err_msg=k)
    else:
        assert loss_mpi == pytest.approx(loss, rel=1e-12)
        assert relative_gradient_error(g_mpi, g, bk) <= 1e-12
    everyone = world.allgather(g_mpi["cell.W_hh"])
    for other in everyone:  # the same gradient on every rank
        np.testing.assert_array_equal(other, everyone[0])


@pytest.mark.parametrize("scheme", ["classic", "implicit"])
def test_odd_length_gru_with_unmirrored_adjoint_blocks_equals_one_process(world, scheme):
    """L = 13 with cfactor 2: the adjoint blocks are not the forward ones shifted by one
    (BlockPlan.mirrored is False), so states and adjoints cross ranks for the sum."""
    model = GRUModel(13, 3, 5, 3, scheme=scheme)
    rng = np.random.default_rng(7)
    params = model.init_params(rng)
    x, y = rng.standard_normal((6, 13, 3)), rng.integers(0, 3, 6)
    settings = LayerParallelSettings.with_iterations(2, 1, levels=2, cfactor=2)
    loss, g, _ = model.layer_parallel_gradient(params, x, y, settings)
    grad = family_gradient(model, settings)
    assert world.size == 1 or not grad.plan.mirrored
    loss_mpi, g_mpi, _ = grad(params, x, y)
    assert loss_mpi == loss
    for k in g:
        np.testing.assert_array_equal(g_mpi[k], g[k], err_msg=k)


def test_serial_gru_over_mpi_is_data_parallel_backprop(world):
    config = _config(serial=True, data_parallel=world.size)
    net, data, state, bk = setup(config)
    x, y = as_network_input(net, data.x_train[:9]), data.y_train[:9]
    loss, g, _ = net.backprop(state.params, x, y, bk)
    name, grad = select_gradient(config, net, bk)
    assert name == ("sequence-parallel-mpi" if world.size > 1 else "sequential")
    loss_mpi, g_mpi, _ = grad(state.params, x, y)
    assert loss_mpi == pytest.approx(loss, rel=1e-12)
    assert relative_gradient_error(g_mpi, g, bk) <= 1e-12


def test_one_level_over_several_sequence_ranks_is_refused(world):
    if world.size == 1:
        pytest.skip("needs several sequence ranks")
    config = _config()
    net, _, _, bk = setup(config)
    with pytest.raises(CollectiveError, match="cannot be split over"):
        family_gradient(net, LayerParallelSettings.exact(), bk)
    one_interval = LayerParallelSettings.with_iterations(1, 1, levels=3, cfactor=4)
    with pytest.raises(CollectiveError, match="exceed the 1 coarsest interval of the MGRIT grid "
                                              "over the 16 sequence positions"):
        family_gradient(net, one_interval, bk)


def test_gru_fit_over_mpi_equals_one_process_and_resumes_across_modes(world, shared_tmp,
                                                                      monkeypatch):
    """2 epochs in one process == 1 epoch over MPI, sequence-parallel (checkpoint) + 1 resumed
    in one process == 1 epoch in one process (checkpoint) + 1 resumed over MPI with data
    parallelism (the largest number of groups; bit-identical with one group)."""
    # the PNGs written beside each checkpoint take ~1 s each and are tested elsewhere
    monkeypatch.setattr(trainer._RunFiles, "curves", lambda self, state: None)
    config = _config(epochs=2, optimizer="adam")
    settings = layer_parallel_settings(config)
    net, data, state, bk = setup(config)
    serial = fit(net, state, data, mgrit_gradient(net, settings, bk), epochs=2,
                 batch_size=config.batch_size, bk=bk, quiet=True)

    def over_mpi(state, out, epochs, D):
        grad = family_gradient(net, settings, bk, data_parallel=D)
        return fit(net, state, data, grad, epochs=epochs, batch_size=config.batch_size, bk=bk,
                   out_dir=out if grad.is_root else None, checkpoint_every=1, quiet=True,
                   meta={"config": config.to_dict()})

    def resumed(folder):
        return setup(TrainConfig(**{**config.to_dict(), "resume": str(folder)}))[2]

    # sequence-parallel over MPI first, then one process resumes from its checkpoint
    over_mpi(setup(config)[2], shared_tmp / "mpi", 1, D=1)
    world.barrier()
    first = fit(net, resumed(shared_tmp / "mpi"), data, mgrit_gradient(net, settings, bk),
                epochs=2, batch_size=config.batch_size, bk=bk, quiet=True)
    assert first.state.epoch == 2
    for k, v in serial.state.params.items():
        np.testing.assert_array_equal(first.state.params[k], v, err_msg=k)
    assert first.final["train_loss"] == serial.final["train_loss"]
    # one process first (rank 0 writes), then data-parallel MPI resumes
    if world.rank == 0:
        fit(net, setup(config)[2], data, mgrit_gradient(net, settings, bk), epochs=1,
            batch_size=config.batch_size, bk=bk, out_dir=shared_tmp / "one", checkpoint_every=1,
            quiet=True, meta={"config": config.to_dict()})
    world.barrier()
    D = _largest_divisor(world.size)
    second = over_mpi(resumed(shared_tmp / "one"), shared_tmp / "one", 2, D)
    tol = 0.0 if D == 1 else 1e-12
    assert relative_gradient_error(second.state.params, serial.state.params) <= tol
    assert second.final["train_loss"] == pytest.approx(serial.final["train_loss"], rel=1e-12)
    assert second.final["val_acc"] == serial.final["val_acc"]
    if world.rank == 0:
        saved = load_checkpoint(shared_tmp / "one")
        assert saved.epoch == 2
        for k, v in serial.state.params.items():
            np.testing.assert_allclose(saved.params[k], v, rtol=tol, atol=tol)
