"""How suite ``step`` times a training step on P ranks (benchmarks/step.py's worker).

* :func:`ping_pong`: α and β of one message, ``t(n) = α + β·n``, three ways of sending;
* :func:`interleaved`: pairs of a serial step (each rank's core in turn, the others asleep:
  the mean of the P) and a P-rank step, back to back in alternating order;
* :func:`breakdown`: where each rank's step time goes under an execution trace
  (:mod:`refbraid.parallel.trace`): step applications, waits, sends, the rest; each traced
  step paired with a serial one, shares as paired medians.
"""

from __future__ import annotations

import numpy as np

VARIANTS = ("pickled", "buffers", "MPIComm")
#: the rows of ``breakdown=True``, per rank (:func:`breakdown`): ms per step ...
BREAKDOWN = ("wall", "Φ fine fwd", "Φ fine adj", "Φ coarse fwd", "Φ coarse adj", "waits",
             "sends", "other")
#: ... and the shares of the serial step (paired medians) of these parts
SHARES = ("Φ", "waits", "other", "wall")


def _round_trips(world, variant: str, a: np.ndarray, trips: int) -> None:
    """``trips`` round trips of ``a`` between ranks 0 and 1, sent the ``variant`` way."""
    from refbraid.parallel.mpi import MPIComm

    rank = world.Get_rank()
    if rank > 1:
        return
    other = 1 - rank
    if variant == "pickled":
        for _ in range(trips):
            if rank == 0:
                req = world.isend(a, dest=other)
                world.recv(source=other)
                req.wait()
            else:
                world.isend(world.recv(source=other), dest=other).wait()
    elif variant == "buffers":
        b = np.empty_like(a)
        for _ in range(trips):
            if rank == 0:
                world.Send(a, dest=other)
                world.Recv(b, source=other)
            else:
                world.Recv(b, source=other)
                world.Send(b, dest=other)
    else:
        there = MPIComm(world)  # rank 0 → rank 1
        back = there.reverted()  # rank 1 → rank 0
        for _ in range(trips):
            if rank == 0:
                there.send_next(a)
                back.recv_prev()
            else:
                back.send_next(there.recv_prev())
        there.wait_sends()
        back.wait_sends()


