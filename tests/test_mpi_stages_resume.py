"""``refbraid train --model conv-stages`` under ``mpiexec``: a checkpoint from an MPI run
resumes in one process and the reverse, bit-identical to an uninterrupted single-process run
(pure layer parallelism over 3 ranks: N = 8 fine steps, 4 coarse intervals, uneven blocks);
with ``--batch-norm`` the MPI run's parameters and history (whose accuracies are measured with
the running statistics) equal the single-process run's, and an MPI checkpoint's running
statistics resume in one process bit for bit."""

from pathlib import Path

import numpy as np
import pytest

from refbraid.cli import main
from refbraid.parallel.launch import run_mpi
from refbraid.training.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 240
FLAGS = ["train", "--model", "conv-stages", "--layers", "7", "--levels", "2", "--samples",
         "120", "--quiet", "--checkpoint-every", "1"]


def _same_run(got, want, what):
    assert got.epoch == want.epoch and set(got.params) == set(want.params), what
    assert [r["train_loss"] for r in got.history] == \
        [r["train_loss"] for r in want.history], what
    assert [r["val_acc"] for r in got.history] == [r["val_acc"] for r in want.history], what
    for k in want.params:
        np.testing.assert_array_equal(got.params[k], want.params[k], err_msg=f"{what} {k}")


@pytest.mark.mpi
@pytest.mark.slow  # four short single-process runs and three under mpiexec
def test_conv_stages_checkpoints_resume_across_mpi_and_one_process(tmp_path):
    def out(name):
        return ["--out", str(tmp_path / name)]

    def mpi(*extra):
        run = run_mpi(3, ["-m", "refbraid", *FLAGS, *extra], timeout=TIMEOUT, cwd=ROOT)
        assert run.ok, run.output

    def ckpt(name):
        return load_checkpoint(tmp_path / name / "checkpoint.npz")

    assert main([*FLAGS, "--epochs", "2", *out("whole")]) == 0  # the oracle, uninterrupted
    assert main([*FLAGS, "--epochs", "1", *out("one")]) == 0
    mpi("--epochs", "1", *out("mpi"))
    mpi("--epochs", "2", "--resume", str(tmp_path / "one"), *out("one-then-mpi"))
    assert main([*FLAGS, "--epochs", "2", "--resume", str(tmp_path / "mpi"),
                 *out("mpi-then-one")]) == 0
    for run in ("one-then-mpi", "mpi-then-one"):
        _same_run(ckpt(run), ckpt("whole"), run)
    bn = ["--batch-norm", "--transition", "strided", "--epochs", "2"]
    assert main([*FLAGS, *bn, *out("bn-one")]) == 0
    mpi(*bn, *out("bn-mpi"))
    _same_run(ckpt("bn-mpi"), ckpt("bn-one"), "batch norm")
    # batch norm's running statistics travel in the checkpoint: MPI epoch 1, one process epoch 2
    bn1 = [a if a != "2" else "1" for a in bn]
    mpi(*bn1, *out("bn-mpi-1"))
    assert main([*FLAGS, *bn, "--resume", str(tmp_path / "bn-mpi-1"),
                 *out("bn-mpi-then-one")]) == 0
    got, want = ckpt("bn-mpi-then-one"), ckpt("bn-one")
    _same_run(got, want, "batch norm resumed")
    assert want.buffers and set(got.buffers) == set(want.buffers)
    for k in want.buffers:
        np.testing.assert_array_equal(got.buffers[k], want.buffers[k], err_msg=k)
