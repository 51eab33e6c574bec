"""Which backends' MGRIT sweeps take batched steps (refbraid.backends.batched_sweeps_on)."""

from __future__ import annotations

from refbraid.backends import Backend, batched_sweeps_on, get_backend, numba_cuda_batched


def test_numpy_and_numba_batch_their_sweeps():
    assert batched_sweeps_on(get_backend("numpy"))
    assert batched_sweeps_on(get_backend("numba"))


def test_cuda_follows_its_switch(monkeypatch):
    cuda_like = Backend("cuda", get_backend("numpy").xp, {}, ())
    monkeypatch.setattr(numba_cuda_batched, "SWITCHED_ON", False)
    assert not batched_sweeps_on(cuda_like)
    monkeypatch.setattr(numba_cuda_batched, "SWITCHED_ON", True)
    assert batched_sweeps_on(cuda_like)


def test_cupy_follows_the_launch_counts(monkeypatch):
    from refbraid.backends import device_batching

    cupy_like = Backend("cupy", get_backend("numpy").xp, {}, ())
    assert batched_sweeps_on(cupy_like)
    monkeypatch.setitem(device_batching.SWITCHED_ON, "cupy", False)
    assert not batched_sweeps_on(cupy_like)


def test_other_backends_do_not():
    assert not batched_sweeps_on(Backend("strict", get_backend("numpy").xp, {}, ()))


def test_every_gpu_step_type_batches_on_the_gpu_backends_and_the_cpu_rule_elsewhere():
    """On cuda and cupy the launch counts decide (device_batching: every step type batches,
    the conv step on cuda through its batched Numba kernels); on the CPU backends each
    layer's measured ``batched_sweeps_pay`` (the conv step: off)."""
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.layer_parallel import batchable
    from refbraid.models import build_network

    conv = build_network("conv", (1, 4, 4), 3, 4, 2, 1.0)
    dense = build_network("resnet", (2,), 3, 4, 4, 1.0)
    numpy = get_backend("numpy")
    for name in ("cuda", "cupy"):
        gpu = Backend(name, numpy.xp, {}, ())
        assert batchable(dense, gpu) and batchable(conv, gpu)
    assert not batchable(conv, numpy) and batchable(dense, numpy)
    with sweeps_batched(False):
        assert not batchable(dense, numpy)
    with sweeps_batched(True):
        assert batchable(conv, numpy)


def test_a_device_whose_arrays_cannot_gather_rows_keeps_per_step_sweeps():
    """The cuda backend in the simulator (array-api-strict arrays: no integer-array indices,
    which batched sweeps gather with) stays per step; the same backend on CuPy-like arrays
    batches."""
    import array_api_strict

    from refbraid.layer_parallel import batchable
    from refbraid.models import build_network

    dense = build_network("resnet", (2,), 3, 4, 4, 1.0)
    assert not batchable(dense, Backend("cuda", array_api_strict, {}, ()))
    assert batchable(dense, Backend("cuda", get_backend("numpy").xp, {}, ()))
