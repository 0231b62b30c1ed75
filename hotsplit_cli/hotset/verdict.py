"""Did a run achieve what it was told to expect? Achieved vs predicted, with a band (numpy free).

A plan gives a run two hit-rate predictions: the in-sample figure (`hit_rate`, exact on the
traffic the plan was fitted on) and, when its histogram had windows, the out-of-sample forecast
(forecast.py: pooled over held-out windows, with the lowest and highest window).
- in-sample: the band is the figure itself, widened by the held-out spread of one window
  ((high - low) / 2 each side); without a forecast it is exact (a run on the fitted traffic).
- out-of-sample: from the lowest held-out window up to the higher of the highest held-out
  window and the in-sample figure (traffic like the fit's is new traffic too, and the fit's
  own rate is what the plan achieves on it).
A run on another task's traffic is outside both when its routing is not the fit's (docs/simulate.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from hotsplit_cli.hotset.forecast import Band

EXACT = 1e-9  # a figure without a spread is judged to rounding


@dataclass(frozen=True)
class Verdict:
    """One prediction judged: WITHIN when low <= achieved <= high."""

    figure: str  # what was predicted, e.g. "hit rate (plan, in-sample)"
    achieved: float
    predicted: float
    low: float
    high: float
    band: str  # where the band comes from

    @property
    def within(self) -> bool:
        return self.low - EXACT <= self.achieved <= self.high + EXACT

    @property
    def word(self) -> str:
        return "WITHIN" if self.within else "OUTSIDE"

    def to_doc(self) -> dict:
        return {"figure": self.figure, "achieved": self.achieved, "predicted": self.predicted,
                "low": self.low, "high": self.high, "band": self.band, "verdict": self.word}


def hit_rate_verdicts(in_sample: float | None, forecast: Band | None, achieved: float) -> list[Verdict]:
    """The plan's hit-rate predictions judged against the `achieved` hit rate (fractions)."""
    out = []
    if in_sample is not None:
        half = 0.0 if forecast is None else (forecast.high - forecast.low) / 2
        band = "exact: no held-out windows" if forecast is None else "+- half the held-out windows' range"
        out.append(Verdict("hit rate (plan, in-sample)", achieved, in_sample, in_sample - half, in_sample + half,
                           band))
    if forecast is not None:
        top = forecast.high if in_sample is None else max(forecast.high, in_sample)
        out.append(Verdict("hit rate (plan, out-of-sample)", achieved, forecast.expected, forecast.low, top,
                           "held-out windows' lowest .. max(highest, in-sample)"))
    return out
