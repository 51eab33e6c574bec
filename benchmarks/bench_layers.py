"""Time one layer, forward then adjoint, on the CPU backends (and PyTorch CPU if present).

The unit timed is what MGRIT (or a sequential sweep) applies over and over: forward then
adjoint, ``out, cache = layer.forward(...)`` followed by ``dx, grads = layer.adjoint(...)``, for

* the dense step ``y_next = y + h σ(y Wᵀ + b)`` (:class:`refbraid.layers.DenseStep`,
  width C, batch B);
* the conv step ``y_next = y + h σ(Conv2d(C→C, 3×3, pad 1)(y))``
  (:class:`refbraid.layers.ConvStep`, C channels at H×W, batch B);
* self-attention ``y = softmax(q kᵀ/√d) v W_outᵀ + b_out`` with 4 heads
  (:class:`refbraid.layers.MultiheadAttention`, width E = C, T tokens, batch B);
* layer norm ``y = γ ⊙ (x − μ)/√(σ² + eps) + β`` (:class:`refbraid.layers.LayerNorm`,
  width E = C, T tokens, batch B);
* the GRU cell ``h_new = h + dt (1 − z) ⊙ (n − h)`` (classic; ``--gru-scheme implicit`` for
  ``(h + dt (1 − z) ⊙ n)/(1 + dt (1 − z))``) (:class:`refbraid.layers.GRUCell`, hidden size
  H = C, input size I = H, a fresh input x (B, I) whose gradient is part of the adjoint).

PyTorch (``torch.set_num_threads(1)``) runs the same computation from its functional ops:
``F.linear`` / ``F.conv2d`` and the activation, ``F.multi_head_attention_forward`` (what
``nn.MultiheadAttention`` calls), ``F.layer_norm``, ``torch.gru_cell`` (implicit: the gates
by hand), backward by autograd for the input and every parameter. Before timing, every
backend's output and gradients are compared with the NumPy reference (``check`` column,
max-norm relative difference; for refbraid backends the adjoint runs on the backend's own
forward cache, so that a ReLU input rounded to the other side of 0 is not counted). Times
are medians over ``--repeats`` runs after ``--warmup`` runs; ratios are taken within the same
run. The header names the BLAS and the CPU kernel it picked (OpenBLAS may pick AVX2 kernels
on a CPU with AVX-512, which halves its float32 GEMM speed next to oneDNN's).

    python benchmarks/bench_layers.py --quick
    python benchmarks/bench_layers.py                      # the full sweep
    python benchmarks/bench_layers.py --dtype float32 --dense-activation gelu
    python benchmarks/bench_layers.py --layers attention,layernorm,gru --gru-scheme implicit

Columns: C is the width (channels for conv, E for attention and layer norm, H for the GRU),
B the batch, T the tokens (attention, layer norm; ``-`` otherwise).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread settings, which BLAS reads on import)

from refbraid.backends import get_backend  # noqa: E402
from refbraid.layers import (  # noqa: E402
    ConvStep,
    DenseStep,
    GRUCell,
    LayerNorm,
    MultiheadAttention,
)

H_STEP = 0.1  # the Euler step size h, and the GRU's dt (any value; it does not change the cost)
HEADS = 4  # attention heads
KINDS = ("dense", "conv", "attention", "layernorm", "gru")

#: sizes per layer kind: (C, B) for dense, conv and gru; (E, B, T) for attention and layernorm
FULL = {
    "dense": [(C, B) for C in (32, 128, 512) for B in (32, 256)],
    "conv": [(C, B) for C in (8, 16, 32) for B in (8, 32)],
    "attention": [(E, 8, T) for E in (32, 64, 128) for T in (16, 64)],
    "layernorm": [(E, 8, T) for E in (32, 64, 128) for T in (16, 64)],
    "gru": [(H, B) for H in (32, 64, 128, 256) for B in (32, 256)],
}
QUICK = {"dense": [(32, 32), (512, 256)], "conv": [(8, 8), (32, 8)],
         "attention": [(32, 8, 16), (128, 8, 64)], "layernorm": [(32, 8, 16), (128, 8, 64)],
         "gru": [(32, 32), (256, 32)]}


# ----------------------------------------------------------------------------- timing
def median_time(fn, repeats: int, warmup: int) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rel_diff(a, b) -> float:
    """max |a − b| / max |b| (max-norm relative difference)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


