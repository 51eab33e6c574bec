"""Lesson 12 (data, space, depth) runs end to end in small mode: its own assertions check the
halo adjoint, the split network against backprop, space × depth against one-process MGRIT,
DASO against synchronous training, and it saves its figure only when asked."""

import runpy
from pathlib import Path

import pytest

LESSON = Path(__file__).resolve().parents[1] / "lessons" / "12_data_space_depth.py"


@pytest.mark.lesson_script
@pytest.mark.mpi
@pytest.mark.slow
def test_lesson_12_runs_in_small_mode_and_saves_its_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    runpy.run_path(str(LESSON), run_name="__main__")
    assert (tmp_path / "12_data_space_depth.png").is_file()
