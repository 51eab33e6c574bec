"""What a layer-parallel code should produce for a network, a batch and MGRIT settings, and
how far the user's own numbers are from it.

For settings S (forward and adjoint MGRIT solves)::

    g_exact  = sequential backprop (the exact discrete adjoint)
    g_S      = refbraid's layer-parallel gradient with S       (layer_parallel_gradient)
    e_p(g)   = ‖g_p − ref_p‖ / ‖ref_p‖  per parameter p, per group (opening/steps/closing) and
               over all parameters ("total"; absolute where ‖ref‖ = 0)

and the residual histories of both solves in refbraid's record and in XBraid's reporting
(xbraid.py). A user's gradient passes when ``e_p(g_theirs)`` against ``g_S`` is ≤ the gradient
tolerance for every p; their residual norms (XBraid's convention, as TorchBraid prints them)
pass when every one is within the residual tolerance (relative) of refbraid's. A failure is
named: the worst parameter, its error against ``g_S`` and against ``g_exact``, and, when their
gradient matches S with the adjoint's final FC relaxation flipped, that this is a convention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..layer_parallel import LayerParallelSettings, layer_parallel_gradient
from ..network import GROUPS, Params, backprop
from .convert import Converted
from .xbraid import refbraid_history, xbraid_stats


@dataclass(frozen=True)
class Tolerances:
    """Relative tolerances of a comparison."""

    gradient: float = 1e-10  # their gradient vs refbraid's layer-parallel one, per parameter
    residual: float = 1e-8  # their residual norms vs refbraid's (XBraid convention)

    def __post_init__(self):
        for name in ("gradient", "residual"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"`{name}` tolerance must be a positive number, got {v!r}.")


def gradient_errors(g: Params, ref: Params) -> dict[str, float]:
    """e_p per parameter, per group and "total" (module docstring)."""
    out, sums = {}, {}
    for k, r in ref.items():
        r = np.asarray(r, dtype=np.float64)
        d = np.asarray(g[k], dtype=np.float64) - r
        num, den = float(np.sum(d * d)), float(np.sum(r * r))
        out[k] = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
        for grp in (k.split(".")[0], "total"):
            a, b = sums.get(grp, (0.0, 0.0))
            sums[grp] = (a + num, b + den)
    for grp, (num, den) in sums.items():
        out[grp] = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
    return out


def _settings_dict(s) -> dict:
    return {"levels": s.levels, "cfactors": list(s.cfactors),
            "relax": [s.relax_on(lvl) for lvl in range(s.levels - 1)],
            "cf_sweeps": [s.sweeps_on(lvl) for lvl in range(s.levels - 1)],
            "max_iter": s.max_iter, "abs_tol": s.abs_tol, "rel_tol": s.rel_tol,
            "cycle": s.cycle, "skip_first_down": s.skip_first_down, "fmg": s.fmg,
            "min_coarse": s.min_coarse, "final_fc_relax": s.final_fc_relax}


def _located(name: str, theirs: Params, ref: Params, keys: dict) -> tuple[str, str | None]:
    """"`name` (`state-dict key`)" for a message; for stacked step weights the worst layer."""
    key = keys.get(name)
    if isinstance(key, list):
        d = np.asarray(theirs[name], dtype=np.float64) - np.asarray(ref[name], dtype=np.float64)
        r = np.asarray(ref[name], dtype=np.float64)
        rows = [float(np.linalg.norm(d[i]) / max(np.linalg.norm(r[i]), 1e-300))
                for i in range(len(key))]
        i = int(np.argmax(rows))
        return f"`{name}` (worst layer {i}: `{key[i]}`)", key[i]
    if key is not None and key != name:
        return f"`{name}` (`{key}`)", key
    return f"`{name}`", key


def _check_their_gradient(theirs: Params, lp: Params, exact: Params, alt: Params | None,
                          tol: Tolerances, keys: dict) -> dict:
    vs_lp, vs_exact = gradient_errors(theirs, lp), gradient_errors(theirs, exact)
    names = list(lp)
    worst = max(names, key=lambda k: vs_lp[k])
    ok = vs_lp[worst] <= tol.gradient
    where, key = _located(worst, theirs, lp, keys)
    out = {"vs_layer_parallel": vs_lp, "vs_exact": vs_exact, "worst": worst,
           "worst_key": key, "pass": ok}
    if ok:
        out["message"] = (f"PASS: their gradient equals refbraid's layer-parallel gradient for "
                          f"these settings (worst `{worst}`: {vs_lp[worst]:.2e} <= "
                          f"{tol.gradient:g}).")
        return out
    msg = (f"FAIL: their gradient differs from refbraid's layer-parallel gradient for these "
           f"settings in {where} by {vs_lp[worst]:.2e} relative (tolerance {tol.gradient:g}; "
           f"total {vs_lp['total']:.2e}); against exact backprop: `{worst}` "
           f"{vs_exact[worst]:.2e}, total {vs_exact['total']:.2e}.")
    if max(vs_exact[k] for k in names) <= tol.gradient:
        msg += " It is the exact gradient: their solves converged, or ran other settings."
    elif alt is not None:
        vs_alt = gradient_errors(theirs, alt)
        if max(vs_alt[k] for k in names) <= tol.gradient:
            msg += (" It equals the gradient with the adjoint's final FC relaxation "
                    "flipped: a convention difference (`final_fc_relax`, "
                    "docs/xbraid_mapping.md), not a bug.")
            out["matches_flipped_final_fc_relax"] = True
    out["message"] = msg
    return out


def _check_their_residuals(theirs: dict, mine: dict, tol: Tolerances) -> dict:
    """Their norms against refbraid's: XBraid's reporting by default, refbraid's record (every
    measurement) with ``"convention": "refbraid"``."""
    if not isinstance(theirs, dict):
        raise ValueError("their residuals must be a JSON object {\"forward\": [...], "
                         "\"backward\": [...]}.")
    convention = theirs.get("convention", "xbraid")
    if convention not in ("xbraid", "refbraid"):
        raise ValueError(f"their residuals' `convention` must be 'xbraid' or 'refbraid', got "
                         f"{convention!r}.")
    out, ok, lines = {"convention": convention}, True, []
    for direction in ("forward", "backward"):
        if direction not in theirs:
            continue
        want = dict(mine[direction]["xbraid"])
        if convention == "refbraid":
            rb = mine[direction]["refbraid"]
            skip = 1 if rb["start"] == "skip" else 0
            want.update(norms=rb["norms"], last=rb["norms"][-1],
                        iteration_numbers=[k + skip for k in range(len(rb["norms"]))])
        got = theirs[direction]
        if not isinstance(got, (list, tuple)):  # getFwdStats()/getBwdStats()'s last norm
            got_list, want_list = [float(got)], [want["last"]]
        else:
            got_list, want_list = [float(v) for v in got], list(want["norms"])
        if len(got_list) != len(want_list):
            ok = False
            lines.append(f"{direction}: they report {len(got_list)} residual norm(s), "
                         f"{convention}'s convention gives {len(want_list)} for these settings "
                         f"(iterations {want['iterations']}, XBraid numbers "
                         f"{want['iteration_numbers']})")
            out[direction] = {"theirs": got_list, "refbraid": want_list, "pass": False}
            continue
        diffs = [abs(a - b) / max(abs(b), 1e-300) for a, b in zip(got_list, want_list,
                                                                   strict=True)]
        passed = all(d <= tol.residual for d in diffs)
        ok &= passed
        if not passed:
            i = int(np.argmax(diffs))
            lines.append(f"{direction}: norm {i + 1} (XBraid iteration "
                         f"{(want['iteration_numbers'] or [None])[i] if want['norms'] else '-'})"
                         f" is {got_list[i]:.10g}, refbraid {want_list[i]:.10g} "
                         f"(rel. diff {diffs[i]:.2e} > {tol.residual:g})")
        out[direction] = {"theirs": got_list, "refbraid": want_list, "rel_diff": diffs,
                          "pass": passed}
    out["pass"] = ok
    out["message"] = (f"PASS: their residual norms equal refbraid's ({convention} convention)."
                      if ok else "FAIL: " + "; ".join(lines) + ".")
    return out


def compare(converted: Converted, x, labels, settings: LayerParallelSettings,
            their_gradient: Params | None = None, their_residuals: dict | None = None,
            tolerances: Tolerances | None = None) -> tuple[dict, dict[str, Params]]:
    """The report (a JSON-able dict) and the gradients ``{"exact": ..., "layer_parallel": ...}``
    (module docstring). ``their_gradient`` is keyed by refbraid name
    (:func:`refbraid.interop.params_from_keyed` converts a state-dict-keyed one);
    ``their_residuals`` is ``{"forward": [norms], "backward": [norms] or last}``."""
    tol = Tolerances() if tolerances is None else tolerances
    net, params = converted.net, converted.params
    loss_exact, g_exact, _ = backprop(net, params, x, labels)
    loss_lp, g_lp, info = layer_parallel_gradient(net, params, x, labels, settings)
    residuals = {}
    for direction, result in (("forward", info.forward), ("backward", info.backward)):
        residuals[direction] = {"refbraid": refbraid_history(result),
                                "xbraid": xbraid_stats(result).as_dict()}
    report = {
        "network": {"n_layers": net.n_layers, "T": net.T, "opening": repr(net.opening),
                    "step": repr(net.step), "closing": repr(net.closing),
                    "n_weights": int(sum(np.size(v) for v in params.values()))},
        "batch": {"size": int(len(labels))},
        "settings": {"forward": _settings_dict(settings.forward),
                     "backward": _settings_dict(settings.backward)},
        "exact": {"loss": loss_exact,
                  "gradient_norm": {g: float(np.sqrt(sum(float(np.sum(v * v))
                                                         for k, v in g_exact.items()
                                                         if k.startswith(g + "."))))
                                    for g in GROUPS}},
        "layer_parallel": {"loss": loss_lp, "loss_error": abs(loss_lp - loss_exact),
                           "gradient_error": gradient_errors(g_lp, g_exact)},
        "residuals": residuals,
        "failures": [],
    }
    if their_gradient is not None:
        missing = [k for k in g_lp if k not in their_gradient]
        if missing:
            raise ValueError(f"their gradient lacks {missing}.")
        flipped = replace(settings, backward=settings.backward.replace(
            final_fc_relax=not settings.backward.final_fc_relax))
        alt = None if settings.backward.levels == 1 else \
            layer_parallel_gradient(net, params, x, labels, flipped)[1]
        check = _check_their_gradient(their_gradient, g_lp, g_exact, alt, tol, converted.keys)
        report["their_gradient"] = check
        if not check["pass"]:
            report["failures"].append(check["message"])
    if their_residuals is not None:
        check = _check_their_residuals(their_residuals, residuals, tol)
        report["their_residuals"] = check
        if not check["pass"]:
            report["failures"].append(check["message"])
    if their_gradient is not None or their_residuals is not None:
        report["verdict"] = "FAIL" if report["failures"] else "PASS"
    return report, {"exact": g_exact, "layer_parallel": g_lp}


def summary(report: dict) -> str:
    """A few lines for the terminal: losses, the gradient error per group, residuals, verdict."""
    ex, lp = report["exact"], report["layer_parallel"]
    err = lp["gradient_error"]
    groups = "  ".join(f"{g} {err[g]:.3e}" for g in (*GROUPS, "total") if g in err)
    lines = [f"exact loss {ex['loss']:.12g}   layer-parallel loss {lp['loss']:.12g} "
             f"(|ΔL| {lp['loss_error']:.2e})",
             f"layer-parallel gradient rel. error vs exact: {groups}"]
    for d in ("forward", "backward"):
        xb, rb = report["residuals"][d]["xbraid"], report["residuals"][d]["refbraid"]
        norms = ", ".join(f"{v:.10g}" for v in xb["norms"]) or "none (-1)"
        lines.append(f"{d:>8}: XBraid/TorchBraid reports {xb['iterations']} iteration(s), "
                     f"residual(s) {norms}; refbraid records {rb['norms']}")
    for key in ("their_gradient", "their_residuals"):
        if key in report:
            lines.append(report[key]["message"])
    if "verdict" in report:
        lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines)
