"""The exercises of the second-wave lessons (10 coarsening, 12 data × space × depth, 13 check
your layer-parallel code) FAIL on typical wrong answers with a message that says where
(cell, rank and row, case, parameter) and how large the error is. Their PASS on the reference
solutions is in tests/test_lessons_exercises.py (every check in ``exercises.EXERCISES``)."""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.lessons import exercises, solutions


# ----------------------------------------------------------------------------- wrong answers
def _sum_not_average(x):
    return 4 * solutions.restrict_average(x)


def _rows_only(x):
    return (x[:, :, 0::2] + x[:, :, 1::2]) / 2


def _injection(x):
    return x[:, :, 0::2, 0::2]


def _constant_interpolation(v):  # P_constant = 4 Rᵀ: the right shape, the wrong scale
    return np.repeat(np.repeat(v, 2, axis=2), 2, axis=3)


def _into_one_corner(v):
    out = np.zeros((*v.shape[:2], 2 * v.shape[2], 2 * v.shape[3]))
    out[:, :, 0::2, 0::2] = v
    return out


def _halos_dropped(dy_halo, counts):
    return [d[:, :, 1:-1] for d in dy_halo]


def _halos_to_the_wrong_rows(dy_halo, counts):
    dy = [np.array(d[:, :, 1:-1]) for d in dy_halo]
    for p in range(len(counts)):
        if p > 0:
            dy[p - 1][:, :, 0] += dy_halo[p][:, :, 0]
        if p < len(counts) - 1:
            dy[p + 1][:, :, -1] += dy_halo[p][:, :, -1]
    return dy


def _halos_kept(dy_halo, counts):
    return list(dy_halo)


def _plain_average(theta_now, sent_sum, n_nodes, wait):
    return sent_sum / n_nodes


def _local_weight_w(theta_now, sent_sum, n_nodes, wait):
    return (wait * theta_now + sent_sum) / (n_nodes + wait)


def _group_as_mean_of_errors(g, ref):
    out = solutions.gradient_errors(g, ref)
    for group in ("opening", "steps", "closing"):
        out[group] = float(np.mean([out[k] for k in ref if k.startswith(group + ".")]))
    return out


def _max_abs_not_two_norm(g, ref):
    out = solutions.gradient_errors(g, ref)
    for k in ref:
        out[k] = float(np.abs(g[k] - ref[k]).max() / np.abs(ref[k]).max())
    return out


def _always_divide(g, ref):
    out = solutions.gradient_errors(g, ref)
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in ref:
            out[k] = float(np.linalg.norm(g[k] - ref[k]) / np.linalg.norm(ref[k]))
    return out


def _parameters_only(g, ref):
    return {k: float(np.linalg.norm(g[k] - ref[k]) / np.linalg.norm(ref[k])) for k in ref}


def _skipped_cycle_not_counted(norms, iterations, status, skipped):
    _, numbers, printed, last = solutions.xbraid_report(norms, iterations, status, skipped)
    return iterations, numbers, printed, last


def _every_measurement_printed(norms, iterations, status, skipped):
    skip = int(skipped)
    return iterations + skip, [j + skip for j in range(len(norms))], list(norms), norms[-1]


def _numbered_from_zero(norms, iterations, status, skipped):
    num_iter, _, printed, last = solutions.xbraid_report(norms, iterations, status, skipped)
    return num_iter, list(range(len(printed))), printed, last


def _zero_when_nothing_printed(norms, iterations, status, skipped):
    num_iter, numbers, printed, _ = solutions.xbraid_report(norms, iterations, status, skipped)
    return num_iter, numbers, printed, printed[-1] if printed else 0.0


