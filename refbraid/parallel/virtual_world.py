"""The virtual cluster's shared state: clocks, mailboxes, collectives, communicator groups.

:mod:`refbraid.parallel.virtual` describes the model; this module holds what the P simulated
ranks share (one :class:`VirtualWorld` per :func:`~refbraid.parallel.virtual.simulate`):

* one :class:`VirtualRecorder` per world rank: its virtual ``clock`` and its events;
* mailboxes keyed by (group, sender, receiver): messages on different communicators never
  overtake or match each other (MPI's communicator contexts);
* :class:`Group`: the world ranks of one communicator (the world, a layer-parallel group, a
  data-parallel group, ...), created once and shared by its members, holding the collective
  in progress. A collective over a group synchronises only its members' clocks::

      t_end = max over members of the entry clocks + collective_cost(kind, |group|, bytes)

  and every member's clock becomes ``t_end``. Its events carry the round's world-unique
  number as ``seq``, so :func:`~refbraid.parallel.trace.critical_path` pairs the members'
  copies of one collective even when other groups run theirs at the same time.

Only the scheduler's running thread touches this state (:mod:`refbraid.parallel.scheduler`).

Shape legend: P world ranks, G ranks of a group.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .costs import DIRECTIONS, check_seconds, collective_cost
from .scheduler import Scheduler
from .trace import Event, Recorder


# ----------------------------------------------------------------------------- one rank's clock
class VirtualRecorder(Recorder):
    """A rank's recorder whose time is its virtual ``clock`` (origin 0).

    The step hook ignores the measured times and advances the clock by ``cost(level,
    direction)``; the communicator sets the clock for messages and collectives.
    """

    def __init__(self, rank: int, cost: Callable[[int, str], float]):
        super().__init__(rank, origin=0.0)
        self.clock = 0.0
        self._cost = cost
        self._table: dict[tuple[int, bool], float] = {}

    def step(self, level: int, start: int, stop: int, t0: float = 0.0, t1: float = 0.0) -> None:
        back = start > stop
        c = self._table.get((level, back))
        if c is None:
            c = check_seconds("costs(level, direction)", self._cost(level, DIRECTIONS[back]))
            self._table[(level, back)] = c
        t = self.clock
        self.clock = t + c
        self.events.append(Event("step", self.rank, t, t + c, level, start, stop))

    def steps(self, level: int, starts, stops, t0: float = 0.0, t1: float = 0.0) -> None:
        """A batched call: each of its k applications costs what it costs alone."""
        for start, stop in zip(starts, stops, strict=True):
            self.step(level, int(start), int(stop))

    def collective_round(self, kind: str, nbytes: int, t0: float, t1: float,
                         ident: int) -> None:
        """A collective, numbered by its world-unique round ``ident`` (module docstring)."""
        self.collective(kind, nbytes, t0, t1)
        self.events[-1] = self.events[-1]._replace(seq=ident)


# ----------------------------------------------------------------------------- groups, rounds
@dataclass(eq=False)
class Round:
    """One collective in progress: every member's value, entry clock and payload size."""

    kind: str
    ident: int
    values: list[Any]
    clocks: list[float]
    nbytes: list[int]
    arrived: int = 0
    waiters: list[int] = field(default_factory=list)  # world ranks
    t_end: float = 0.0


@dataclass(eq=False)
class Group:
    """The world ranks of one communicator, in its rank order, and its collective in
    progress."""

    ident: int
    members: tuple[int, ...]
    round: Round | None = None

    @property
    def size(self) -> int:
        return len(self.members)


