"""Reference solutions of the course's exercises, written as a student would (NumPy only).

Each function is the answer to the exercise of the same name in ``refbraid.lessons.exercises``
(``check_<name>``) and passes its check; the checks compare with refbraid's own layers,
solver and theory, not with these functions (except :func:`gradient_settings`, whose cost is
the budget of its exercise).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..layer_parallel import LayerParallelSettings
from ..mgrit import MGRITSettings


def euler_steps(y0: float, lam: float, T: float, N: int) -> np.ndarray:
    """Lesson 00: forward Euler for y' = λ y on [0, T], h = T/N; returns y[0..N] (N+1,)."""
    h = T / N
    y = [float(y0)]
    for _ in range(N):
        y.append(y[-1] + h * lam * y[-1])
    return np.array(y)


def resnet_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray, h: float) -> np.ndarray:
    """Lesson 01: y[n+1] = y[n] + h tanh(y[n] W[n]ᵀ + b[n]); returns y[0..N] (N+1, B, C)."""
    states = [x]
    for n in range(len(W)):
        y = states[-1]
        states.append(y + h * np.tanh(y @ W[n].T + b[n]))
    return np.stack(states)


def dense_step_adjoint(W: np.ndarray, b: np.ndarray, y: np.ndarray, dy_next: np.ndarray,
                       h: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lesson 02: s = h tanh'(z) ⊙ dy_next, z = y Wᵀ + b; dy = dy_next + s W, dW = sᵀ y,
    db = Σ_batch s."""
    z = y @ W.T + b  # B,C
    s = h * (1.0 - np.tanh(z) ** 2) * dy_next  # B,C
    return dy_next + s @ W, s.T @ y, s.sum(axis=0)


def f_relaxation(u: np.ndarray, step: Callable, m: int) -> np.ndarray:
    """Lesson 03: u[k] = step(u[k-1], k-1, k) for every F-point k (k % m ≠ 0), in order."""
    u = np.array(u, dtype=float, copy=True)
    for k in range(1, len(u)):
        if k % m:
            u[k] = step(u[k - 1], k - 1, k)
    return u


def two_level_factor(z: float, m: int, n_c: int, relax: str) -> float:
    """Lesson 04: ‖E‖₂ for backward Euler, λ = 1/(1 − z), μ = 1/(1 − m z);
    E_F = I − B⁻¹A, E_FCF = E_F (I − A), A = I − λ^m S, B = I − μ S (S: down-shift)."""
    lam, mu = 1.0 / (1.0 - z), 1.0 / (1.0 - m * z)
    shift, identity = np.eye(n_c, k=-1), np.eye(n_c)
    A, B = identity - lam**m * shift, identity - mu * shift
    E = identity - np.linalg.solve(B, A)
    if relax == "FCF":
        E = E @ (identity - A)
    return float(np.linalg.norm(E, 2))


def gradient_settings() -> LayerParallelSettings:
    """Lesson 05: two levels, cfactor 4, F-relaxation, 3 forward and 3 adjoint cycles.

    Found by trying levels 2–4, cfactor 2/4/8, F or FCF and 0–6 cycles each way on the
    exercise network: the cheapest with gradient error ≤ 1e-3 (6.6e-4, 704 step
    applications; TorchBraid's defaults: 292 applications, error 0.43).
    """
    common = dict(levels=2, cfactor=4, relax="F", abs_tol=None, rel_tol=None)
    return LayerParallelSettings(forward=MGRITSettings(max_iter=3, **common),
                                 backward=MGRITSettings(max_iter=3, **common))


def block_starts(n_layers: int, cfactor: int, levels: int, ranks: int) -> list[int]:
    """Lesson 06: K = N / cfactor^(levels−1) coarsest intervals; rank q gets ⌊K/P⌋ of them,
    one more for q < K mod P; a block starts at its first interval's first layer."""
    spacing = cfactor ** (levels - 1)
    base, extra = divmod(n_layers // spacing, ranks)
    starts, interval = [], 0
    for q in range(ranks):
        starts.append(interval * spacing)
        interval += base + (1 if q < extra else 0)
    return starts


def layernorm_adjoint(x: np.ndarray, gamma: np.ndarray, dy: np.ndarray,
                      eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lesson 07: x̂ = (x − μ) r, r = 1/√(σ² + eps); g = dy ⊙ γ;
    dx = r (g − mean g − x̂ mean(g ⊙ x̂)), dγ = Σ dy ⊙ x̂, dβ = Σ dy (sums over all but E)."""
    mean = x.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mean) * r
    g = dy * gamma
    dx = r * (g - g.mean(axis=-1, keepdims=True)
              - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    E = x.shape[-1]
    return dx, (dy * xhat).reshape(-1, E).sum(axis=0), dy.reshape(-1, E).sum(axis=0)


def implicit_gru_step(x: np.ndarray, h: np.ndarray, W_ih: np.ndarray, W_hh: np.ndarray,
                      b_ih: np.ndarray, b_hh: np.ndarray, dt: float) -> np.ndarray:
    """Lesson 08: gates r, z, n as torch.nn.GRUCell; h_new = (h + dt(1−z) n)/(1 + dt(1−z))."""
    H = h.shape[1]
    gx, gh = x @ W_ih.T + b_ih, h @ W_hh.T + b_hh  # B,3H

    def sigmoid(a):
        return 1.0 / (1.0 + np.exp(-a))

    r = sigmoid(gx[:, :H] + gh[:, :H])
    z = sigmoid(gx[:, H:2 * H] + gh[:, H:2 * H])
    n = np.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
    return (h + dt * (1.0 - z) * n) / (1.0 + dt * (1.0 - z))


def allreduce_time(nbytes: float, ranks: int, alpha: float, beta: float) -> float:
    """Lesson 09: reduce-scatter + all-gather, each P − 1 messages of n/P bytes:
    2 (P − 1) (α + n β / P); zero on one rank."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * (alpha + nbytes / ranks * beta)


def restrict_average(x: np.ndarray) -> np.ndarray:
    """Lesson 10: 2×2 average restriction of (B, C, H, W) feature maps, H and W even:
    (R x)[i, j] = (x[2i, 2j] + x[2i+1, 2j] + x[2i, 2j+1] + x[2i+1, 2j+1]) / 4."""
    return (x[:, :, 0::2, 0::2] + x[:, :, 1::2, 0::2]
            + x[:, :, 0::2, 1::2] + x[:, :, 1::2, 1::2]) / 4.0


def restrict_average_transpose(v: np.ndarray) -> np.ndarray:
    """Lesson 10: Rᵀ of the 2×2 average: every coarse value, divided by 4, to each of its
    four fine cells: (Rᵀ v)[2i+a, 2j+b] = v[i, j] / 4 (a, b ∈ {0, 1}); (B, C, 2h, 2w)."""
    return np.repeat(np.repeat(v, 2, axis=2), 2, axis=3) / 4.0


def halo_adjoint(dy_halo: list[np.ndarray], counts: tuple[int, ...]) -> list[np.ndarray]:
    """Lesson 12: adjoint of the two-sided halo exchange of a row split (rank p owns
    ``counts[p]`` rows; ``dy_halo[p]`` is (B, C, n_p + 2, W)): y_p = ỹ_p[1:−1], then each
    ghost row is added back into the row it copied: ỹ_p[0] → last row of rank p − 1,
    ỹ_p[−1] → first row of rank p + 1 (ghosts beyond the image were zeros: dropped)."""
    dy = [np.array(d[:, :, 1:-1], dtype=float, copy=True) for d in dy_halo]
    for p in range(len(counts)):
        if p > 0:
            dy[p - 1][:, :, -1] += dy_halo[p][:, :, 0]
        if p < len(counts) - 1:
            dy[p + 1][:, :, 0] += dy_halo[p][:, :, -1]
    return dy


def stale_merge(theta_now: np.ndarray, sent_sum: np.ndarray, n_nodes: int,
                wait: int) -> np.ndarray:
    """Lesson 12: the local model counts as 2w copies beside the G sent ones:
    θ ← (2w·θ_now + Σ_h θ_h) / (G + 2w); w = 0 gives the plain average Σ_h θ_h / G."""
    return (2 * wait * theta_now + sent_sum) / (n_nodes + 2 * wait)


def gradient_errors(g: dict, ref: dict) -> dict[str, float]:
    """Lesson 13: e = ‖g − ref‖₂ / ‖ref‖₂ (‖g − ref‖₂ where ‖ref‖ = 0) per parameter, per
    group (the name before the first ".") and over all ("total"), summing squares first."""
    out, sums = {}, {}
    for name, r in ref.items():
        r = np.asarray(r, dtype=float)
        num = float(np.sum((np.asarray(g[name], dtype=float) - r) ** 2))
        den = float(np.sum(r**2))
        out[name] = np.sqrt(num / den) if den > 0 else np.sqrt(num)
        for key in (name.split(".")[0], "total"):
            a, b = sums.get(key, (0.0, 0.0))
            sums[key] = (a + num, b + den)
    for key, (num, den) in sums.items():
        out[key] = np.sqrt(num / den) if den > 0 else np.sqrt(num)
    return {k: float(v) for k, v in out.items()}


def xbraid_report(norms: list[float], iterations: int, status: str,
                  skipped: bool) -> tuple[int, list[int], list[float], float]:
    """Lesson 13: XBraid counts the skipped first cycle (num_iter = iterations + skip),
    numbers measurement j as j + skip, and on max_iter does not report the last measurement
    (the final relaxation's); TorchBraid's last norm is the last printed one, −1 if none."""
    skip = 1 if skipped else 0
    printed = list(norms) if status == "converged" else list(norms[:-1])
    numbers = [j + skip for j in range(len(printed))]
    return iterations + skip, numbers, printed, printed[-1] if printed else -1.0


def bias_noise_ratio(g_lp: np.ndarray, g: np.ndarray,
                     micro: np.ndarray) -> tuple[float, float, float]:
    """Lesson 11: bias = ‖g_LP − g‖, noise = √(Σ_i ‖g_i − ḡ‖² / (M(M − 1))) (the standard
    error of the mean of the M micro-batch gradients g_i), and bias / noise."""
    bias = float(np.linalg.norm(g_lp - g))
    M = micro.shape[0]
    noise = float(np.sqrt(((micro - micro.mean(axis=0)) ** 2).sum() / (M * (M - 1))))
    return bias, noise, bias / noise
