"""How a command ends: the exit codes and the one line a user reads when it fails.

:func:`explain` turns the exception that ended a command into ``(one line, exit code)``;
:func:`debug_requested` says whether the traceback is wanted instead (``--debug`` or
``REFBRAID_DEBUG=1``). The command line (:mod:`refbraid.cli`) and the sub-commands that
guard their own ranks (``refbraid train`` under mpiexec) both read them from here.
"""

from __future__ import annotations

import argparse
import errno
import os

from .errors import notes
from .interrupts import ended_by_interrupt

EXIT_ERROR = 1  # the run failed for a reason outside its input: disk, memory, a bug
EXIT_USAGE = 2  # bad input (argparse exits with 2 too)
EXIT_DIVERGED = 3  # training diverged (log.json status "diverged")
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT; log.json status "interrupted")
EXIT_CODES = {"error": EXIT_ERROR, "usage": EXIT_USAGE, "diverged": EXIT_DIVERGED,
              "interrupted": EXIT_INTERRUPTED}

DEBUG_ENV = "REFBRAID_DEBUG"

_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_NO_PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}


def _os_error(err: OSError) -> str:
    where = f" writing {err.filename}" if err.filename else ""
    if err.errno in _DISK_FULL:
        return f"no space left on the device{where}"
    if err.errno == errno.EFBIG:
        return (f"file too large{where} (a file-size limit of this file system or shell, see "
                f"`ulimit -f`)")
    if err.errno in _NO_PERMISSION:
        return f"permission denied{where}"
    return f"{err.strerror or type(err).__name__}{where}"


def explain(err: BaseException) -> tuple[str, int]:
    """(one line for the user, exit code) for an exception that ended a command."""
    from .training.divergence import TrainingDiverged

    if ended_by_interrupt(err):
        text, code = "interrupted (Ctrl-C).", EXIT_INTERRUPTED
    elif isinstance(err, TrainingDiverged):
        text, code = f"diverged: {err}", EXIT_DIVERGED
    elif isinstance(err, MemoryError):
        detail = f" ({err})" if str(err) else ""
        text, code = (f"out of memory{detail}: the arrays of this run do not fit in this "
                      f"machine's memory; lower `--samples`, `--width`, `--layers` or "
                      f"`--batch-size`."), EXIT_ERROR
    elif isinstance(err, (ValueError, TypeError, ImportError, FileNotFoundError)):
        text, code = f"error: {err}", EXIT_USAGE
    elif isinstance(err, OSError):
        text, code = f"error: {_os_error(err)}.", EXIT_ERROR
    else:
        text, code = (f"internal error: {type(err).__name__}: {err} — a bug in refbraid; rerun "
                      f"with --debug (or {DEBUG_ENV}=1) for the traceback and report it."), \
            EXIT_ERROR
    return " ".join([text, *notes(err)]), code


def debug_requested(args: argparse.Namespace | None = None) -> bool:
    """True with ``--debug`` or ``REFBRAID_DEBUG`` set to anything but "", "0" or "false"."""
    env = os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")
    return env or bool(getattr(args, "debug", False))
