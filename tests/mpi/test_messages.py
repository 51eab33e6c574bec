"""Neighbour messages of :class:`~refbraid.parallel.mpi.MPIComm`: what is sent arrives unchanged.

Arrays travel as raw bytes behind a header (shape, dtype), everything else pickled
(refbraid/parallel/mpi.py, module docstring). Oracle: the value the sender built, rebuilt on
the receiver from the same seed — same dtype, same shape, the same bytes (NaN payloads and
-0.0 included). Runs on every rank under mpiexec; with one rank only the encoding is checked.
"""

import numpy as np
import pytest

from refbraid.parallel.codec import decode_message, encode_message, travels_raw


def arrays(seed: int) -> list[np.ndarray]:
    """Arrays of many dtypes, shapes and layouts; the same list for the same seed."""
    rng = np.random.default_rng(seed)
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 5e-324, seed])
    special[0] = np.frombuffer(np.uint64(0x7FF800000000BEEF).tobytes(), np.float64)[0]
    return [
        rng.standard_normal((64, 32)),  # an MGRIT state of the dense benchmark
        np.array(rng.standard_normal()),  # 0-d
        np.zeros((0,)),
        np.zeros((3, 0, 2), np.int32),  # empty, with shape
        special,  # NaN with a payload, -0.0, ±inf, a subnormal
        rng.standard_normal((5, 4)).T,  # not C-contiguous
        rng.standard_normal((6, 8))[::2, 1::3],  # strided view
        rng.standard_normal(7).astype(np.float32),
        rng.standard_normal(5).astype(np.float16),
        rng.standard_normal(3) + 1j * rng.standard_normal(3),
        (rng.standard_normal(4) + 1j).astype(np.complex64),
        rng.integers(-128, 127, (2, 3), dtype=np.int8),
        rng.integers(0, 2**16, 9, dtype=np.uint16),
        rng.integers(-(2**62), 2**62, (2, 1, 2), dtype=np.int64),
        rng.random(11) < 0.5,  # bool
        np.arange(6, dtype=">f8").reshape(2, 3),  # big-endian
        rng.standard_normal((2,) * 7),
        rng.standard_normal(40_000),  # 320 kB: past MPICH's eager limit (rendezvous)
    ]


def others(seed: int) -> list:
    """Values that are not numeric arrays: they travel pickled."""
    return [None, {"rank": seed, "rows": [1, 2]}, (seed, np.arange(3)), "text", 3.5,
            np.float64(seed), np.array(["a", "bc"]), np.array([1, None], dtype=object)]


def assert_same(got, want, what: str) -> None:
    assert type(got) is type(want), f"{what}: {type(got)} != {type(want)}"
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"{what}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
        if travels_raw(want):
            assert got.tobytes() == want.tobytes(), f"{what}: the bytes differ"
            if want.dtype.isnative:  # NumPy's own dtype object: backends test `dtype is`
                assert got.dtype is np.dtype(want.dtype.type), f"{what}: a copy of the dtype"
        else:
            assert got.tolist() == want.tolist(), f"{what}: {got!r} != {want!r}"
    elif isinstance(want, tuple):
        assert got[0] == want[0] and np.array_equal(got[1], want[1]), what
    else:
        assert got == want, f"{what}: {got!r} != {want!r}"


def test_numeric_arrays_travel_raw_and_the_rest_pickled():
    assert all(travels_raw(a) for a in arrays(0))
    assert not any(travels_raw(v) for v in others(0))
    assert not travels_raw(np.ma.masked_array([1.0]))  # subclasses pickle (they carry a mask)


@pytest.mark.parametrize("kind", ["arrays", "others"])
def test_encoding_round_trips(kind):
    for i, v in enumerate((arrays if kind == "arrays" else others)(7)):
        buf = encode_message(v)
        assert buf.dtype == np.uint8 and buf.ndim == 1
        assert_same(decode_message(buf), v, f"{kind}[{i}]")
    a = arrays(7)[0]
    head = encode_message(a).nbytes - a.nbytes
    assert head % 16 == 0 and head <= 64, f"header of a 2-d array: {head} bytes"


def test_decoding_refuses_a_foreign_buffer():
    with pytest.raises(ValueError, match="not a neighbour message"):
        decode_message(np.zeros(32, np.uint8))


@pytest.fixture(params=[False, True], ids=["order", "reverted"])
def comm(world, request):
    return world.reverted() if request.param else world


