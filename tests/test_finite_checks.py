"""The finiteness checks of inputs, parameters and gradients (``backends.host``), on the host
and on a device.

On a device (the counting CuPy stand-in) an array is finite when its sum is — one NaN or ±inf
makes the sum NaN or ±inf — so one reduction answers where ``all(isfinite(a))`` took two
launches; a sum that is not finite (a NaN/inf, or finite values whose sum overflows) is
checked again exactly. Oracles: NumPy's ``isfinite`` on the same values, and the launches
counted (one ``sum`` per array, one ``stack`` and one copy for a dict; the exact check only
where a sum overflowed or is not finite).
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import launch_count
from refbraid.backends.host import all_finite, all_finite_exactly, first_non_finite


def _weights(dtype):
    rng = np.random.default_rng(0)
    return {"W": rng.standard_normal((3, 4)).astype(dtype),
            "b": rng.standard_normal(4).astype(dtype),
            "empty": np.zeros((0, 2), dtype)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf, "overflow"])
def test_a_device_array_is_finite_by_its_sum_and_rechecked_when_the_sum_is_not(dtype, bad):
    weights = _weights(dtype)
    big = np.finfo(np.dtype(dtype).type(0).real.dtype).max
    if bad == "overflow":  # finite values whose sum is ±inf: finite, found by the recheck
        weights["W"][...] = big
    elif bad is not None:
        weights["W"][1, 2] = bad
    want = None if bad in (None, "overflow") else "W"
    assert first_non_finite(weights.items()) == want  # NumPy: exactly, as before
    assert all_finite(weights["W"]) == (want is None) == all_finite_exactly(weights["W"])
    # (the stand-in sums in NumPy, which warns of the overflow a GPU's sum makes silently)
    with launch_count.counting("cupy") as bk, np.errstate(over="ignore"):
        dev = {k: bk.asarray(v) for k, v in weights.items()}
        counted = launch_count.count(lambda: first_non_finite(dev.items()))
        assert first_non_finite(dev.items()) == want
        one = launch_count.count(lambda: all_finite(dev["W"]))
        assert all_finite(dev["W"]) == (want is None)
    rechecked = bad is not None  # the sum of W is NaN or ±inf
    assert counted.by_name == {"sum": 3, "stack": 1,
                               **({"isfinite": 1, "all": 1} if rechecked else {})}
    assert counted.d2h == 1 + rechecked
    assert one.by_name == {"sum": 1, **({"isfinite": 1, "all": 1} if rechecked else {})}


def test_an_empty_dict_has_nothing_to_check():
    assert first_non_finite([]) is None
