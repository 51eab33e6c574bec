"""Send SIGINT to ``refbraid train`` at random moments (shared by the tests and by hand).

``python tests/bad_inputs/sigint_probe.py N`` sends N signals and prints one row per try.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--samples", "60", "--layers", "8", "--width", "4", "--levels", "2", "--epochs", "3",
        "--checkpoint-every", "1", "--quiet"]


@dataclass
class Try:
    delay_s: float  # after the guard was in place (numpy mapped)
    serial: bool
    returncode: int
    stop_s: float  # from the signal to the process's exit
    stderr: str
    status: str | None  # log.json's, None without a log
    checkpoint_ok: bool | None  # None without a checkpoint


def _ready(pid: int, timeout: float = 60) -> None:
    """Wait until the process has imported numpy (refbraid's start-up guard comes first)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text():
                return
        except OSError:
            return
        time.sleep(0.002)


def _ranks(out: Path, n: int, timeout: float = 120) -> None:
    """Wait until ``n`` processes started with ``--out out`` (the MPI ranks) have imported
    numpy: a signal before is one during ``MPI_Init``, which Python only sees once it returns."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() \
                    else []
            except OSError:
                continue
            if str(out).encode() in argv and "mpiexec" not in os.path.basename(argv[0].decode()):
                pids.append(int(entry.name))
        if len(pids) >= n:
            for pid in pids:
                _ready(pid)
            return
        time.sleep(0.01)


def one_try(delay_s: float, serial: bool, folder: Path, launcher=()) -> Try:
    from refbraid.training.checkpoint import load_checkpoint

    out = folder / "run"
    argv = [*launcher, sys.executable, *(["-m", "mpi4py"] if launcher else []), "-m",
            "refbraid", "train", *TINY, *(["--serial"] if serial else []), "--out", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "REFBRAID_DEBUG": "",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=folder, start_new_session=True)
    try:
        if launcher:
            _ranks(out, int(launcher[launcher.index("-n") + 1]))
        else:
            _ready(proc.pid)
        time.sleep(delay_s)
        t_signal = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        stop_s = time.monotonic() - t_signal
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    status = None
    if (out / "log.json").exists():
        status = json.loads((out / "log.json").read_text())["status"]
    ok = None
    if (out / "checkpoint.npz").exists():
        try:
            load_checkpoint(out)
            ok = True
        except (ValueError, OSError):
            ok = False
    return Try(delay_s, serial, proc.returncode, stop_s, err, status, ok)


def run_length(serial: bool = True, workers: int = 1) -> float:
    """Seconds from the start-up guard to the exit of an untouched run, with ``workers`` of
    them running at once (the load the tries see); the median of their lengths."""
    def one(i: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [sys.executable, "-m", "refbraid", "train", *TINY,
                    *(["--serial"] if serial else []), "--out", str(Path(tmp) / "run")]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=env, cwd=tmp)
            _ready(proc.pid)
            t0 = time.monotonic()
            proc.wait(timeout=300)
            return time.monotonic() - t0

    with ThreadPoolExecutor(workers) as pool:
        lengths = sorted(pool.map(one, range(workers)))
    return lengths[len(lengths) // 2]


def many(n: int, span_s: float | None = None, workers: int = 4, seed: int = 0,
         launcher=(), redraws: int = 3) -> list[Try]:
    """``n`` tries, delays uniform in [0, span_s) (default: an untouched run's length under
    the same load), layer-parallel and --serial alternating. A try whose signal came after
    the run had finished is drawn again, uniform in [0, its delay), up to ``redraws`` times,
    so that (load permitting) every one of the ``n`` signals lands inside a run."""
    rng = random.Random(seed)
    span_s = run_length(workers=workers) if span_s is None else span_s
    plan = [(rng.uniform(0, span_s), i % 2 == 1) for i in range(n)]
    results: list[Try | None] = [None] * n
    todo = list(range(n))
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(workers) as pool:
        for attempt in range(redraws + 1):
            folders = [Path(tmp) / f"t{i}-{attempt}" for i in todo]
            for f in folders:
                f.mkdir()
            done = pool.map(lambda a: one_try(*plan[a[0]], a[1], launcher),
                            zip(todo, folders, strict=True))
            for i, t in zip(todo, done, strict=True):
                results[i] = t
            todo = [i for i in todo if results[i].returncode == 0]  # finished before it
            for i in todo:
                plan[i] = (rng.uniform(0, plan[i][0]), plan[i][1])
            if not todo:
                break
    return results


if __name__ == "__main__":  # pragma: no cover
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    span = float(sys.argv[2]) if len(sys.argv) > 2 else None
    for t in many(n, span):
        last = t.stderr.strip().splitlines()[-1:] or [""]
        print(f"{t.delay_s:6.2f} {'serial' if t.serial else 'lp    '} rc={t.returncode:4d} "
              f"stop={t.stop_s:5.2f}s status={t.status} ckpt={t.checkpoint_ok} "
              f"lines={len(t.stderr.strip().splitlines())} {last[0][:90]}")
