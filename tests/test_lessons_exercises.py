"""Every exercise check PASSes on its reference solution and FAILs on a typical wrong answer
with a message that says where (index, point, rank, case) and how large the error is."""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.layer_parallel import LayerParallelSettings
from refbraid.lessons import exercises, notebooks, solutions
from refbraid.lessons.checking import Verdict
from refbraid.mgrit import MGRITSettings
from refbraid.mgrit.theory import dahlquist_eigenvalues, two_level_bound

CHECKS = [c for checks in exercises.EXERCISES.values() for c in checks]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_every_check_passes_on_its_reference_solution(check, capsys):
    verdict = check(exercises.solution_for(check))
    assert verdict.passed and verdict, verdict
    assert capsys.readouterr().out.startswith("PASS")


#: lessons whose exercise is still to come
WITHOUT_EXERCISE: set[str] = set()


def test_every_lesson_has_an_exercise():
    numbers = [lesson.number for lesson in notebooks.find_lessons()]
    assert {"00", "01", "09", "10", "12", "13"} <= set(numbers)
    want = [n for n in numbers if n not in WITHOUT_EXERCISE]
    assert list(exercises.EXERCISES) == want


def test_lessons_show_the_students_result_only():
    """An exercise cell checks the student's function; checking the reference solution is
    this file's job, so an untouched notebook shows TODO, never a reference PASS."""
    for lesson in notebooks.find_lessons():
        source = lesson.path.read_text()
        assert "(solutions." not in source, lesson.stem
        assert "check_all(" not in source, lesson.stem


# ----------------------------------------------------------------------------- wrong answers
def _euler_with_n_plus_1_intervals(y0, lam, T, N):
    h = T / (N + 1)
    return y0 * (1 + h * lam) ** np.arange(N + 1)
def _resnet_without_transpose(x, W, b, h):
    states = [x]
    for n in range(len(W)):
        states.append(states[-1] + h * np.tanh(states[-1] @ W[n] + b[n]))
    return np.stack(states)


def _adjoint_without_identity(W, b, y, dy_next, h):
    dy, dW, db = solutions.dense_step_adjoint(W, b, y, dy_next, h)
    return dy - dy_next, dW, db


def _jacobi_relaxation(u, step, m):
    old, new = np.array(u, float), np.array(u, float)
    for k in range(1, len(u)):
        if k % m:
            new[k] = step(old[k - 1], k - 1, k)
    return new


def _relaxation_of_every_point(u, step, m):
    u = np.array(u, float)
    for k in range(1, len(u)):
        u[k] = step(u[k - 1], k - 1, k)
    return u


def _bound_not_norm(z, m, n_c, relax):
    lam, mu = dahlquist_eigenvalues(z, m, "backward")
    return two_level_bound(lam, mu, m, n_c, relax)


def _even_layers(n_layers, cfactor, levels, ranks):
    return [q * n_layers // ranks for q in range(ranks)]


def _layernorm_without_mean_term(x, gamma, dy, eps):
    dx, dgamma, dbeta = solutions.layernorm_adjoint(x, gamma, dy, eps)
    g = dy * gamma
    r = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    return dx + r * g.mean(axis=-1, keepdims=True), dgamma, dbeta


def _classic_gru_step(x, h, W_ih, W_hh, b_ih, b_hh, dt):
    H = h.shape[1]
    gx, gh = x @ W_ih.T + b_ih, h @ W_hh.T + b_hh
    r = 1 / (1 + np.exp(-(gx[:, :H] + gh[:, :H])))
    z = 1 / (1 + np.exp(-(gx[:, H:2 * H] + gh[:, H:2 * H])))
    n = np.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
    return h + dt * (1 - z) * (n - h)


def _allreduce_once(nbytes, ranks, alpha, beta):
    return (ranks - 1) * (alpha + nbytes / ranks * beta)


def _too_many_cycles():
    common = dict(levels=2, cfactor=4, relax="F", abs_tol=None, rel_tol=None)
    return LayerParallelSettings(MGRITSettings(max_iter=4, **common),
                                 MGRITSettings(max_iter=4, **common))


WRONG = [
    (exercises.check_euler_steps, _euler_with_n_plus_1_intervals,
     ["`y`[2]", "y0 = 1.0, λ = -1.0, T = 3.0, N = 8: step 2; h = T/N = 0.375", "rel err"]),
    (exercises.check_resnet_forward, _resnet_without_transpose,
     ["`states[1]`[", "y[1], after layer 0: sample", "yours", "rel err"]),
    (exercises.check_dense_step_adjoint, _adjoint_without_identity,
     ["dot-product test fails for `dy`", "not the adjoint"]),
    (exercises.check_f_relaxation, _jacobi_relaxation,
     ["point 2 (F-point 2 of interval 0, computed from point 1)", "rel err"]),
    (exercises.check_f_relaxation, _relaxation_of_every_point,
     ["point 4 (a C-point: F-relaxation must leave it as it was)"]),
    (exercises.check_two_level_factor, _bound_not_norm,
     ["z = ", "relax F", "the upper bound"]),
    (exercises.check_gradient_settings, LayerParallelSettings(),
     ["gradient error 4.3", "> 0.001"]),
    (exercises.check_gradient_settings, _too_many_cycles(),
     ["<= 0.001, but 896 step applications", "reference solution needs 704"]),
    (exercises.check_block_starts, _even_layers,
     ["P = 3: rank 1 starts at layer 21, expected 32"]),
    (exercises.check_layernorm_adjoint, _layernorm_without_mean_term,
     ["dot-product test fails for `dx`"]),
    (exercises.check_implicit_gru_step, _classic_gru_step,
     ["`h_new`[", "dt = 0.5, sample", "rel err"]),
    (exercises.check_allreduce_time, _allreduce_once,
     ["2 ranks", "yours", "the latency part alone"]),
]


@pytest.mark.parametrize(("check", "wrong", "phrases"), WRONG,
                         ids=[f"{c.__name__}-{getattr(w, '__name__', 'defaults')}"
                              for c, w, _ in WRONG])
def test_every_check_fails_usefully_on_a_wrong_answer(check, wrong, phrases, capsys):
    verdict = check(wrong)
    printed = capsys.readouterr().out
    assert verdict.status == "FAIL" and not verdict, verdict
    assert printed.strip() == str(verdict)
    for phrase in phrases:
        assert phrase in verdict.message, verdict.message


def test_checks_report_unwritten_broken_and_misshapen_answers():
    def not_yet(*args):
        raise NotImplementedError

    def broken(*args):
        return {}["W"]

    todo = exercises.check_resnet_forward(not_yet, quiet=True)
    assert todo.status == "TODO" and "not written yet" in todo.message
    crash = exercises.check_dense_step_adjoint(broken, quiet=True)
    assert crash.status == "FAIL" and "`broken` raised KeyError" in crash.message
    shape = exercises.check_resnet_forward(lambda x, W, b, h: x, quiet=True)
    assert "`states` has shape (3, 4), expected (7, 3, 4)" in shape.message, shape.message
    deep = MGRITSettings(levels=2, cfactor=128)
    unusable = exercises.check_gradient_settings(LayerParallelSettings(deep, deep), quiet=True)
    assert unusable.status == "FAIL" and "these settings fail on a 64-layer network: " \
        "ValueError" in unusable.message, unusable.message
    nan = exercises.check_allreduce_time(lambda *a: float("nan"), quiet=True)
    assert nan.status == "FAIL"
    with pytest.raises(ValueError, match="`status`"):
        Verdict("x", "MAYBE", "")
