"""relax.propagate_at on NumPy arrays writes its rows into one block: the same numbers as the
list-and-stack definition, also when a step changes the dtype (the list path takes over)."""

import numpy as np
import pytest

from refbraid.mgrit.relax import propagate_at


def by_list(u, g, points, positions, step, ghost=None, ghost_point=None):
    rows = []
    for k in positions:
        if k > 0:
            val = step(u[k - 1], int(points[k - 1]), int(points[k]))
        elif int(points[0]) == 0:
            rows.append(g[0] if g is not None else np.zeros_like(u[0]))
            continue
        else:
            val = step(ghost, ghost_point, int(points[0]))
        rows.append(val + g[k] if g is not None else val)
    return np.stack(rows)


@pytest.mark.parametrize("first", [0, 8])
@pytest.mark.parametrize("forced", [True, False])
@pytest.mark.parametrize("cast_at", [None, 2])
def test_block_equals_list_and_stack(first, forced, cast_at):
    rng = np.random.default_rng(3)
    n = 6
    u = rng.standard_normal((n, 3, 2))
    g = rng.standard_normal((n, 3, 2)) if forced else None
    points = np.arange(first, first + n)
    M = rng.standard_normal((2, 2))

    def step(y, a, b):
        out = np.tanh(y @ M) * (b - a) + y
        return out.astype(np.float32) if cast_at is not None and b == first + cast_at else out

    ghost = rng.standard_normal((3, 2)) if first else None
    for positions in ([0, 2, 4], [1, 3, 5], list(range(n))):
        got = propagate_at(u, g, points, positions, step, ghost, first - 1 if first else None)
        want = by_list(u, g, points, positions, step, ghost, first - 1 if first else None)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
