"""Faults under MPI: an error on one rank ends the whole job with one line, never a hang.

Faults. Run programs as ``mpiexec -n N python -m mpi4py ...``: an uncaught exception on any
rank then calls ``MPI_Abort`` and ends the job with that rank's traceback instead of leaving
the others blocked in a receive. :func:`abort_on_error` does the same for entry points that
are not started through ``-m mpi4py`` (e.g. ``mpiexec -n 2 refbraid train``).

:func:`root_decides` lets world rank 0 check something (e.g. the output folder) for every
rank, so a refusal stops all ranks alike, before any work.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..errors import CollectiveError
from .mpi import MPIComm, launched_by_mpiexec, mpi_module

#: Seconds a failing rank waits before MPI_Abort, so ranks failing the same way can print too.
ABORT_GRACE_S = 1.0


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


def one_line(err: BaseException) -> str:
    """``Type: message`` of an exception, without a traceback."""
    return "".join(traceback.format_exception_only(type(err), err)).strip()


@contextlib.contextmanager
def abort_on_error(comm=None, grace_s: float = ABORT_GRACE_S,
                   describe: Callable[[BaseException], str] = one_line, debug: bool = False):
    """Turn an exception on this rank into ``MPI_Abort`` of the whole job, after printing it.

    Use around entry points not started through ``python -m mpi4py`` so that one failing rank
    never leaves the others blocked. The rank prints ``describe(err)`` prefixed with its rank
    (one line; the traceback too with ``debug``), waits ``grace_s`` seconds — ranks that fail
    at the same moment print theirs meanwhile — and aborts. A
    :class:`~refbraid.errors.CollectiveError` is raised on every rank alike, so it propagates
    unchanged (no rank is left waiting; the caller prints it once). Outside MPI, or on one
    rank, every exception propagates unchanged.
    """
    try:
        yield
    except (SystemExit, CollectiveError):
        raise
    except BaseException as err:
        if not launched_by_mpiexec():
            raise
        MPI = mpi_module()
        world = comm.mpi if isinstance(comm, MPIComm) else (comm or MPI.COMM_WORLD)
        if world.Get_size() == 1:
            raise
        rank = MPI.COMM_WORLD.Get_rank()
        text = traceback.format_exc() if debug else describe(err)
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
        sys.stderr.flush()
        time.sleep(grace_s)
        world.Abort(1)
        raise  # Abort does not return; never swallow the error if it did
