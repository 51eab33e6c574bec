"""Where MGRIT's batched sweeps pay on a GPU backend (``cuda``, ``cupy``): decided by counts.

On the CPU backends a step layer's ``batched_sweeps_pay`` says whether one call per sweep beat
one call per interval *in time* (docs/batched.md: cache effects decide it there). On a GPU
small steps are bound by launches (docs/gpu_layer_parallel.md), so the question is how many
launches the host issues per gradient, which :mod:`refbraid.backends.launch_count` counts
without a GPU. Per step type, one layer-parallel gradient (TorchBraid's settings, N = 64 and
256, ``python benchmarks/count_launches.py``), ``cupy``:

==============  ==========================  ==========================
step            launches per-step → batched  launches per-step → batched
                N = 64                       N = 256
==============  ==========================  ==========================
dense           2,510 → 771 (0.31×)         9,626 → 1,707 (0.18×)
conv            11,010 → 2,691 (0.24×)      43,422 → 4,947 (0.11×)
transformer     17,672 → see the table      70,196 → see the table
GRU             12,770 → 1,945 (0.15×)      50,690 → 4,330 (0.09×)
==============  ==========================  ==========================

Fewer launches in every case, with the same dependency depth (critical path): so batched
sweeps are on for all four step types on both GPU backends (:data:`BATCHED_ON_DEVICE`), and
one sweep is one launch set: the CPU's cache-sized chunks of the transformer and GRU batched
calls do not apply on a device (:func:`chunk_rows`). ``tests/test_launch_count.py`` checks
the rule on the counting device (batched issues fewer launches than per-step for every step
type listed here), so a change that breaks it fails there. With a GPU at hand,
``benchmarks/bench_gpu.py``'s ``sweeps`` rows time the same comparison.
"""

from __future__ import annotations

#: The GPU backends (one launch per array operation or kernel).
DEVICE_BACKENDS = ("cuda", "cupy")

#: Whether each GPU backend's MGRIT sweeps take batched steps at all
#: (:func:`refbraid.backends.batched_sweeps_on`).
SWITCHED_ON = {"cuda": True, "cupy": True}

#: Step layers (class names) whose batched sweeps are on for the GPU backends: the launch counts
#: in the module docstring.
BATCHED_ON_DEVICE = frozenset({"DenseStep", "ConvStep", "EncoderStep", "GRUCell"})


def on_device(bk) -> bool:
    """True for a GPU backend (``bk`` a Backend, or None for a plain call)."""
    return getattr(bk, "name", None) in DEVICE_BACKENDS


def pays(layer, bk) -> bool:
    """Whether MGRIT's sweeps of ``layer`` should be batched on GPU backend ``bk``."""
    return on_device(bk) and type(layer).__name__ in BATCHED_ON_DEVICE


def chunk_rows(bk, cpu_rows: int, k: int) -> int:
    """Rows per batched call: the CPU's cache-sized ``cpu_rows``, or all ``k`` rows on a GPU
    backend (one launch set per sweep)."""
    return max(int(k), 1) if on_device(bk) else cpu_rows
