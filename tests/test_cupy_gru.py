"""The ``cupy`` backend's GRU cell: its gate algebra in one launch each way.

On the counting device (the CuPy stand-in) each kernel of :mod:`refbraid.backends.cupy_gru`
runs the reference and is charged one launch: NumPy's bits, classic and implicit, float32
and float64. The CUDA source compiles for real GPUs (tests/test_gpu_fused.py); its
arithmetic runs only on a GPU (``pytest -m gpu``: the catalogue and the GRU's layer-parallel
step against NumPy).
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import launch_count, reference
from refbraid.backends.host import to_host
from refbraid.backends.launch_model import tracking


@pytest.mark.parametrize("implicit", [False, True], ids=["classic", "implicit"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_gru_cell_has_the_reference_bits_in_one_launch_each_way(dtype, implicit):
    rng = np.random.default_rng(0)
    B, H = 3, 5
    gx, gh = (rng.standard_normal((B, 3 * H)).astype(dtype) for _ in range(2))
    h, dh_new = (rng.standard_normal((B, H)).astype(dtype) for _ in range(2))
    want = reference.gru_cell(gx, gh, h, 0.25, implicit)
    want_adj = reference.gru_cell_adjoint(want[1], gh, h, dh_new, 0.25, implicit)
    with launch_count.counting("cupy") as bk:
        d = bk.asarray
        with tracking() as forward:
            got = bk.gru_cell(d(gx), d(gh), d(h), 0.25, implicit)
        with tracking() as adjoint:
            got_adj = bk.gru_cell_adjoint(got[1], d(gh), d(h), d(dh_new), 0.25, implicit)
        got, got_adj = [to_host(a) for a in got], [to_host(a) for a in got_adj]
    assert dict(forward.tally.by_name) == {"gru_cell_rows": 1}
    assert dict(adjoint.tally.by_name) == {"gru_cell_adjoint_rows": 1}
    for name, g, w in zip(("h_new", "gates", "dgx", "dgh", "dh"), got + got_adj,
                          list(want) + list(want_adj), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        np.testing.assert_array_equal(g, w, err_msg=name)


def test_bad_shapes_are_named_as_the_reference_names_them():
    with launch_count.counting("cupy") as bk:
        h = bk.asarray(np.zeros((2, 3)))
        with pytest.raises(ValueError, match="`gx`"):
            bk.gru_cell(bk.asarray(np.zeros((2, 8))), bk.asarray(np.zeros((2, 9))), h, 1.0,
                        False)
