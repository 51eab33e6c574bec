"""Bad input through ``refbraid train``: one line naming the flag, a non-zero exit, no traceback.

Each case is ``(id, flags, exit code, pattern the one-line message must match)``. The command
runs in-process (``refbraid.cli.main``), so a case costs milliseconds unless it trains; a few
run as a real subprocess to prove that the user sees no Python traceback.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refbraid.backends.cupy_gpu import is_usable as cupy_usable
from refbraid.cli import EXIT_DIVERGED, EXIT_ERROR, EXIT_USAGE, main
from refbraid.data.mnist_idx import IMAGES, LABELS, write_idx

TINY = ["--samples", "200", "--layers", "16", "--width", "4", "--epochs", "1", "--quiet"]
U = EXIT_USAGE

#: (id, flags, exit code, regex for the message). ``{tmp}`` is a fresh folder per case.
CASES = [
    # numbers out of range
    ("layers-zero", ["--layers", "0"], U, r"`--layers` must be a positive integer, got 0"),
    ("layers-negative", ["--layers", "-3"], U, r"`--layers`"),
    ("width-zero", ["--width", "0"], U, r"`--width`"),
    ("epochs-zero", ["--epochs", "0"], U, r"`--epochs`"),
    ("batch-zero", ["--batch-size", "0"], U, r"`--batch-size`"),
    ("lr-zero", ["--lr", "0"], U, r"`--lr` must be a positive finite number"),
    ("lr-negative", ["--lr", "-1"], U, r"`--lr`"),
    ("lr-nan", ["--lr", "nan"], U, r"`--lr`.*nan"),
    ("lr-inf", ["--lr", "inf"], U, r"`--lr`.*inf"),
    ("T-zero", ["--T", "0"], U, r"`--T`"),
    ("T-negative", ["--T", "-2"], U, r"`--T`"),
    ("momentum-one", ["--momentum", "1.0"], U, r"`--momentum`"),
    ("val-fraction-zero", ["--val-fraction", "0"], U, r"`--val-fraction`"),
    ("val-fraction-above-one", ["--val-fraction", "1.5"], U, r"`--val-fraction`"),
    ("samples-one", ["--samples", "1"], U, r"`--samples`"),
    ("levels-zero", ["--levels", "0"], U, r"`--levels`"),
    ("cfactor-one", ["--cfactor", "1"], U, r"`--cfactor`"),
    ("fwd-iters-negative", ["--fwd-iters", "-1"], U, r"`--fwd-iters`"),
    ("bwd-tol-zero", ["--bwd-tol", "0"], U, r"`--bwd-tol`"),
    ("checkpoint-every-negative", ["--checkpoint-every", "-1"], U, r"`--checkpoint-every`"),
    ("data-parallel-zero", ["--data-parallel", "0"], U, r"`--data-parallel`"),
    ("seed-negative", ["--seed", "-1"], U, r"`--seed`"),
    ("check-gradient-negative", ["--check-gradient-every", "-2"], U,
     r"`--check-gradient-every`"),
    # names that are not choices
    ("relax-unknown", ["--relax", "X"], U, r"`--relax`"),
    ("relax-empty-entry", ["--relax", "F,,FCF"], U, r"`--relax`"),
    ("relax-longer-than-levels", ["--relax", "F,FCF,F,F"], U, r"`--relax`.*level"),
    ("cycle-unknown", ["--cycle", "W"], U, r"`--cycle`"),
    ("data-unknown", ["--data", "cifar"], U, r"`--data`"),
    ("model-unknown", ["--model", "vgg"], U, r"`--model`"),
    ("activation-unknown", ["--activation", "sigmoid"], U, r"`--activation`"),
    ("optimizer-unknown", ["--optimizer", "rmsprop"], U, r"`--optimizer`"),
    ("backend-unknown", ["--backend", "jax"], U, r"`--backend`"),
    ("dtype-unknown", ["--dtype", "float16"], U, r"`--dtype`"),
    # combinations that cannot work
    ("mnist-without-data-dir", ["--data", "mnist"], U, r"`--data-dir` is required"),
    ("mnist-missing-folder", ["--data", "mnist", "--data-dir", "{tmp}/nowhere"], U,
     r"`data_dir` .*nowhere.* is not a folder"),
    ("mnist-missing-files", ["--data", "mnist", "--data-dir", "{tmp}"], U,
     r"MNIST files missing"),
    ("levels-do-not-fit-layers", ["--layers", "4"], U,
     r"`--levels 3` with `--cfactor 4` does not fit `--layers 4`"),
    ("gru-sequence-too-short", ["--model", "gru", "--data", "peaks"], U,
     r"sequence length 2 of `--data peaks`"),
    ("epochs-below-checkpoint", ["--resume", "{ckpt}", "--epochs", "1"], U,
     r"`--epochs` 1 is below the checkpoint's epoch 2"),
    ("resume-other-network", ["--resume", "{ckpt}", "--epochs", "3", "--width", "8"], U,
     r"does not match this run: `--width`"),
    # the output folder, checked before any work
    ("out-empty", ["--out", ""], U, r"`--out`"),
    ("out-is-a-file", ["--out", "{tmp}/file.txt"], U, r"`--out` .*file\.txt.* is a file"),
    ("out-inside-a-file", ["--out", "{tmp}/file.txt/run"], U,
     r"`--out` .* cannot be created: a part of it is a file"),
    ("out-is-a-device", ["--out", "/dev/null"], U, r"`--out` '/dev/null' is not a folder"),
    ("out-name-too-long", ["--out", "{tmp}/" + "x" * 300], U,
     r"`--out` .* cannot be created: File name too long"),
    ("out-holds-a-run", ["--out", "{run}"], U,
     r"`--out` .* already holds a run \(status 'finished' at epoch 2\).*`--overwrite`"),
    # the resume checkpoint
    ("resume-missing", ["--resume", "{tmp}/nothing.npz"], U, r"`--resume` checkpoint .*"
     r"nothing\.npz.* does not exist"),
    ("resume-corrupt", ["--resume", "{tmp}/file.txt"], U,
     r"`--resume` checkpoint .*file\.txt.* is not a .npz archive of arrays"),
    ("resume-nan-weights", ["--resume", "{nan_ckpt}", "--epochs", "3"], U,
     r"checkpoint .*nan.* holds NaN or infinite values in \['steps\.W'\]"),
    ("resume-incomplete-optimizer", ["--resume", "{opt_ckpt}", "--epochs", "3"], U,
     r"checkpoint .*incomplete.* optimizer state.*exp_avg"),
    pytest.param("backend-cupy-without-gpu", ["--backend", "cupy"], U,
                 r"`--backend cupy` needs an NVIDIA GPU", id="backend-cupy-without-gpu",
                 marks=pytest.mark.skipif(cupy_usable(), reason="a GPU runs CuPy here")),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 2-epoch run with a checkpoint (the resume cases start from it)."""
    out = tmp_path_factory.mktemp("finished")
    assert main(["train", *TINY, "--epochs", "2", "--serial", "--checkpoint-every", "1",
                 "--out", str(out)]) == 0
    return out


