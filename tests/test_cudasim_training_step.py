"""One whole layer-parallel training step of each model family on ``--backend cuda`` in
Numba's CUDA simulator, against the same step on NumPy, with the host↔device copies counted.

A step is what ``refbraid train`` does per batch: the MGRIT forward and adjoint solves, the
gradient, and an SGD-with-momentum update (``train_epoch`` over one batch of 4). Sizes are
tiny (width ≤ 8, batch 4, N ≤ 8) because the simulator runs one Python thread per CUDA
thread. Oracle: the NumPy step in the same test; parameters after the step agree to round-off.

Device residency. In the simulator the ``cuda`` backend's arrays are ``array_api_strict``
arrays on a non-default device (refbraid.backends.numba_cuda_memory, mode ``sim``), and its
kernels read and write their storage in place. The test proves, during the step:

* zero copies through numba.cuda: ``cuda.to_device``, ``cuda.device_array``, the implicit
  copy a kernel launch makes of a NumPy argument (``auto_device``), ``copy_to_host``;
* every kernel output is a device array of the backend, and the Numba kernels really ran
  (launches counted), so no kernel fell back to the host reference;
* no implicit host conversion anywhere (``forbid_host_conversions``: ``float()``,
  ``bool()``, ``numpy.asarray`` … of a device array raise);
* host copies only through the documented door, ``refbraid.backends.host.to_host`` (the
  stand-in's one exit, ``to_device(CPU)``, is recorded), and few: scalars (the loss, MGRIT's
  residual norms, the input's finiteness), the batch's labels (range check), and the
  parameters' and the gradients' finiteness flags, one vector each
  (``host.first_non_finite``). No activation, state or weight crosses.
"""

import os

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

from refbraid.backends import Backend, get_backend
from refbraid.backends.host import COUNTS
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.models import build_network
from refbraid.network import init_params, to_backend
from refbraid.sequence import GRUModel, TransformerModel
from refbraid.training.gradients import mgrit_gradient
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
    """Counts numba.cuda's copies and allocations, kernel launches, and the backend's kernel
    outputs that are not device arrays, while installed (monkeypatch undoes it)."""

    def __init__(self, monkeypatch):
        from numba import cuda
        from numba.cuda.simulator import kernel as sim_kernel
        from numba.cuda.simulator.cudadrv import devicearray

        self.copies: dict[str, int] = {"to_device": 0, "device_array": 0, "auto_device": 0,
                                       "copy_to_host": 0}
        self.launches = self.kernel_calls = 0
        self.host_outputs: list[str] = []

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
            self.launches += not kernel._device  # device functions are not launches
            return launch(kernel, *args)

        monkeypatch.setattr(sim_kernel.FakeCUDAKernel, "__call__", counted_launch)
        self.door_sizes: list[int] = []  # sizes of the arrays brought to the host
        import array_api_strict

        cpu = array_api_strict.Device("CPU_DEVICE")
        array_type = type(array_api_strict.asarray(0.0))
        to_device = array_type.to_device

        def recorded_to_device(array, device, /, **kwargs):
            if device == cpu and array.device != cpu:
                self.door_sizes.append(array.size)
            return to_device(array, device, **kwargs)

        monkeypatch.setattr(array_type, "to_device", recorded_to_device)

    def wrap(self, bk: Backend) -> Backend:
        """``bk`` with every overridden kernel checked: its array outputs are device arrays."""
        from refbraid.backends.numba_cuda_memory import is_backend_array

        def checked(name, kernel):
            def call(*args, **kwargs):
                self.kernel_calls += 1
                result = kernel(*args, **kwargs)
                for r in result if isinstance(result, tuple) else (result,):
                    if hasattr(r, "shape") and not is_backend_array(r):
                        self.host_outputs.append(f"{name} -> {type(r).__name__}")
                return result
            return call

        kernels = {k: checked(k, f) if k in bk.overrides else f for k, f in bk.kernels.items()}
        return Backend(bk.name, bk.xp, kernels, bk.overrides, bk.device)


def _step(net, params, x, labels, bk):
    state = TrainState(to_backend({k: np.array(v) for k, v in params.items()}, bk),
                       make_optimizer("sgd", 0.1, momentum=0.9), np.random.default_rng(3))
    loss, stats, _ = train_epoch(state, mgrit_gradient(net, SETTINGS, bk), x, labels, BATCH,
                                 bk, epoch=1)
    return loss, state.params, stats[0]


@pytest.mark.skipif(not SIMULATED, reason="counts the simulator's copies; on a GPU the same "
                    "steps run in tests/test_gpu.py (pytest -m gpu)")
