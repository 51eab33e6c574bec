"""The ``cupy`` backend's attention softmax: one launch each way.

On the counting device (the CuPy stand-in) each kernel of :mod:`refbraid.backends.cupy_softmax`
runs the reference and is charged one launch: NumPy's bits, masked (a fully masked row
included) or not, float32 and float64; a mask of another shape takes the reference
operations. The CUDA source compiles for real GPUs (tests/test_gpu_fused.py); its arithmetic
runs only on a GPU (``pytest -m gpu``), which no stand-in can replace.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import launch_count, reference
from refbraid.backends.host import to_host
from refbraid.backends.launch_model import tracking


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_softmax_has_the_reference_bits_in_one_launch_each_way(dtype, masked):
    rng = np.random.default_rng(0)
    x, dp = (rng.standard_normal((2, 3, 5)).astype(dtype) for _ in range(2))
    mask = None
    if masked:
        mask = rng.random((2, 3, 5)) < 0.4
        mask[0, 1, :] = True  # a fully masked row: all zeros, never NaN
    p_want = reference.softmax(x, mask)
    dx_want = reference.softmax_adjoint(p_want, dp)
    with launch_count.counting("cupy") as bk:
        d = bk.asarray
        with tracking() as forward:
            p = bk.softmax(d(x), None if mask is None else d(mask))
        with tracking() as adjoint:
            dx = bk.softmax_adjoint(p, d(dp))
        p, dx = to_host(p), to_host(dx)
    assert dict(forward.tally.by_name) == {"softmax_rows": 1}
    assert dict(adjoint.tally.by_name) == {"softmax_adjoint_rows": 1}
    np.testing.assert_array_equal(p, p_want)
    np.testing.assert_array_equal(dx, dx_want)
    if masked:
        assert not np.any(p[0, 1]) and np.all(np.isfinite(p))


def test_a_broadcast_mask_takes_the_reference_operations():
    rng = np.random.default_rng(1)
    x, mask = rng.standard_normal((2, 3, 5)), rng.random((3, 5)) < 0.3
    want = reference.softmax(x, mask)
    with launch_count.counting("cupy") as bk:
        with tracking() as t:
            got = to_host(bk.softmax(bk.asarray(x), bk.asarray(mask)))
    assert "softmax_rows" not in t.tally.by_name
    np.testing.assert_array_equal(got, want)
