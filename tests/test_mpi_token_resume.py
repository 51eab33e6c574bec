"""A token model's checkpoint from ``mpiexec refbraid train`` resumes in one process (and the
reverse): the untied GPT, bit-identical to an uninterrupted single-process run with a pure
layer-parallel split, as tests/test_mpi_launch.py checks for the ResNets."""

from pathlib import Path

import numpy as np
import pytest

from refbraid.cli import main
from refbraid.parallel.launch import run_mpi
from refbraid.training.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 240


@pytest.mark.mpi
@pytest.mark.slow  # four short runs, two of them under mpiexec
def test_gpt_checkpoints_resume_across_mpi_and_one_process(tmp_path):
    flags = ["train", "--model", "gpt-untied", "--levels", "2", "--width", "8", "--samples",
             "120", "--quiet", "--checkpoint-every", "1"]

    def out(name):
        return ["--out", str(tmp_path / name)]

    def mpi(*extra):
        run = run_mpi(3, ["-m", "refbraid", *flags, *extra], timeout=TIMEOUT, cwd=ROOT)
        assert run.ok, run.output

    assert main([*flags, "--epochs", "2", *out("whole")]) == 0  # the oracle, uninterrupted
    assert main([*flags, "--epochs", "1", *out("one")]) == 0
    mpi("--epochs", "1", *out("mpi"))
    mpi("--epochs", "2", "--resume", str(tmp_path / "one"), *out("one-then-mpi"))
    assert main([*flags, "--epochs", "2", "--resume", str(tmp_path / "mpi"),
                 *out("mpi-then-one")]) == 0
    whole = load_checkpoint(tmp_path / "whole" / "checkpoint.npz")
    for run in ("one-then-mpi", "mpi-then-one"):
        ckpt = load_checkpoint(tmp_path / run / "checkpoint.npz")
        assert ckpt.epoch == 2 and set(ckpt.params) == set(whole.params), run
        assert [r["train_loss"] for r in ckpt.history] == \
            [r["train_loss"] for r in whole.history], run
        for k in whole.params:
            np.testing.assert_array_equal(ckpt.params[k], whole.params[k], err_msg=f"{run} {k}")
