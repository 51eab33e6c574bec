"""An opt-in execution trace: what every rank did, when, and what it waited for.

A trace is a list of :class:`Event` records, each a plain tuple of numbers and short strings
(picklable, so MPI can gather the ranks' traces to rank 0 and :meth:`Trace.merge` them)::

    kind        fields set                             meaning
    'step'      level, start, stop                     one step application Φ on ``level``
                                                       from fine index ``start`` to ``stop``;
                                                       ``start > stop``: an adjoint step
    'send'      peer, nbytes, seq                      a neighbour message handed to ``peer``
    'recv'      peer, nbytes, seq                      a message from ``peer``; ``t1 - t0`` is
                                                       the time spent waiting for it
    'allreduce' nbytes, seq                            a reduction over every rank
    'gather'    nbytes, seq                            ... and the other collectives by name
    'bcast', 'allgather', 'alltoall', 'scatter'

Every event has ``rank``, ``t0`` and ``t1`` (seconds since the recorder's origin). Messages
between a pair of ranks are matched by ``seq``: the k-th send from a to b is the k-th receive
at b from a (MPI and the thread mailboxes keep each pair's messages in order). Collectives
are matched by ``seq`` too: every rank calls them in the same order. (``seq`` counts all of a
recorder's collectives, so this matching assumes they all run over the same ranks; a
program that also reduces over sub-communicators should record those on another recorder.)

Recording is off unless a :class:`Recorder` is active in the running thread (a
``contextvars.ContextVar``; threads do not inherit it, so each rank body activates its own)::

    with recording(Recorder(rank=comm.rank)) as rec:
        solve(problem, settings, comm=comm)
    trace = rec.trace()

Cost when off: every hook site does ONE lookup, ``rec = active_recorder()`` (a bound
``ContextVar.get``, tens of nanoseconds), and nothing else when it is ``None``.

Hook sites (the only code that knows tracing exists):

* :class:`refbraid.mgrit.problem.CountingStep` — every step application, on every level
  (``rec.step``; a batched call of k applications, ``rec.steps``: k boxes sharing its time);
* :class:`~refbraid.parallel.comm.SerialComm` and :class:`~refbraid.parallel.comm.ThreadComm`
  — neighbour messages and reductions;
* :class:`~refbraid.parallel.virtual.VirtualComm` writes the same events with virtual times.

What an MPI communicator must call (times from ``time.perf_counter()``; ``nbytes`` from
:func:`payload_bytes` of the Python object sent or received)::

    rec = active_recorder()                                 # once per method call
    send_next:       t0 = perf_counter(); req = isend(...); t1 = perf_counter()
                     if rec is not None: rec.send(dest, payload_bytes(value), t0, t1)
    recv_prev:       t0 = perf_counter(); value = recv(...); t1 = perf_counter()
                     if rec is not None: rec.recv(source, payload_bytes(value), t0, t1)
    allreduce_sum:   t0 = ...; out = ...; t1 = ...
                     if rec is not None: rec.collective("allreduce", payload_bytes(value), t0, t1)
    gather, bcast... the same with their name: rec.collective("gather", ...)

Peers are *ranks* of that communicator (not block positions). No call is made for a
neighbour that does not exist (the first block's receive, the last block's send). To merge
the ranks' traces on one time axis, give every rank's recorder an origin taken right after a
barrier (``Recorder(rank, origin=perf_counter())`` after ``Barrier()``; clocks of different
nodes agree only to the barrier's skew), then ``Trace.merge(comm.gather(rec.trace()))``.

Shape legend: E events, P ranks.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

#: Kinds of events; the collectives are every kind after 'recv'.
STEP, SEND, RECV = "step", "send", "recv"
COLLECTIVES = ("allreduce", "gather", "bcast", "allgather", "alltoall", "scatter")
KINDS = (STEP, SEND, RECV, *COLLECTIVES)

#: Bytes of a Python number in a message (a float64 / int64 on the wire).
NUMBER_BYTES = 8


class Event(NamedTuple):
    """One thing a rank did from ``t0`` to ``t1`` (module docstring); -1 marks unused fields."""

    kind: str
    rank: int
    t0: float
    t1: float
    level: int = -1
    start: int = -1
    stop: int = -1
    peer: int = -1
    nbytes: int = 0
    seq: int = -1

    @property
    def duration(self) -> float:
        return self.t1 - self.t0

    @property
    def direction(self) -> str | None:
        """'forward' or 'backward' (adjoint) for a step, None otherwise."""
        if self.kind != STEP:
            return None
        return "backward" if self.start > self.stop else "forward"

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVES


def payload_bytes(value: Any, array_scale: float = 1.0) -> int:
    """Bytes a message carrying ``value`` moves (the payload, no header).

    Arrays count ``nbytes`` (times ``array_scale``: the cost-only mode sends tiny stand-in
    states and scales them to the real state's size); Python numbers :data:`NUMBER_BYTES`;
    ``None`` 0; lists, tuples and dict values the sum of their items; anything else 0.
    """
    if value is None:
        return 0
    nb = getattr(value, "nbytes", None)
    if nb is not None:
        return int(round(nb * array_scale))
    if isinstance(value, (bool, int, float, complex, np.number)):
        return NUMBER_BYTES
    if isinstance(value, dict):
        return sum(payload_bytes(v, array_scale) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(v, array_scale) for v in value)
    return 0


# ----------------------------------------------------------------------------- the recorder
_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "refbraid_trace_recorder", default=None
)

#: The recorder active in this thread/context, or None (tracing off). The one hot-path lookup.
active_recorder: Callable[[], Recorder | None] = _ACTIVE.get


class Recorder:
    """Collects one rank's events with wall-clock times (``time.perf_counter``).

    rank    the rank these events belong to
    origin  ``perf_counter()`` value that becomes time 0 (default: now); give every rank of a
            run the same origin to put their traces on one time axis

    The hooks take ``perf_counter()`` readings; the event stores them relative to ``origin``.
    Messages get their per-pair ``seq`` and collectives their running ``seq`` here.
    """

    def __init__(self, rank: int = 0, origin: float | None = None):
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
            raise ValueError(f"`rank` must be a non-negative integer, got {rank!r}.")
        self.rank = int(rank)
        self.origin = time.perf_counter() if origin is None else float(origin)
        self.events: list[Event] = []
        self._sent: dict[int, int] = defaultdict(int)  # messages so far to each peer
        self._received: dict[int, int] = defaultdict(int)  # ... and from each peer
        self._collectives = 0

    # -- hooks ------------------------------------------------------------------------------
    def step(self, level: int, start: int, stop: int, t0: float, t1: float) -> None:
        """One step application ``start → stop`` (fine indices) on ``level``, from t0 to t1."""
        o = self.origin
        self.events.append(Event(STEP, self.rank, t0 - o, t1 - o, level, start, stop))

    def steps(self, level: int, starts, stops, t0: float, t1: float) -> None:
        """k step applications ``starts[j] → stops[j]`` made by ONE batched call from t0 to t1.

        Recorded as k consecutive boxes of length ``(t1 - t0) / k`` in the order given, so the
        trace still has one step event per interval (step counts, critical paths and the
        timeline stay valid) and the rank still does one thing at a time.
        """
        k = len(starts)
        dt = (t1 - t0) / k if k else 0.0
        o = t0 - self.origin
        append = self.events.append
        for j in range(k):
            append(Event(STEP, self.rank, o + j * dt, o + (j + 1) * dt, level, int(starts[j]),
                         int(stops[j])))

    def send(self, peer: int, nbytes: int, t0: float, t1: float) -> None:
        """A message to rank ``peer`` was handed over (posted) between t0 and t1."""
        seq = self._sent[peer]
        self._sent[peer] = seq + 1
        o = self.origin
        self.events.append(Event(SEND, self.rank, t0 - o, t1 - o, peer=peer, nbytes=nbytes,
                                 seq=seq))

    def recv(self, peer: int, nbytes: int, t0: float, t1: float) -> None:
        """A message from rank ``peer`` was waited for from t0 and received at t1."""
        seq = self._received[peer]
        self._received[peer] = seq + 1
        o = self.origin
        self.events.append(Event(RECV, self.rank, t0 - o, t1 - o, peer=peer, nbytes=nbytes,
                                 seq=seq))

    def collective(self, kind: str, nbytes: int, t0: float, t1: float) -> None:
        """A collective ``kind`` (one of :data:`COLLECTIVES`) entered at t0, left at t1."""
        if kind not in COLLECTIVES:
            raise ValueError(f"`kind` must be one of {COLLECTIVES}, got {kind!r}.")
        seq = self._collectives
        self._collectives = seq + 1
        o = self.origin
        self.events.append(Event(kind, self.rank, t0 - o, t1 - o, nbytes=nbytes, seq=seq))

    def trace(self) -> Trace:
        """The events recorded so far, as a :class:`Trace`."""
        return Trace(tuple(self.events))


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Activate ``recorder`` in the current thread/context for the ``with`` block."""
    if not isinstance(recorder, Recorder):
        raise TypeError(f"`recorder` must be a refbraid.parallel.trace.Recorder, got "
                        f"{type(recorder).__name__}.")
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)