# ----------------------------------------------------------------------------- refbraid steps
def make_layer(kind: str, size: tuple, variant: str, hw: int):
    """The refbraid layer of one benchmark row (``variant``: activation or GRU scheme)."""
    if kind == "dense":
        return DenseStep(size[0], variant)
    if kind == "conv":
        return ConvStep(size[0], hw, hw, variant)
    if kind == "attention":
        return MultiheadAttention(size[0], HEADS, size[2])
    if kind == "layernorm":
        return LayerNorm(size[0], size[2])
    return GRUCell(size[0], size[0], variant)


def make_case(kind: str, size: tuple, variant: str, hw: int, dtype):
    """The layer, its parameters, a state y and an adjoint seed dy_next (all seeded).

    Parameters get a N(0, 0.1²) perturbation (no zero biases or unit γ in the checks); the
    GRU's input x (B, I) is a params entry, as in refbraid.layers.gru.
    """
    rng = np.random.default_rng(0)
    layer = make_layer(kind, size, variant, hw)
    params = {k: v + 0.1 * rng.standard_normal(v.shape).astype(dtype)
              for k, v in layer.init(rng, dtype).items()}
    B = size[1]
    if kind == "gru":
        params["x"] = rng.standard_normal((B, layer.input_size)).astype(dtype)
    shape = layer.state_shape if hasattr(layer, "state_shape") else layer.in_shape
    y = rng.standard_normal((B, *shape)).astype(dtype)
    dy_next = rng.standard_normal(y.shape).astype(dtype)
    return layer, params, y, dy_next


def refbraid_parts(layer, params, y, dy_next, backend: str):
    """Closures ``forward() -> (out, cache)`` and ``adjoint(cache) -> (dy, *dθ)`` on ``backend``,
    dθ in the order of ``params``. ODE steps take h = H_STEP; plain layers take none."""
    bk = get_backend(backend)
    on = {k: bk.asarray(v) for k, v in params.items()}
    y_b, dy_b = bk.asarray(y), bk.asarray(dy_next)
    step = hasattr(layer, "state_shape")

    def forward():
        return layer.forward(on, y_b, H_STEP, bk) if step else layer.forward(on, y_b, bk)

    def adjoint(cache):
        if step:
            dy, grads = layer.adjoint(on, cache, dy_b, H_STEP, bk)
        else:
            dy, grads = layer.adjoint(on, cache, dy_b, bk)
        return (dy, *(grads[k] for k in params))

    return forward, adjoint


def refbraid_step(layer, params, y, dy_next, backend: str):
    """A closure running forward then adjoint on ``backend``; returns (out, dy, *dθ)."""
    forward, adjoint = refbraid_parts(layer, params, y, dy_next, backend)

    def run():
        out, cache = forward()
        return (out, *adjoint(cache))

    return run


def to_host(tree):
    """``tree`` (a layer cache: arrays in tuples, lists and dicts) with every array on the host."""
    if isinstance(tree, (tuple, list)):
        return type(tree)(to_host(a) for a in tree)
    if isinstance(tree, dict):
        return {k: to_host(v) for k, v in tree.items()}
    if hasattr(tree, "get") and hasattr(tree, "__cuda_array_interface__"):
        return tree.get()  # a CuPy array
    return tree