def _doctored_checkpoint(src: Path, dest: Path, change) -> Path:
    """A copy of checkpoint ``src`` with ``change(arrays)`` applied to its arrays."""
    with np.load(src / "checkpoint.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(arrays)
    dest.mkdir(parents=True, exist_ok=True)
    np.savez(dest / "checkpoint.npz", **arrays)
    return dest / "checkpoint.npz"


def _nan_weights(arrays):
    arrays["param/steps.W"] = np.full_like(arrays["param/steps.W"], np.nan)


def _drop_adam_buffer(arrays):
    del arrays["optim/exp_avg/steps.W"]


def _fill(arg: str, tmp: Path, finished: Path) -> str:
    if "{nan_ckpt}" in arg:
        return str(_doctored_checkpoint(finished, tmp / "nan", _nan_weights))
    if "{opt_ckpt}" in arg:
        return str(_doctored_checkpoint(finished, tmp / "incomplete", _drop_adam_buffer))
    return arg.format(tmp=tmp, ckpt=finished / "checkpoint.npz", run=finished)


@pytest.mark.parametrize("case_id, flags, code, pattern", CASES,
                         ids=[c[0] if isinstance(c, tuple) else c.id for c in CASES])
def test_bad_input_gives_one_named_line_and_a_nonzero_exit(case_id, flags, code, pattern,
                                                           tmp_path, finished_run, capsys):
    (tmp_path / "file.txt").write_text("not a folder, not a checkpoint")
    argv = [_fill(a, tmp_path, finished_run) for a in flags]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    got = main(["train", *TINY, *argv])
    err = capsys.readouterr().err
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refbraid train: error: "), err
    assert "Traceback" not in err
    assert re.search(pattern, lines[0]), f"{lines[0]!r} does not match {pattern!r}"
    assert case_id


def test_the_catalogue_is_large_enough():
    assert len(CASES) >= 45


# ----------------------------------------------------------------------------- data files
def _mnist_folder(folder: Path, n: int = 20) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / (IMAGES + ".gz"), rng.integers(0, 255, (n, 28, 28), dtype=np.uint8))
    write_idx(folder / (LABELS + ".gz"), rng.integers(0, 10, n, dtype=np.uint8))
    return folder


