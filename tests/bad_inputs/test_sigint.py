"""Ctrl-C always stops ``refbraid train``: at a random moment, inside a weakref callback, at
start-up, under ``mpiexec``.

Each try starts a tiny real run and sends SIGINT after a random delay drawn over the length
of one untouched run (start-up imports, Numba compilation, epochs, checkpoint writes, figures,
the final gradient-error study). Every try must end within a second of the signal with exit
code 130 and one line on stderr, its ``log.json`` (when the run got far enough to write one)
saying "interrupted" and its checkpoint (when there is one) loadable. A signal that lands after
the run has written everything ends nothing: exit 0 with status "finished" (counted, and then
the code and the status must agree).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from refbraid.parallel.launch import find_mpiexec

from .sigint_probe import ROOT, many

STOP_S = 1.0  # a Ctrl-C ends the process within this many seconds


def _check(tries) -> dict:
    late = 0
    for t in tries:
        lines = t.stderr.strip().splitlines()
        what = f"SIGINT {t.delay_s:.2f} s in ({'serial' if t.serial else 'layer-parallel'})"
        assert t.stop_s < STOP_S, f"{what}: stopped after {t.stop_s:.2f} s"
        assert "Traceback" not in t.stderr and "Exception ignored" not in t.stderr, t.stderr
        if t.returncode == 0:  # the run had finished writing everything
            assert t.status == "finished" and not lines, (what, t.stderr)
            late += 1
            continue
        assert t.returncode == 130, f"{what}: exit {t.returncode}: {t.stderr}"
        assert len(lines) == 1 and "interrupted (Ctrl-C)" in lines[0], (what, t.stderr)
        assert t.status in (None, "interrupted"), (what, t.status)
        assert t.checkpoint_ok in (None, True), what
    return {"tries": len(tries), "before_the_log": sum(t.status is None for t in tries),
            "interrupted": sum(t.status == "interrupted" for t in tries), "late": late,
            "worst_stop_s": round(max(t.stop_s for t in tries), 3)}


@pytest.mark.slow
def test_sigint_at_50_random_moments_always_stops_within_a_second():
    summary = _check(many(50, workers=4, seed=1))
    assert summary["late"] <= 2, summary  # late ones are drawn again: they land in the run
    assert summary["before_the_log"] and summary["interrupted"], summary  # both phases hit
    print(summary)


@pytest.mark.slow
def test_sigint_under_mpiexec_stops_the_job_with_one_line_and_exit_130():
    tries = many(4, workers=2, seed=2, launcher=(find_mpiexec(), "-n", "2"))
    print(_check(tries))


_CALLBACK = textwrap.dedent("""
    import os, signal, sys, time, weakref
    from refbraid import interrupts

    class Thing:
        pass

    def callback(ref):  # Python cannot raise from here: it prints "Exception ignored"
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))

    with interrupts.graceful(rank=0):
        t0 = time.monotonic()
        try:
            things = weakref.WeakKeyDictionary()
            thing = Thing()
            keep = weakref.ref(thing, callback)
            things[thing] = 1
            del thing  # both callbacks run now; the interrupt is raised inside one
            while time.monotonic() - t0 < 10:
                sum(range(100))  # no check() here: only the redelivery can stop this loop
            print("not stopped")
        except KeyboardInterrupt:
            print(f"stopped {time.monotonic() - t0:.3f}")
            print("pending" if interrupts.requested() else "clear")
""")

_SWALLOWED = textwrap.dedent("""
    import os, signal
    from refbraid import interrupts

    with interrupts.graceful(rank=0):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))
        except BaseException:  # a library that swallows everything
            pass
        try:
            interrupts.check()  # the next safe point of the loop
            print("not stopped")
        except KeyboardInterrupt:
            print("stopped at the safe point")
""")

_PRINTED_BY_C = textwrap.dedent("""
    import ctypes, os, signal, sys, tempfile
    from pathlib import Path
    from refbraid import interrupts

    folder = tempfile.mkdtemp()
    Path(folder, "halted.py").write_text("import os, signal\\n"
                                         "os.kill(os.getpid(), signal.SIGINT)\\n"
                                         "sum(range(1000))\\n")
    sys.path.insert(0, folder)
    with interrupts.graceful(rank=0):
        # C code that imports a module and prints the error itself (PyErr_Print), as NumPy's
        # import_array() and Numba's dispatcher do before raising ImportError
        code = ctypes.pythonapi.PyRun_SimpleString(b"import halted")
        print(f"C code returned {code}")
        try:
            interrupts.check()
            print("not stopped")
        except KeyboardInterrupt:
            print("stopped at the safe point")
    sys.excepthook(ValueError, ValueError("after the command"), None)  # printed as before
