"""The ``cupy`` backend's attention head split and merge, and the softmax with its scale:
one launch each.

On the counting device (the CuPy stand-in) each kernel of :mod:`refbraid.backends.cupy_heads`
runs the reference and is charged one launch for all stacked blocks (q; k and v; q, k and v):
NumPy's bits, float32 and float64; the scaled softmax and its adjoint stay one launch each. The
CUDA source compiles for real GPUs (tests/test_gpu_fused.py) and runs on the CPU in the CUDA C
emulator (tests/cuda_c); its speed is a GPU's alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import launch_count, reference
from refbraid.backends.host import to_host
from refbraid.backends.launch_model import tracking


@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_and_merge_have_the_reference_bits_in_one_launch_each(dtype, parts):
    B, L, heads, d = 2, 3, 2, 4
    rng = np.random.default_rng(parts)
    a = rng.standard_normal((B * L, parts * heads * d)).astype(dtype)
    want = reference.split_heads(a, B, L, heads, parts)
    with launch_count.counting("cupy") as bk:
        with tracking() as split:
            got = bk.split_heads(bk.asarray(a), B, L, heads, parts)
        with tracking() as merge:
            back = bk.merge_heads(list(got), B, heads)
        got, back = [to_host(g) for g in got], to_host(back)
    assert dict(split.tally.by_name) == {"split_heads_rows": 1}
    assert dict(merge.tally.by_name) == {"merge_heads_rows": 1}
    assert len(got) == parts
    for g, w in zip(got, want, strict=True):
        assert g.shape == (B * heads, L, d)
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(back, a)  # merge undoes split


def test_the_head_split_is_torchs_layout():
    """Head j of sample b holds columns j·d … j·d + d − 1 of that sample's rows."""
    B, L, heads, d = 2, 3, 2, 4
    a = np.arange(B * L * heads * d, dtype=np.float64).reshape(B * L, heads * d)
    (q,) = reference.split_heads(a, B, L, heads)
    for b in range(B):
        for j in range(heads):
            np.testing.assert_array_equal(q[b * heads + j], a[b * L:(b + 1) * L, j * d:(j + 1) * d])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_scaled_softmax_is_one_launch_each_way_with_the_reference_bits(dtype):
    rng = np.random.default_rng(4)
    x, dp = (rng.standard_normal((2, 3, 5)).astype(dtype) for _ in range(2))
    scale = 1 / np.sqrt(8.0)
    p_want = reference.softmax(x * dtype(scale), None)
    dx_want = reference.softmax_adjoint(p_want, dp) * dtype(scale)
    with launch_count.counting("cupy") as bk:
        with tracking() as forward:
            p = bk.softmax(bk.asarray(x), None, float(scale))
        with tracking() as adjoint:
            dx = bk.softmax_adjoint(p, bk.asarray(dp), float(scale))
        p, dx = to_host(p), to_host(dx)
    assert dict(forward.tally.by_name) == {"softmax_rows": 1}
    assert dict(adjoint.tally.by_name) == {"softmax_adjoint_rows": 1}
    np.testing.assert_array_equal(p, p_want)
    np.testing.assert_array_equal(dx, dx_want)


def test_more_blocks_than_the_kernel_takes_use_the_reference_operations():
    blocks = [np.full((2, 3, 4), float(i)) for i in range(4)]
    want = reference.merge_heads(blocks, 1, 2)
    with launch_count.counting("cupy") as bk:
        with tracking() as t:
            got = to_host(bk.merge_heads([bk.asarray(b) for b in blocks], 1, 2))
    assert "merge_heads_rows" not in t.tally.by_name
    np.testing.assert_array_equal(got, want)
