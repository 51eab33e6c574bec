"""``refbraid lessons list | build``: the course as a list, or as executed notebooks."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import notebooks

DEFAULT_OUT = "lesson_notebooks"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``lessons`` sub-command (``list``, ``build``) on ``subparsers``."""
    p = subparsers.add_parser(
        "lessons", help="list the course's lessons, or build them as executed notebooks",
        description="The course: lessons/NN_*.py, percent-format scripts that Jupyter opens "
        "as notebooks. `build` executes them (jupytext + nbclient, the optional extra "
        "`lessons`) into .ipynb files with every output and figure.")
    sub = p.add_subparsers(dest="lessons_command", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="number, title and file of every lesson")
    build = sub.add_parser("build", help="execute lessons into .ipynb notebooks with outputs")
    build.add_argument("numbers", nargs="*", metavar="LESSON",
                       help="lesson numbers to build (default: all), e.g. 01 3")
    build.add_argument("--small", action="store_true",
                       help="small sizes (REFBRAID_LESSON_SMALL=1): all lessons in minutes")
    build.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), metavar="DIR",
                       help=f"folder for the notebooks (default: {DEFAULT_OUT}/)")
    for q in (listing, build):
        q.add_argument("--lessons", type=Path, default=None, metavar="DIR",
                       help="the lessons folder (default: lessons/ of this checkout)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    lessons = notebooks.find_lessons(args.lessons)
    if args.lessons_command == "list":
        for lesson in lessons:
            print(f"{lesson.number}  {lesson.title}\n    {lesson.path}")
        return 0
    from ..training.run_folder import output_folder

    chosen = notebooks.select(lessons, args.numbers)
    notebooks.require_extra(chosen)
    size = "small" if args.small else "full-size"
    with output_folder(args.out) as out:  # checked like a run folder, before any work
        print(f"building {len(chosen)} lesson notebook(s), {size}, into {out}/")
        built = notebooks.build(out, small=args.small, lessons=chosen)
    failed = [b for b in built if b.error]
    if failed:
        names = ", ".join(b.lesson.number for b in failed)
        print(f"{len(failed)} of {len(built)} lessons failed ({names}); their notebooks show "
              f"the error in the failing cell.")
        return 1
    print(f"built {len(built)} notebooks in {sum(b.seconds for b in built):.0f} s; open them "
          f"with: jupyter lab {args.out}")
    return 0
