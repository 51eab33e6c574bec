"""Ctrl-C always stops the command line: at start-up, in the middle of a run, under MPI.

Python turns SIGINT into ``KeyboardInterrupt`` at the next bytecode of the main thread. Two
places lose it:

* **start-up**: while ``refbraid`` and its dependencies are still being imported, nothing can
  catch it yet, so Python prints a traceback and the process dies by the signal (exit -2);
* **callbacks Python cannot raise from** (a weakref callback, ``__del__``, a garbage-collector
  hook): Python prints "Exception ignored in ..." and goes on as if nothing happened;
* **C extensions that print an error** (``PyErr_Print``): NumPy's ``import_array()`` and
  Numba's dispatcher print the error of an import they need, then raise ``ImportError``; a
  Ctrl-C landing in that import prints a traceback of ``importlib`` frames.

Three stages, all for the command-line process only (importing refbraid as a library changes
no signal handler):

1. :func:`guard_startup` (called by ``refbraid/__init__`` before any heavy import, and only
   when the process is ``refbraid`` / ``python -m refbraid``): SIGINT prints one line and ends
   the process with exit code 130 at once — nothing has been written yet, so nothing is lost.
2. :func:`graceful` (around a command's work): SIGINT sets a flag and raises
   ``KeyboardInterrupt``, which the command turns into status "interrupted", keeps its files
   and exits 130. If the exception was swallowed inside a callback, ``sys.unraisablehook`` sees
   it (and hides Python's "Exception ignored" text) and raises it again a few milliseconds
   later, when the callback is over (a one-shot SIGALRM timer; it waits again if it lands in a
   callback or in that hook). A pending Ctrl-C that C code prints through ``sys.excepthook``
   is not shown either: that code goes on with an error of its own (an ``ImportError``), which
   :func:`ended_by_interrupt` reads as the interrupt. Loops also call :func:`check` at safe
   points (each training batch), which raises if a Ctrl-C is pending. Either way the run stops
   within one step.
3. Under MPI only world rank 0 acts on SIGINT (``mpiexec`` forwards it to every rank): the
   other ranks carry on with the protocol so rank 0 is never left blocked in a receive; rank 0
   stops, records the run as interrupted and ends the job with ``MPI_Abort`` (its text
   hidden, :func:`end_process`) — after a Ctrl-C ``mpiexec`` waits for every rank rather than
   stopping them when one exits. So that this works from the first moment, stage 1 starts
   MPI (``MPI_Init``) right away under ``mpiexec``; a Ctrl-C during ``MPI_Init`` itself is
   acted on when it returns.

Once a command's work is saved (:func:`finished`), a Ctrl-C ends the process at once with
exit code 0: there is nothing left to stop, and the run's status is "finished".

A leaf module: it imports nothing of refbraid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT
MESSAGE = "interrupted (Ctrl-C)."
#: seconds after a swallowed KeyboardInterrupt before it is raised again
REDELIVER_S = 0.005
#: environment variables that hold this process's MPI world rank (MPICH, Open MPI, PMIx)
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")

_requested = False  # a Ctrl-C arrived during graceful() and has not been acted on


def launched_rank() -> int:
    """This process's MPI world rank from the launcher's environment (0 outside MPI)."""
    for var in RANK_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def is_cli_process() -> bool:
    """True when this process is the ``refbraid`` command (script, ``-m refbraid``, or under
    ``python -m mpi4py -m refbraid``)."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    if any(a == "-m" and b == "refbraid" for a, b in zip(argv, argv[1:], strict=False)):
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0]) == "refbraid"


