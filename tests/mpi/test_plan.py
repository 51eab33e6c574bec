"""Who owns which layer, state and adjoint (BlockPlan): pure bookkeeping, checked by brute force.

Oracle: run the serial MGRIT solves with step functions that record which (start, stop) pairs
each block's owner would compute; the plan's row lists must cover exactly those.
"""

import numpy as np
import pytest

from refbraid.distributed.engine import shard_sizes
from refbraid.distributed.ownership import BlockPlan, Rows
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.mgrit import MGRITSettings, Problem, solve

CASES = [
    (64, LayerParallelSettings(), 4),
    (70, LayerParallelSettings(), 3),  # 70 is not a multiple of 16: no mirrored layout
    (48, LayerParallelSettings.with_iterations(2, 1, levels=2, cfactor=3), 4),
    (9, LayerParallelSettings.exact(), 3),
]


def _steps_by_rank(n_layers, settings, layout, direction, n_ranks):
    """(start, stop) fine-index pairs computed by each rank, found by running the solve."""
    seen = []

    def step(u, start, stop):
        seen.append((start, stop))
        return u

    u0 = np.zeros(1)
    solve(Problem(step, u0, n_layers, direction=direction), settings)
    out = {q: set() for q in range(n_ranks)}
    for start, stop in seen:
        s = start if direction == "forward" else n_layers - start  # made where it starts
        pos = layout.owner(s)
        out[pos if direction == "forward" else n_ranks - 1 - pos].add((start, stop))
    return out


@pytest.mark.parametrize("n_layers,settings,n_ranks", CASES)
def test_plan_rows_cover_every_step_the_solves_make(n_layers, settings, n_ranks):
    plan = BlockPlan.build(n_layers, settings, n_ranks)
    fwd = _steps_by_rank(n_layers, settings.forward, plan.forward_layout, "forward", n_ranks)
    bwd = _steps_by_rank(n_layers, settings.backward, plan.backward_layout, "backward", n_ranks)
    layers = [plan.owned_layers(q) for q in range(n_ranks)]
    assert np.array_equal(np.concatenate(layers), np.arange(n_layers))  # a partition
    ys = np.sort(np.concatenate([plan.forward_points(q) for q in range(n_ranks)]))
    lams = np.sort(np.concatenate([plan.backward_points(q) for q in range(n_ranks)]))
    assert np.array_equal(ys, np.arange(n_layers + 1))
    assert np.array_equal(lams, np.arange(n_layers + 1))
    for q in range(n_ranks):
        assert {a for a, _ in fwd[q]} <= set(plan.forward_weight_rows(q))
        assert {b for _, b in bwd[q]} <= set(plan.backward_rows(q))
    assert 0 in plan.backward_points(0)  # λ[0] for the opening layer on rank 0
    assert n_layers in plan.forward_points(n_ranks - 1)  # y[N] for the closing on the last


def test_mirrored_layout_needs_no_row_from_another_rank():
    """Every step is made by the rank that owns its start point, so with mirrored blocks each
    rank applies its own layers only, forward and adjoint: no ghost weight, no state fetched,
    no gradient row sent home."""
    plan = BlockPlan.build(64, LayerParallelSettings(), 4)
    assert plan.mirrored
    for q in range(4):
        b = plan.forward_points(q)
        lam = plan.backward_points(q)
        expect = np.arange(b[0] + 1 if q else 0, b[-1] + 2 if q < 3 else 65)
        assert np.array_equal(lam, expect)  # λ owned on (b_q, b_{q+1}]
        own = set(plan.owned_layers(q))
        assert set(plan.backward_rows(q)) == own
        assert set(plan.forward_weight_rows(q)) == own
        assert set(plan.gradient_rows(q)) == own
    assert all(row.split()[-3:] == ["0", "0", "0"] for row in plan.table().splitlines()[1:])
    assert not BlockPlan.build(70, LayerParallelSettings(), 3).mirrored


def test_plan_errors_name_the_problem():
    with pytest.raises(ValueError, match="layer-parallel over 2 ranks with 16 layers"):
        BlockPlan.build(16, LayerParallelSettings(), 2)  # one coarsest interval
    with pytest.raises(TypeError, match="`settings` must be a LayerParallelSettings"):
        BlockPlan.build(16, MGRITSettings(), 1)
    with pytest.raises(ValueError, match="`rank` must be in"):
        BlockPlan.build(64, LayerParallelSettings(), 2).owned_layers(2)
    with pytest.raises(KeyError, match="rank 1 holds no row 5 of steps.W"):
        Rows("steps.W", 1, {7: np.zeros(2)})[5]


def test_shard_sizes_split_the_batch():
    assert shard_sizes(10, 3) == [4, 3, 3] and sum(shard_sizes(64, 4)) == 64
    with pytest.raises(ValueError, match="batch of 2 samples cannot be split over 3"):
        shard_sizes(2, 3)


def test_table_lists_every_rank():
    text = BlockPlan.build(64, LayerParallelSettings(), 2).table()
    assert len(text.splitlines()) == 3 and "0..31" in text and "32..63" in text