def traced(fn: Callable[[Any], Any], origin: float | None = None) -> Callable[[Any], Any]:
    """Wrap a rank body ``fn(comm)`` so that it runs under a :class:`Recorder` of ``comm.rank``;
    the wrapped body returns ``(fn(comm), trace)``. Pass one ``origin`` for all ranks."""

    def body(comm):
        with recording(Recorder(comm.rank, origin)) as rec:
            out = fn(comm)
        return out, rec.trace()

    return body


# ----------------------------------------------------------------------------- the trace
@dataclass(frozen=True)
class Trace:
    """Events of one or more ranks; each rank's events in the order it did them."""

    events: tuple[Event, ...] = ()

    @classmethod
    def merge(cls, traces: Iterable[Trace]) -> Trace:
        """One trace from the ranks' traces (e.g. gathered to rank 0), ordered by rank."""
        events = [e for t in traces for e in t.events]
        events.sort(key=lambda e: e.rank)  # stable: each rank keeps its own order
        return cls(tuple(events))

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    @property
    def ranks(self) -> list[int]:
        return sorted({e.rank for e in self.events})

    @property
    def end(self) -> float:
        """The latest end time (0 for an empty trace)."""
        return max((e.t1 for e in self.events), default=0.0)

    def on_rank(self, rank: int) -> list[Event]:
        """Rank ``rank``'s events in program order."""
        return [e for e in self.events if e.rank == rank]

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def step_counts(self) -> dict[tuple[int, int], int]:
        """Step applications per ``(rank, level)``."""
        out: dict[tuple[int, int], int] = defaultdict(int)
        for e in self.events:
            if e.kind == STEP:
                out[(e.rank, e.level)] += 1
        return dict(out)

    def message_pairs(self) -> list[tuple[Event, Event | None]]:
        """Every send with its matching receive (None if it was never received)."""
        recvs = {(e.peer, e.rank, e.seq): e for e in self.events if e.kind == RECV}
        return [(e, recvs.get((e.rank, e.peer, e.seq)))
                for e in self.events if e.kind == SEND]

    def summary(self) -> dict[int, dict[str, float]]:
        """Per rank: seconds in steps, waiting in receives, in collectives; and the end."""
        out: dict[int, dict[str, float]] = {}
        for r in self.ranks:
            ev = self.on_rank(r)
            out[r] = {
                "steps": float(sum(e.duration for e in ev if e.kind == STEP)),
                "wait": float(sum(e.duration for e in ev if e.kind == RECV)),
                "collectives": float(sum(e.duration for e in ev if e.is_collective)),
                "end": float(max((e.t1 for e in ev), default=0.0)),
            }
        return out


