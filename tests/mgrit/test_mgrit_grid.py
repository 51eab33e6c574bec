"""The level hierarchy (C/F points for any N) and the rank layout aligned with it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refbraid.mgrit import build_hierarchy, max_levels
from refbraid.parallel import Layout, check_layout, partition


def test_uneven_last_interval_is_f_points_after_last_c_point():
    h = build_hierarchy(10, (3,), min_coarse=1)
    fine, coarse = h[0], h[1]
    assert list(fine.points) == list(range(11))
    assert list(fine.c_points) == [0, 3, 6, 9]
    assert list(fine.f_points) == [1, 2, 4, 5, 7, 8, 10]  # 10 follows the last C-point 9
    assert list(coarse.points) == [0, 3, 6, 9] and coarse.cfactor is None
    assert coarse.is_c.all()  # the coarsest level is solved directly: no F-points


def test_step_sizes_per_level_follow_the_time_grid():
    h = build_hierarchy(8, (2, 2), min_coarse=1)
    t = np.linspace(0, 1, 9)
    np.testing.assert_allclose(h[1].step_sizes(t), [0.25] * 4)
    np.testing.assert_allclose(h[2].step_sizes(t), [0.5] * 2)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 400),
    factors=st.lists(st.integers(2, 8), min_size=0, max_size=4),
    min_coarse=st.integers(1, 3),
)
def test_hierarchy_is_repeated_injection_or_names_levels(n, factors, min_coarse):
    try:
        h = build_hierarchy(n, tuple(factors), min_coarse)
    except ValueError as err:
        assert "`levels`" in str(err)
        assert max_levels(n, tuple(factors), min_coarse) < len(factors) + 1
        return
    assert len(h) == len(factors) + 1 == max_levels(n, tuple(factors), min_coarse)
    assert h[0].n_intervals == n
    for finer, coarser, m in zip(h.levels, h.levels[1:], factors, strict=False):
        assert np.array_equal(coarser.points, finer.c_points)
        assert coarser.n_intervals == finer.n_intervals // m >= min_coarse
        assert finer.points[0] == 0 and finer.is_c[0]


def test_max_levels_with_one_cfactor_is_the_deepest_buildable():
    for n, m in [(64, 2), (100, 3), (7, 2), (1000, 8)]:
        L = max_levels(n, m, min_coarse=2)
        build_hierarchy(n, (m,) * (L - 1), 2)
        with pytest.raises(ValueError, match="`levels`"):
            build_hierarchy(n, (m,) * L, 2)


def test_too_short_grid_names_levels_and_sizes():
    with pytest.raises(ValueError, match=r"`levels`=4 .*n_steps=20.*min_coarse=2"):
        build_hierarchy(20, (4, 4, 4), min_coarse=2)


# -- layout -------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 300), m=st.integers(2, 5), levels=st.integers(1, 4), p=st.integers(1, 9))
def test_partition_blocks_start_at_coarsest_points_and_are_balanced(n, m, levels, p):
    L = min(levels, max_levels(n, m, 1))
    h = build_hierarchy(n, (m,) * (L - 1), 1)
    K = h.coarsest.n_intervals
    if p > K:
        with pytest.raises(ValueError, match="ranks exceed the"):
            partition(h.coarsest.points, n, p)
        return
    lay = partition(h.coarsest.points, n, p)
    check_layout(lay, h.coarsest.points, n)
    covered = np.concatenate([np.arange(*lay.bounds(b)) for b in range(p)])
    assert np.array_equal(covered, np.arange(n + 1))  # contiguous cover of 0..N
    points_per_block = np.diff(np.searchsorted(h.coarsest.points, [*lay.starts, n + 1]))
    intervals = points_per_block - (np.arange(p) == p - 1)  # the last block also holds c_K
    assert intervals.sum() == K and intervals.max() - intervals.min() <= 1
    for lvl in h:  # every block of every level starts with a C-point
        for b in range(p):
            sl = lay.positions(lvl.points, b)
            assert sl.stop > sl.start and lvl.is_c[sl.start]


def test_layout_api_and_errors():
    lay = Layout(10, (0, 4, 8))
    assert lay.n_blocks == 3 and lay.bounds(2) == (8, 11)
    assert [lay.owner(s) for s in (0, 3, 4, 10)] == [0, 0, 1, 2]
    assert list(lay.fine_indices(1, "backward")) == [6, 5, 4, 3]
    with pytest.raises(ValueError, match="`starts`"):
        Layout(10, (0, 5, 5))
    with pytest.raises(ValueError, match="coarsest"):
        check_layout(Layout(10, (0, 3)), [0, 4, 8], 10)
    with pytest.raises(ValueError, match="`n_blocks`"):
        partition([0, 4, 8], 10, 0)
