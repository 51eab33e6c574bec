"""Suite ``kernels``: one layer, forward then adjoint, on the CPU backends and PyTorch CPU.

    python -m benchmarks full kernels [-o dtype=float32] [-o layers=attention,layernorm]

The unit timed is what MGRIT (or a sequential sweep) applies over and over: forward then
adjoint, ``out, cache = layer.forward(...)`` followed by ``dx, grads = layer.adjoint(...)``, for

* the dense step ``y_next = y + h σ(y Wᵀ + b)`` (:class:`refbraid.layers.DenseStep`, width C,
  batch B);
* the conv step ``y_next = y + h σ(Conv2d(C→C, 3×3, pad 1)(y))`` (:class:`~refbraid.layers.
  ConvStep`, C channels at ``hw``×``hw``, batch B);
* self-attention ``y = softmax(q kᵀ/√d) v W_outᵀ + b_out`` with 4 heads
  (:class:`~refbraid.layers.MultiheadAttention`, width E = C, T tokens, batch B);
* layer norm ``y = γ ⊙ (x − μ)/√(σ² + eps) + β`` (:class:`~refbraid.layers.LayerNorm`);
* the GRU cell ``h_new = h + dt (1 − z) ⊙ (n − h)`` (``gru_scheme=implicit``:
  ``(h + dt (1 − z) ⊙ n)/(1 + dt (1 − z))``; :class:`~refbraid.layers.GRUCell`, H = C, I = H,
  a fresh input x (B, I) whose gradient is part of the adjoint).

PyTorch (``torch.set_num_threads(1)``) runs the same computation from its functional ops
(``F.linear``, ``F.conv2d``, ``F.multi_head_attention_forward``, ``F.layer_norm``,
``torch.gru_cell``), backward by autograd for the input and every parameter. Before timing,
every backend is compared with the NumPy reference (``check``, max-norm relative difference;
a refbraid backend's adjoint runs on its own forward cache, so that a ReLU input rounded to
the other side of 0 is not counted). Values per case: ms of each backend (wall, median after
2 warm-ups), numba ÷ numpy and numba ÷ torch from the same run, and the largest check.
"""

from __future__ import annotations

import numpy as np

from benchmarks.harness import Result, measure

H_STEP = 0.1  # the Euler step size h, and the GRU's dt (any value; it does not change the cost)
HEADS = 4  # attention heads
KINDS = ("dense", "conv", "attention", "layernorm", "gru")
OPTIONS = {"dtype": "float64", "layers": ",".join(KINDS), "backends": "numpy,numba",
           "dense_activation": "tanh", "conv_activation": "relu", "gru_scheme": "classic",
           "hw": 28, "torch": True}

#: sizes per layer kind: (C, B) for dense, conv and gru; (E, B, T) for attention and layernorm
SIZES = {
    "full": {"dense": [(C, B) for C in (32, 128, 512) for B in (32, 256)],
             "conv": [(C, B) for C in (8, 16, 32) for B in (8, 32)],
             "attention": [(E, 8, T) for E in (32, 64, 128) for T in (16, 64)],
             "layernorm": [(E, 8, T) for E in (32, 64, 128) for T in (16, 64)],
             "gru": [(H, B) for H in (32, 64, 128, 256) for B in (32, 256)]},
    "quick": {"dense": [(32, 32), (512, 256)], "conv": [(8, 8), (32, 8)],
              "attention": [(32, 8, 16), (128, 8, 64)], "layernorm": [(32, 8, 16), (128, 8, 64)],
              "gru": [(32, 32), (256, 32)]},
    "tiny": {"dense": [(4, 2)], "conv": [(2, 2)], "attention": [(8, 2, 4)],
             "layernorm": [(8, 2, 4)], "gru": [(4, 2)]},
}
REPEATS = {"full": 20, "quick": 5, "tiny": 1}


def rel_diff(a, b) -> float:
    """max |a − b| / max |b| (max-norm relative difference)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


# ----------------------------------------------------------------------------- refbraid
def make_case(kind: str, size: tuple, variant: str, hw: int, dtype):
    """The layer, its parameters, a state y and an adjoint seed dy_next (all seeded).

    Parameters get a N(0, 0.1²) perturbation (no zero biases or unit γ in the checks); the
    GRU's input x (B, I) is a params entry, as in refbraid.layers.gru."""
    from refbraid.layers import ConvStep, DenseStep, GRUCell, LayerNorm, MultiheadAttention

    rng = np.random.default_rng(0)
    layer = {"dense": lambda: DenseStep(size[0], variant),
             "conv": lambda: ConvStep(size[0], hw, hw, variant),
             "attention": lambda: MultiheadAttention(size[0], HEADS, size[2]),
             "layernorm": lambda: LayerNorm(size[0], size[2]),
             "gru": lambda: GRUCell(size[0], size[0], variant)}[kind]()
    params = {k: v + 0.1 * rng.standard_normal(v.shape).astype(dtype)
              for k, v in layer.init(rng, dtype).items()}
    B = size[1]
    if kind == "gru":
        params["x"] = rng.standard_normal((B, layer.input_size)).astype(dtype)
    shape = layer.state_shape if hasattr(layer, "state_shape") else layer.in_shape
    y = rng.standard_normal((B, *shape)).astype(dtype)
    return layer, params, y, rng.standard_normal(y.shape).astype(dtype)