WRONG = [
    (exercises.check_restrict_average, _sum_not_average,
     ["`R x`[", "coarse cell (", "rel err", "yours is 4 × the 2×2 average everywhere"]),
    (exercises.check_restrict_average, _rows_only,
     ["`R x` has shape (2, 3, 4, 6), expected (2, 3, 4, 3)"]),
    (exercises.check_restrict_average, _injection, ["`R x`[", "yours", "rel err"]),
    (exercises.check_restrict_average_transpose, _constant_interpolation,
     ["dot-product test fails", "not the transpose", "yours is 4 × Rᵀ everywhere"]),
    (exercises.check_restrict_average_transpose, _into_one_corner,
     ["dot-product test fails", "rel err"]),
    (exercises.check_halo_adjoint, _halos_dropped,
     ["split [2, 3, 1]", "dot-product test fails",
      "first wrong: rank 0, row 1 of its 2 (rank 1 took it as its ghost row above)"]),
    (exercises.check_halo_adjoint, _halos_to_the_wrong_rows,
     ["split [2, 3, 1]", "first wrong: rank 0, row 0 of its 2 (no neighbour reads this row)"]),
    (exercises.check_halo_adjoint, _halos_kept,
     ["`dy[0]` has shape (2, 2, 5, 3), expected (2, 2, 3, 3)"]),
    (exercises.check_stale_merge, _plain_average,
     ["G = 2 nodes, w = 2", "rel err", "yours is the plain average"]),
    (exercises.check_stale_merge, _local_weight_w,
     ["G = 2 nodes, w = 2", "must weigh as 2w stale copies, not w"]),
    (exercises.check_xbraid_report, _skipped_cycle_not_counted,
     ["skipped first cycle, max_iter 2", "braid_GetNumIter: yours 2, XBraid's 3",
      "does the skipped first cycle count?"]),
    (exercises.check_xbraid_report, _every_measurement_printed,
     ["status 'max_iter' after 2 cycle(s)", "yours prints 3 norm(s), XBraid 2"]),
    (exercises.check_xbraid_report, _numbered_from_zero,
     ["iteration numbers: yours [0, 1], XBraid's [1, 2]"]),
    (exercises.check_xbraid_report, _zero_when_nothing_printed,
     ["max_iter 0", "getFwdStats()[1]: yours 0, TorchBraid's -1", "nothing was printed"]),
    (exercises.check_gradient_errors, _group_as_mean_of_errors,
     ["`opening`: yours", "not the mean of their errors"]),
    (exercises.check_gradient_errors, _max_abs_not_two_norm, ["`opening.W`: yours", "rel err"]),
    (exercises.check_gradient_errors, _always_divide,
     ["all zeros", "`closing.b`: yours inf", "the error is absolute"]),
    (exercises.check_gradient_errors, _parameters_only,
     ["no entry 'opening'", "per group ['opening', 'steps', 'closing'] and 'total'"]),
]


@pytest.mark.parametrize(("check", "wrong", "phrases"), WRONG,
                         ids=[f"{c.__name__}-{w.__name__}" for c, w, _ in WRONG])
def test_every_check_fails_usefully_on_a_wrong_answer(check, wrong, phrases, capsys):
    verdict = check(wrong)
    printed = capsys.readouterr().out
    assert verdict.status == "FAIL" and not verdict, verdict
    assert printed.strip() == str(verdict)
    for phrase in phrases:
        assert phrase in verdict.message, verdict.message


@pytest.mark.parametrize("check", [c for n in ("10", "12", "13")
                                   for c in exercises.EXERCISES[n]], ids=lambda c: c.__name__)
def test_unwritten_and_misshapen_answers(check):
    def not_yet(*args):
        raise NotImplementedError

    todo = check(not_yet, quiet=True)
    assert todo.status == "TODO" and "`not_yet` is not written yet" in todo.message
    nothing = check(lambda *args: None, quiet=True)
    assert nothing.status == "FAIL", nothing


def test_the_checks_do_not_need_the_reference_answers_to_be_the_solutions():
    """The oracles are the package's: a solution that is right another way also passes."""
    def transpose_by_loops(v):
        out = np.zeros((*v.shape[:2], 2 * v.shape[2], 2 * v.shape[3]))
        for a in (0, 1):
            for b in (0, 1):
                out[:, :, a::2, b::2] = v / 4
        return out

    assert exercises.check_restrict_average_transpose(transpose_by_loops, quiet=True)
    assert exercises.check_restrict_average(
        lambda x: x.reshape(*x.shape[:2], x.shape[2] // 2, 2, x.shape[3] // 2, 2)
        .mean(axis=(3, 5)), quiet=True)


# ----------------------------------------------------------------------------- lesson 11
def _noise_of_one_micro_batch(g_lp, g, micro):
    bias, _, _ = solutions.bias_noise_ratio(g_lp, g, micro)
    M = micro.shape[0]
    spread = float(np.sqrt(((micro - micro.mean(axis=0)) ** 2).sum() / (M - 1)))
    return bias, spread, bias / spread


def _relative_bias(g_lp, g, micro):
    bias, noise, _ = solutions.bias_noise_ratio(g_lp, g, micro)
    bias /= float(np.linalg.norm(g))
    return bias, noise, bias / noise


@pytest.mark.parametrize("wrong, words", [
    (_noise_of_one_micro_batch, ["noise", "smaller by √M", "M = 4 micro-batches"]),
    (_relative_bias, ["bias", "expected", "P = 7 parameters"]),
    (lambda g_lp, g, micro: 1.0, ["return three numbers"]),
])
def test_bias_noise_ratio_fails_on_wrong_answers(wrong, words, capsys):
    verdict = exercises.check_bias_noise_ratio(wrong)
    assert verdict.status == "FAIL"
    for word in words:
        assert word in verdict.message, (word, verdict.message)
