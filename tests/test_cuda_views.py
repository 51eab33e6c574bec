"""The ``cuda`` backend's Numba views of CuPy memory, made once per pointer and layout.

On a GPU every Numba kernel argument that is a CuPy array becomes a Numba device array over
the same memory; making one from ``__cuda_array_interface__`` is Python work at every
argument of every launch. ``numba_cuda_memory.cupy_view`` keeps them by (device, pointer,
shape, strides, dtype). What these tests see: the keying, the reuse, the bound, that a
view owns nothing and carries no stream, and that a kernel call keeps alive what its views
show. What they cannot: a GPU's launch with such a view
(``pytest -m gpu`` runs every kernel through it) and the time it saves.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from refbraid.backends import numba_cuda_memory as mem


class _Memory:
    def __init__(self, ptr: int, device_id: int = 0):
        self.ptr, self.device_id = ptr, device_id


class _CupyLike:
    """What cupy_view reads of a CuPy array: ``data.ptr``, ``data.device_id``, the layout
    and the interface (CuPy's version 3 carries the stream)."""

    def __init__(self, ptr, shape, strides, dtype, device_id=0):
        self.data = _Memory(ptr, device_id)
        self.shape, self.strides, self.dtype = shape, strides, np.dtype(dtype)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "strides": None, "typestr": self.dtype.str,
                "data": (self.data.ptr, False), "version": 3, "stream": 1}


@pytest.fixture
def made(monkeypatch):
    """The descriptions views were made from, in order (no Numba device array is built)."""
    calls = []
    monkeypatch.setattr(mem, "_new_view", lambda desc: calls.append(desc) or object())
    monkeypatch.setattr(mem, "_VIEWS", type(mem._VIEWS)())
    return calls


def test_a_view_is_made_once_per_pointer_and_layout(made):
    a = _CupyLike(4096, (8, 4), (16, 4), np.float32)
    first = mem.cupy_view(a)
    assert mem.cupy_view(a) is first
    assert mem.cupy_view(_CupyLike(4096, (8, 4), (16, 4), np.float32)) is first  # pool reuse
    assert len(made) == 1 and "stream" not in made[0] and made[0]["data"][0] == 4096
    for other in (_CupyLike(8192, (8, 4), (16, 4), np.float32),  # another block
                  _CupyLike(4096, (4, 8), (32, 4), np.float32),  # another shape
                  _CupyLike(4096, (8, 4), (4, 32), np.float32),  # a transposed layout
                  _CupyLike(4096, (8, 4), (32, 8), np.float64),  # another dtype
                  _CupyLike(4096, (8, 4), (16, 4), np.float32, device_id=1)):
        assert mem.cupy_view(other) is not first
    assert len(made) == 6


def test_the_views_kept_are_bounded_least_recently_used_first(made, monkeypatch):
    monkeypatch.setattr(mem, "VIEW_CACHE_SIZE", 3)
    arrays = [_CupyLike(256 * (i + 1), (4,), (4,), np.float32) for i in range(4)]
    views = [mem.cupy_view(a) for a in arrays[:3]]
    assert mem.cupy_view(arrays[0]) is views[0]  # now the most recently used
    mem.cupy_view(arrays[3])  # drops arrays[1]'s view, the least recently used
    assert mem.cupy_view(arrays[0]) is views[0] and mem.cupy_view(arrays[2]) is views[2]
    assert mem.cupy_view(arrays[1]) is not views[1]
    assert len(mem._VIEWS) == 3 and len(made) == 5


class _FakeCupy:
    """The CuPy functions KernelCall calls in device mode, each making a new array (so a
    temporary's lifetime can be watched)."""

    float32, float64 = np.float32, np.float64

    def __init__(self):
        self.made = []

    def _new(self, shape, dtype):
        a = _CupyLike(4096 * (len(self.made) + 1), tuple(shape), (), dtype)
        self.made.append(weakref.ref(a))
        return a

    def astype(self, a, dtype):
        return self._new(a.shape, dtype)

    def reshape(self, a, shape):
        return self._new(shape, a.dtype)

    def ascontiguousarray(self, a):
        return self._new(a.shape, a.dtype)

    def empty(self, shape, dtype):
        return self._new(shape, dtype)


def test_a_kernel_call_keeps_the_arrays_its_views_show_alive_until_it_is_dropped(monkeypatch):
    """A view owns nothing, so the temporaries a call makes for its kernel (a cast, a
    reshaped or contiguous copy, an output, a placeholder) must be kept by the call: freed at
    once, CuPy's pool would hand their memory to the next allocation (the kernel's output)
    before the kernel read them. (The first GPU run of the view cache failed so: outputs
    aliasing cast inputs.)"""
    fake, viewed = _FakeCupy(), []
    monkeypatch.setattr(mem, "MODE", "cupy")
    monkeypatch.setattr(mem, "xp", fake)
    monkeypatch.setattr(mem, "is_backend_array", lambda a: isinstance(a, _CupyLike))
    # a view that, as cupy_view's, owns nothing: it only notes which array it shows
    monkeypatch.setattr(mem, "_view", lambda a: viewed.append(weakref.ref(a)) or object())
    x = _CupyLike(64, (2, 3), (), np.float32)
    call = mem.KernelCall(x, names=("x",))
    call.arg(x, np.float64, (6,))  # a cast, reshaped, made contiguous: three temporaries
    call.out((6,), np.float64)
    call.placeholder(np.float64)
    gc.collect()
    assert len(fake.made) == 5 and len(viewed) == 3
    assert all(ref() is not None for ref in viewed)  # the last temporary, output, placeholder
    del call
    gc.collect()
    assert all(ref() is None for ref in fake.made)
