"""Time every lesson as a script and as an executed notebook (what `refbraid lessons build`
does), small or full size.

For each lesson: ``script`` runs ``python lessons/NN_*.py`` in a fresh process (figures saved
to a temporary folder); ``notebook`` reads it with jupytext and executes it with nbclient in a
fresh kernel (figures displayed inline), as :func:`refbraid.lessons.notebooks.execute` does.
Both start a new interpreter, so ``notebook − script`` is the price of the kernel and of the
notebook machinery. Times are medians over ``--repeats`` runs; the load average is printed
because these are wall-clock times on a machine that may be shared.

    python benchmarks/bench_lessons.py --small            # the CI sizes
    python benchmarks/bench_lessons.py --small 01 05      # some lessons
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from refbraid.lessons import notebooks


def time_script(lesson: notebooks.Lesson, env: dict[str, str], folder: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, str(lesson.path)], env=env, cwd=folder, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def time_notebook(lesson: notebooks.Lesson, env: dict[str, str], folder: Path) -> float:
    nb = notebooks.read_notebook(lesson.path)
    start = time.perf_counter()
    notebooks.execute(nb, folder, env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("numbers", nargs="*", help="lesson numbers (default: all)")
    parser.add_argument("--small", action="store_true", help="REFBRAID_LESSON_SMALL=1")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    notebooks.require_extra()
    lessons = notebooks.select(notebooks.find_lessons(), args.numbers)
    print(f"lessons {'small' if args.small else 'full size'}, median of {args.repeats}; "
          f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'lesson':<40} {'script s':>9} {'notebook s':>11} {'ratio':>6}")
    totals = [0.0, 0.0]
    for lesson in lessons:
        with tempfile.TemporaryDirectory() as tmp:
            env = notebooks.kernel_environment(args.small)
            script_env = {**env, "REFBRAID_LESSON_FIGURES": tmp}
            script = statistics.median(time_script(lesson, script_env, Path(tmp))
                                       for _ in range(args.repeats))
            notebook = statistics.median(time_notebook(lesson, env, Path(tmp))
                                         for _ in range(args.repeats))
        totals[0] += script
        totals[1] += notebook
        print(f"{lesson.stem:<40} {script:9.1f} {notebook:11.1f} {notebook / script:6.2f}")
    print(f"{'total':<40} {totals[0]:9.1f} {totals[1]:11.1f} {totals[1] / totals[0]:6.2f}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
