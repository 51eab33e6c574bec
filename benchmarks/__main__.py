"""The runner: ``python -m benchmarks SIZE [SUITE ...] [-o NAME=VALUE ...] [--json PATH]``.

    python -m benchmarks quick                        # kernels, solver, step, scaling, counts
    python -m benchmarks full step -o settings=fast   # one suite, full sizes, an option
    python -m benchmarks quick --list                 # the suites and their options

SIZE is ``tiny`` (the test's sizes: checks the output, times nothing worth reading),
``quick`` (a few minutes on 2 cores) or ``full``. Without SUITE names it runs every suite of
:data:`QUICK`. It prints each suite's notes (settings, load, allocator), then ONE table of
every result, and writes the same as JSON (``--json``; default ``benchmarks.json`` in the
working directory). ``-o name=value`` sets a suite option (``--list`` shows them with their
defaults); an option no chosen suite has is an error.

A suite is a module of this package with ``OPTIONS`` (name → default) and
``run(size, opts, notes) -> list[harness.Result]``; :data:`SUITES` registers it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from benchmarks.harness import SIZES, Result, metadata, prepare_worker, table, write_json

#: the suites: each the module ``benchmarks.<name>``
SUITES = ("kernels", "solver", "step", "scaling", "counts", "gpu")
#: what ``python -m benchmarks quick`` (or any size without suite names) runs
QUICK = ("kernels", "solver", "step", "scaling", "counts")


def load(name: str):
    """The suite called ``name``: a module of this package."""
    if name not in SUITES:
        raise ValueError(f"suite must be one of {', '.join(SUITES)}, got {name!r}.")
    return importlib.import_module(f"benchmarks.{name}")


def parse_options(pairs: list[str], suites: dict) -> dict[str, dict]:
    """``-o name=value`` → per suite its options (defaults updated, typed as the default)."""
    opts = {name: dict(suite.OPTIONS) for name, suite in suites.items()}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        owners = [n for n in opts if key in opts[n]]
        if not sep or not owners:
            known = sorted({k for o in opts.values() for k in o})
            raise ValueError(f"`-o` must be name=value with a name among {known}, got {pair!r}.")
        for n in owners:
            default = opts[n][key]
            if isinstance(default, bool):
                value = text.lower() in ("1", "true", "yes", "on")
            else:
                value = type(default)(text)
            opts[n][key] = value
    return opts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("size", choices=SIZES)
    ap.add_argument("suites", nargs="*", help=f"among {', '.join(SUITES)} (default: "
                    f"{' '.join(QUICK)})")
    ap.add_argument("-o", "--option", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--json", default="benchmarks.json", help="where the JSON file goes")
    ap.add_argument("--list", action="store_true", help="list the suites and their options")
    args = ap.parse_args(argv)
    try:
        suites = {name: load(name) for name in (args.suites or QUICK)}
        opts = parse_options(args.option, suites)
    except ValueError as err:
        ap.error(str(err))
    if args.list:
        for name, suite in suites.items():
            print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in suite.OPTIONS.items()))
        return 0
    prepare_worker()  # the suites that time in this process: malloc pinned, as in the workers
    meta = metadata(args.size, list(suites))
    notes: dict[str, list[str]] = {}
    results: list[Result] = []
    for name, suite in suites.items():
        notes[name] = [f"load {os.getloadavg()[0]:.2f} at the start"]
        try:
            results += suite.run(args.size, opts[name], notes[name])
        except ValueError as err:  # an option's value the suite refuses: a line, not a trace
            ap.error(f"suite {name}: {err}")
        notes[name].append(f"load {os.getloadavg()[0]:.2f} at the end")
    meta["options"] = opts
    print(f"refbraid benchmarks, {args.size}: {meta['date_utc']} UTC, {meta['cpus']} CPUs, "
          f"python {meta['python']}, numpy {meta['numpy']}, threads 1 per process")
    for name, lines in notes.items():
        print(f"\n[{name}]")
        print("\n".join(f"  {line}" for line in lines))
    print()
    print(table(results))
    write_json(args.json, meta, notes, results)
    print(f"\nwrote {args.json}")
    # A suite that keeps going past a failing case says so in a note "FAILED ...": the
    # table and the JSON file keep every other case, and the exit status says it failed.
    failed = [f"{name}: {line}" for name, lines in notes.items() for line in lines
              if line.startswith("FAILED")]
    if failed:
        print("\n" + "\n".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
