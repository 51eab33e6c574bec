"""The adjoint's forward caches: stacks as views of one batched call (refbraid/step_caches.py), and
coarse adjoint steps reusing the fine caches (refbraid/layer_parallel.py)."""

import numpy as np
import pytest
from conftest import BACKEND_PARAMS, CUDA_SIMULATED

import refbraid.layer_parallel as lp
import refbraid.propagators as propagators
from refbraid import Network, init_params
from refbraid.indexing import signed_even_slice
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.step_caches import cached_stacks, remember


@pytest.mark.parametrize("pos", [[7, 5, 3, 1], [6, 4, 2, 0], [3], [0, 1, 2], [1, 5, 9], [],
                                 [5, 3, 2], [2, 2], [0, 2, 1]])
def test_signed_even_slice_reads_the_same_rows(pos):
    sl = signed_even_slice(pos)
    a = np.arange(12)
    steps = np.diff(pos).tolist()
    even = len(set(steps)) <= 1 and 0 not in steps
    assert (sl is not None) == even
    if sl is not None:
        assert a[sl].tolist() == list(pos)


def test_cached_stacks_views_and_fallback():
    rng = np.random.default_rng(0)
    Y, Z = rng.standard_normal((4, 3, 2)), rng.standard_normal((4, 3, 2))
    caches, origins = {}, {}
    layers = [8, 12, 16, 20]
    for j, a in enumerate(layers):
        caches[a] = (Y[j], Z[j])
    remember(origins, layers, Y, Z)
    for rows in ([20, 16, 12], [8, 16], [12]):
        y, z = cached_stacks(caches, origins, rows, np)
        assert y.base is not None and z.base is not None  # views
        np.testing.assert_array_equal(y, np.stack([caches[a][0] for a in rows]))
        np.testing.assert_array_equal(z, np.stack([caches[a][1] for a in rows]))
    caches[99] = (Y[0] + 1, Z[0] + 1)  # a cache from a per-step call: no origin
    y, z = cached_stacks(caches, origins, [8, 99], np)
    np.testing.assert_array_equal(y, np.stack([Y[0], Y[0] + 1]))
    y, _ = cached_stacks(caches, origins, [8, 16, 12], np)  # uneven: stacked
    np.testing.assert_array_equal(y, np.stack([Y[0], Y[2], Y[1]]))


@pytest.mark.parametrize("N", [32, 100])
def test_gradient_bit_identical_to_stacked_caches(N, monkeypatch):
    net = Network(DenseLift(2, 8), DenseStep(8, "tanh"), Classifier((8,), 3), N, 3.0)
    params = init_params(net, 0)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((5, 2)), rng.integers(0, 3, 5)
    views = []
    real = propagators.cached_stacks

    def spy(caches, origins, layers, xp):
        out = real(caches, origins, layers, xp)
        views.append(out[0].base is not None)
        return out

    monkeypatch.setattr(propagators, "cached_stacks", spy)
    loss, g, _ = lp.layer_parallel_gradient(net, params, x, y)
    assert views and all(views)  # TorchBraid's settings: every sweep finds one batched call
    monkeypatch.setattr(propagators, "cached_stacks", lambda c, o, layers, xp: (
        xp.stack([c[a][0] for a in layers]), xp.stack([c[a][1] for a in layers])))
    loss_s, g_s, _ = lp.layer_parallel_gradient(net, params, x, y)
    assert loss == loss_s
    for k in g:
        np.testing.assert_array_equal(g[k], g_s[k])


def _conv_net(N):
    from refbraid.layers import Classifier, ConvLift, ConvStep

    return Network(ConvLift(1, 2, 5, 5), ConvStep(2, 5, 5, "relu"), Classifier((2, 5, 5), 3),
                   N, 1.0)


def _dense_net(N):
    return Network(DenseLift(2, 6), DenseStep(6, "tanh"), Classifier((6,), 3), N, 2.0)


def _nets_and_backends():
    """Every backend for the dense net; the conv net not in the CUDA simulator (90 s of CI on
    two cores): the reuse is backend-independent bookkeeping, which the dense net checks on
    device arrays, and tests/mgrit/test_fused.py runs the conv gradient on the simulator."""
    for make, name in ((_dense_net, "dense"), (_conv_net, "conv")):
        for p in BACKEND_PARAMS:
            if not (make is _conv_net and CUDA_SIMULATED and p.values[0] == "cuda"):
                yield pytest.param(make, p.values[0], id=f"{name}-{p.id}", marks=p.marks)


@pytest.mark.parametrize(("make", "backend_name"), list(_nets_and_backends()))
@pytest.mark.parametrize("settings", ["torchbraid", "2level"])
def test_coarse_adjoint_steps_reuse_the_fine_caches_bit_for_bit(backend_name, make, settings,
                                                                monkeypatch):
    """A coarse adjoint step a + m → a linearises at y[a] with θ_a, as the fine step does:
    where the layer's cache does not depend on h it reuses the fine cache instead of
    recomputing the forward at step m·h. Oracle: the same gradient with the reuse switched
    off (every coarse step recomputes its cache), compared byte for byte."""
    from conftest import backend_or_skip

    from refbraid.backends.host import to_host
    from refbraid.mgrit import MGRITSettings
    from refbraid.network import to_backend

    bk = backend_or_skip(backend_name)
    net = make(16 if backend_name == "cudasim" else 32)  # the simulator: the fewest layers
    mg = {"torchbraid": lp.LayerParallelSettings(),
          "2level": lp.LayerParallelSettings(
              forward=MGRITSettings.torchbraid(levels=2, cfactor=8, max_iter=1),
              backward=MGRITSettings.torchbraid(levels=2, cfactor=8, max_iter=0))}[settings]
    params = to_backend(init_params(net, 0), bk)
    rng = np.random.default_rng(2)
    x = bk.asarray(rng.standard_normal((4, *net.opening.in_shape)))
    y = bk.asarray(rng.integers(0, 3, 4))
    hits = []
    real = lp.CapturingAdjoint.__init__

    def keep(self, *args, **kwargs):
        real(self, *args, **kwargs)
        hits.append(self.counts)

    monkeypatch.setattr(lp.CapturingAdjoint, "__init__", keep)
    runs = {}
    for reuse in (True, False):
        monkeypatch.setattr(type(net.step), "cache_independent_of_h", reuse)
        loss, g, info = lp.layer_parallel_gradient(net, params, x, y, mg, bk)
        runs[reuse] = (loss, {k: np.asarray(to_host(v)).tobytes() for k, v in g.items()})
    assert runs[True] == runs[False]
    assert hits[0]["coarse_cache_hits"] > 0 and hits[1]["coarse_cache_hits"] == 0
