"""Which parallelism, when? Predicted time and bytes per training step for data (D), space (S)
and depth (Q) and every combination D·S·Q = P, and DASO against plain data parallelism on a
described two-level cluster (docs/references.md §4, §5, §12; seeds 002 and 003).

Built on :func:`refbraid.scaling.predict.calibrate_network` (a :class:`Machine`: serial step
times per batch, per-level step costs, α, β, the virtual cluster for MGRIT schedules)::

    data      T_D   = serial(B/D) + ring(n_θ, D)
    space     T_S   = serial(B)/S · g_S + 4N·(α + r·β) + ring(n_θ, S)
                      (a halo row of r = B·C·W·8 bytes from each neighbour per step, forward
                      and adjoint; the partial weight gradients summed over S;
                      g_S = (H/S + 2)/(H/S): the convolution of a haloed block computes its
                      two ghost rows' outputs too, refbraid/space/layers.py: conv_rows)
    depth     T_Q   = virtual MGRIT schedule on Q ranks + extra    (predict.py's LP(Q))
    D × S × Q       = the virtual schedule on Q ranks with step costs · s_D·g_S / S, plus two halo
                      messages per step application (r·s_D bytes), states of n_y·s_D/S bytes,
                      extra·s_D/S, and ring(n_θ/Q, D·S) (each layer block's gradient summed
                      over its D·S peers); s_D = serial(B/D)/serial(B)

``ring(n, p) = 2(p−1)α + 2(p−1)/p·n·β`` (:func:`~refbraid.scaling.predict.ring_allreduce`).
Bytes per rank: data 2(D−1)/D·n_θ; space 4N·r + 2(S−1)/S·n_θ; depth the state messages of
the virtual run; combinations add them. Space needs S ≤ H rows; depth needs every layer rank
to hold a coarsest interval; data needs D ≤ B.

DASO (:func:`daso_step`) on a :class:`Cluster` of nodes with ``per_node`` ranks (L), intra-
and inter-node α, β: plain data parallelism is one ring over all P ranks, as slow as its
inter-node links; DASO sums within the node every step and averages parameters over the
G = P/L nodes every k steps (blocking), or overlapped with w batches of compute::

    plain   T = c(B/P) + ring(n_θ, P; inter)
    DASO    T = c(B/P) + ring(n_θ, L; intra) + max(0, ring(n_θ, G; inter) + bcast − w·c)/k

Shape legend: N layers, B batch, H×W image, C channels, P ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..distributed.ownership import BlockPlan
from ..parallel.costs import StepCosts
from ..parallel.trace import SEND, STEP
from .predict import Machine, extra_on, ring_allreduce
from .virtual_step import simulate_gradient_schedule


@dataclass(frozen=True)
class Split:
    """Predicted seconds and bytes (per rank) of one training step on D·S·Q ranks."""

    data: int
    space: int
    depth: int
    seconds: float
    bytes_per_rank: float

    @property
    def ranks(self) -> int:
        return self.data * self.space * self.depth

    @property
    def name(self) -> str:
        axes = [f"{n}{v}" for n, v in (("D", self.data), ("S", self.space), ("Q", self.depth))
                if v > 1]
        return "×".join(axes) or "serial"


def _batch_scale(m: Machine, d: int) -> float | None:
    b = math.ceil(m.batch / d)
    if d > m.batch:
        return None
    full = m.serial[max(m.serial)]
    return m.serial.get(b, full * b / m.batch) / full


def ghost_factor(rows: int, s: int) -> float:
    """g_S = (H/S + 2)/(H/S): rows convolved per owned row on S space ranks (1 for S = 1)."""
    return 1.0 if s == 1 else (rows / s + 2) / (rows / s)


def _depth(m: Machine, q: int, s: int, scale: float, row_bytes: float, rows: int):
    """(seconds, bytes per rank) of the MGRIT gradient on q layer ranks, each step split over s
    space ranks (halo: two messages per step application), at batch scale ``scale``."""
    try:
        BlockPlan.build(m.n_layers, m.settings, q)
    except ValueError:
        return None
    halo = 0.0 if s == 1 else 2 * (m.alpha + row_bytes * scale * m.beta)
    back = m.costs.backward or m.costs.forward
    g = ghost_factor(rows, s) / s
    costs = StepCosts(forward=tuple(c * scale * g + halo for c in m.costs.forward),
                      backward=tuple(c * scale * g + halo for c in back))
    run = simulate_gradient_schedule(m.n_layers, int(m.state_bytes * scale / s), q,
                                     m.settings, costs, m.alpha, m.beta, m.iterations)
    sent = sum(e.nbytes for e in run.trace if e.kind == SEND) / q
    steps = sum(1 for e in run.trace if e.kind == STEP) / q
    halo_bytes = 0.0 if s == 1 else 2 * steps * row_bytes * scale
    return run.wall_time + extra_on(m, q) * scale / s, sent + halo_bytes


def predict_split(m: Machine, d: int, s: int, q: int, rows: int, row_bytes: float
                  ) -> Split | None:
    """One D × S × Q split (module docstring); None where it cannot exist."""
    scale = _batch_scale(m, d)
    if scale is None or s > rows:
        return None
    n = m.grad_bytes
    if q == 1:
        compute = m.serial[max(m.serial)] * scale / s * ghost_factor(rows, s)
        halo_msgs = 0 if s == 1 else 4 * m.n_layers
        t = compute + halo_msgs * (m.alpha + row_bytes * scale * m.beta)
        t += ring_allreduce(n, d * s, m.alpha, m.beta)
        nbytes = halo_msgs * row_bytes * scale + 2 * (d * s - 1) / (d * s) * n
        return Split(d, s, q, t, nbytes)
    got = _depth(m, q, s, scale, row_bytes, rows)
    if got is None:
        return None
    t, nbytes = got
    t += ring_allreduce(n / q, d * s, m.alpha, m.beta)
    nbytes += 2 * (d * s - 1) / (d * s) * n / q if d * s > 1 else 0.0
    return Split(d, s, q, t, nbytes)


def _powers(p: int) -> list[int]:
    out, v = [], 1
    while v <= p:
        out.append(v)
        v *= 2
    return out


def all_splits(m: Machine, p: int, rows: int, row_bytes: float) -> list[Split]:
    """Every split D·S·Q = p over powers of two that can exist, fastest first."""
    out = []
    for d in _powers(p):
        for s in _powers(p // d):
            got = predict_split(m, d, s, p // (d * s), rows, row_bytes)
            if got is not None:
                out.append(got)
    return sorted(out, key=lambda r: r.seconds)


# ----------------------------------------------------------------------------- DASO
@dataclass(frozen=True)
class Cluster:
    """A described cluster (the numbers are assumptions, stated with every table).

    Defaults: 4 GPUs per node on NVLink-class links (2 µs, 100 GB/s) and nodes on a 100 Gb/s
    InfiniBand-class network (5 µs, 12.5 GB/s)."""

    per_node: int = 4
    alpha_intra: float = 2e-6
    beta_intra: float = 1 / 100e9
    alpha_inter: float = 5e-6
    beta_inter: float = 1 / 12.5e9

    def describe(self) -> str:
        return (f"{self.per_node} ranks per node; intra-node α = {self.alpha_intra * 1e6:.0f} µs,"
                f" {1e-9 / self.beta_intra:.0f} GB/s; inter-node α = "
                f"{self.alpha_inter * 1e6:.0f} µs, {1e-9 / self.beta_inter:.1f} GB/s")


def plain_dp_step(compute_s: float, grad_bytes: float, p: int, cluster: Cluster) -> float:
    """One ring over all p ranks; beyond one node its slowest links are inter-node."""
    inter = p > cluster.per_node
    a = cluster.alpha_inter if inter else cluster.alpha_intra
    b = cluster.beta_inter if inter else cluster.beta_intra
    return compute_s + ring_allreduce(grad_bytes, p, a, b)


def daso_step(compute_s: float, grad_bytes: float, p: int, cluster: Cluster, every: int,
              wait: int = 0) -> float:
    """Mean seconds per step of DASO's cycling phase (module docstring)."""
    L = min(p, cluster.per_node)
    G = max(p // L, 1)
    local = ring_allreduce(grad_bytes, L, cluster.alpha_intra, cluster.beta_intra)
    if G == 1:  # one node: DASO is plain data parallelism on its fast links
        return compute_s + local
    bcast = 0.0 if L == 1 else cluster.alpha_intra + grad_bytes * cluster.beta_intra
    glob = ring_allreduce(grad_bytes, G, cluster.alpha_inter, cluster.beta_inter) + bcast
    return compute_s + local + max(0.0, glob - wait * compute_s) / every


def daso_bytes(grad_bytes: float, p: int, per_node: int, every: int) -> tuple[float, float]:
    """(intra, inter) bytes per rank per step of DASO's cycling phase (ring model)."""
    L = min(p, per_node)
    G = max(p // L, 1)
    bcast = grad_bytes * (L - 1) / L / every if G > 1 else 0.0
    intra = 2 * (L - 1) / L * grad_bytes + bcast
    inter = (2 * (G - 1) / G * grad_bytes / L) / every if G > 1 else 0.0
    return intra, inter