@pytest.mark.parametrize("name", ["dense", "conv", "transformer", "gru"])
def test_one_layer_parallel_training_step_on_the_simulator_is_device_resident(name,
                                                                             monkeypatch):
    from refbraid.backends.strict_device import forbid_host_conversions

    net, params, x, labels = _model(name, np.random.default_rng(0))
    want_loss, want, want_stats = _step(net, params, x, labels, get_backend("numpy"))
    cuda = get_backend("cuda")
    counter = TransferCounter(monkeypatch)
    door = COUNTS["to_host"]
    with forbid_host_conversions():
        loss, got, stats = _step(net, params, x, labels, counter.wrap(cuda))
    door = COUNTS["to_host"] - door

    assert counter.copies == dict.fromkeys(counter.copies, 0), counter.copies
    assert counter.host_outputs == [], counter.host_outputs
    assert counter.kernel_calls > 0 and counter.launches >= counter.kernel_calls // 2
    assert len(counter.door_sizes) == door > 0  # every exit went through host.to_host
    # scalars, the batch's labels, and one finiteness flag per parameter (or gradient)
    assert max(counter.door_sizes) <= max(BATCH, len(params)), counter.door_sizes
    assert door <= 16, door  # a handful per step, not a few per parameter or per kernel
    assert loss == pytest.approx(want_loss, rel=1e-13)
    for k, v in want.items():
        np.testing.assert_allclose(cuda.to_numpy(got[k]), v, rtol=1e-12, atol=1e-15, err_msg=k)
    assert stats == pytest.approx(want_stats, rel=1e-10)


@pytest.mark.skipif(not SIMULATED, reason="the simulator's device arrays")
def test_a_kernel_given_host_and_device_arrays_names_the_host_one():
    bk = get_backend("cuda")
    x, W = bk.asarray(np.ones((2, 3))), np.ones((4, 3))
    with pytest.raises(TypeError, match="`W` is a host ndarray"):
        bk.linear(x, W, None)


@pytest.mark.skipif(not SIMULATED, reason="the simulator's device arrays")
def test_host_arrays_still_go_in_and_come_out_of_a_single_kernel():
    """The per-call copies remain for NumPy inputs (tests of one kernel): NumPy out."""
    rng = np.random.default_rng(1)
    x, W, b = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal(5)
    got = get_backend("cuda").linear(x, W, b)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, x @ W.T + b, rtol=1e-13)


def _host_mode_step_copies(name: str) -> dict[str, int]:
    """Run in a subprocess with REFBRAID_CUDA_ARRAYS=host: one step's numba.cuda copies,
    those made outside a kernel wrapper, and the largest parameter error against NumPy."""
    from numba import cuda
    from numba.cuda.simulator.cudadrv import devicearray

    counts = {"h2d": 0, "d2h": 0, "outside": 0, "depth": 0}

    def counted(key, original):
        def call(*args, **kwargs):
            counts[key] += 1
            counts["outside"] += counts["depth"] == 0
            return original(*args, **kwargs)
        return call

    cuda.to_device = counted("h2d", cuda.to_device)
    devicearray.FakeCUDAArray.copy_to_host = counted("d2h", devicearray.FakeCUDAArray.copy_to_host)

    def marked(kernel):
        def call(*args, **kwargs):
            counts["depth"] += 1
            try:
                return kernel(*args, **kwargs)
            finally:
                counts["depth"] -= 1
        return call

    bk = get_backend("cuda")
    assert bk.xp is np, "REFBRAID_CUDA_ARRAYS=host gives NumPy arrays"
    bk = Backend(bk.name, bk.xp, {k: marked(f) for k, f in bk.kernels.items()}, bk.overrides)
    net, params, x, labels = _model(name, np.random.default_rng(0))
    _, want, _ = _step(net, params, x, labels, get_backend("numpy"))
    _, got, _ = _step(net, params, x, labels, bk)
    counts["error"] = max(float(np.max(np.abs(got[k] - v))) for k, v in want.items())
    return counts


@pytest.mark.skipif(not SIMULATED, reason="the simulator's copies")
def test_host_array_mode_copies_inside_the_kernels_only():
    """``REFBRAID_CUDA_ARRAYS=host`` (what a GPU without CuPy gets): NumPy arrays, each kernel
    copying in and out, and nothing else moving data; same result."""
    import json
    import subprocess
    import sys

    code = ("import json, test_cudasim_training_step as t; "
            "print(json.dumps(t._host_mode_step_copies('dense')))")
    env = {**os.environ, "REFBRAID_CUDA_ARRAYS": "host", "NUMBA_ENABLE_CUDASIM": "1"}
    run = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(__file__), env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    assert counts["h2d"] > 0 and counts["d2h"] > 0 and counts["outside"] == 0, counts
    assert counts["error"] <= 1e-14, counts


def test_with_host_arrays_gives_the_cuda_kernels_on_numpy_arrays():
    """What the MPI trainers use (they send host arrays): the same kernels, NumPy arrays."""
    from refbraid.backends import with_host_arrays

    cuda = get_backend("cuda")
    host = with_host_arrays(cuda)
    assert host.xp is np and host.device is None and host.kernels is cuda.kernels
    assert with_host_arrays(get_backend("numba")) is get_backend("numba")
    x = np.arange(6.0).reshape(2, 3)
    assert isinstance(host.activation(x, "tanh"), np.ndarray)


def test_only_the_memory_module_copies_or_allocates_through_numba_cuda():
    """The kernel wrappers get inputs and outputs from KernelCall (numba_cuda_memory) only."""
    from pathlib import Path

    import refbraid.backends as backends

    folder = Path(backends.__file__).parent
    wrappers = [p for p in folder.glob("numba_cuda*.py") if p.name != "numba_cuda_memory.py"]
    assert len(wrappers) == 11
    for path in wrappers:
        code = path.read_text()
        for call in ("cuda.to_device(", "cuda.device_array(", ".copy_to_host("):
            assert call not in code, f"{path.name} calls {call}"
