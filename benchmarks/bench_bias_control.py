"""Gradient bias of layer-parallel GPT training, and what controlling it costs.

Trains the GPT of ``refbraid train --model gpt`` on ``lm-reverse`` once per setting, each in a
fresh run folder (``--out``, default a temporary folder), and prints three tables from the
runs' ``log.json``, ``language.json`` and ``bias_control.json``:

1. per run: final train loss, validation perplexity and exact match of greedily generated
   answers (sequential forward / the MGRIT forward the run trained), Φ applications of the
   training gradients (MGRIT's ``phi_calls``; 2N per serial backprop) and of the bias
   measurements, wall seconds (compare only within one run of this script, and state the load);
2. per measured run and epoch: bias ‖g_MGRIT − g‖, mini-batch noise (standard error over
   micro-batches), their ratio, relative bias, final forward/adjoint residuals, cycles;
   every controller decision with its numbers;
3. the proxy: correlation of log fwd_res / log bwd_res with log bias/noise over all
   measurements.

Runs: serial; fixed 2/1 cycles (refbraid's gpt default); fixed 1/0 (TorchBraid's); 1/0 with the
``iterations`` and ``serial`` controllers (threshold 1); 1/0 with buffer layers 1 and 2; 1/0 with
the ``iterations`` controller on the residual proxy (fwd_res > 10)::

    python benchmarks/bench_bias_control.py                 # 8 epochs each (~1 h on 2 busy cores)
    python benchmarks/bench_bias_control.py --quick         # 2 epochs, 400 sequences
    python benchmarks/bench_bias_control.py --report DIR    # tables of runs already in DIR
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from refbraid.training.config import TrainConfig
from refbraid.training.run import train

RUNS = {
    "serial": ("serial (backprop)", dict(serial=True)),
    "fixed21": ("LP fixed 2/1 (refbraid's gpt default)", dict(bias_control="measure")),
    "fixed10": ("LP fixed 1/0 (TorchBraid's)", dict(fwd_iters=1, bwd_iters=0,
                                                    bias_control="measure")),
    "iterations": ("LP 1/0 + controller iterations", dict(fwd_iters=1, bwd_iters=0,
                                                          bias_control="iterations")),
    "toserial": ("LP 1/0 + controller serial", dict(fwd_iters=1, bwd_iters=0,
                                                    bias_control="serial")),
    "buffer1": ("LP 1/0, buffer 1", dict(fwd_iters=1, bwd_iters=0, buffer=1,
                                         bias_control="measure")),
    "buffer2": ("LP 1/0, buffer 2", dict(fwd_iters=1, bwd_iters=0, buffer=2,
                                         bias_control="measure")),
    "proxy": ("LP 1/0 + iterations on fwd_res > 10", dict(
        fwd_iters=1, bwd_iters=0, bias_control="iterations", bias_signal="residual",
        bias_residual=10.0)),
}


def _load(folder: Path, name: str):
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def run_table(root: Path) -> None:
    print("| run | epochs | final train loss | val perplexity (seq. / MGRIT fwd) | exact match "
          "| Φ applications | + measuring | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for key, (name, _) in RUNS.items():
        log = _load(root / key, "log.json")
        if log is None or log["status"] != "finished":
            print(f"| {name} | (no finished run) |||||||")
            continue
        h, lang, bc = log["history"], _load(root / key, "language.json") or {}, \
            _load(root / key, "bias_control.json")
        steps = sum(r["steps"] for r in h)
        apps = bc["step_applications"] if bc else 2 * log["network"]["layers"] * steps
        meas = bc["measure_applications"] if bc else 0
        s, m = lang.get("sequential", {}), lang.get("mgrit")
        ppl = f"{s['perplexity']:.3f}" + (f" / {m['perplexity']:.3f}" if m else "")
        em = f"{100 * s['exact_match']:.1f}%" + (f" / {100 * m['exact_match']:.1f}%" if m else "")
        wall = sum(r["time_s"] for r in h)
        print(f"| {name} | {len(h)} | {h[-1]['train_loss']:.4f} | {ppl} | {em} | {apps:.0f} | "
              f"{meas:.0f} | {wall:.0f} |")


def bias_tables(root: Path) -> None:
    measured = []
    for key, (name, _) in RUNS.items():
        bc, log = _load(root / key, "bias_control.json"), _load(root / key, "log.json")
        if not bc or not log:
            continue
        measured += bc["measurements"]
        per_epoch = log["history"][0]["steps"]
        print(f"\n{name}: means per epoch of the measurements")
        print("| epoch | train loss | bias | noise | bias/noise | rel. bias | fwd_res | bwd_res "
              "| cycles |")
        print("|---|---|---|---|---|---|---|---|---|")
        for e, rec in enumerate(log["history"], 1):
            ms = [m for m in bc["measurements"] if (m["step"] - 1) // per_epoch + 1 == e]
            if ms:
                def avg(k, ms=ms):
                    return sum(m[k] for m in ms) / len(ms)
                print(f"| {e} | {rec['train_loss']:.4f} | {avg('bias'):.3g} | {avg('noise'):.3g} "
                      f"| {avg('bias_ratio'):.2f} | {avg('rel_bias'):.3f} | {avg('fwd_res'):.3g} "
                      f"| {avg('bwd_res'):.3g} | {ms[-1]['fwd_iters']}/{ms[-1]['bwd_iters']} |")
        for d in bc["decisions"]:
            why = (f"bias/noise {d['bias_ratio']:.2f} (bias {d['bias']:.3g}, noise "
                   f"{d['noise']:.3g}), " if "bias_ratio" in d else "")
            print(f"- step {d['step']}: {why}fwd_res {d['fwd_res']:.3g}, bwd_res "
                  f"{d['bwd_res']:.3g} → {d['action']}")
    if len(measured) > 3:
        r = np.log([m["bias_ratio"] for m in measured])
        print(f"\nproxy over {len(measured)} measurements: correlation of log bias/noise with")
        for k in ("fwd_res", "bwd_res"):
            print(f"- log {k}: {np.corrcoef(np.log([m[k] for m in measured]), r)[0, 1]:+.2f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="2 epochs on 400 sequences")
    p.add_argument("--out", help="folder for the runs (default: a temporary folder)")
    p.add_argument("--report", help="only print the tables of the runs in this folder")
    p.add_argument("--backend", default="numba")
    args = p.parse_args(argv)
    if args.report:
        root = Path(args.report)
    else:
        root = Path(args.out or tempfile.mkdtemp(prefix="bench_bias_"))
        size = dict(samples=400, epochs=2) if args.quick else {}
        print(f"runs in {root}/  (load: {os.getloadavg()[0]:.1f})")
        for key, (_, extra) in RUNS.items():
            train(TrainConfig(model="gpt", backend=args.backend, bias_every=5, quiet=True,
                              overwrite=True, out=str(root / key), **size, **extra))
    run_table(root)
    bias_tables(root)


if __name__ == "__main__":
    main()
