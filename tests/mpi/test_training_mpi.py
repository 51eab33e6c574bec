"""Training with the trainer's loop over MPI equals training in one process (to round-off).

The distributed gradient plugs into :func:`refbraid.training.trainer.fit` in both parameter
modes: replicated (``gradient(params, x, labels) -> (loss, grads, stats)`` plus
``gradient.logits``) and owned shards (:class:`~refbraid.distributed.sharded.ShardedGradient`,
what ``refbraid train`` uses: its hooks shard the state, gather it on rank 0 for evaluation
and checkpoints). Every rank runs the same batches, only world rank 0 prints and writes files.
Oracle: the same ``fit`` in this process with the single-process layer-parallel gradient.
"""

import io

import numpy as np
import pytest

from refbraid.distributed.network import distributed_gradient
from refbraid.distributed.sharded import ShardedGradient
from refbraid.layer_parallel import relative_gradient_error
from refbraid.training.checkpoint import load_checkpoint
from refbraid.training.config import TrainConfig
from refbraid.training.run import setup
from refbraid.training.trainer import fit, layer_parallel_settings, mgrit_gradient


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


@pytest.mark.parametrize("split", ["layers", "data"])
def test_sharded_fit_steps_owned_layers_and_equals_one_process(world, shared_tmp, split):
    """``refbraid train``'s MPI gradient (ShardedGradient): each rank steps only its shard;
    rank 0 evaluates, logs and checkpoints the gathered parameters; the result is serial's."""
    config = TrainConfig(model="resnet", layers=64, width=4, samples=240, epochs=2,
                         batch_size=32, seed=3, quiet=True, optimizer="adam")
    settings = layer_parallel_settings(config)
    net, data, state, bk = setup(config)
    serial = fit(net, state, data, mgrit_gradient(net, settings, bk), epochs=config.epochs,
                 batch_size=config.batch_size, bk=bk, quiet=True)

    D = 1 if split == "layers" else divisors(world.size)[-1]
    net, data, state, bk = setup(config)
    grad = ShardedGradient(distributed_gradient(net, settings, bk, data_parallel=D))
    seen = []  # the parameters each step updates on this rank

    def step(params, x, labels):
        seen.append({k: v.shape for k, v in params.items()})
        return grad(params, x, labels)

    for hook in ("is_root", "logits", "localize", "gather_params", "gather_optimizer", "share"):
        setattr(step, hook, getattr(grad, hook))
    out = shared_tmp / "run"
    result = fit(net, state, data, step, epochs=config.epochs, batch_size=config.batch_size,
                 bk=bk, out_dir=out if grad.is_root else None, checkpoint_every=1, quiet=True)
    owned = len(grad.gradient.owned)
    assert all(s["steps.W"][0] == owned for s in seen)
    assert all(("opening.W" in s) == (grad.gradient.q == 0) for s in seen)
    assert all(("closing.W" in s) == (grad.gradient.q == grad.gradient.last) for s in seen)
    assert result.final["train_loss"] == pytest.approx(serial.final["train_loss"], rel=1e-12)
    assert result.final["val_acc"] == serial.final["val_acc"]  # rank 0's record, everywhere
    world.barrier()
    ckpt = load_checkpoint(out / "checkpoint.npz")  # one file, the single-process format
    assert relative_gradient_error(ckpt.params, serial.state.params) <= 1e-12
    assert set(ckpt.optimizer_state) == set(serial.state.optimizer.state_dict())
    if grad.is_root:  # the full parameters and optimizer are back on rank 0
        assert relative_gradient_error(result.state.params, serial.state.params) <= 1e-12
        assert result.state.optimizer.t == serial.state.optimizer.t
    else:
        assert result.state.params["steps.W"].shape[0] == owned
