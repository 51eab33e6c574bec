"""Launch ``mpiexec -n N python -m mpi4py ...`` from Python (tests, lessons, benchmarks).

::

    run_mpi(4, ["-m", "pytest", "tests/mpi", "-q"], timeout=120)
      → mpiexec -n 4 <this python> -m mpi4py -m pytest tests/mpi -q

* ``mpiexec`` is the one next to the interpreter (the MPICH wheel of ``pip install
  'refbraid[mpi]'`` puts it there), else ``$REFBRAID_MPIEXEC``, else the first on ``PATH``.
  For Open MPI, ``--oversubscribe`` is added (more ranks than cores) and running as root is
  allowed (``OMPI_ALLOW_RUN_AS_ROOT=1``, ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``).
* ``python -m mpi4py`` turns an uncaught exception on any rank into ``MPI_Abort``: the job
  ends with that rank's traceback instead of hanging.
* Every rank runs with one thread: ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
  ``MKL_NUM_THREADS`` and ``NUMBA_NUM_THREADS`` are pinned to 1 (P ranks use P cores).
* More ranks than cores (MPICH): ``MPIR_CVAR_ENABLE_HEAVY_YIELD=1`` unless already set, so
  a rank waiting for a message sleeps between polls instead of spinning through
  ``sched_yield`` and taking the core from the rank it waits for (4 ranks on 2 cores: the
  ``tests/mpi`` suite 81 → 65 s, its system time 36 → 5 s).
* A timeout kills the whole process group (mpiexec and its ranks) and reports
  ``timed_out=True``; nothing is left running.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Thread-count variables pinned to 1 for every rank.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")

#: MPICH's switch from spinning (``sched_yield``) to sleeping (``nanosleep``) while a rank waits.
HEAVY_YIELD = "MPIR_CVAR_ENABLE_HEAVY_YIELD"

#: Seconds a launched job may run unless told otherwise.
DEFAULT_TIMEOUT = 120.0


def find_mpiexec() -> str:
    """Path of ``mpiexec``: next to ``sys.executable``, ``$REFBRAID_MPIEXEC``, or on PATH."""
    env = os.environ.get("REFBRAID_MPIEXEC")
    if env:
        return env
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise FileNotFoundError(
        "no `mpiexec` found next to the Python interpreter or on PATH; install MPI with "
        "pip install 'refbraid[mpi]' (mpi4py + the MPICH wheel) or set REFBRAID_MPIEXEC."
    )


def is_open_mpi(mpiexec: str) -> bool:
    """True when ``mpiexec --version`` names Open MPI."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "open mpi" in (out.stdout + out.stderr).lower()


def mpi_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the thread counts pinned to 1 (plus ``extra``)."""
    env = dict(os.environ)
    env.update({v: "1" for v in THREAD_VARS})
    env.update(extra or {})
    return env


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def oversubscription_env(n: int, cores: int) -> dict[str, str]:
    """Variables for ``n`` ranks on ``cores`` cores: MPICH's heavy yield when ``n > cores``
    (module docstring); nothing otherwise, and nothing the caller's environment already sets."""
    if n <= cores or HEAVY_YIELD in os.environ:
        return {}
    return {HEAVY_YIELD: "1"}


def mpiexec_command(n: int, argv: Sequence[str], python: str | None = None,
                    mpiexec: str | None = None) -> list[str]:
    """``[mpiexec, -n, N, (--oversubscribe), python, -m, mpi4py, *argv]``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` (number of ranks) must be a positive integer, got {n!r}.")
    if isinstance(argv, str):
        raise TypeError("`argv` must be a list of arguments, not one string.")
    mpiexec = mpiexec or find_mpiexec()
    cmd = [mpiexec, "-n", str(n)]
    if is_open_mpi(mpiexec):
        cmd.append("--oversubscribe")
    return [*cmd, python or sys.executable, "-m", "mpi4py", *argv]


@dataclass
class MPIRun:
    """What a launched job left: exit code, merged stdout+stderr, wall time, timeout flag."""

    command: list[str]
    returncode: int
    output: str
    seconds: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def check(self) -> MPIRun:
        """Raise RuntimeError with the output unless the job succeeded."""
        if not self.ok:
            why = f"timed out after {self.seconds:.0f} s" if self.timed_out else \
                f"exit code {self.returncode}"
            raise RuntimeError(f"{' '.join(self.command)} failed ({why}):\n{self.output}")
        return self


def run_mpi(n: int, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT,
            cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
            python: str | None = None) -> MPIRun:
    """Run ``argv`` on ``n`` ranks through ``python -m mpi4py``; see the module docstring.

    ``env`` adds variables to the (thread-pinned) environment. Returns an :class:`MPIRun`;
    use ``.check()`` to raise on failure.
    """
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"`timeout` must be a positive number of seconds, got {timeout!r}.")
    cmd = mpiexec_command(n, argv, python)
    extra = {**oversubscription_env(n, usable_cores()), **(env or {})}
    if is_open_mpi(cmd[0]):
        extra.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        extra.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=mpi_env(extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and the ranks it started
        out, _ = proc.communicate()
        timed_out = True
    return MPIRun(cmd, proc.returncode, out, time.perf_counter() - t0, timed_out)