""")


_IN_THE_HOOK = textwrap.dedent("""
    import os, signal, sys, time
    from types import SimpleNamespace
    from refbraid import interrupts

    with interrupts.graceful(rank=0):
        interrupts._requested = True  # as after a KeyboardInterrupt swallowed in a callback
        arm, calls = interrupts._redeliver_later, []

        def arm_then_sigint():  # the hook arms the timer, then a SIGINT lands inside the hook
            calls.append(1)
            arm()
            if len(calls) == 1:
                os.kill(os.getpid(), signal.SIGINT)
                sum(range(1000))

        interrupts._redeliver_later = arm_then_sigint
        t0 = time.monotonic()
        try:
            sys.unraisablehook(SimpleNamespace(exc_type=KeyboardInterrupt,
                                               exc_value=KeyboardInterrupt(),
                                               exc_traceback=None, err_msg=None, object=None))
            while time.monotonic() - t0 < 10:
                sum(range(100))
            print("not stopped")
        except KeyboardInterrupt:
            print(f"stopped {time.monotonic() - t0:.3f} after {len(calls)} arms")
""")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_an_interrupt_swallowed_in_a_weakref_callback_is_delivered_again():
    done = _python(_CALLBACK)
    assert done.stdout.startswith("stopped "), done.stdout + done.stderr
    assert float(done.stdout.split()[1]) < STOP_S
    assert "Exception ignored" not in done.stderr, done.stderr


def test_an_interrupt_landing_inside_the_hook_is_delivered_again():
    done = _python(_IN_THE_HOOK)
    assert done.stdout.startswith("stopped "), done.stdout + done.stderr
    assert float(done.stdout.split()[1]) < STOP_S and "after 2 arms" in done.stdout
    assert "Exception ignored" not in done.stderr, done.stderr


def test_an_interrupt_c_code_prints_is_not_shown_and_stops_the_run():
    done = _python(_PRINTED_BY_C)
    assert done.stdout.split("\n")[:2] == ["C code returned -1", "stopped at the safe point"], \
        done.stdout + done.stderr
    assert "KeyboardInterrupt" not in done.stderr, done.stderr  # the text CI once saw
    assert "ValueError: after the command" in done.stderr, done.stderr  # hook given back


def test_an_interrupt_a_library_swallowed_stops_at_the_next_safe_point():
    done = _python(_SWALLOWED)
    assert done.stdout.strip() == "stopped at the safe point", done.stdout + done.stderr


def test_sigint_during_start_up_imports_is_one_line_and_exit_130(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    # the guard comes first in refbraid/__init__: a signal as soon as numpy is being imported
    code = ("import os, signal, sys; sys.argv = ['refbraid', 'train']; "
            "sys.orig_argv = ['python', '-m', 'refbraid', 'train']; import refbraid.interrupts "
            "as i; i.guard_startup(); os.kill(os.getpid(), signal.SIGINT); import numpy; "
            "print('not stopped')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=env)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "refbraid train: interrupted (Ctrl-C).\n"
    assert "not stopped" not in done.stdout


def test_importing_refbraid_as_a_library_leaves_sigint_alone():
    # The child starts with SIGINT at its default disposition whatever the test runner's is (a
    # process that inherits SIGINT ignored keeps it ignored, and Python installs no handler).
    code = ("import signal; before = signal.getsignal(signal.SIGINT); import refbraid; "
            "after = signal.getsignal(signal.SIGINT); "
            "print(after is before, after is signal.default_int_handler)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr


def test_sigint_is_restored_after_a_command_in_process(tmp_path):
    from refbraid.cli import main

    before = signal.getsignal(signal.SIGINT)
    assert main(["train", "--samples", "60", "--layers", "8", "--width", "4", "--levels", "2",
                 "--epochs", "1", "--quiet", "--serial", "--out", str(tmp_path / "r")]) == 0
    assert signal.getsignal(signal.SIGINT) is before


def test_an_error_a_ctrl_c_caused_ends_the_run_as_interrupted():
    """A KeyboardInterrupt turned into another error on its way out (an import it halted
    fails again with ImportError; a library wraps it) is still the user's Ctrl-C: exit 130
    and status "interrupted", never "error" with exit 2."""
    from refbraid import interrupts
    from refbraid.exits import EXIT_INTERRUPTED, explain
    from refbraid.training.trainer import run_status

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("import of refbraid.x halted; None in sys.modules") from None
    except ImportError as err:
        wrapped = err
    assert explain(wrapped)[1] == EXIT_INTERRUPTED and run_status(wrapped) == "interrupted"

    plain = ImportError("no module named x")
    assert explain(plain)[1] != EXIT_INTERRUPTED and run_status(plain) == "error"
    with interrupts.graceful():
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass
        assert run_status(plain) == "interrupted"  # what the trainer records inside the run
        with pytest.raises(KeyboardInterrupt) as raised:  # and how it passes the error on
            try:
                raise plain
            except ImportError as err:
                interrupts.reraise(err)
        assert raised.value.__cause__ is plain and explain(raised.value)[1] == EXIT_INTERRUPTED
    assert not interrupts.requested()  # the command's end clears it