@pytest.mark.parametrize("damage", ["truncated", "not-gzip"])
def test_a_damaged_gzip_mnist_file_is_named(tmp_path, capsys, damage):
    folder = _mnist_folder(tmp_path / "mnist")
    images = folder / (IMAGES + ".gz")
    blob = images.read_bytes()
    images.write_bytes(blob[: len(blob) // 2] if damage == "truncated" else b"garbage" * 50)
    code = main(["train", *TINY, "--data", "mnist", "--data-dir", str(folder), "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
    assert "train-images-idx3-ubyte.gz' cannot be read" in err and "damaged" in err


def test_a_gzip_mnist_folder_that_is_fine_trains(tmp_path):
    folder = _mnist_folder(tmp_path / "mnist", n=40)
    with gzip.open(folder / (IMAGES + ".gz")) as fh:
        assert len(fh.read()) == 16 + 40 * 28 * 28
    assert main(["train", "--data", "mnist", "--data-dir", str(folder), "--model", "conv",
                 "--layers", "2", "--width", "2", "--epochs", "1", "--serial", "--quiet",
                 "--out", str(tmp_path / "out")]) == 0


# ----------------------------------------------------------------------------- divergence
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_a_finite_loss_that_blows_up_is_diverged_not_finished(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", *TINY, "--epochs", "3", "--lr", "1e9", "--serial", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == EXIT_DIVERGED, err
    assert err.startswith("refbraid train: diverged: the training loss diverged") \
        or "became" in err, err
    assert "--lr" in err and len(err.strip().splitlines()) == 1
    log = json.loads((out / "log.json").read_text())
    assert log["status"] == "diverged"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_network_that_overflows_at_its_first_step_does_not_blame_the_learning_rate(
        tmp_path, capsys):
    code = main(["train", *TINY, "--T", "1e300", "--serial", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == EXIT_DIVERGED, err
    assert "before any update" in err and "`--T`" in err and "smaller learning rate" not in err


# ----------------------------------------------------------------------------- the command
def test_version_prints_the_package_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"refbraid {version('refbraid')}"


@pytest.mark.parametrize("argv", [["train", "--layers", "abc"], ["train", "--frobnicate"],
                                  ["fly"]], ids=["not-an-int", "unknown-flag", "no-command"])
def test_argparse_errors_exit_2_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_help_lists_every_file_a_run_writes(capsys):
    from refbraid.training.run_folder import RUN_FILES

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in RUN_FILES:
        assert name in text, name
    assert "exact-forward val acc" in text and "--overwrite" in text


@pytest.mark.parametrize("flags, code, message", [
    (["--layers", "0"], EXIT_USAGE, "refbraid train: error: `--layers` must be"),
    (["--out", "/dev/null"], EXIT_USAGE, "refbraid train: error: `--out` '/dev/null'"),
    (["--samples", "1000000000000"], EXIT_ERROR, "refbraid train: out of memory"),
], ids=["config", "out-device", "out-of-memory"])
def test_a_user_at_the_terminal_sees_one_line_and_no_traceback(flags, code, message, tmp_path):
    env = {**os.environ, "REFBRAID_DEBUG": ""}
    run = subprocess.run([sys.executable, "-m", "refbraid", "train", *TINY, "--serial",
                          "--out", str(tmp_path / "out"), *flags], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == code, run.stderr
    assert run.stderr.startswith(message), run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_debug_shows_the_traceback(tmp_path):
    run = subprocess.run([sys.executable, "-m", "refbraid", "train", "--layers", "0", "--debug"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode != 0 and "Traceback" in run.stderr and "`--layers`" in run.stderr


def test_backend_cuda_without_a_gpu_points_at_the_simulator(tmp_path):
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    probe = subprocess.run([sys.executable, "-c", "from refbraid.backends.numba_cuda import "
                            "is_usable; print(is_usable())"], capture_output=True, text=True,
                           env=env, timeout=120)
    if probe.stdout.strip() == "True":
        pytest.skip("a GPU is present: --backend cuda runs")
    run = subprocess.run([sys.executable, "-m", "refbraid", "train", *TINY, "--backend", "cuda",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == EXIT_USAGE
    line = run.stderr.strip()
    assert line.startswith("refbraid train: error: `--backend cuda` needs an NVIDIA GPU")
    assert "NUMBA_ENABLE_CUDASIM=1" in line and "\n" not in line
    assert not (tmp_path / "out").exists()  # refused before the folder was touched