def detach(value):
    """A copy sharing no memory with ``value`` (arrays, and dicts/lists/tuples of them)."""
    if isinstance(value, dict):
        return {k: detach(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(detach(v) for v in value)
    copy = getattr(value, "copy", None)
    return copy() if callable(copy) else value


# ----------------------------------------------------------------------------- the world
class VirtualWorld:
    """Mailboxes, groups and their collectives, clocks (the ranks' :class:`VirtualRecorder`)
    and the scheduler (module docstring)."""

    def __init__(self, size: int, cost, alpha: float, beta: float, sizeof):
        self.size = size
        self.alpha, self.beta, self.sizeof = alpha, beta, sizeof
        self.sched = Scheduler(size)
        self.recorders = [VirtualRecorder(r, cost) for r in range(size)]
        self.mail: dict[tuple[int, int, int], deque] = defaultdict(deque)
        self.waiting: dict[tuple[int, int, int], int] = {}
        self._groups: dict[tuple[int, ...], Group] = {}
        self._rounds = 0
        self.everyone = self.group(tuple(range(size)))

    def group(self, members: tuple[int, ...]) -> Group:
        """The shared :class:`Group` of these world ranks (created on first use)."""
        g = self._groups.get(members)
        if g is None:
            if not members or len(set(members)) != len(members) or \
                    not all(0 <= m < self.size for m in members):
                raise ValueError(f"`members` must be distinct world ranks in [0, {self.size}), "
                                 f"got {members!r}.")
            g = self._groups[members] = Group(len(self._groups), members)
        return g

    def send(self, group: Group, src: int, dst: int, value: Any) -> None:
        """Non-blocking: ``value`` leaves world rank ``src`` at its clock for ``dst``."""
        rec = self.recorders[src]
        nbytes = self.sizeof(value)
        key = (group.ident, src, dst)
        self.mail[key].append((detach(value), rec.clock, nbytes))
        rec.send(dst, nbytes, rec.clock, rec.clock)
        waiter = self.waiting.pop(key, None)
        if waiter is not None:
            self.sched.make_ready(waiter)

    def recv(self, group: Group, src: int, dst: int) -> Any:
        """The next message from ``src`` to ``dst`` on ``group``: dst's clock becomes
        ``max(clock, t_sent + α + β·nbytes)``."""
        key = (group.ident, src, dst)
        box = self.mail[key]
        while not box:
            self.waiting[key] = dst
            self.sched.block(dst, f"a message from rank {src}")
        value, t_sent, nbytes = box.popleft()
        rec = self.recorders[dst]
        c0 = rec.clock
        rec.clock = max(c0, t_sent + self.alpha + self.beta * nbytes)
        rec.recv(src, nbytes, c0, rec.clock)
        return value

    def collective(self, group: Group, rank: int, kind: str, value: Any,
                   nbytes: int | None = None, model: str | None = None) -> list[Any]:
        """Every member's ``value`` (a copy taken on arrival) in group order, after
        synchronising the members' clocks.
        ``rank`` is the caller's rank in the group; ``nbytes`` its payload for the cost
        (default ``sizeof(value)``); ``model`` the cost rule of
        :func:`~refbraid.parallel.costs.collective_cost` (default ``kind``, the name the
        trace records)."""
        rnd = group.round
        if rnd is None:
            n = group.size
            rnd = group.round = Round(kind, self._rounds, [None] * n, [0.0] * n, [0] * n)
            self._rounds += 1
        elif rnd.kind != kind:
            raise RuntimeError(f"rank {rank} called {kind} while other ranks are in "
                               f"{rnd.kind}: every rank must call the same collectives in "
                               f"the same order.")
        me = group.members[rank]
        rec = self.recorders[me]
        rnd.values[rank], rnd.clocks[rank] = detach(value), rec.clock  # the caller may
        # change its arrays before the last member has read them
        rnd.nbytes[rank] = self.sizeof(value) if nbytes is None else int(nbytes)
        rnd.arrived += 1
        if rnd.arrived < group.size:
            rnd.waiters.append(me)
            self.sched.block(me, f"the other ranks in {kind}")
        else:
            group.round = None
            rnd.t_end = max(rnd.clocks) + collective_cost(model or kind, group.size,
                                                          max(rnd.nbytes), self.alpha, self.beta)
            for w in rnd.waiters:
                self.sched.make_ready(w)
        rec.collective_round(kind, rnd.nbytes[rank], rnd.clocks[rank], rnd.t_end, rnd.ident)
        rec.clock = rnd.t_end
        return rnd.values
