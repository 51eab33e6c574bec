"""The tied GPT (with buffer layers) and the autoregressive encoder–decoder under ``mpiexec
refbraid train``: the CLI trains them on 2 ranks, prints the GPT's generated samples, and their
checkpoints resume in one process and back, bit-identical to an uninterrupted single-process run
(pure layer parallelism), as tests/test_mpi_token_resume.py checks for the untied GPT."""

from pathlib import Path

import numpy as np
import pytest

from refbraid.cli import main
from refbraid.parallel.launch import run_mpi
from refbraid.training.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 240
MODELS = {
    "gpt": ["--model", "gpt", "--layers", "6", "--buffer", "1"],
    "transformer-seq2seq": ["--model", "transformer-seq2seq", "--layers", "4"],
}


@pytest.mark.mpi
@pytest.mark.slow  # five short runs each, two of them under mpiexec
@pytest.mark.parametrize("model", list(MODELS))
def test_checkpoints_resume_across_mpi_and_one_process(tmp_path, model):
    flags = ["train", *MODELS[model], "--levels", "2", "--width", "8", "--samples", "48",
             "--checkpoint-every", "1"]

    def out(name):
        return ["--out", str(tmp_path / name)]

    def mpi(*extra):
        run = run_mpi(2, ["-m", "refbraid", *flags, *extra], timeout=TIMEOUT, cwd=ROOT)
        assert run.ok, run.output
        return run.output

    quiet = ["--quiet"]
    assert main([*flags, *quiet, "--epochs", "2", *out("whole")]) == 0  # the oracle
    assert main([*flags, *quiet, "--epochs", "1", *out("one")]) == 0
    printed = mpi("--epochs", "1", *out("mpi"))  # not quiet: what a user sees
    assert "epoch 1/1" in printed and "finished" in printed, printed
    if model == "gpt":  # generation prints samples
        assert "perplexity" in printed and "generated:" in printed, printed
    mpi(*quiet, "--epochs", "2", "--resume", str(tmp_path / "one"), *out("one-then-mpi"))
    assert main([*flags, *quiet, "--epochs", "2", "--resume", str(tmp_path / "mpi"),
                 *out("mpi-then-one")]) == 0
    whole = load_checkpoint(tmp_path / "whole" / "checkpoint.npz")
    for run in ("one-then-mpi", "mpi-then-one"):
        ckpt = load_checkpoint(tmp_path / run / "checkpoint.npz")
        assert ckpt.epoch == 2 and set(ckpt.params) == set(whole.params), run
        assert [r["train_loss"] for r in ckpt.history] == \
            [r["train_loss"] for r in whole.history], run
        for k in whole.params:
            np.testing.assert_array_equal(ckpt.params[k], whole.params[k], err_msg=f"{run} {k}")
