"""Lesson 11 (gradient bias in layer-parallel transformers) runs end to end in small mode (its
own assertions are the checks) and saves its figure when asked."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

LESSON = Path(__file__).resolve().parent.parent / "lessons" / "11_gradient_bias.py"


@pytest.mark.slow  # four short training runs: ~5 s idle, ~40 s on 2 busy shared cores
@pytest.mark.lesson_script
def test_lesson_11_runs_in_small_mode_and_saves_its_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(LESSON), run_name="__main__")  # the lesson's own asserts must pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["11_gradient_bias.png"]