def critical_path(trace: Trace, tol: float = 0.0) -> list[Event]:
    """The chain of events that determines the end time, earliest first.

    Start from the event that ends last and go backwards; the predecessor of an event is

    * for a receive that waited (``t1 - t0 > tol``): the matching send (the message was late);
    * for a collective: the previous event of the rank that entered it last (everyone waited
      for that rank), after replacing the collective by that rank's copy of it;
    * otherwise the previous event on the same rank.

    On a virtual trace (:mod:`refbraid.parallel.virtual`) every link is exact: each event
    starts when its predecessor ends, or (a late message) ends ``α + β·nbytes`` after its
    send. On a measured trace it is a reading of the clocks (``tol`` ignores waits shorter
    than it).
    """
    ev = trace.events
    if not ev:
        return []
    per_rank: dict[int, list[int]] = defaultdict(list)  # indices into ev, program order
    where: list[int] = []  # position of ev[i] in its rank's list
    sends: dict[tuple[int, int, int], int] = {}
    colls: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(ev):
        where.append(len(per_rank[e.rank]))
        per_rank[e.rank].append(i)
        if e.kind == SEND:
            sends[(e.rank, e.peer, e.seq)] = i
        elif e.is_collective:
            colls[e.seq].append(i)

    i: int | None = max(range(len(ev)), key=lambda k: (ev[k].t1, -ev[k].rank, k))
    path: list[int] = []
    while i is not None:
        e = ev[i]
        if e.is_collective:  # the copy of the rank that arrived last
            i = max(colls[e.seq], key=lambda k: (ev[k].t0, -ev[k].rank))
            e = ev[i]
        path.append(i)
        key = (e.peer, e.rank, e.seq)
        if e.kind == RECV and e.t1 - e.t0 > tol and key in sends:
            i = sends[key]
        else:
            w = where[i]
            i = per_rank[e.rank][w - 1] if w > 0 else None
    return [ev[k] for k in reversed(path)]


def path_breakdown(path: list[Event]) -> dict[str, float]:
    """Seconds of a critical path by what they were spent on: ``'step L<level> <direction>'``,
    ``'messages'`` (the latency of late messages) and each collective by name.

    Each event is charged ``t1`` minus the previous path event's ``t1`` (its own ``t0`` for
    the first), so the parts add up to the path's length, i.e. the predicted wall time of a
    virtual run whose path starts at 0.
    """
    out: dict[str, float] = defaultdict(float)
    prev_end = path[0].t0 if path else 0.0
    for e in path:
        if e.kind == STEP:
            key = f"step L{e.level} {e.direction}"
        elif e.is_collective:
            key = e.kind
        else:
            key = "messages"
        out[key] += e.t1 - prev_end
        prev_end = e.t1
    return {k: float(v) for k, v in sorted(out.items())}
