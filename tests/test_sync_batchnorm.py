"""The synchronised batch-norm kernels (refbraid.distributed.sync_batchnorm) on one group: the
backend's own kernels to round-off, and their adjoint passes the dot-product test. (Over D > 1
groups they are checked against one process in tests/mpi/test_stages_mpi.py.)"""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.distributed.sync_batchnorm import combined_batch_stats, synchronised_backend
from refbraid.layers.batchnorm import BatchStats


class OneGroup:
    """The data communicator of a single group: sums and gathers of one rank."""

    def allgather(self, value):
        return [value]

    def sum_to_all(self, array):
        return np.array(array, copy=True)


@pytest.mark.parametrize("shape", [(4, 3, 6, 6), (3, 2, 4, 4, 4)])
def test_one_group_equals_the_backend_kernels(shape):
    bk = get_backend("numpy")
    sync = synchronised_backend(bk, OneGroup())
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    gamma = rng.standard_normal(shape[1])
    mean, rstd = sync.batchnorm_stats(x, 1e-5)
    mean0, rstd0 = bk.batchnorm_stats(x, 1e-5)
    np.testing.assert_allclose(mean, mean0, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(rstd, rstd0, rtol=1e-13)
    for train in (True, False):
        got = sync.batchnorm_adjoint(x, mean, rstd, gamma, dy, train)
        want = bk.batchnorm_adjoint(x, mean0, rstd0, gamma, dy, train)
        for a, b, name in zip(got, want, ("dx", "dgamma", "dbeta"), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13, err_msg=name)


def test_synchronised_adjoint_passes_the_dot_product_test():
    """<J v, w> = <v, Jᵀ w> for x ↦ γ (x − μ(x)) r(x) with the synchronised kernels."""
    sync = synchronised_backend(get_backend("numpy"), OneGroup())
    rng = np.random.default_rng(1)
    x, v, w = (rng.standard_normal((5, 2, 4, 4)) for _ in range(3))
    gamma, beta = rng.standard_normal(2), rng.standard_normal(2)

    def f(z):
        mean, rstd = sync.batchnorm_stats(z, 1e-5)
        return sync.batchnorm_apply(z, mean, rstd, gamma, beta)

    eps = 1e-6
    jv = (f(x + eps * v) - f(x - eps * v)) / (2 * eps)
    mean, rstd = sync.batchnorm_stats(x, 1e-5)
    dx, _, _ = sync.batchnorm_adjoint(x, mean, rstd, gamma, w, True)
    assert np.vdot(jv, w) == pytest.approx(np.vdot(v, dx), rel=1e-8)


def test_combined_statistics_of_two_groups_are_the_full_batch_ones():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 3, 2, 2))
    mean = x.mean(axis=(0, 2, 3))
    parts = [x[:4], x[4:]]

    class TwoGroups(OneGroup):
        def allgather(self, value):
            return [[(((p - mean[None, :, None, None]) ** 2).mean(axis=(0, 2, 3)),
                      p.size // 3)] for p in parts]

    local = [("stage0.", 2, BatchStats(mean, np.zeros(3), 16))]
    (prefix, row, st), = combined_batch_stats(local, TwoGroups())
    assert (prefix, row, st.count) == ("stage0.", 2, 28)
    np.testing.assert_allclose(st.var, x.var(axis=(0, 2, 3)), rtol=1e-13)