def end_process(code: int) -> None:
    """End this process at once with exit code ``code`` — and under ``mpiexec`` the whole job.

    Under MPI this is ``MPI_Abort(code)`` with this process's output closed first: ``mpiexec``
    then stops every rank and exits with ``code``, without MPICH's "Abort(code) ..." text
    (after a Ctrl-C ``mpiexec`` waits for every rank instead of stopping them, so a plain exit
    of one rank is not enough). Callers print their one line before.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if any(var in os.environ for var in RANK_VARS):
        with contextlib.suppress(Exception):
            from mpi4py import MPI

            if MPI.COMM_WORLD.Get_size() > 1:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                MPI.COMM_WORLD.Abort(code)
    os._exit(code)


def _exit_now(signum, frame) -> None:  # pragma: no cover - runs in a subprocess
    """Start-up handler: one line, exit 130 (nothing written yet, nothing to keep)."""
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(2, f"refbraid{' ' + command if command.isalpha() else ''}: {MESSAGE}\n".encode())
    end_process(EXIT_INTERRUPTED)


def _ignore(signum, frame) -> None:
    """MPI ranks other than 0: rank 0 stops the job (see the module docstring)."""


def guard_startup() -> None:
    """Stage 1: in the command-line process, make SIGINT during imports exit 130 cleanly."""
    if not is_cli_process() or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _exit_now if launched_rank() == 0 else _ignore)
    if any(var in os.environ for var in RANK_VARS):  # under mpiexec: MPI_Init now, so that
        with contextlib.suppress(ImportError):      # a Ctrl-C can end the job at any moment
            from mpi4py import MPI  # noqa: F401


def _inside(frame, code) -> bool:
    """True when ``frame`` or one of its callers runs ``code``."""
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _raise(signum, frame) -> None:
    """Graceful handler: flag the Ctrl-C and raise KeyboardInterrupt — unless this runs inside
    :func:`_hook`, where it would be swallowed once more: then deliver it again a moment later."""
    global _requested
    _requested = True
    if _inside(frame, _hook_code):
        _redeliver_later()
        return
    raise KeyboardInterrupt


def _alarm(signum, frame) -> None:  # the timer of _redeliver_later
    if _requested:
        _raise(signum, frame)


def _redeliver_later() -> None:
    """Raise the pending KeyboardInterrupt again in :data:`REDELIVER_S` seconds (a one-shot
    SIGALRM timer, handled by :func:`_alarm` in the main thread)."""
    signal.setitimer(signal.ITIMER_REAL, REDELIVER_S)


def _hook_for(previous):
    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _requested:
            _redeliver_later()
            return  # no "Exception ignored" text: the interrupt is delivered again
        previous(unraisable)

    return hook


_hook_code = _hook_for(None).__code__  # every hook made by _hook_for runs this code


def _excepthook_for(previous):
    def excepthook(exc_type, exc_value, exc_traceback) -> None:
        if issubclass(exc_type, KeyboardInterrupt) and _requested:
            return  # printed by C code (PyErr_Print), which raises its own error next
        previous(exc_type, exc_value, exc_traceback)

    return excepthook


def requested() -> bool:
    """True once a Ctrl-C arrived inside :func:`graceful`."""
    return _requested


def ended_by_interrupt(err: BaseException) -> bool:
    """True when ``err`` is a Ctrl-C or came out of one: a KeyboardInterrupt in its cause or
    context chain, or any error raised after a Ctrl-C arrived (an import the interrupt halted
    fails again later with an ImportError, a library turns it into its own error). The user
    pressed Ctrl-C, so the run ends as interrupted (exit 130), not as an error."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return _requested


def reraise(err: BaseException) -> None:
    """Raise ``err`` on — as a KeyboardInterrupt caused by it when it came out of a Ctrl-C
    (:func:`ended_by_interrupt`), so that every layer above reads it as the interrupt it was.
    Call inside an ``except`` block that has recorded the stop."""
    if ended_by_interrupt(err) and not isinstance(err, KeyboardInterrupt):
        raise KeyboardInterrupt from err
    raise err


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a Ctrl-C is pending (call at safe points of a loop).

    Raising it acts on the Ctrl-C: a redelivery still on its way is then dropped, so it cannot
    interrupt the run's last writes."""
    global _requested
    if _requested:
        _requested = False
        raise KeyboardInterrupt


@contextlib.contextmanager
def graceful(rank: int | None = None) -> Iterator[None]:
    """Stage 2 around a command's work; restores the previous handler and hook on exit.

    Outside the main thread it does nothing (Python delivers signals to the main thread only).
    ``rank``: the MPI world rank (default: from the launcher's environment); ranks other than
    0 ignore SIGINT.
    """
    global _requested
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    rank = launched_rank() if rank is None else rank
    _requested = False
    previous = signal.signal(signal.SIGINT, _raise if rank == 0 else _ignore)
    previous_alarm = signal.signal(signal.SIGALRM, _alarm)
    previous_hook, previous_excepthook = sys.unraisablehook, sys.excepthook
    sys.unraisablehook = _hook_for(previous_hook)
    sys.excepthook = _excepthook_for(previous_excepthook)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)  # no redelivery after the command
        signal.signal(signal.SIGALRM, previous_alarm)
        if signal.getsignal(signal.SIGINT) in (_raise, _ignore):  # not finished(): restore
            signal.signal(signal.SIGINT, previous)
        sys.unraisablehook, sys.excepthook = previous_hook, previous_excepthook
        _requested = False  # acted on: the command has ended


def leave_now(code: int) -> None:
    """In the command-line process outside MPI, end it at once with ``code``: every file is
    written and closed, and the interpreter's shutdown is skipped — it takes seconds on a
    loaded machine, and during it Python puts back its own SIGINT handling (a Ctrl-C there
    would kill the process by the signal). Elsewhere (tests, a library caller, MPI ranks,
    which must finalise MPI) it returns and the caller goes on."""
    if is_cli_process() and not any(var in os.environ for var in RANK_VARS):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _done(signum, frame) -> None:  # pragma: no cover - runs in a subprocess
    """After :func:`finished`: the work is saved, so Ctrl-C just ends the process (exit 0)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def finished() -> None:
    """The command's work is done and saved: a Ctrl-C from now on has nothing to stop, and
    ends the process at once with success (under MPI it is ignored: the job ends as usual)."""
    if threading.current_thread() is threading.main_thread() and is_cli_process():
        under_mpi = any(var in os.environ for var in RANK_VARS)
        signal.signal(signal.SIGINT, signal.SIG_IGN if under_mpi else _done)
