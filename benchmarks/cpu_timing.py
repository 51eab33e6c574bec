"""The benchmarks' CPU timer: one warm-up call, then the median of ``repeat`` calls' process
time (CPU seconds of this process: on a shared machine, the time the call itself used)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeat: int) -> float:
    """Median CPU seconds of ``repeat`` calls of ``fn`` after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)