def refbraid_check(layer, params, y, dy_next, backend: str) -> float:
    """Max-norm relative difference of one backend from the NumPy reference: the forward output
    end to end, the adjoint outputs on the backend's own forward cache. (A ReLU input that
    the two forwards round to opposite sides of 0 would otherwise show up as an O(h) "error" in
    the adjoint: the kink, not the kernels.)"""
    forward, adjoint = refbraid_parts(layer, params, y, dy_next, backend)
    ref_forward, ref_adjoint = refbraid_parts(layer, params, y, dy_next, "numpy")
    out, cache = forward()
    checks = [rel_diff(to_host(out), ref_forward()[0])]
    pairs = zip(adjoint(cache), ref_adjoint(to_host(cache)), strict=True)
    return max(checks + [rel_diff(to_host(g), e) for g, e in pairs])


# ----------------------------------------------------------------------------- PyTorch
def torch_function(kind: str, variant: str, torch, F):
    """f(y, p) of one benchmark row in torch ops, p the parameters by refbraid name."""
    acts = {
        "tanh": torch.tanh,
        "relu": torch.relu,
        "gelu": F.gelu,  # exact erf GELU, as the reference
        "identity": lambda z: z,
    }
    if kind in ("dense", "conv"):
        act = acts[variant]
        if kind == "dense":
            return lambda y, p: y + H_STEP * act(F.linear(y, p["W"], p["b"]))
        return lambda y, p: y + H_STEP * act(F.conv2d(y, p["W"], p["b"],
                                                      padding=p["W"].shape[-1] // 2))
    if kind == "attention":
        def attention(x, p):
            q = x.transpose(0, 1)  # T,B,E: the layout nn.MultiheadAttention hands over
            out = F.multi_head_attention_forward(
                q, q, q, x.shape[-1], HEADS, p["W_in"], p["b_in"], None, None, False, 0.0,
                p["W_out"], p["b_out"], training=True, need_weights=False)[0]
            return out.transpose(0, 1)
        return attention
    if kind == "layernorm":
        return lambda x, p: F.layer_norm(x, x.shape[-1:], p["gamma"], p["beta"])
    if variant == "classic":  # h + dt (GRUCell(x, h) − h)
        return lambda y, p: y + H_STEP * (
            torch.gru_cell(p["x"], y, p["W_ih"], p["W_hh"], p["b_ih"], p["b_hh"]) - y)

    def implicit_gru(y, p):
        gx_r, gx_z, gx_n = F.linear(p["x"], p["W_ih"], p["b_ih"]).chunk(3, dim=1)
        gh_r, gh_z, gh_n = F.linear(y, p["W_hh"], p["b_hh"]).chunk(3, dim=1)
        r, z = torch.sigmoid(gx_r + gh_r), torch.sigmoid(gx_z + gh_z)
        n = torch.tanh(gx_n + r * gh_n)
        return (y + H_STEP * (1 - z) * n) / (1 + H_STEP * (1 - z))
    return implicit_gru


def torch_step(kind: str, variant: str, params, y, dy_next):
    """The same computation in PyTorch, backward by autograd; returns (out, dy, *dθ) in the
    order of ``params``, or None without torch."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(1)
    f = torch_function(kind, variant, torch, F)
    p0 = {k: torch.from_numpy(v) for k, v in params.items()}
    y0, g = torch.from_numpy(y), torch.from_numpy(dy_next)

    def run():
        yt = y0.detach().requires_grad_(True)
        p = {k: v.detach().requires_grad_(True) for k, v in p0.items()}
        out = f(yt, p)
        grads = torch.autograd.grad(out, (yt, *p.values()), grad_outputs=g)
        return (out.detach().numpy(), *(d.numpy() for d in grads))

    return run


# ----------------------------------------------------------------------------- driver
def bench(args) -> list[dict]:
    dtype = np.dtype(args.dtype)
    sizes = QUICK if args.quick else FULL
    rows = []
    variants = {"dense": args.dense_activation, "conv": args.conv_activation,
                "attention": "self", "layernorm": "-", "gru": args.gru_scheme}
    for kind in KINDS:
        if kind not in args.layers:
            continue
        variant = variants[kind]
        for size in sizes[kind]:
            layer, params, y, dy_next = make_case(kind, size, variant, args.hw, dtype)
            runs = {name: refbraid_step(layer, params, y, dy_next, name) for name in args.backends}
            torch_run = None if args.no_torch else torch_step(kind, variant, params, y, dy_next)
            if torch_run is not None:
                runs["torch"] = torch_run
            expected = refbraid_step(layer, params, y, dy_next, "numpy")()
            row = {"layer": kind, "act": variant, "C": size[0], "B": size[1],
                   "T": size[2] if len(size) > 2 else "-"}
            for name, run in runs.items():
                if name == "torch":  # end to end: a ReLU kink may count (see refbraid_check)
                    pairs = zip(run(), expected, strict=True)
                    row[f"check_{name}"] = max(rel_diff(g, e) for g, e in pairs)
                else:
                    row[f"check_{name}"] = refbraid_check(layer, params, y, dy_next, name)
                row[name] = median_time(run, args.repeats, args.warmup)
            rows.append(row)
            print(format_row(row, list(runs)), flush=True)
    return rows


def header(names: list[str]) -> str:
    cols = "".join(f"{n + ' ms':>11}" for n in names)
    ratios = "".join(f"{r:>13}" for r in ratio_names(names))
    return f"{'layer':<10}{'act':<9}{'C':>5}{'B':>5}{'T':>4}{cols}{ratios}{'max check':>11}"


def ratio_names(names: list[str]) -> list[str]:
    out = []
    if "numba" in names and "numpy" in names:
        out.append("numba/numpy")
    if "numba" in names and "torch" in names:
        out.append("numba/torch")
    return out


def format_row(row: dict, names: list[str]) -> str:
    cols = "".join(f"{row[n] * 1e3:11.3f}" for n in names)
    ratios = ""
    for r in ratio_names(names):
        a, b = r.split("/")
        ratios += f"{row[a] / row[b]:13.2f}"
    check = max(row[f"check_{n}"] for n in names)
    return (f"{row['layer']:<10}{row['act']:<9}{row['C']:>5}{row['B']:>5}{row['T']:>4}{cols}"
            f"{ratios}{check:11.1e}")


def blas_info() -> str:
    """NumPy's BLAS and the CPU kernel it picked, e.g. "openblas 0.3.31 Haswell" (threadpoolctl
    reports it when installed)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "BLAS unknown"
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return "BLAS unknown"
    info = blas[0]
    return " ".join(str(info.get(k, "")) for k in ("internal_api", "version", "architecture"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two sizes per layer, 5 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs (20; quick 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--backends", default="numpy,numba", help="comma list of backends")
    parser.add_argument("--layers", default=",".join(KINDS),
                        help=f"comma list of {', '.join(KINDS)} (default: all)")
    parser.add_argument("--dense-activation", default="tanh")
    parser.add_argument("--conv-activation", default="relu")
    parser.add_argument("--gru-scheme", choices=("classic", "implicit"), default="classic")
    parser.add_argument("--hw", type=int, default=28, help="conv image height = width (default 28)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    args = parser.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.layers = [n for n in args.layers.split(",") if n]
    unknown = sorted(set(args.layers) - set(KINDS))
    if unknown:
        parser.error(f"`--layers` must name layers among {', '.join(KINDS)}, got {unknown}.")
    if args.repeats is None:
        args.repeats = 5 if args.quick else 20
    if args.repeats < 1 or args.warmup < 0:
        parser.error(f"`--repeats` must be ≥ 1 and `--warmup` ≥ 0, got {args.repeats}, "
                     f"{args.warmup}.")
    names = list(args.backends)
    if not args.no_torch:
        try:
            import torch  # noqa: F401

            names.append("torch")
        except ImportError:
            print("(PyTorch not installed: no torch column)")
    threads = {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    print(f"# forward+adjoint of one layer, {args.dtype}, median of {args.repeats} after "
          f"{args.warmup} warm-up; threads {threads}; numpy {np.__version__} ({blas_info()}), "
          f"python {sys.version.split()[0]}")
    print(header(names))
    bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
