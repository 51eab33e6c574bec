"""Message cost on this machine: α (latency) and β (seconds per byte) from a ping-pong.

The model of one neighbour message of n bytes is ``t(n) = α + β·n`` (docs/references.md §4).
:func:`measure_messages` launches ``mpiexec -n 2 python -m mpi4py -m refbraid.scaling.messages``
and times round trips of float64 arrays through :class:`refbraid.parallel.mpi.MPIComm` — the
path MGRIT's messages take — for sizes from 8 B to 1 MiB; the one-way time is half a round
trip (the fastest of ``REPEAT`` trials: other load on a shared machine only adds time). α is
the one-way time of the smallest message, ``β = (t(n_max) − t(n_min)) / (n_max − n_min)``.
Without mpi4py or ``mpiexec`` it returns None and the caller says which default it uses.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

SIZES = (8, 1024, 65536, 1 << 20)  # bytes per message
REPEAT = 9  # trials per size (median)
TRIPS = 20  # round trips per trial
TAG = "PINGPONG "


def alpha_beta(one_way: dict[int, float]) -> tuple[float, float]:
    """(α, β) of ``t(n) = α + β·n`` through the smallest and the largest size."""
    lo, hi = min(one_way), max(one_way)
    return one_way[lo], max(one_way[hi] - one_way[lo], 0.0) / (hi - lo)


def measure_messages(timeout: float = 120.0) -> tuple[float, float] | None:
    """(α, β) measured with two MPI ranks here, or None when MPI cannot run."""
    try:
        from ..parallel.launch import run_mpi

        run = run_mpi(2, ["-m", "refbraid.scaling.messages"], timeout=timeout)
    except (ImportError, OSError, RuntimeError, ValueError):
        return None
    for line in run.output.splitlines():
        if run.ok and line.startswith(TAG):
            table = {int(k): v for k, v in json.loads(line[len(TAG):]).items()}
            return alpha_beta(table)
    return None


def _ping_pong() -> None:  # pragma: no cover - runs under mpiexec
    from ..parallel.mpi import MPIComm

    comm = MPIComm.world()
    if comm.size != 2:
        raise SystemExit("run with mpiexec -n 2")
    one_way = {}
    for n in SIZES:
        a = np.zeros(n // 8)
        trials = []
        for _ in range(REPEAT):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(TRIPS):
                if comm.rank == 0:
                    comm.send_next(a)
                    back = comm.reverted().recv_prev()
                else:
                    back = comm.recv_prev()
                    comm.reverted().send_next(back)
            trials.append((time.perf_counter() - t0) / (2 * TRIPS))
        one_way[n] = min(trials)  # the least disturbed trial: a shared machine only adds
    comm.wait_sends()
    if comm.rank == 0:
        print(TAG + json.dumps(one_way), flush=True)


if __name__ == "__main__":  # pragma: no cover
    _ping_pong()
    sys.exit(0)
