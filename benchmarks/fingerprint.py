"""SHA-256 fingerprints of what MGRIT computes, to prove a memory-only change bit-identical.

Hashes the raw bytes of the loss, every gradient array, both trajectories and both solves'
residual histories (norms of every recorded visit) of the layer-parallel gradient for

* dense ResNets, N = 32, 64, 128, 512 (width 32, batch 64, tanh), TorchBraid's settings;
* TorchBraid's MNIST conv network (4 channels, batch 50), N = 128, float32 and float64;
* the GRU (L = 64) and the encoder-only transformer (N = 32) of refbraid.sequence;
* MGRIT alone on Dahlquist and heat (3 levels, cfactor 4, FCF, nested), solution and norms;

one line per case. Run it on two trees and ``diff`` the outputs::

    PYTHONPATH=/path/to/tree python benchmarks/fingerprint.py [--quick] > before.txt

``--workspace`` (trees with :class:`refbraid.mgrit.Workspace`): every case runs three times
with kept arrays (a gradient workspace, or one MGRIT workspace), the first call on a
workspace dirtied by a *different* case, each call after NaN is written into every kept array
whose contents a solve must overwrite (``Workspace.scribble``); the third call's fingerprint is
printed: it must equal the fingerprint without a workspace.
"""

from __future__ import annotations

import argparse
import hashlib
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402


def _digest(parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        a = np.ascontiguousarray(np.asarray(p))
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _norms(result) -> list:
    return [np.array([v.norm for v in rec.visits]) for rec in result.records]


def _gradient_parts(loss, grads, info) -> list:
    parts = [np.float64(loss)]
    parts += [grads[k] for k in sorted(grads)]
    parts += [getattr(info, k) for k in ("states", "adjoints") if hasattr(info, k)]
    parts += _norms(info.forward) + _norms(info.backward)
    return parts


def dense_case(N: int):
    from refbraid import Network, init_params
    from refbraid.layers import Classifier, DenseLift, DenseStep

    net = Network(DenseLift(2, 32), DenseStep(32, "tanh"), Classifier((32,), 5), N, 3.0)
    rng = np.random.default_rng(0)
    return net, init_params(net, 0), rng.standard_normal((64, 2)), rng.integers(0, 5, 64)


def conv_case(N: int, dtype: str):
    from refbraid.models import build_network
    from refbraid.network import init_params

    net = build_network("conv", (1, 28, 28), 10, N, 4, 1.0, "relu")
    params = init_params(net, 0, np.dtype(dtype))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 1, 28, 28)).astype(dtype)
    return net, params, x, rng.integers(0, 10, 50)


def network_cases(quick: bool, backend: str):
    from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient

    def lp(net, params, x, y, ws=None):
        kw = {} if ws is None else {"workspace": ws}
        return layer_parallel_gradient(net, params, x, y, LayerParallelSettings(), backend, **kw)

    for N in ((32, 128) if quick else (32, 64, 128, 512)):
        yield f"dense N={N}", dense_case(N), lp
    for dtype in ("float32", "float64"):
        yield f"conv N={32 if quick else 128} {dtype}", conv_case(32 if quick else 128, dtype), lp


def sequence_cases():
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.sequence import GRUModel, TransformerModel

    settings = LayerParallelSettings.with_iterations(2, 1, levels=3, cfactor=2,
                                                     skip_first_down=True)
    rng = np.random.default_rng(0)
    for name, model, x, y in (
        ("gru L=64", GRUModel(64, 4, 32, 4), rng.standard_normal((16, 64, 4)),
         rng.integers(0, 4, 16)),
        ("transformer N=32", TransformerModel(8, 10, 2, 32, 16, 2, 32, 2.0),
         rng.integers(0, 8, (16, 10)), rng.integers(0, 2, 16)),
    ):
        params = model.init_params(np.random.default_rng(1))

        def run(m, p, a, b, ws=None, model=model):  # (the sequence models take no workspace)
            return model.layer_parallel_gradient(p, a, b, settings, "numpy")

        yield name, (model, params, x, y), run


def mgrit_cases():
    from refbraid.mgrit import MGRITSettings, solve
    from refbraid.mgrit.problems import dahlquist, heat_1d

    settings = MGRITSettings(levels=3, cfactor=4, relax="FCF", fmg=True, abs_tol=1e-10,
                             keep_residuals=True)
    for name, problem in (("dahlquist N=1024", dahlquist(-1.0, 1024)),
                          ("heat N=256", heat_1d(64, 256))):
        def run(ws=None, problem=problem):
            kw = {} if ws is None else {"workspace": ws}
            return solve(problem, settings, **kw)
        yield name, run


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workspace", action="store_true")
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--only", default="", help="substring of the case names to run")
    args = parser.parse_args(argv)
    if args.workspace:
        from refbraid.layer_parallel import GradientWorkspace
        from refbraid.mgrit import Workspace
    cases = list(network_cases(args.quick, args.backend)) + list(sequence_cases())
    dirty = None
    for name, (model, params, x, y), fn in cases:
        if args.only not in name:
            continue
        if not args.workspace:
            parts = _gradient_parts(*fn(model, params, x, y))
        else:
            ws = dirty or GradientWorkspace()
            for _ in range(3):
                ws.scribble()  # NaN in every kept array a solve must write before reading
                out = fn(model, params, x, y, ws)
            parts = _gradient_parts(*out)
            dirty = ws  # the next case starts on arrays this one left
        print(f"{name:<22} {_digest(parts)}", flush=True)
    ws = Workspace() if args.workspace else None
    for name, run in mgrit_cases():
        if args.only not in name:
            continue
        result = run(ws) if ws is not None else run()
        if ws is not None:
            for _ in range(2):
                ws.scribble()
                result = run(ws)
        print(f"{name:<22} {_digest([result.solution, *_norms(result)])}", flush=True)


if __name__ == "__main__":
    main()
