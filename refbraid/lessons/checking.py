"""What every exercise check shares: a verdict that prints PASS or what is wrong.

A check calls the student's function on inputs it chooses, compares with the package's own
answer (or applies a test that needs no answer, such as the dot-product test of an adjoint)
and returns a :class:`Verdict`, printed as one line:

    PASS  [02 dense step adjoint] dy, dW, db match refbraid's adjoint (max rel err 3.1e-16) ...
    FAIL  [02 dense step adjoint] `dy`[1, 3]: yours -0.41 vs expected 0.07 (rel err 6.1e-01) ...
    TODO  [03 F-relaxation] not written yet: replace the `raise NotImplementedError` ...

A student function that raises ``NotImplementedError`` is "TODO", any other exception a FAIL
naming it: a check never raises on the student's behalf.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..verify.result import array_rel_error

STATUSES = ("PASS", "FAIL", "TODO")


@dataclass(frozen=True)
class Verdict:
    """The outcome of one exercise check; truthy when it passed."""

    exercise: str
    status: str
    message: str

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"`status` must be one of {STATUSES}, got {self.status!r}.")

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return f"{self.status:<5} [{self.exercise}] {self.message}"


class Wrong(Exception):
    """Raised inside a check to stop at the first thing that is wrong (becomes a FAIL)."""


class _NotYet(Exception):
    """Raised when the student's function is not written yet (becomes a TODO)."""


def run_check(exercise: str, body: Callable[[], str], quiet: bool = False) -> Verdict:
    """Run ``body`` (returns the PASS message, raises :class:`Wrong` with the FAIL message)
    and print the verdict unless ``quiet``."""
    try:
        verdict = Verdict(exercise, "PASS", body())
    except Wrong as err:
        verdict = Verdict(exercise, "FAIL", str(err))
    except _NotYet as err:
        verdict = Verdict(exercise, "TODO", str(err))
    if not quiet:
        print(verdict)
    return verdict


def call(fn: Callable, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``: a NotImplementedError means "not written yet" (TODO), any other
    exception is a FAIL that names it."""
    if not callable(fn):
        raise Wrong(f"expected a function, got {type(fn).__name__}")
    name = getattr(fn, "__name__", "your function")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise _NotYet(f"`{name}` is not written yet: replace its `raise NotImplementedError` "
                      f"with your code and run the check again") from None
    except Exception as err:  # the student's bug, reported instead of raised
        raise Wrong(f"`{name}` raised {type(err).__name__}: {err}") from None


def as_array(label: str, value, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as a float64 array of ``shape``, or a FAIL naming ``label`` and the shapes."""
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise Wrong(f"`{label}` must be an array of numbers, got {type(value).__name__}") from None
    if a.shape != tuple(shape):
        raise Wrong(f"`{label}` has shape {a.shape}, expected {tuple(shape)}")
    if not np.all(np.isfinite(a)):
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise Wrong(f"`{label}`{list(idx)} is {a[idx]} (not finite)")
    return a


def compare(label: str, got, expected: np.ndarray, tol: float, where: str = "") -> float:
    """Max relative error of ``got`` against ``expected`` (relative to max |expected|); a FAIL
    naming ``label``, the worst index (and ``where`` it is) and both values above ``tol``."""
    a = as_array(label, got, np.shape(expected))
    err, idx = array_rel_error(a, expected)
    if not err <= tol:
        context = f" ({where.format(*idx)})" if where else ""
        raise Wrong(f"`{label}`{list(idx)}{context}: yours {a[idx]:.6g} vs expected "
                    f"{expected[idx]:.6g} (rel err {err:.1e} > {tol:.0e})")
    return err