def test_values_arrive_unchanged(comm):
    """Every rank sends the whole catalogue on; the next one rebuilds it from the seed."""
    sent = [*arrays(comm.position), *others(comm.position)]
    for v in sent:
        comm.send_next(v)
    if comm.position == 0:
        assert comm.recv_prev() is None
    else:
        for i, want in enumerate([*arrays(comm.position - 1), *others(comm.position - 1)]):
            assert_same(comm.recv_prev(), want, f"message {i} from position "
                                                f"{comm.position - 1}")
    comm.wait_sends()


def test_the_sender_may_overwrite_its_array_after_send_next(comm):
    a = np.full((4, 5), float(comm.position))
    comm.send_next(a)
    a[...] = -1.0  # the message holds its own copy
    got = comm.recv_prev()
    if comm.position > 0:
        np.testing.assert_array_equal(got, np.full((4, 5), float(comm.position - 1)))
    comm.wait_sends()


def test_many_messages_in_flight_keep_their_order(world):
    """300 messages of mixed kinds and sizes are sent before any is received."""
    def message(k, position):
        if k % 5 == 0:
            return None
        if k % 7 == 0:
            return {"k": k, "from": position}
        return np.full(1 + (k * 37) % 3000, k + 0.5 + position)  # 8 B … 24 kB

    for k in range(300):
        world.send_next(message(k, world.position))
    if world.position > 0:
        for k in range(300):
            assert_same(world.recv_prev(), message(k, world.position - 1), f"message {k}")
    world.wait_sends()
    assert not world._pending


def test_sends_outlive_a_dropped_reverted_view(world):
    """The adjoint solve sends on a ``reverted()`` view that is dropped when it returns; its
    unreceived sends (rendezvous-sized here) must still deliver what was sent. (Before the
    pending list was shared for good, the view's requests died with it and the receiver read
    freed memory: MPICH's process_vm_readv failed with EFAULT.)"""
    import gc

    for trial in range(3):
        back = world.reverted()
        for k in range(3):
            back.send_next(np.full(300_000, 100.0 * trial + k + back.position))
        del back
        gc.collect()
        junk = [np.full(300_000, -1.0) for _ in range(3)]  # reuse the freed memory, if any
        world.barrier()  # nothing is received before every view is gone
        back = world.reverted()
        for k in range(3):
            got = back.recv_prev()
            if back.position > 0:
                np.testing.assert_array_equal(got, 100.0 * trial + k + back.position - 1,
                                              err_msg=f"trial {trial}, message {k}")
        del junk
    world.wait_sends()


def test_counters_count_messages_and_bytes_on_the_wire(world):
    before = dict(world.counters)
    sent = [arrays(world.position)[0], None, {"a": 1}]
    for v in sent:
        world.send_next(v)
    got = [world.recv_prev() for _ in sent] if world.position > 0 else []
    world.wait_sends()
    delta = {k: world.counters[k] - before[k] for k in ("sends", "recvs", "bytes_sent",
                                                         "bytes_recv")}
    last = world.position == world.size - 1
    wire = sum(encode_message(v).nbytes for v in sent)
    assert delta["sends"] == (0 if last else 3)
    assert delta["bytes_sent"] == (0 if last else wire)
    assert delta["recvs"] == len(got)
    everyone = world.allgather(delta)
    if world.position > 0:  # what the previous rank sent, byte for byte
        assert delta["bytes_recv"] == everyone[world.position - 1]["bytes_sent"]
    assert world.reverted().counters is world.counters


def test_reverted_views_share_the_pending_sends(world):
    back = world.reverted()
    for _ in range(3):
        back.send_next(np.zeros(50_000))  # rendezvous: pending until received
    assert back._pending is world._pending
    for _ in range(3):
        got = back.recv_prev()
        assert back.position == 0 or got.shape == (50_000,)
    world.wait_sends()  # completes the reverted view's sends too
    assert not back._pending


@pytest.mark.parametrize("root", ["first", "last"])
def test_bcast_delivers_the_roots_value_unchanged(world, root):
    """Arrays go as raw bytes (after their dtype and shape), the rest pickled; root gets a copy."""
    root = 0 if root == "first" else world.size - 1
    for i, want in enumerate([*arrays(root), *others(root)]):
        mine = want if world.rank == root else None
        got = world.bcast(mine, root=root)
        assert_same(got, want, f"bcast of value {i} from rank {root}")
        if world.rank == root and isinstance(mine, np.ndarray):
            assert not np.shares_memory(got, mine), f"value {i}: root got its own array back"
