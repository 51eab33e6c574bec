"""Command line: ``refbraid train | verify``.

Each sub-command lives with the code it drives and registers itself here through an
``add_parser(subparsers)`` function that sets ``func`` (called with the parsed namespace and
returning the process exit code).
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from . import verify
    from .training import cli as train_cli

    parser = argparse.ArgumentParser(
        prog="refbraid",
        description="Layer-parallel training of deep networks with MGRIT "
        "(teaching and reference code).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train_cli.add_parser(sub)
    verify.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as err:
        print(f"refbraid {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
