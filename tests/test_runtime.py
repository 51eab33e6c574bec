"""refbraid.runtime.pin_allocator: pins glibc's malloc thresholds, a safe no-op elsewhere."""

from __future__ import annotations

import subprocess
import sys

import pytest

from refbraid import runtime


@pytest.fixture
def fresh(monkeypatch):
    """pin_allocator as in a new process (it remembers that it pinned)."""
    monkeypatch.setattr(runtime, "_pinned", None)
    return monkeypatch


def test_opt_out_does_nothing(fresh):
    calls = []
    fresh.setattr(runtime, "_glibc_mallopt", lambda: calls.append(1))
    for value in ("0", "false", "OFF", "no"):
        assert runtime.pin_allocator({runtime.OPT_OUT_ENV: value}) is False
    assert calls == []  # never even looked for mallopt
    assert runtime._pinned is None


def test_no_glibc_is_a_no_op(fresh):
    fresh.setattr(runtime, "_glibc_mallopt", lambda: None)  # macOS, Windows, musl
    assert runtime.pin_allocator({}) is False
    assert runtime._pinned is None
    assert "default" in runtime.allocator_state()


def test_sets_the_three_parameters_once_and_user_variables_win(fresh):
    calls = []

    def mallopt(param, value):
        calls.append((param, value))
        return 1

    fresh.setattr(runtime, "_glibc_mallopt", lambda: mallopt)
    assert runtime.pin_allocator({"MALLOC_TOP_PAD_": "0"}) is True
    assert sorted(calls) == sorted([(runtime._M_MMAP_THRESHOLD, runtime.MMAP_THRESHOLD),
                                    (runtime._M_TRIM_THRESHOLD, runtime.TRIM_THRESHOLD)])
    assert runtime.pin_allocator({}) is True  # idempotent: no second round of calls
    assert len(calls) == 2
    assert runtime.allocator_state().startswith("malloc: pinned")


def test_refused_mallopt_reports_false(fresh):
    fresh.setattr(runtime, "_glibc_mallopt", lambda: (lambda param, value: 0))
    assert runtime.pin_allocator({}) is False
    assert runtime._pinned is None


def test_real_call_in_a_child_process_keeps_numpy_working():
    """The real mallopt (on glibc) or the no-op (elsewhere), then allocation-heavy NumPy."""
    code = ("import numpy as np\nfrom refbraid.runtime import pin_allocator, allocator_state\n"
            "ok = pin_allocator()\n"
            "a = [np.ones((1 << k,)) for k in range(10, 26)]\n"
            "del a[::2]\nb = np.zeros(40 << 20, dtype=np.uint8)\n"
            "print(ok, float(sum(x.sum() for x in a)), int(b.sum()), allocator_state())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    expected = float(sum((1 << k) for k in range(11, 26, 2)))
    assert float(out[1]) == expected and out[2] == "0"
    if sys.platform.startswith("linux") and runtime._glibc_mallopt() is not None:
        assert out[0] == "True" and "pinned" in " ".join(out[3:])
