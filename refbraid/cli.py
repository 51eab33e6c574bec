"""Command line: ``refbraid train | scale | verify | compare``.

Each sub-command lives with the code it drives and registers itself here through an
``add_parser(subparsers)`` function that sets ``func`` (called with the parsed namespace and
returning the process exit code).

Errors. Whatever goes wrong, the user reads ONE line on stderr, ``refbraid COMMAND: ...``,
and the process exits with a code that says what kind of thing happened (:data:`EXIT_CODES`);
:func:`refbraid.exits.explain` is the one place that turns an exception into that line. The
line carries the exception's notes (e.g. what a stopped training run kept on disk).
``--debug`` (or the environment variable ``REFBRAID_DEBUG=1``) shows the Python traceback
instead. Under ``mpiexec`` the job ends with the same line, once, and the same exit code
(:func:`refbraid.parallel.faults.end_job`). Ctrl-C always stops a command within a step,
its files kept, with exit code 130 (:mod:`refbraid.interrupts`).
"""

from __future__ import annotations

import argparse
import sys
import traceback

from . import __version__, interrupts
from .errors import CollectiveError
from .exits import (  # noqa: F401  (the exit codes: part of the command line's interface)
    DEBUG_ENV,
    EXIT_CODES,
    EXIT_DIVERGED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    debug_requested,
    explain,
)
from .runtime import pin_allocator

#: commands whose step times should not depend on the process's allocation history: they pin
#: glibc malloc's thresholds first (refbraid/runtime.py; REFBRAID_PIN_ALLOCATOR=0 opts out)
PINNED_COMMANDS = ("train", "scale")


def build_parser() -> argparse.ArgumentParser:
    from . import verify
    from .interop import cli as compare_cli
    from .lessons import cli as lessons_cli
    from .scaling import cli as scale_cli
    from .training import cli as train_cli

    parser = argparse.ArgumentParser(
        prog="refbraid",
        description="Layer-parallel training of deep networks with MGRIT "
        "(teaching and reference code).",
        epilog=f"Exit codes: 0 success, {EXIT_USAGE} bad input, {EXIT_DIVERGED} training "
        f"diverged, {EXIT_INTERRUPTED} interrupted (Ctrl-C), {EXIT_ERROR} any other failure "
        f"(disk full, out of memory, a bug).",
    )
    parser.add_argument("--version", action="version", version=f"refbraid {__version__}")
    debug_help = f"show Python tracebacks instead of one-line errors (also: {DEBUG_ENV}=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train_cli.add_parser(sub)
    scale_cli.add_parser(sub)
    verify.add_parser(sub)
    compare_cli.add_parser(sub)
    lessons_cli.add_parser(sub)
    for command in sub.choices.values():  # `refbraid train --debug` works as well
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help=debug_help)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in PINNED_COMMANDS:
        pin_allocator()  # repeatable step times, whatever ran before (refbraid/runtime.py)
    try:
        with interrupts.graceful():  # Ctrl-C always stops, files kept (refbraid/interrupts.py)
            code = int(args.func(args) or 0)
            interrupts.finished()
    except SystemExit:
        raise
    except BaseException as err:
        code = _report(args, err)
    interrupts.leave_now(code)  # the command line: no slow interpreter shutdown after the work
    return code


def _report(args: argparse.Namespace, err: BaseException) -> int:
    """Print the one line for ``err`` (once, also under MPI) and return its exit code."""
    from .parallel.faults import end_job, many_ranks

    text, code = explain(err)
    line = f"refbraid {args.command}: {text}"
    collective = isinstance(err, CollectiveError)
    if many_ranks() and not collective:  # one line, the one-process exit code, no MPI_Abort
        if debug_requested(args):
            line = traceback.format_exc().rstrip() + "\n" + line
        end_job(line, code)
    if debug_requested(args):
        raise err
    if not collective or _is_world_root():
        print(line, file=sys.stderr, flush=True)
    return code


def _is_world_root() -> bool:
    from .parallel.mpi import is_world_root

    return is_world_root()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
