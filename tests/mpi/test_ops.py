"""Communication operators and their adjoints: the distributed dot-product test
(docs/references.md §5).

⟨A x, y⟩ = ⟨x, Aᵀ y⟩ with inner products summed over ranks, ≤ 1e-12 relative (float64), for
every operator and on the reverted communicator; plus what each forward map must deliver.
Runs on every rank under mpiexec (any number of ranks, including 1).
"""

import numpy as np
import pytest

from refbraid.parallel.mpi import sum_to_all
from refbraid.parallel.ops import (
    AllReduce,
    Broadcast,
    Gather,
    HaloExchange,
    RowExchange,
    ShiftNext,
    SumReduce,
    adjoint_mismatch,
    dot,
)

TOL = 1e-12
S = (3, 2)  # shape of one row


def rng_for(comm, salt=0):
    """Different random numbers on every rank, reproducible."""
    return np.random.default_rng(1000 * salt + comm.rank)


@pytest.fixture(params=[False, True], ids=["order", "reverted"])
def comm(world, request):
    return world.reverted() if request.param else world


def test_comm_basics(world):
    assert world.position == world.rank
    rev = world.reverted()
    assert rev.position == world.size - 1 - world.rank and rev.reverted().position == world.rank
    total = world.allreduce_sum(0.1 * (world.rank + 1))
    assert world.allgather(total) == [total] * world.size  # the same float on every rank
    assert total == pytest.approx(0.1 * world.size * (world.size + 1) / 2, rel=1e-15)
    got = world.gather(world.rank, root=0)
    assert got == (list(range(world.size)) if world.rank == 0 else None)
    with pytest.raises(ValueError, match="`root` must be a rank"):
        world.gather(1, root=world.size)


def test_sum_to_all_is_bit_identical_on_every_rank(world):
    a = rng_for(world).standard_normal(1000)
    s = sum_to_all(world.mpi, a)
    everyone = world.allgather(s)
    for other in everyone:
        np.testing.assert_array_equal(other, everyone[0])
    expected = sum(np.random.default_rng(q).standard_normal(1000) for q in range(world.size))
    np.testing.assert_allclose(s, expected, rtol=1e-12, atol=1e-12)


def test_shift_next_moves_values_forward_and_its_adjoint(comm):
    x = np.full(S, float(comm.rank + 1))
    y = ShiftNext(comm).forward(x)
    prev = comm._neighbour(-1)
    np.testing.assert_array_equal(y, np.zeros(S) if prev is None else np.full(S, prev + 1.0))
    r = rng_for(comm, 1)
    op = ShiftNext(comm)
    assert adjoint_mismatch(op, r.standard_normal(S), r.standard_normal(S)) <= TOL
    assert adjoint_mismatch(op.T, r.standard_normal(S), r.standard_normal(S)) <= TOL


def test_halo_exchange_prepends_the_ghost_and_its_adjoint_adds_it_back(comm):
    n = 2 + comm.rank % 2  # uneven blocks
    x = np.arange(n * 2, dtype=float).reshape(n, 2) + 100 * comm.rank
    op = HaloExchange(comm)
    y = op.forward(x)
    assert y.shape == (n + 1, 2)
    np.testing.assert_array_equal(y[1:], x)
    ghosts = comm.allgather((comm.position, y[0]))
    lasts = dict(comm.allgather((comm.position, x[-1])))
    for pos, ghost in ghosts:
        np.testing.assert_array_equal(ghost, np.zeros(2) if pos == 0 else lasts[pos - 1])
    r = rng_for(comm, 2)
    assert adjoint_mismatch(op, r.standard_normal((n, *S)), r.standard_normal((n + 1, *S))) <= TOL


@pytest.mark.parametrize("root_from_end", [0, 1])
def test_broadcast_and_sum_reduce_are_adjoint(world, root_from_end):
    root = max(world.size - 1 - root_from_end, 0)
    r = rng_for(world, 3)
    x = r.standard_normal(S) if world.rank == root else None
    y = r.standard_normal(S)
    b = Broadcast(world, root)
    out = b.forward(x)
    np.testing.assert_array_equal(out, world.bcast(x, root=root))
    assert adjoint_mismatch(b, x, y) <= TOL
    s = SumReduce(world, root)
    assert adjoint_mismatch(s, y, x) <= TOL
    total = s.forward(y)
    if world.rank == root:
        np.testing.assert_allclose(total, sum(world.gather(y, root=root) or []), rtol=1e-14)
    else:
        assert total is None
        world.gather(y, root=root)


def test_allreduce_is_self_adjoint(world):
    r = rng_for(world, 4)
    op = AllReduce(world)
    assert adjoint_mismatch(op, r.standard_normal(S), r.standard_normal(S)) <= TOL
    everyone = world.allgather(op.forward(np.full(S, 1.0)))
    for v in everyone:
        np.testing.assert_array_equal(v, np.full(S, float(world.size)))


def test_gather_and_scatter_are_adjoint(world):
    n = 1 + world.rank  # uneven blocks
    op = Gather(world, rows=n, root=0)
    total = world.size * (world.size + 1) // 2
    r = rng_for(world, 5)
    x = r.standard_normal((n, *S))
    y = r.standard_normal((total, *S)) if world.rank == 0 else None
    assert adjoint_mismatch(op, x, y) <= TOL
    full = op.forward(x)
    if world.rank == 0:
        assert full.shape == (total, *S)
    back = op.adjoint(full)
    np.testing.assert_array_equal(back, x)  # scatter ∘ gather = identity
    with pytest.raises(ValueError, match="rows on rank"):
        op.forward(np.zeros((n + 1, *S)))


def test_row_exchange_fetches_rows_and_adds_halos_back(world):
    P, per = world.size, 4
    owned = list(range(per * world.rank, per * (world.rank + 1)))
    r = np.random.default_rng(7)  # the same plan on every rank ...
    needs = [sorted(r.choice(per * P, size=3, replace=False).tolist()) for _ in range(P)]
    op = RowExchange(world, owned, needs[world.rank])
    rows = {i: np.full(S, float(i)) for i in owned}
    got = op.forward(rows)
    assert sorted(got) == needs[world.rank]
    for i, v in got.items():
        np.testing.assert_array_equal(v, np.full(S, float(i)))
    back = op.adjoint({i: np.ones(S) for i in needs[world.rank]})
    for i, v in back.items():  # row i comes back once per rank that needed it
        assert i in owned
        np.testing.assert_array_equal(v, np.full(S, float(sum(i in nd for nd in needs))))
    rr = rng_for(world, 6)  # ... and random values for the dot-product test
    x = {i: rr.standard_normal(S) for i in owned}
    y = {i: rr.standard_normal(S) for i in needs[world.rank]}
    assert adjoint_mismatch(op, x, y) <= TOL


def test_row_exchange_rejects_bad_plans_on_every_rank(world):
    with pytest.raises(ValueError, match="owned by no rank"):
        RowExchange(world, [world.rank], [world.size + 5])
    if world.size > 1:
        with pytest.raises(ValueError, match="exactly one owner"):
            RowExchange(world, [0], [])
    with pytest.raises(ValueError, match="non-negative integer"):
        RowExchange(world, [-1], [])


def test_dot_sums_over_ranks(world):
    v = np.ones(4)
    assert dot(world, v, v) == 4.0 * world.size
    assert dot(world, {1: v}, {1: v, 2: v}) == 4.0 * world.size
    assert dot(world, None, v) == 0.0
