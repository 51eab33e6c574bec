"""The cost model of suite ``step`` (docs/references.md §4; benchmarks/step.py's docstring):
unit step costs, each rank's counted Φ calls per level and messages, an overhead per call
fitted to the 1-rank run, and the ring allreduce of data parallelism.
"""

from __future__ import annotations


def _counts(r, L):
    fwd, bwd = r["fwd"], r["bwd"]
    return {"fine_fwd": sum(fwd[: L - 1]), "coarsest": fwd[L - 1] + bwd[L - 1],
            "bwd_fine": bwd[0], "bwd_coarse": sum(bwd[1: L - 1]), "calls": sum(fwd) + sum(bwd),
            "coarsest_bwd": bwd[L - 1], "coarsest_fwd": fwd[L - 1]}


def _work(c, u):
    """Seconds of kernel work outside the coarsest level, and on it."""
    w = c["fine_fwd"] * u["c_f"] + c["bwd_fine"] * u["c_bg"] + c["bwd_coarse"] * u["c_bc"]
    return w, c["coarsest_fwd"] * u["c_f"] + c["coarsest_bwd"] * u["c_bc"]


def model(one: dict, many: dict) -> dict:
    """Predicted per-batch times (see the module docstring) from the 1-rank and P-rank runs."""
    L = one.get("levels", 3)
    u = {k: one[k] for k in ("c_f", "c_bc", "c_bg")}
    c1 = _counts(one["per_rank"][0], L)
    w1, wc1 = _work(c1, u)
    recomputed1 = one["per_rank"][0]["recomputed"] * u["c_f"]
    o = max(one["lp_s"] - w1 - wc1 - recomputed1, 0.0) / c1["calls"]
    alpha, beta = many.get("ping_pong", {}).get("MPIComm", (0.0, 0.0))  # send_next's way
    t_msg = alpha + one["state_bytes"] * beta
    busy, pipe, msgs = [], 0.0, 0
    for r in many["per_rank"]:
        c = _counts(r, L)
        w, wc = _work(c, u)
        busy.append(w + r["recomputed"] * u["c_f"] + o * (c["calls"] - c["coarsest"]))
        pipe += wc + o * c["coarsest"]
        msgs = max(msgs, r["sends"])
    coarsest_1 = wc1 + o * c1["coarsest"]

    def at(p):
        return (one["lp_s"] - coarsest_1) / p + coarsest_1 + msgs * t_msg

    return {"lp": max(busy) + pipe + msgs * t_msg, "o": o, "t_msg": t_msg, "at": at}


def ring_allreduce(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """T ≈ 2(p−1)·α + 2(p−1)/p · n·β (docs/references.md §4)."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta
