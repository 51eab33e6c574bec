"""Layer-parallel training over MPI on device arrays: the strict stand-in, then the CUDA simulator.

The sharded trainer (:class:`~refbraid.distributed.sharded.ShardedTrainer`, and ``fit`` with
:class:`~refbraid.distributed.sharded.ShardedGradient`, what ``refbraid train`` runs under
``mpiexec``) on the ``strict`` backend: its arrays are array-api-strict arrays on a
non-default device, which refuse every implicit host conversion
(``forbid_host_conversions``) and, here, any trip through MPI's pickle
(``refuse_pickled_device_arrays``). So every neighbour message, ghost-weight fetch, gradient
sum over the data-parallel groups and gather for evaluation and checkpoints must go through
buffers (staged through host buffers: no CUDA-aware MPI here), and every host value through
``refbraid.backends.host.to_host``. Oracle: the same run on NumPy under the same ``mpiexec``
(itself checked against one process in test_distributed.py and test_training_mpi.py): the
reference kernels do the same arithmetic on both array types, so the results are
bit-identical.

N = 10 layers with 2 MGRIT levels and cfactor 2 make 5 coarsest intervals: the layer blocks
are uneven on 2, 3 and 4 ranks. The CUDA-simulator test (``--backend cuda`` under
``NUMBA_ENABLE_CUDASIM=1``, which tests/conftest.py sets) uses width 4, batch 4, N = 8.
"""

import os

import numpy as np
import pytest

pytest.importorskip("array_api_strict")

from refbraid.backends import get_backend
from refbraid.backends.host import COUNTS, to_host
from refbraid.backends.strict_device import DEVICE, forbid_host_conversions
from refbraid.distributed.network import distributed_gradient
from refbraid.distributed.sharded import ShardedGradient, ShardedTrainer
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.models import build_network
from refbraid.network import init_params, to_backend
from refbraid.parallel.device_messages import refuse_pickled_device_arrays
from refbraid.sequence.losses import IGNORE
from refbraid.training.config import TrainConfig
from refbraid.training.optim import make_optimizer
from refbraid.training.run import setup
from refbraid.training.trainer import fit

STRICT, NUMPY = get_backend("strict"), get_backend("numpy")
SETTINGS = LayerParallelSettings.with_iterations(2, 1, levels=2, cfactor=2, min_coarse=1)
N = 10  # 5 coarsest intervals: uneven layer blocks on 2, 3 and 4 ranks


@pytest.fixture(autouse=True)
def _guards():
    """Implicit host conversions and pickled device arrays fail the test."""
    with forbid_host_conversions(), refuse_pickled_device_arrays():
        yield


def _splits(size: int) -> list[int]:
    """Data-parallel group counts D to test: 1, and 2 where it divides the world (else P)."""
    return sorted({1, 2 if size % 2 == 0 else size})


#: token models: 7 token ids, 5 positions; the GPT scores the last 3 tokens (IGNORE before)
TOKENS = {"vocab_size": 7}
LM = {"vocab_size": 7, "per_token": True, "language_model": True}


def _net(kind: str, layers: int = N, width: int = 4):
    """The Network the MPI gradient distributes (a token model's ``mpi_network``)."""
    if kind == "resnet":
        return build_network("resnet", (2,), 3, layers, width, 1.0, "tanh")
    if kind == "conv":
        return build_network("conv", (1, 4, 4), 3, layers, 2, 1.0, "relu")
    info = TOKENS if kind == "transformer" else LM
    return build_network(kind, (5,), 3 if kind == "transformer" else 7, layers, width, 1.0,
                         "tanh", info).mpi_network


def _batches(net, n: int = 2, B: int = 6):
    rng = np.random.default_rng(7)
    if net.opening.in_shape != (5,):  # features
        return [(rng.standard_normal((B, *net.opening.in_shape)),
                 rng.integers(0, net.closing.out_shape[0], B)) for _ in range(n)]
    out = []
    for _ in range(n):  # token ids; per-sequence classes, or per-token ids scored at the end
        x = rng.integers(0, 7, (B, 5))
        if len(net.closing.out_shape) == 1:
            out.append((x, rng.integers(0, net.closing.out_shape[0], B)))
        else:
            y = rng.integers(0, 7, (B, 5))
            y[:, :2] = IGNORE
            out.append((x, y))
    return out


def _train(net, bk, D: int, batches):
    """Two Adam steps with owned shards on ``bk``: (losses, gathered params, optimizer state,
    trainer)."""
    params = to_backend(init_params(net, 3), bk)
    trainer = ShardedTrainer(distributed_gradient(net, SETTINGS, bk, data_parallel=D), params,
                             make_optimizer("adam", 1e-2))
    losses = [trainer.step(bk.asarray(x), bk.asarray(y))[0] for x, y in batches]
    return losses, trainer.gather_params(), trainer.gather_optimizer_state(), trainer


