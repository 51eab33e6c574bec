"""``Σ r²`` of a NumPy array in one pass, with the bits of NumPy's ``numpy.sum(r * r)``.

MGRIT's residual norms are ``(Σ_ranks Σ r²)^½`` over blocks of states (20 MB for a rank's
C-points of the conv network in float32). ``numpy.sum(r * r)`` reads ``r``, writes the
squares to a temporary as large as ``r`` and reads them again: three passes. This kernel
squares on the fly and adds in NumPy's order, so it reads ``r`` once and returns the same
float. NumPy sums a contiguous float array *pairwise* (``pairwise_sum`` in NumPy's
``loops_utils.h.src``)::

    S(a, n) = a_0 + … + a_{n−1} (left to right, from 0)         n < 8
            = ((r_0 + r_1) + (r_2 + r_3)) + ((r_4 + r_5) + (r_6 + r_7)) + a_m + … + a_{n−1}
              with r_j = a_j + a_{j+8} + a_{j+16} + …  (j < 8, up to m = n − n mod 8)   n ≤ 128
            = S(a[:k], k) + S(a[k:], n − k),  k = n/2 rounded down to a multiple of 8   else

each square rounded to the array's dtype before it is added (as ``r * r`` rounds it), all in
that dtype. tests/test_numba_sums.py compares the bits with ``numpy.sum(r * r)`` over many
shapes and scales (NumPy 2.4; NumPy 2.0 sums an array of more than 8,192 values as pairwise
sums of 8,192-value chunks added one after another — other bits, measured — and the solver's
norms are this kernel's on either); anything but a C-contiguous float32/float64 NumPy array takes
``numpy.sum(r * r)`` itself. Measured (one thread, 32 × 156,800 values, load 2.2): 4.5 → 3.5
ms in float32, 11.9 → 4.2 ms in float64 on a warm cache; more where ``r`` comes from memory.

A block of rows (MGRIT's residual, formed row by row by its sweep) can have most of its sum
formed while each row is still in cache: the tree is fixed by the block's length, so
:func:`collect_row` computes, from one row, the sums of the tree's subtrees that lie inside
that row (at most two per level); :func:`sum_of_squares_with_rows` walks the same tree, takes
those sums where it meets them and reads only the leaves that cross a row's edge: the same
float, without a second pass over the block.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .numba_cpu import native_floats

#: NumPy's block below which the pairwise sum runs eight accumulators (PW_BLOCKSIZE).
BLOCK = 128


@njit(cache=True)
def _pairwise_squares(a, lo, n):
    """S(a[lo:lo+n]²) as NumPy's pairwise_sum forms it (module docstring)."""
    if n < 8:
        res = a.dtype.type(0)
        for i in range(lo, lo + n):
            res += a[i] * a[i]
        return res
    if n <= BLOCK:
        r0, r1 = a[lo] * a[lo], a[lo + 1] * a[lo + 1]
        r2, r3 = a[lo + 2] * a[lo + 2], a[lo + 3] * a[lo + 3]
        r4, r5 = a[lo + 4] * a[lo + 4], a[lo + 5] * a[lo + 5]
        r6, r7 = a[lo + 6] * a[lo + 6], a[lo + 7] * a[lo + 7]
        m = lo + n - n % 8
        i = lo + 8
        while i < m:
            r0 += a[i] * a[i]
            r1 += a[i + 1] * a[i + 1]
            r2 += a[i + 2] * a[i + 2]
            r3 += a[i + 3] * a[i + 3]
            r4 += a[i + 4] * a[i + 4]
            r5 += a[i + 5] * a[i + 5]
            r6 += a[i + 6] * a[i + 6]
            r7 += a[i + 7] * a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < lo + n:
            res += a[i] * a[i]
            i += 1
        return res
    k = n // 2
    k -= k % 8
    return _pairwise_squares(a, lo, k) + _pairwise_squares(a, lo + k, n - k)


#: room for a row's maximal subtrees: at most two per level of a tree of depth ≤ 31
MAX_NODES = 64


@njit(cache=True)
def _collect(a_row, row_lo, row, lo, n, node_lo, node_val, count):
    """The subtrees of S(a[lo:lo+n]) that lie inside the row ``[row_lo, row_lo + row)`` and
    whose parent does not: their starts and sums (from ``a_row``, the row's values), appended
    at ``count``; returns the new count. A leaf (≤ 128 values) across a row's edge is left
    for the block's walk to read."""
    hi = lo + n
    if hi <= row_lo or lo >= row_lo + row:
        return count
    if lo >= row_lo and hi <= row_lo + row:
        node_lo[count] = lo
        node_val[count] = _pairwise_squares(a_row, lo - row_lo, n)
        return count + 1
    if n <= BLOCK:
        return count
    k = n // 2
    k -= k % 8
    count = _collect(a_row, row_lo, row, lo, k, node_lo, node_val, count)
    return _collect(a_row, row_lo, row, lo + k, n - k, node_lo, node_val, count)


@njit(cache=True)
def _walk(a, lo, n, row, node_lo, node_val, counts):
    """S(a[lo:lo+n]²), a subtree inside a row j with ``counts[j] > 0`` read from that row's
    collected sums (the walk meets the same subtrees the row's collection kept)."""
    j = lo // row
    if counts[j] > 0 and lo + n <= (j + 1) * row:
        for i in range(counts[j]):
            if node_lo[j, i] == lo:
                return node_val[j, i]
    if n <= BLOCK:
        return _pairwise_squares(a, lo, n)
    k = n // 2
    k -= k % 8
    return (_walk(a, lo, k, row, node_lo, node_val, counts)
            + _walk(a, lo + k, n - k, row, node_lo, node_val, counts))


def collect_row(row, j: int, rows: int, node_lo, node_val) -> int:
    """Row ``j`` of a block of ``rows`` rows like ``row``: the sums of the subtrees of the
    block's pairwise tree that lie inside it, written into ``node_lo`` / ``node_val`` (length
    :data:`MAX_NODES`, the block's dtype); returns how many (0: a row the kernel does not
    take, then the block's sum reads it)."""
    if not (native_floats(row) and row.flags.c_contiguous and row.size):
        return 0
    flat = row.reshape(-1)
    return _collect(flat, j * flat.size, flat.size, 0, rows * flat.size, node_lo, node_val, 0)


def sum_of_squares_with_rows(r, node_lo, node_val, counts) -> float:
    """:func:`sum_of_squares` of the block ``r``, the subtrees inside row j taken from
    :func:`collect_row`'s sums of that row (``node_lo[j]``, ``node_val[j]``, ``counts[j]``):
    the same float, reading only what no row collected."""
    if native_floats(r) and r.flags.c_contiguous and r.size and r.shape[0]:
        flat = r.reshape(-1)
        total = _walk(flat, 0, flat.size, flat.size // r.shape[0], node_lo, node_val, counts)
        return float(flat.dtype.type(0) + total)
    return float(np.sum(r * r))


def sum_of_squares(r) -> float:
    """``float(numpy.sum(r * r))`` of a real NumPy array, in one pass where it can (module
    docstring): the same float."""
    if native_floats(r) and r.flags.c_contiguous and r.size:
        flat = r.reshape(-1)
        return float(flat.dtype.type(0) + _pairwise_squares(flat, 0, flat.size))
    return float(np.sum(r * r))
