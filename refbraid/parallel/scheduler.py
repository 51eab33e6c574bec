"""Run P threads one at a time: the virtual cluster's scheduler.

Each simulated rank is an OS thread (its Python stack holds the real solver's recursion while
it waits for a message), but only ONE runs at a time. A rank runs until it must wait — a
receive whose message is not there yet, a collective not everyone has reached, its end — and
then hands the CPU to the next ready rank, first come first served. With P in the thousands
this avoids thousands of threads fighting over the interpreter lock, and a communication
deadlock (every unfinished rank waiting) is found at once and raised as
:class:`DeadlockError` instead of hanging.

A rank sleeps on its own lock; :meth:`Scheduler.block` hands the CPU to the next ready rank
and sleeps, :meth:`Scheduler.make_ready` queues a sleeping rank. Only the running thread
touches the queues, except while aborting (guarded by ``mutex``).
"""

from __future__ import annotations

import _thread
import threading
from collections import deque


class DeadlockError(RuntimeError):
    """Every unfinished simulated rank waits for a message or a collective."""


class Aborted(BaseException):
    """Unwinds a rank after another rank failed (a BaseException: ``except Exception`` in a
    rank body must not swallow it)."""


class Scheduler:
    """Runs exactly one of ``size`` rank threads at a time (module docstring)."""

    def __init__(self, size: int):
        self.size = size
        self.locks = [_thread.allocate_lock() for _ in range(size)]
        for lock in self.locks:
            lock.acquire()
        self.ready: deque[int] = deque(range(size))
        self.sleeping = set(range(size))
        self.finished = 0
        self.failed: BaseException | None = None
        self.mutex = threading.Lock()
        self.done = threading.Event()
        self.what: dict[int, str] = {}  # what each blocked rank waits for (deadlock message)

    def start(self) -> None:
        """Let the first ready rank run (every rank starts ready, in rank order)."""
        self._pass_baton()

    def wait_start(self, rank: int) -> None:
        """A rank thread's first call: sleep until it is this rank's turn."""
        self.locks[rank].acquire()
        if self.failed is not None:
            raise Aborted

    def block(self, rank: int, what: str) -> None:
        """Sleep until ``make_ready(rank)`` and the CPU come back (raises if aborted)."""
        self.what[rank] = what
        self.sleeping.add(rank)
        self._pass_baton()
        self.locks[rank].acquire()
        if self.failed is not None:
            raise Aborted

    def make_ready(self, rank: int) -> None:
        self.what.pop(rank, None)
        self.ready.append(rank)

    def _pass_baton(self) -> None:
        if self.ready:
            nxt = self.ready.popleft()
            self.sleeping.discard(nxt)
            self.locks[nxt].release()
        elif self.sleeping:
            waits = "; ".join(f"rank {r} waits for {w}" for r, w in sorted(self.what.items())[:8])
            self.abort(DeadlockError(f"virtual cluster deadlock: every unfinished rank waits "
                                     f"({waits})."))

    def abort(self, err: BaseException) -> None:
        """Record ``err`` (the first one wins) and wake every sleeping rank to unwind."""
        with self.mutex:
            if self.failed is None:
                self.failed = err
            for r in list(self.sleeping):
                self.sleeping.discard(r)
                self.locks[r].release()
            self.ready.clear()

    def finish(self) -> None:
        """A rank thread's last call: pass the CPU on, or signal ``done`` after the last."""
        with self.mutex:
            self.finished += 1
            last = self.finished == self.size
            failed = self.failed is not None
        if last:
            self.done.set()
        elif not failed:
            self._pass_baton()