def _host(tree):
    return {k: np.asarray(to_host(v)) for k, v in tree.items()}


@pytest.mark.parametrize("kind", ["resnet", "conv", "transformer", "gpt-untied"])
def test_sharded_training_on_device_arrays_equals_numpy(world, kind):
    net = _net(kind)
    batches = _batches(net)
    for D in _splits(world.size):
        want_losses, want, want_opt, _ = _train(net, NUMPY, D, batches)
        losses, got, opt, trainer = _train(net, STRICT, D, batches)
        assert losses == want_losses, D  # the same arithmetic: bit-identical
        assert trainer.gradient.topo.layer.to_device is not None  # messages may carry arrays
        buffers = [v for k, v in trainer.optimizer.state.items() if k != "step"]
        for v in (*trainer.shard.values(), *buffers):  # the shard and its Adam state stay
            assert v.device == DEVICE
        if world.rank != 0:
            assert got is None and opt is None
            continue
        assert all(v.device == DEVICE for v in got.values())  # gathered onto the device
        for k, v in want.items():
            np.testing.assert_array_equal(to_host(got[k]), v, err_msg=f"D={D} {k}")
        for k, v in want_opt.items():
            np.testing.assert_array_equal(opt[k], v, err_msg=f"D={D} {k}")


def test_replicated_gradient_on_device_arrays_equals_numpy(world):
    net = _net("resnet")
    params = init_params(net, 4)
    (x, y), = _batches(net, n=1)
    D = _splits(world.size)[-1]
    want_loss, want, _ = distributed_gradient(net, SETTINGS, NUMPY, D)(params, x, y)
    loss, got, _ = distributed_gradient(net, SETTINGS, STRICT, D)(
        to_backend(params, STRICT), STRICT.asarray(x), STRICT.asarray(y))
    assert loss == want_loss
    for k, v in want.items():
        assert got[k].device == DEVICE
        np.testing.assert_array_equal(to_host(got[k]), v, err_msg=k)


def test_fit_with_checkpoints_on_device_arrays_equals_numpy(world, shared_tmp):
    """``refbraid train``'s loop: shards localized, gathered on rank 0 for evaluation and an
    atomic checkpoint each epoch, the epoch record shared; only host values cross the door."""
    config = TrainConfig(model="resnet", data="peaks", samples=24, layers=N, width=4, epochs=2,
                         batch_size=8, levels=2, cfactor=2, seed=5, quiet=True)
    D = _splits(world.size)[-1]
    results = {}
    for bk in (NUMPY, STRICT):
        net, data, state, _ = setup(config)
        state.params = to_backend(state.params, bk)
        grad = ShardedGradient(distributed_gradient(net, SETTINGS, bk, data_parallel=D))
        out = shared_tmp / bk.name
        results[bk.name] = fit(net, state, data, grad, epochs=2, batch_size=8, bk=bk,
                               out_dir=out if grad.is_root else None, checkpoint_every=1,
                               quiet=True)
    ref, dev = results["numpy"].state, results["strict"].state
    assert [r["train_loss"] for r in dev.history] == \
        pytest.approx([r["train_loss"] for r in ref.history], rel=1e-12)
    assert [r["val_acc"] for r in dev.history] == [r["val_acc"] for r in ref.history]
    if world.rank == 0:
        assert (shared_tmp / "strict" / "checkpoint.npz").is_file()
        for k, v in _host(ref.params).items():
            assert dev.params[k].device == DEVICE
            np.testing.assert_allclose(to_host(dev.params[k]), v, rtol=1e-12, atol=1e-14)
        for k, v in ref.optimizer.state_dict().items():
            np.testing.assert_allclose(dev.optimizer.state_dict()[k], v, rtol=1e-11, atol=1e-14)


def test_a_device_array_reaching_mpi_pickle_fails(world):
    from refbraid.parallel.device_messages import DevicePickleError

    with pytest.raises(DevicePickleError, match="reached MPI's pickle"):  # every rank pickles
        world.mpi.allgather({"row": STRICT.asarray(np.ones(3))})  # first: none is left waiting
    assert world.mpi.allgather({"host": np.ones(2)})[-1]["host"].shape == (2,)


# ----------------------------------------------------------------------------- CUDA simulator
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