def ping_pong(world, sizes=(8, 1 << 20), repeat: int = 5) -> dict[str, tuple[float, float]]:
    """(α, β) per way of sending (:data:`VARIANTS`), the same on every rank: one-way time,
    half a round trip; each trial times every way in turn (same load), medians of trials."""
    import statistics
    import time

    from refbraid.scaling.messages import alpha_beta

    times: dict[str, dict[int, list[float]]] = {v: {} for v in VARIANTS}
    for n in sizes:
        a = np.random.default_rng(0).standard_normal(max(1, n // 8))
        trips = int(min(400, max(4, (8 << 20) // max(n, 1))))
        for v in VARIANTS:
            _round_trips(world, v, a, 1)  # warm-up: connections, allocations
        for _ in range(repeat):
            for v in VARIANTS:
                world.Barrier()
                t0 = time.perf_counter()
                _round_trips(world, v, a, trips)
                times[v].setdefault(n, []).append((time.perf_counter() - t0) / (2 * trips))
    fits = {v: alpha_beta({n: statistics.median(t) for n, t in by_n.items()})
            for v, by_n in times.items()}
    return world.bcast(fits, root=0)


# ----------------------------------------------------------------------------- the worker


def _idle_barrier(world) -> None:
    """A barrier that sleeps while it waits (MPICH's blocking calls spin on a core)."""
    import time

    req = world.Ibarrier()
    while not req.Test():
        time.sleep(5e-4)


def _serial_once(world, serial) -> float:
    """Seconds of one ``serial()``, the mean over the ranks' cores: each rank in turn runs it
    while the others sleep in a barrier (every rank gets the number). A P-rank step runs on
    all P cores, a serial one on whichever core it is given; where the cores' speeds differ
    by tens of per cent from moment to moment (a shared machine), the mean is the serial
    step's expected time, and rank 0's core alone would make the ratio follow that core."""
    import time

    times = []
    for q in range(world.Get_size()):
        _idle_barrier(world)
        t = 0.0
        if world.Get_rank() == q:
            t0 = time.perf_counter()
            serial()
            t = time.perf_counter() - t0
        times.append(world.bcast(t, root=q))
    _idle_barrier(world)
    return float(np.mean(times))


def interleaved(world, serial, parallel, rounds: int) -> list[tuple[float, float]]:
    """``rounds`` pairs (serial seconds, P-rank seconds), the two measured back to back in
    alternating order: serial on each rank's core in turn while the others sleep in a
    barrier (:func:`_serial_once`), then the P-rank step (slowest rank). A pair shares the
    machine's state of the moment, so the pair's ratio is steadier than a ratio of medians
    taken minutes apart."""
    import time

    from mpi4py import MPI

    def parallel_once() -> float:
        world.Barrier()
        t0 = time.perf_counter()
        parallel()
        return world.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    _serial_once(world, serial)  # warm-up of the serial step (the P-rank one is warm)
    pairs = []
    for k in range(rounds):
        if k % 2:
            s = _serial_once(world, serial)
            pairs.append((s, parallel_once()))
        else:
            p = parallel_once()
            pairs.append((_serial_once(world, serial), p))
    return pairs


def _traced_parts(world, step) -> dict[str, float]:
    """One ``step()`` under an execution trace: this rank's seconds by kind (module
    docstring), ``wall`` and ``other`` (wall minus the traced parts)."""
    import time
    from collections import defaultdict

    from refbraid.parallel.trace import Recorder, recording

    parts: dict[str, float] = defaultdict(float)
    world.Barrier()
    t0 = time.perf_counter()
    with recording(Recorder(world.Get_rank(), t0)) as rec:
        step()
    parts["wall"] = time.perf_counter() - t0
    for e in rec.trace():
        if e.kind == "step":
            kind = f"Φ {'fine' if e.level == 0 else 'coarse'} " \
                   f"{'adj' if e.start > e.stop else 'fwd'}"
        else:
            kind = "sends" if e.kind == "send" else "waits"
        parts[kind] += e.t1 - e.t0
    parts["other"] = parts["wall"] - sum(v for k, v in parts.items() if k != "wall")
    return parts


def breakdown(world, step, repeat: int, serial=None) -> dict[str, float]:
    """This rank's seconds per ``step()`` under an execution trace, the mean of ``repeat``:
    ``wall``, step applications by kind (``Φ fine fwd`` …), ``waits`` (receives and
    collectives), ``sends`` and ``other`` (the rest; module docstring). With ``serial``, each
    traced step is paired with one serial step (:func:`_serial_once`; back to back,
    alternating order) and ``"<part> ÷ serial"`` is the median over the pairs of that part's
    share of the serial step, for the parts of :data:`SHARES` (``Φ``: every step
    application)."""
    reps, serial_s = [], []
    if serial is not None:
        _serial_once(world, serial)  # its warm-up
    for i in range(repeat):
        if serial is not None and i % 2 == 0:
            serial_s.append(_serial_once(world, serial))
        reps.append(_traced_parts(world, step))
        if serial is not None and i % 2 == 1:
            serial_s.append(_serial_once(world, serial))
    kinds = sorted({k for r in reps for k in r})
    out = {k: float(np.mean([r.get(k, 0.0) for r in reps])) for k in kinds}
    for share in SHARES if serial_s else ():
        ratios = [sum(v for k, v in r.items() if k.split()[0] == share) / s
                  for r, s in zip(reps, serial_s, strict=True)]
        out[f"{share} ÷ serial"] = float(np.median(ratios))
    return out
