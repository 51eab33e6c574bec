"""Under ``mpiexec -n 2`` an error ends the job like one process: the same exit code (2 bad
input, 3 diverged, 1 anything else, 130 Ctrl-C — see test_sigint.py), the same one line,
printed once, without MPICH's "Abort(...)" text."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from refbraid.cli import EXIT_DIVERGED, EXIT_ERROR, EXIT_USAGE
from refbraid.parallel.launch import run_mpi

from .sigint_probe import ROOT

TINY = ["--samples", "60", "--layers", "8", "--width", "4", "--levels", "2", "--epochs", "2",
        "--quiet"]


def _one_process(argv: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "refbraid", *argv], capture_output=True,
                          text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "REFBRAID_DEBUG": ""})


CASES = [  # (id, flags after `train`, exit code)
    ("bad-flag-combination", ["--layers", "2"], EXIT_USAGE),
    ("corrupt-resume", ["--resume", "corrupt.npz"], EXIT_USAGE),
    ("diverged", ["--lr", "1e9", "--serial", "--epochs", "3"], EXIT_DIVERGED),
]


@pytest.mark.slow
@pytest.mark.parametrize("case_id, flags, code", CASES, ids=[c[0] for c in CASES])
def test_an_mpi_error_exits_like_one_process(tmp_path, case_id, flags, code):
    (tmp_path / "corrupt.npz").write_bytes(b"not a checkpoint")
    argv = ["train", *TINY, *flags]
    alone = _one_process([*argv, "--out", "alone"], tmp_path)
    assert alone.returncode == code, alone.stderr
    expected = alone.stderr.strip().split(" Kept ")[0]  # the files kept may differ
    assert len(expected.splitlines()) == 1, alone.stderr
    job = run_mpi(2, ["-m", "refbraid", *argv, "--out", "mpi"], timeout=300, cwd=tmp_path,
                  env={"PYTHONPATH": str(ROOT), "REFBRAID_DEBUG": ""})
    assert job.returncode == code, job.output
    lines = job.output.strip().splitlines()
    assert [line.split(" Kept ")[0] for line in lines] == [expected], job.output
    assert "Abort(" not in job.output and "MPI_Abort" not in job.output


#: ``refbraid`` with a bug injected into training (every rank raises the same RuntimeError):
#: what the user reads for "anything else" (exit 1), which no bad input can provoke on purpose
WITH_A_BUG = """
import sys
import refbraid.training.run as run
def fit(*args, **kwargs):
    raise RuntimeError("a bug injected by the test")
run.fit = fit
from refbraid.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_an_internal_error_under_mpi_exits_like_one_process(tmp_path):
    argv = ["train", *TINY]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REFBRAID_DEBUG": ""}
    alone = subprocess.run([sys.executable, "-c", WITH_A_BUG, *argv, "--out", "alone"],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert alone.returncode == EXIT_ERROR, alone.stderr
    expected = alone.stderr.strip().split(" Kept ")[0]
    assert len(expected.splitlines()) == 1 and "internal error: RuntimeError" in expected
    job = run_mpi(2, ["-c", WITH_A_BUG, *argv, "--out", "mpi"], timeout=300, cwd=tmp_path,
                  env={"PYTHONPATH": str(ROOT), "REFBRAID_DEBUG": ""})
    assert job.returncode == EXIT_ERROR, job.output
    lines = job.output.strip().splitlines()
    assert [line.split(" Kept ")[0] for line in lines] == [expected], job.output
    assert "Abort(" not in job.output and "MPI_Abort" not in job.output