class CudaCopies:
    """numba.cuda's host↔device copies and allocations, and kernel launches, while installed."""

    def __init__(self, monkeypatch):
        from numba import cuda
        from numba.cuda.simulator import kernel as sim_kernel
        from numba.cuda.simulator.cudadrv import devicearray

        self.copies = dict.fromkeys(("to_device", "device_array", "auto_device",
                                     "copy_to_host"), 0)
        self.launches = 0

        def counted(name, original):
            def call(*args, **kwargs):
                self.copies[name] += 1
                return original(*args, **kwargs)
            return call

        for name, owner in (("to_device", cuda), ("device_array", cuda),
                            ("auto_device", devicearray)):
            monkeypatch.setattr(owner, name, counted(name, getattr(owner, name)))
        monkeypatch.setattr(devicearray.FakeCUDAArray, "copy_to_host",
                            counted("copy_to_host", devicearray.FakeCUDAArray.copy_to_host))
        launch = sim_kernel.FakeCUDAKernel.__call__

        def counted_launch(kernel, *args):
            self.launches += not kernel._device
            return launch(kernel, *args)

        monkeypatch.setattr(sim_kernel.FakeCUDAKernel, "__call__", counted_launch)


@pytest.mark.skipif(not SIMULATED, reason="the CUDA simulator's device arrays")
def test_sharded_training_step_on_the_cuda_simulator_is_device_resident(world, monkeypatch):
    """``--backend cuda`` in the simulator (its arrays: the strict stand-in's, its kernels run
    on their storage): one sharded step (dense, N = 8, width 4, batch 4) equals NumPy; the
    kernels make no numba.cuda copy; messages are staged (counted), never pickled."""
    from refbraid.backends.numba_cuda_memory import MODE

    assert MODE == "sim"
    cuda = get_backend("cuda")
    net = _net("resnet", layers=8)
    batch = _batches(net, n=1, B=4)
    want_losses, want, _, _ = _train(net, NUMPY, 1, batch)
    params = to_backend(init_params(net, 3), cuda)
    trainer = ShardedTrainer(distributed_gradient(net, SETTINGS, cuda), params,
                             make_optimizer("adam", 1e-2))
    x, y = cuda.asarray(batch[0][0]), cuda.asarray(batch[0][1])
    layer = trainer.gradient.topo.layer
    sends, door = layer.counters["sends"], COUNTS["to_host"]
    counter = CudaCopies(monkeypatch)
    loss, _ = trainer.step(x, y)
    sends, door = layer.counters["sends"] - sends, COUNTS["to_host"] - door
    assert counter.copies == dict.fromkeys(counter.copies, 0), counter.copies  # zero-copy
    assert counter.launches > 0  # the Numba kernels ran (no host fallback)
    assert not layer.direct  # no CUDA-aware MPI here: device messages are staged ...
    assert door >= sends  # ... each through the host door (plus the scalars)
    assert loss == pytest.approx(want_losses[0], rel=1e-13)
    got = trainer.gather_params()
    if world.rank == 0:
        for k, v in want.items():
            np.testing.assert_allclose(to_host(got[k]), v, rtol=1e-12, atol=1e-14, err_msg=k)


def test_language_model_fit_and_report_on_device_arrays_equal_numpy(world, shared_tmp):
    """``refbraid train --model gpt-untied``'s path under mpiexec (select_gradient → sharded
    MPI gradient → fit → language report on world rank 0) on the stand-in: the per-token
    evaluation gathers the scored tokens on the device (``take``), counts hits there."""
    from refbraid.training.gradients import select_gradient
    from refbraid.training.run import write_language_report

    config = TrainConfig(model="gpt-untied", layers=8, levels=2, cfactor=2, width=4, samples=16,
                         batch_size=8, epochs=1, quiet=True)
    results = {}
    for bk in (NUMPY, STRICT):
        config = TrainConfig.from_dict({**config.to_dict(), "out": str(shared_tmp / bk.name)})
        net, data, state, _ = setup(config)
        state.params = to_backend(state.params, bk)
        name, grad = select_gradient(config, net, bk)
        fit(net, state, data, grad, epochs=1, batch_size=8, bk=bk, quiet=True)
        report = None
        if getattr(grad, "is_root", True):  # one rank: the single-process gradient
            (shared_tmp / bk.name).mkdir(exist_ok=True)
            report = write_language_report(config, net, data, state, bk, grad.logits,
                                           None).read_text()
        results[bk.name] = (name, state.history[-1], report)
    (name, ref, ref_report), (dev_name, dev, dev_report) = results["numpy"], results["strict"]
    assert name == dev_name == ("layer-parallel-mpi" if world.size > 1 else "layer-parallel")
    assert dev["train_loss"] == ref["train_loss"] and dev["val_acc"] == ref["val_acc"]
    assert dev_report == ref_report
