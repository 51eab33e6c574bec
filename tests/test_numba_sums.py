"""One-pass Σ r² (refbraid/backends/numba_cpu_sums.py): NumPy's ``numpy.sum(r * r)``, bit for
bit, over shapes that exercise every branch of the pairwise sum (n < 8, n ≤ 128, splits),
scales, dtypes, non-finite values and the fallbacks; and the block's sum from its rows' sums
(whole-row subtrees taken from them, the rest read), the same bits."""

import math

import numpy as np
import pytest

from refbraid.backends.numba_cpu_sums import (
    MAX_NODES,
    collect_row,
    sum_of_squares,
    sum_of_squares_with_rows,
)


def _bits(x) -> bytes:
    return np.float64(x).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_sum_has_numpys_bits(dtype):
    rng = np.random.default_rng(0)
    sizes = [1, 7, 8, 9, 15, 16, 127, 128, 129, 136, 255, 1000, 4097, 65_537, 3 * 156_800]
    shapes = [(n,) for n in sizes] + [(3, 5, 7), (4, 50, 28, 28), (2, 1, 1, 129)]
    for shape in shapes:
        for scale in (1e-20, 1.0, 1e15):
            r = (scale * rng.standard_normal(shape)).astype(dtype)
            assert _bits(sum_of_squares(r)) == _bits(np.sum(r * r)), (shape, scale)


def test_what_it_does_not_take_is_numpys_own_sum():
    rng = np.random.default_rng(1)
    r = rng.standard_normal((6, 10))
    for other in (r[:, ::2], r.astype(np.float16), r[:0]):
        assert _bits(sum_of_squares(other)) == _bits(np.sum(other * other))
    assert sum_of_squares(np.zeros(0)) == 0.0


def test_nan_and_inf_propagate():
    r = np.ones(300)
    r[200] = np.nan
    assert math.isnan(sum_of_squares(r))
    r[200] = np.inf
    assert sum_of_squares(r) == math.inf


def _collected(r, which):
    rows = r.shape[0]
    node_lo = np.zeros((rows, MAX_NODES), np.int64)
    node_val = np.zeros((rows, MAX_NODES), r.dtype)
    counts = np.zeros(rows, np.int64)
    for j in range(rows):
        if which[j]:
            counts[j] = collect_row(r[j], j, rows, node_lo[j], node_val[j])
    return node_lo, node_val, counts


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_sum_from_the_rows_sums_has_numpys_bits(dtype):
    """Blocks of 1–17 rows of several lengths, every row collected, none, or some: the bits
    of the block's one-pass sum (numpy.sum(r * r)'s, test above)."""
    rng = np.random.default_rng(2)
    for rows in (1, 2, 3, 4, 5, 15, 16, 17):
        for shape in ((7,), (64,), (130,), (1000,), (5, 4, 28, 28)):
            r = (3 * rng.standard_normal((rows, *shape))).astype(dtype)
            for which in (np.ones(rows, bool), np.zeros(rows, bool), rng.random(rows) > 0.5):
                got = sum_of_squares_with_rows(r, *_collected(r, which))
                assert _bits(got) == _bits(sum_of_squares(r)), (rows, shape, which)


def test_collected_sums_are_read_not_recomputed():
    """A wrong collected sum shows in the total: the walk reads it (5 rows of 1000 values:
    subtrees inside rows, leaves across their edges). A row the kernel does not take
    collects nothing."""
    r = np.ones((5, 1000))
    node_lo, node_val, counts = _collected(r, np.ones(5, bool))
    assert sum_of_squares_with_rows(r, node_lo, node_val, counts) == 5000.0
    assert counts.min() > 0
    node_val[2, 0] += 1.0
    assert sum_of_squares_with_rows(r, node_lo, node_val, counts) == 5001.0
    lo, val = np.zeros(MAX_NODES, np.int64), np.zeros(MAX_NODES)
    assert collect_row(r[0, ::2], 0, 5, lo, val) == 0
