"""Rolling-origin hold-out, shared by every figure fitted on a windowed histogram (numpy free):
which windows a refit is judged on, and the band the judged figures make.

A figure fitted on all W windows is refitted on windows [0, k) and judged on window k, the next
traffic it did not see, for every origin k of the later half (k = ceil(W / 2) .. W - 1; earlier
origins fit on too little to stand for a fit on all W). Used by the plan's hit-rate forecast
(hotset/forecast.py) and the placement's balancedness (placement/held_out.py).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_WINDOWS = 2  # one to fit, one to judge
HOW_TO_GET_WINDOWS = "capture the histogram with `hotsplit balance --window-steps N`"


@dataclass(frozen=True)
class Band:
    """A forecast: the pooled held-out figure and the lowest and highest held-out window."""

    expected: float
    low: float
    high: float

    def contains(self, x: float, slack: float = 1e-12) -> bool:
        return self.low - slack <= x <= self.high + slack

    def to_doc(self) -> dict:
        return {"expected": self.expected, "low": self.low, "high": self.high}


def origins_of(num_windows: int) -> range:
    """The origins k judged: the later half of the windows, each fitted on all before it."""
    return range(max(1, -(-num_windows // 2)), num_windows)
