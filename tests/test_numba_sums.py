"""One-pass Σ r² (refbraid/backends/numba_cpu_sums.py): NumPy's ``numpy.sum(r * r)``, bit for
bit, over shapes that exercise every branch of the pairwise sum (n < 8, n ≤ 128, splits),
scales, dtypes, non-finite values and the fallbacks."""

import math

import numpy as np
import pytest

from refbraid.backends.numba_cpu_sums import sum_of_squares


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_that_start_anywhere_in_memory(dtype):
    """The vector lanes load rows of eight values from any element boundary (a view that
    starts one element into its buffer: no 32-byte alignment)."""
    rng = np.random.default_rng(2)
    for n in (8, 129, 4097):
        buf = rng.standard_normal(n + 3).astype(dtype)
        for start in (1, 2, 3):
            r = buf[start:start + n]
            assert _bits(sum_of_squares(r)) == _bits(np.sum(r * r)), (n, start)


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
