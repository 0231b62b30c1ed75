"""How hotsplit times things: one module for the probes, selftest, the CPU cold path's rate
check and the full-size benchmark, so that every figure is measured the same way.

A clock runs a callable once and returns the seconds it took: `wall_clock` on the host,
`cuda_event_clock` on a GPU (events on the current stream, which time the device's work rather
than the launch). `sync` callables make a wall-clock time include asynchronous device work.
torch is passed in, never imported here: probes stay importable without it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

Clock = Callable[[Callable[[], None]], float]  # run once, seconds


def _nothing() -> None:
    return None


def wall_clock(run: Callable[[], None]) -> float:
    """Seconds of one call of `run` by the host's monotonic clock."""
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def cuda_event_clock(torch: Any) -> Clock:
    """A clock of CUDA events on the current stream: seconds of the device work `run` queued."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def elapsed_s(run: Callable[[], None]) -> float:
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return elapsed_s


def median_ms(fn: Callable[[], object], reps: int, sync: Callable[[], None] = _nothing) -> float:
    """Median wall time of `reps` single calls of `fn` in ms, `sync` called before and after each
    (a device synchronise, so queued work is not charged to the next call)."""
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def per_call_ms(fn: Callable[[], object], clock: Clock = wall_clock, sync: Callable[[], None] = _nothing,
                budget_ms: float = 300.0) -> float:
    """Median ms per call of `fn`, called back to back in samples of about 10 ms and as many
    samples (3..20) as fit in `budget_ms`; one call first warms up, one more estimates the cost."""
    fn()
    sync()
    est_ms = max(median_ms(fn, 1, sync), 1e-3)
    calls = max(1, min(50, int(10.0 / est_ms)))
    samples = max(3, min(20, int(budget_ms / (calls * est_ms))))

    def batch() -> None:
        for _ in range(calls):
            fn()
        sync()

    return statistics.median(clock(batch) * 1e3 / calls for _ in range(samples))
