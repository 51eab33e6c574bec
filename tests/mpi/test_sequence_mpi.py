"""Token models under MPI: the encoder transformer and the untied GPT (with and
without buffer layers) train over ranks, layer-parallel and data-parallel, as in one process.

Launched like every file here (``mpiexec -n N python -m mpi4py -m pytest tests/mpi``, N = 1..4).
Two MGRIT levels with cfactor 2 over 8 layers give 4 coarse intervals, so 3 ranks split the
layers unevenly. Oracles: the single-process layer-parallel gradient of the model itself
(``model.layer_parallel_gradient``), bit-identical with pure layer parallelism and to round-off
with data parallelism; a sharded ``fit`` against ``fit`` in one process.
"""

import numpy as np
import pytest

from refbraid.distributed.network import distributed_gradient
from refbraid.distributed.sharded import ShardedGradient
from refbraid.layer_parallel import relative_gradient_error
from refbraid.models import as_network_input
from refbraid.training.config import TrainConfig
from refbraid.training.gradients import mgrit_gradient
from refbraid.training.run import setup
from refbraid.training.trainer import fit, layer_parallel_settings

CASES = {
    "gpt-untied": dict(model="gpt-untied", layers=8, width=8, samples=80),
    "gpt-untied-buffer": dict(model="gpt-untied", layers=10, width=8, samples=80, buffer=1),
    "transformer": dict(model="transformer", data="seq-match", layers=8, width=8, samples=80),
}


def _config(name, **kw):
    return TrainConfig(**CASES[name], levels=2, cfactor=2, epochs=1, batch_size=16, seed=4,
                       quiet=True, **kw)


def _largest_divisor(n):
    return max(d for d in range(1, n + 1) if n % d == 0)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("split", ["layers", "data"])
def test_token_model_gradient_over_mpi_equals_one_process(world, name, split):
    config = _config(name)
    model, data, state, bk = setup(config)
    settings = layer_parallel_settings(config)
    x = as_network_input(model, data.x_train[:12])
    y = data.y_train[:12]
    loss, g, _ = model.layer_parallel_gradient(state.params, x, y, settings, bk)
    D = 1 if split == "layers" else _largest_divisor(world.size)
    grad = distributed_gradient(model.mpi_network, settings, bk, data_parallel=D)
    loss_mpi, g_mpi, _ = grad(state.params, x, y)
    assert set(g_mpi) == set(g)
    if D == 1:  # pure layer parallelism: the same operations in the same order
        assert loss_mpi == loss
        for k in g:
            np.testing.assert_array_equal(g_mpi[k], g[k], err_msg=k)
    else:
        assert loss_mpi == pytest.approx(loss, rel=1e-12)
        assert relative_gradient_error(g_mpi, g, bk) <= 1e-12


def test_sharded_fit_of_a_token_model_equals_one_process(world, shared_tmp):
    config = _config("gpt-untied")
    settings = layer_parallel_settings(config)
    model, data, state, bk = setup(config)
    serial = fit(model, state, data, mgrit_gradient(model, settings, bk), epochs=1,
                 batch_size=config.batch_size, bk=bk, quiet=True)
    model, data, state, bk = setup(config)
    grad = ShardedGradient(distributed_gradient(model.mpi_network, settings, bk,
                                                data_parallel=_largest_divisor(world.size)))
    result = fit(model, state, data, grad, epochs=1, batch_size=config.batch_size, bk=bk,
                 out_dir=shared_tmp / "run" if grad.is_root else None, quiet=True)
    if grad.is_root:
        assert relative_gradient_error(result.state.params, serial.state.params) <= 1e-12
        assert result.final["val_acc"] == serial.final["val_acc"]
    assert result.final["train_loss"] == pytest.approx(serial.final["train_loss"], rel=1e-12)