def refbraid_parts(layer, params, y, dy_next, backend: str):
    """Closures ``forward() -> (out, cache)`` and ``adjoint(cache) -> (dy, *dθ)`` on ``backend``,
    dθ in the order of ``params``. ODE steps take h = H_STEP; plain layers take none."""
    from refbraid.backends import get_backend

    bk = get_backend(backend)
    on = {k: bk.asarray(v) for k, v in params.items()}
    y_b, dy_b = bk.asarray(y), bk.asarray(dy_next)
    h = (H_STEP,) if hasattr(layer, "state_shape") else ()

    def forward():
        return layer.forward(on, y_b, *h, bk)

    def adjoint(cache):
        dy, grads = layer.adjoint(on, cache, dy_b, *h, bk)
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
    from refbraid.backends.host import to_host as array_to_host

    if isinstance(tree, (tuple, list)):
        return type(tree)(to_host(a) for a in tree)
    if isinstance(tree, dict):
        return {k: to_host(v) for k, v in tree.items()}
    return array_to_host(tree) if hasattr(tree, "shape") else tree


def refbraid_check(layer, params, y, dy_next, backend: str) -> float:
    """Largest relative difference of ``backend`` from the NumPy reference: the forward end to
    end, the adjoint on the backend's own forward cache (see the module docstring)."""
    forward, adjoint = refbraid_parts(layer, params, y, dy_next, backend)
    ref_forward, ref_adjoint = refbraid_parts(layer, params, y, dy_next, "numpy")
    out, cache = forward()
    checks = [rel_diff(to_host(out), ref_forward()[0])]
    pairs = zip(adjoint(cache), ref_adjoint(to_host(cache)), strict=True)
    return max(checks + [rel_diff(to_host(g), e) for g, e in pairs])


# ----------------------------------------------------------------------------- PyTorch
def torch_function(kind: str, variant: str, torch, F):
    """f(y, p) of one case in torch ops, p the parameters by refbraid name."""
    acts = {"tanh": torch.tanh, "relu": torch.relu, "gelu": F.gelu, "identity": lambda z: z}
    if kind == "dense":
        return lambda y, p: y + H_STEP * acts[variant](F.linear(y, p["W"], p["b"]))
    if kind == "conv":
        return lambda y, p: y + H_STEP * acts[variant](
            F.conv2d(y, p["W"], p["b"], padding=p["W"].shape[-1] // 2))
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


# ----------------------------------------------------------------------------- the suite
def blas_info() -> str:
    """NumPy's BLAS and the CPU kernel it picked, e.g. "openblas 0.3.31 Haswell" (OpenBLAS may
    pick AVX2 kernels on a CPU with AVX-512, which halves its float32 GEMM speed)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "BLAS unknown"
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return "BLAS unknown"
    return " ".join(str(blas[0].get(k, "")) for k in ("internal_api", "version", "architecture"))


def run(size: str, opts: dict, notes: list[str]) -> list[Result]:
    """Every layer kind at the suite's sizes (``size``: tiny, quick, full)."""
    dtype = np.dtype(opts["dtype"])
    kinds = [k for k in opts["layers"].split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"`layers` must name layers among {', '.join(KINDS)}, got {unknown}.")
    variants = {"dense": opts["dense_activation"], "conv": opts["conv_activation"],
                "attention": "self", "layernorm": "-", "gru": opts["gru_scheme"]}
    repeat, warmup = REPEATS[size], 2 if size != "tiny" else 1
    notes.append(f"forward+adjoint of one layer, {dtype}, wall ms, median of {repeat} after "
                 f"{warmup} warm-ups; {blas_info()}")
    out = []
    for kind in kinds:
        for dims in SIZES[size][kind]:
            layer, params, y, dy_next = make_case(kind, dims, variants[kind], opts["hw"], dtype)
            runs = {b: refbraid_step(layer, params, y, dy_next, b)
                    for b in opts["backends"].split(",") if b}
            checks = {b: refbraid_check(layer, params, y, dy_next, b) for b in runs}
            torch_run = torch_step(kind, variants[kind], params, y, dy_next) \
                if opts["torch"] else None
            if torch_run is not None:  # end to end: a ReLU kink may count (refbraid_check)
                expected = refbraid_step(layer, params, y, dy_next, "numpy")()
                runs["torch"] = torch_run
                checks["torch"] = max(rel_diff(g, e)
                                      for g, e in zip(torch_run(), expected, strict=True))
            tokens = f" T={dims[2]}" if len(dims) > 2 else ""
            res = Result("kernels", f"{kind} {variants[kind]} C={dims[0]} B={dims[1]}{tokens}",
                         {"layer": kind, "variant": variants[kind], "C": dims[0], "B": dims[1],
                          "T": dims[2] if len(dims) > 2 else None, "dtype": str(dtype)})
            ms = {b: 1e3 * measure(fn, repeat, warmup).median() for b, fn in runs.items()}
            for b, t in ms.items():
                res.add(b, t, "ms")
            for a, b in (("numba", "numpy"), ("numba", "torch")):
                if a in ms and b in ms:
                    res.add(f"{a}/{b}", ms[a] / ms[b], "×")
            out.append(res.add("check", max(checks.values()), "rel"))
    return out
