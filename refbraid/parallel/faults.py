"""Faults under MPI: an error on one rank ends the whole job with one line, never a hang.

Faults. Run programs as ``mpiexec -n N python -m mpi4py ...``: an uncaught exception on any
rank then calls ``MPI_Abort`` and ends the job with that rank's traceback instead of leaving
the others blocked in a receive. The command line does better (:func:`end_job`, called by
:func:`refbraid.cli.main`): under ``mpiexec`` an error ends the job with the exit code and the
one line the same error gives in one process (2 bad input, 3 diverged, 130 Ctrl-C, ...),
printed once.

:func:`root_decides` lets world rank 0 check something (e.g. the output folder) for every
rank, so a refusal stops all ranks alike, before any work.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from ..errors import CollectiveError
from ..interrupts import end_process
from .mpi import launched_by_mpiexec, mpi_module

#: Seconds a failing rank other than 0 waits for rank 0 to end the job (see :func:`end_job`):
#: rank 0 writes the run's log and figures first, which can take seconds on a loaded machine
END_GRACE_S = 30.0
#: Seconds the printing rank waits after its line before ending the job: ``MPI_Abort`` tears
#: the job down at once, and on a loaded machine MPICH's launcher had not yet forwarded the
#: line from the rank's stderr pipe (the exit code came through, the message did not)
END_FORWARD_S = 0.3


def root_decides(decide: Callable[[], Any]) -> Any:
    """Run ``decide()`` on world rank 0 only and let every rank share its verdict.

    Returns ``decide()``'s result on rank 0 and None elsewhere. If it raised a user error
    (``ValueError``, ``TypeError``, ``OSError``), every rank raises
    :class:`~refbraid.errors.CollectiveError` with its message — before any rank has started
    work — so the job stops cleanly and the message is printed once. Outside MPI it is just
    ``decide()``.
    """
    if not launched_by_mpiexec():
        return decide()
    world = mpi_module().COMM_WORLD
    if world.Get_size() == 1:
        return decide()
    result, message = None, None
    if world.Get_rank() == 0:
        try:
            result = decide()
        except (ValueError, TypeError, OSError) as err:
            message = str(err)
    message = world.bcast(message, root=0)
    if message is not None:
        raise CollectiveError(message)
    return result


def many_ranks() -> bool:
    """True when an MPI launcher started this process on more than one rank."""
    return launched_by_mpiexec() and mpi_module().COMM_WORLD.Get_size() > 1


def end_job(line: str, code: int, grace_s: float = END_GRACE_S) -> NoReturn:
    """End the whole MPI job with exit code ``code``, the user reading ``line`` once.

    World rank 0 prints ``line`` and leaves (after :data:`END_FORWARD_S`); ``mpiexec`` then
    stops the other ranks and exits with ``code`` (:func:`refbraid.interrupts.end_process`;
    MPICH's "Abort(code) ..." text is not shown). Any other rank first waits ``grace_s``
    seconds: an error every rank meets (bad input, divergence) reaches rank 0 too, which ends
    the job meanwhile, after writing the run's files; only an error of this rank alone gets
    here after the wait, and this rank prints it.
    """
    if mpi_module().COMM_WORLD.Get_rank() != 0:
        time.sleep(grace_s)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()
    time.sleep(END_FORWARD_S)  # the launcher forwards the line before the job is torn down
    end_process(code)
    raise SystemExit(code)  # pragma: no cover - end_process does not return
