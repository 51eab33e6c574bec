"""Batch norm inside the layer-parallel section: accuracy of layer-parallel vs serial training
of the conv-stages network.

``refbraid train --model conv-stages`` on digits with the model's defaults (16 layers in two
stages, width 4, 2×2 average pool + zero channels between them, MGRIT 3 levels, cfactor 2,
one forward and one adjoint cycle, FCF), with and without ``--batch-norm`` (BN conv steps and
a BN transition; running statistics from the final fine sweep), serial and layer-parallel
(with and without ``--spatial-levels 1``). Prints one row per (model, gradient): final
validation accuracy per seed, their mean, and seconds per epoch (median over the runs).

    python benchmarks/bench_bn_stages.py [--epochs 5] [--seeds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from refbraid.training.config import TrainConfig
from refbraid.training.run import train

RUNS = [  # (label, flags)
    ("conv", "serial", dict(serial=True)),
    ("conv", "layer-parallel", {}),
    ("conv + BN", "serial", dict(batch_norm=True, serial=True)),
    ("conv + BN", "layer-parallel", dict(batch_norm=True)),
    ("conv + BN", "layer-parallel, spatial level 1", dict(batch_norm=True, spatial_levels="1")),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seeds", type=int, default=2)
    args = p.parse_args()
    print(f"digits, conv-stages, {args.epochs} epochs, seeds 0..{args.seeds - 1}\n")
    print("| model | gradient | val acc per seed | mean | s / epoch |")
    print("|---|---|---|---|---|")
    for model, label, flags in RUNS:
        accs, times = [], []
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as out:
                config = TrainConfig(model="conv-stages", epochs=args.epochs, seed=seed,
                                     quiet=True, out=out, **flags)
                start = time.perf_counter()
                result = train(config)
                times.append((time.perf_counter() - start) / args.epochs)
            accs.append(100 * result.final["val_acc"])
        per_seed = ", ".join(f"{a:.1f}" for a in accs)
        print(f"| {model} | {label} | {per_seed} | {statistics.mean(accs):.1f} | "
              f"{statistics.median(times):.2f} |", flush=True)


if __name__ == "__main__":
    main()
