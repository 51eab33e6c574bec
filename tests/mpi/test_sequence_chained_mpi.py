"""The tied GPT (with and without buffer layers) and both encoder–decoders under MPI:
layer- and data-parallel gradients, and sharded training, as in one process.

Launched like every file here (``mpiexec -n N python -m mpi4py -m pytest tests/mpi``, N = 1..4).
Two MGRIT levels with cfactor 2 over 8 layers (per block) give 4 coarse intervals, so 3 ranks
split the layers unevenly (and with 10 layers and one buffer step per side, 8 in the block).
Oracles: the model's own single-process layer-parallel gradient, bit-identical with pure layer
parallelism and to round-off with data parallelism; a sharded ``fit`` against ``fit`` in one
process, including the autoregressive decoder's token-by-token evaluation on rank 0.
"""

import numpy as np
import pytest

from refbraid.distributed.choose import family_gradient
from refbraid.distributed.sharded import ShardedGradient
from refbraid.layer_parallel import relative_gradient_error
from refbraid.models import as_network_input
from refbraid.training.config import TrainConfig
from refbraid.training.gradients import mgrit_gradient
from refbraid.training.run import setup
from refbraid.training.trainer import fit, layer_parallel_settings

TINY = dict(width=8, samples=48, levels=2, cfactor=2, epochs=1, batch_size=12, seed=5,
            quiet=True)
CASES = {
    "gpt": dict(model="gpt", layers=8),
    "gpt-buffer": dict(model="gpt", layers=10, buffer=1),
    "transformer-decoder": dict(model="transformer-decoder", data="seq-reverse", layers=8),
    "transformer-seq2seq": dict(model="transformer-seq2seq", data="seq-reverse", layers=8),
}

def _config(name, **kw):
    return TrainConfig(**CASES[name], **{**TINY, **kw})

def _splits(size):
    """Pure layer parallelism, and data parallelism where the world has room for it (D = 2
    with 2 or 4 ranks: 1 or 2 layer ranks per group; D = 3 with 3 ranks)."""
    return [1] + ([size if size < 4 else 2] if size > 1 else [])

@pytest.mark.parametrize("name", list(CASES))
def test_chained_or_tied_gradient_over_mpi_equals_one_process(world, name):
    config = _config(name)
    model, data, state, bk = setup(config)
    settings = layer_parallel_settings(config)
    x = as_network_input(model, data.x_train[:12])
    y = data.y_train[:12]
    loss, g, _ = model.layer_parallel_gradient(state.params, x, y, settings, bk)
    for D in _splits(world.size):
        grad = family_gradient(model, settings, bk, data_parallel=D)
        for mode in ("replicated", "sharded") if D == 1 else ("sharded",):  # training's
            if mode == "replicated":
                loss_mpi, g_mpi, _ = grad(state.params, x, y)
            else:  # each rank's shard; group 0's shards gathered to world rank 0
                loss_mpi, g_shard, _ = grad.sharded(grad.shard(state.params), x, y)
                g_mpi = grad.gather(g_shard)
            if g_mpi is None:  # off world rank 0 (sharded)
                continue
            assert set(g_mpi) == set(g), (mode, D)
            if D == 1:  # pure layer parallelism: the same operations in the same order
                assert loss_mpi == loss, (mode, D)
                for k in g:
                    np.testing.assert_array_equal(g_mpi[k], g[k], err_msg=f"{mode} {k}")
            else:
                assert loss_mpi == pytest.approx(loss, rel=1e-12), (mode, D)
                assert relative_gradient_error(g_mpi, g, bk) <= 1e-12, (mode, D)

@pytest.mark.parametrize("name, data_parallel", [("gpt", True), ("transformer-seq2seq", False)])
def test_sharded_fit_of_a_chained_or_tied_model_equals_one_process(world, shared_tmp, name,
                                                                   data_parallel):
    config = _config(name, samples=24)  # the decoder's evaluation decodes token by token
    settings = layer_parallel_settings(config)
    model, data, state, bk = setup(config)
    serial = fit(model, state, data, mgrit_gradient(model, settings, bk), epochs=1,
                 batch_size=config.batch_size, bk=bk, quiet=True)
    model, data, state, bk = setup(config)
    D = _splits(world.size)[-1] if data_parallel else 1
    grad = ShardedGradient(family_gradient(model, settings, bk, data_parallel=D))
    result = fit(model, state, data, grad, epochs=1, batch_size=config.batch_size, bk=bk,
                 out_dir=shared_tmp / "run" if grad.is_root else None, quiet=True)
    if grad.is_root:
        assert set(result.state.params) == set(serial.state.params)
        if D == 1:  # pure layer parallelism: bit-identical training
            for k in serial.state.params:
                np.testing.assert_array_equal(result.state.params[k], serial.state.params[k],
                                              err_msg=k)
        else:
            assert relative_gradient_error(result.state.params, serial.state.params) <= 1e-12
        assert result.final["val_acc"] == serial.final["val_acc"]
    assert result.final["train_loss"] == pytest.approx(serial.final["train_loss"],
                                                       rel=0 if D == 1 else 1e-12)
