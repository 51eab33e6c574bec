"""Training with the trainer's loop over MPI equals training in one process (to round-off).

The distributed gradient plugs into :func:`refbraid.training.trainer.fit` unchanged
(``gradient(params, x, labels) -> (loss, grads, stats)`` plus ``gradient.logits``): every
rank runs the same batches, only world rank 0 prints and writes files. Oracle: the same
``fit`` in this process with the single-process layer-parallel gradient.
"""

import io

import numpy as np
import pytest

from refbraid.training.config import TrainConfig
from refbraid.training.distributed import distributed_gradient
from refbraid.training.layer_parallel import relative_gradient_error
from refbraid.training.trainer import fit, layer_parallel_settings, mgrit_gradient, setup


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize("split", ["layers", "data"])
def test_fit_over_mpi_equals_fit_in_one_process(world, shared_tmp, split):
    config = TrainConfig(model="resnet", layers=64, width=4, samples=240, epochs=2,
                         batch_size=32, seed=3, quiet=True)
    settings = layer_parallel_settings(config)
    net, data, state, bk = setup(config)
    serial = fit(net, state, data, mgrit_gradient(net, settings, bk), epochs=config.epochs,
                 batch_size=config.batch_size, bk=bk, quiet=True)

    D = 1 if split == "layers" else divisors(world.size)[-1]
    net, data, state, bk = setup(config)
    grad = distributed_gradient(net, settings, bk, data_parallel=D)
    out = shared_tmp / "run"
    stream = io.StringIO()
    result = fit(net, state, data, grad, epochs=config.epochs, batch_size=config.batch_size,
                 bk=bk, out_dir=out if grad.is_root else None, quiet=not grad.is_root,
                 stream=stream)
    assert relative_gradient_error(result.state.params, serial.state.params) <= 1e-12
    assert result.final["train_loss"] == pytest.approx(serial.final["train_loss"], rel=1e-12)
    assert result.final["val_acc"] == serial.final["val_acc"]
    assert bool(stream.getvalue()) == grad.is_root  # only rank 0 prints ...
    world.barrier()
    written = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert "log.json" in written  # ... and rank 0 wrote the files
    everyone = world.allgather(result.state.params["steps.W"])
    for other in everyone:  # replicated parameters stay bit-identical on every rank
        np.testing.assert_array_equal(other, everyone[0])
