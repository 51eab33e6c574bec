"""Device arrays in MPI messages, on the CPU: the staged route with the strict stand-in.

The strict backend's arrays (array-api-strict on a non-default device; see
refbraid.backends.strict_device) refuse every implicit host conversion and pickling inside
``forbid_host_conversions()``, so a message that reached MPI any other way than through
``to_host`` and a host buffer fails here. Oracle: the same values as NumPy arrays, and the
serial MGRIT solve of the same problem on NumPy.
"""

import numpy as np
import pytest

pytest.importorskip("array_api_strict")

from refbraid.backends import get_backend
from refbraid.backends.host import to_host
from refbraid.backends.strict_device import DEVICE, forbid_host_conversions
from refbraid.mgrit import MGRITSettings, Problem, gather_solution, solve
from refbraid.parallel.mpi import MPIComm

BK = get_backend("strict")


@pytest.fixture
def device_world(world):
    """The world communicator, able to bring staged arrays back onto the strict device."""
    return MPIComm(world.mpi, to_device=BK.asarray)


def _value(rank: int) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal((3, 4))


def test_neighbour_messages_are_staged_and_arrive_on_the_device(device_world):
    for comm in (device_world, device_world.reverted()):
        with forbid_host_conversions():
            comm.send_next(BK.asarray(_value(comm.position)))
            got = comm.recv_prev()
        if comm.position == 0:
            assert got is None
        else:
            assert got.device == DEVICE
            np.testing.assert_array_equal(to_host(got), _value(comm.position - 1))
        comm.wait_sends()


def test_a_communicator_without_to_device_refuses_device_arrays(world):
    with pytest.raises(TypeError, match="to_device"):
        world.send_next(BK.asarray(np.ones(2)))


def test_reductions_and_collectives_stage_device_arrays(device_world):
    w = device_world
    with forbid_host_conversions():
        total = w.sum_to_all(BK.asarray(_value(w.rank)))
        root_value = w.bcast(BK.asarray(_value(0)) if w.rank == 0 else None, root=0)
        rows = w.gather({"row": BK.asarray(_value(w.rank)), "rank": w.rank}, root=0)
    want = sum(_value(r) for r in range(w.size))
    assert total.device == DEVICE and root_value.device == DEVICE
    np.testing.assert_allclose(to_host(total), want, rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(to_host(root_value), _value(0))
    if w.rank == 0:
        for r, entry in enumerate(rows):
            assert entry["rank"] == r and entry["row"].device == DEVICE
            np.testing.assert_array_equal(to_host(entry["row"]), _value(r))


def _problem(bk, n_steps=23):
    """u[i] = u[i-1] + h tanh(u[i-1] Wᵀ): a small nonlinear ODE on the backend's arrays."""
    rng = np.random.default_rng(1)
    W = bk.asarray(rng.standard_normal((3, 3)) / 2)
    xp, h = bk.xp, 1.0 / n_steps

    def step(u, start, stop):
        return u + (stop - start) * h * xp.tanh(u @ W.T)

    return Problem(step, bk.asarray(rng.standard_normal((2, 3))), n_steps)


def test_mgrit_on_device_arrays_across_ranks_equals_the_serial_numpy_solve(device_world):
    settings = MGRITSettings(levels=3, cfactor=2, abs_tol=None, max_iter=3, min_coarse=1)
    serial = solve(_problem(get_backend("numpy")), settings)
    with forbid_host_conversions():
        res = solve(_problem(BK), settings, comm=device_world)
        full = gather_solution(res, device_world)
    np.testing.assert_allclose(res.norms, serial.norms, rtol=1e-12, atol=1e-300)
    if device_world.rank == 0:
        np.testing.assert_allclose(to_host(full), serial.solution, rtol=1e-13, atol=1e-15)


def test_alltoall_scatter_and_allgather_stage_device_arrays(device_world):
    w = device_world
    with forbid_host_conversions():
        got = w.alltoall([BK.asarray(_value(10 * w.rank + q)) for q in range(w.size)])
        part = w.scatter([BK.asarray(_value(q)) for q in range(w.size)] if w.rank == 0
                         else None, root=0)
        every = w.allgather(BK.asarray(_value(w.rank)))
    for q, a in enumerate(got):
        np.testing.assert_array_equal(to_host(a), _value(10 * q + w.rank))
    np.testing.assert_array_equal(to_host(part), _value(w.rank))
    for q, a in enumerate(every):
        assert a.device == DEVICE
        np.testing.assert_array_equal(to_host(a), _value(q))
