"""What the benchmarks print beside their figures: a sample's median with its spread, and the
machine's load while they ran (on a shared machine the load says how far to trust a time)."""

from __future__ import annotations

import os
import statistics


def spread(xs: list[float], fmt: str) -> str:
    """`median (min-max)` of a sample, each in `fmt`."""
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def load_average() -> float:
    """The 1-minute load average (what `uptime` prints first)."""
    return os.getloadavg()[0]


def load_span(before: float) -> str:
    """`load average B -> A`: the load when a measurement began (`before`) and now."""
    return f"load average {before:.1f} -> {load_average():.1f}"
