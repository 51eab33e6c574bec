"""Row positions as slices: the one index helper MGRIT's sweeps and the stacked weights share.

A NumPy array indexed by a slice is a view; indexed by an integer array it is a gathered copy.
MGRIT's C-points and the rows of one batched F-sweep are evenly spaced, and so are the layers
whose weights a sweep stacks, so they can be read and written in place.
"""

from __future__ import annotations

import numpy as np


def even_slice(positions) -> slice | None:
    """``positions`` as ``slice(p_0, p_last + 1, stride)`` when they are evenly spaced and
    increasing (stride ≥ 1), else None; an empty ``positions`` is ``slice(0, 0)``.

    The check compares Python lists: on the short arrays of a sweep (tens of rows) it is a
    few µs cheaper than ``np.diff`` + ``np.all``, and the batched cycle asks once per sweep.
    """
    pos = positions.tolist() if isinstance(positions, np.ndarray) else list(positions)
    if not pos:
        return slice(0, 0)
    first, last = int(pos[0]), int(pos[-1])
    stride = int(pos[1]) - first if len(pos) > 1 else 1
    if stride < 1 or pos != list(range(first, last + 1, stride)):
        return None
    return slice(first, last + 1, stride)


def signed_even_slice(positions) -> slice | None:
    """:func:`even_slice`, also for evenly spaced *decreasing* positions (a negative stride:
    ``slice(p_0, p_last - 1, -stride)``, with stop None when that would be -1)."""
    pos = positions.tolist() if isinstance(positions, np.ndarray) else list(positions)
    if len(pos) < 2 or int(pos[1]) > int(pos[0]):
        return even_slice(pos)
    up = even_slice(pos[::-1])
    if up is None:
        return None
    first, last = int(pos[0]), int(pos[-1])
    return slice(first, last - 1 if last > 0 else None, -up.step)
