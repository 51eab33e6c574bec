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


def test_other_backends_do_not():
    assert not batched_sweeps_on(Backend("cupy", get_backend("numpy").xp, {}, ()))
