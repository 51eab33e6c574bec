"""One whole layer-parallel training step of each model family on ``--backend cuda`` in
Numba's CUDA simulator, against the same step on NumPy, with the host↔device copies counted.

A step is what ``refbraid train`` does per batch: the MGRIT forward and adjoint solves, the
gradient, and an SGD-with-momentum update (``train_epoch`` over one batch of 4). Sizes are
tiny (width ≤ 8, batch 4, N ≤ 8) because the simulator runs one Python thread per CUDA
thread. Oracle: the NumPy step in the same test; parameters after the step agree to round-off.

Transfers. The ``cuda`` kernels take host or device arrays and return host arrays (their
contract, refbraid.backends.numba_cuda), so each kernel call copies its inputs in and its
output out. The test counts every ``cuda.to_device`` and ``copy_to_host`` of the step and
checks that each one happens inside a kernel call: the layers, the MGRIT solver, the
optimizer and the trainer never move data between host and device themselves.
"""

import os

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

from refbraid.backends import Backend, get_backend
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.network import init_params, to_backend
from refbraid.sequence import GRUModel, TransformerModel
from refbraid.training.gradients import mgrit_gradient
from refbraid.training.models import build_network
from refbraid.training.optim import make_optimizer
from refbraid.training.trainer import TrainState, train_epoch

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

SETTINGS = LayerParallelSettings.with_iterations(1, 1, levels=2, cfactor=2, min_coarse=1)
BATCH = 4


def _model(name: str, rng):
    """(model, params, x, labels): width ≤ 8, batch 4, N ≤ 8."""
    if name == "dense":
        net, x = build_network("resnet", (2,), 3, 4, 4, 1.0), rng.standard_normal((BATCH, 2))
    elif name == "conv":
        net = build_network("conv", (1, 4, 4), 3, 4, 2, 1.0)
        x = rng.standard_normal((BATCH, 1, 4, 4))
    elif name == "transformer":  # vocab 5, 4 tokens, 3 classes, width 4, 2 layers, 1 head
        net, x = TransformerModel(5, 4, 3, 4, 2, 1, 4, 1.0), rng.integers(0, 5, (BATCH, 4))
    else:  # GRU: 4 positions (the time steps MGRIT parallelises), 2 inputs, hidden 4
        net, x = GRUModel(4, 2, 4, 3, "classic"), rng.standard_normal((BATCH, 4, 2))
    params = init_params(net, 1) if name in ("dense", "conv") else net.init_params(rng)
    return net, params, x, rng.integers(0, 3, BATCH)


class TransferCounter:
    """Counts host→device (``cuda.to_device``) and device→host (``copy_to_host``) copies,
    and those made outside a kernel call of the wrapped backend."""

    def __init__(self, monkeypatch):
        from numba import cuda

        self.h2d = self.d2h = self.outside = self.kernel_calls = 0
        self._depth = 0
        to_device = cuda.to_device
        array_type = type(to_device(np.zeros(1)))
        copy_to_host = array_type.copy_to_host

        def counted_to_device(*args, **kwargs):
            self.h2d += 1
            self.outside += self._depth == 0
            return to_device(*args, **kwargs)

        def counted_copy_to_host(array, *args, **kwargs):
            self.d2h += 1
            self.outside += self._depth == 0
            return copy_to_host(array, *args, **kwargs)

        monkeypatch.setattr(cuda, "to_device", counted_to_device)
        monkeypatch.setattr(array_type, "copy_to_host", counted_copy_to_host)

    def wrap(self, bk: Backend) -> Backend:
        """``bk`` with every kernel marking the copies it makes as its own."""
        def marked(kernel):
            def call(*args, **kwargs):
                self._depth += 1
                self.kernel_calls += 1
                try:
                    return kernel(*args, **kwargs)
                finally:
                    self._depth -= 1
            return call

        return Backend(bk.name, bk.xp, {k: marked(f) for k, f in bk.kernels.items()},
                       bk.overrides, bk.device)


def _step(net, params, x, labels, bk):
    state = TrainState(to_backend({k: np.array(v) for k, v in params.items()}, bk),
                       make_optimizer("sgd", 0.1, momentum=0.9), np.random.default_rng(3))
    loss, stats, _ = train_epoch(state, mgrit_gradient(net, SETTINGS, bk), x, labels, BATCH,
                                 bk, epoch=1)
    return loss, state.params, stats[0]


@pytest.mark.skipif(not SIMULATED, reason="counts the simulator's copies; on a GPU the same "
                    "steps run in tests/test_gpu.py (pytest -m gpu)")
@pytest.mark.parametrize("name", ["dense", "conv", "transformer", "gru"])
def test_one_layer_parallel_training_step_on_the_simulator_equals_numpy(name, monkeypatch):
    net, params, x, labels = _model(name, np.random.default_rng(0))
    want_loss, want, want_stats = _step(net, params, x, labels, get_backend("numpy"))
    counter = TransferCounter(monkeypatch)
    cuda = counter.wrap(get_backend("cuda"))
    loss, got, stats = _step(net, params, x, labels, cuda)
    assert loss == pytest.approx(want_loss, rel=1e-13)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-12, atol=1e-15, err_msg=k)
    assert stats == pytest.approx(want_stats, rel=1e-10)
    assert counter.kernel_calls > 0 and counter.h2d > 0 and counter.d2h > 0
    assert counter.outside == 0, f"{counter.outside} copies outside the kernels"
    assert counter.d2h <= 3 * counter.kernel_calls  # at most one copy per kernel output
