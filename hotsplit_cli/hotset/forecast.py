"""What a plan's hit rate will be on traffic it has not seen: rolling-origin refits (numpy only).

A plan's `hit_rate` is measured on the histogram it was fitted on, so it is the best case. With
a windowed histogram (`balance --window-steps`), the same planner is refitted on the windows up
to an origin k and judged on window k (core/holdout.py: which origins). The forecast is the
pooled hit rate over those held-out windows, its range the lowest and highest window.
Shape letters: W = windows, L = MoE layers, E = experts, R = ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.holdout import HOW_TO_GET_WINDOWS, MIN_WINDOWS, Band, origins_of

__all__ = ["Band", "HeldOut", "no_forecast", "origins_of", "rolling_origin"]  # Band, origins_of: re-exported

Fit = Callable[[np.ndarray], np.ndarray]  # counts [L, E] -> hot mask [R, L, E] (the plan's own planner)
RankRates = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (counts [L, E], hot [R, L, E]) -> rate [R]


@dataclass(frozen=True)
class HeldOut:
    """Rolling-origin hit rates of a plan (None figures with a `reason` when there are no windows)."""

    reason: str | None  # why there is no forecast; None when there is one
    origins: tuple[int, ...] = ()  # fitted on windows [0, k), judged on window k
    rate_K: np.ndarray | None = None  # float [K]: overall hit rate of each held-out window
    overall: Band | None = None
    rank_rate_KR: np.ndarray | None = None  # float [K, R]: each rank's (with a placement)
    ranks: tuple[Band, ...] = ()

    def to_doc(self) -> dict:
        if self.reason is not None:
            return {"available": False, "reason": self.reason}
        doc = {"available": True, "method": "rolling origin: refit on windows [0, k), judged on window k",
               "origins": list(self.origins), "window_hit_rates": [float(x) for x in self.rate_K],
               **self.overall.to_doc()}
        if self.ranks:
            doc["ranks"] = [b.to_doc() for b in self.ranks]
        return doc


def no_forecast(windows: int) -> HeldOut:
    have = "no windows" if windows == 0 else f"{windows} window"
    return HeldOut(f"the histogram has {have}; an out-of-sample estimate needs at least {MIN_WINDOWS} "
                   f"(fit on earlier, judge on later); {HOW_TO_GET_WINDOWS}")


def rolling_origin(windows_WLE: np.ndarray | None, fit: Fit, rank_rates: RankRates | None = None) -> HeldOut:
    """Refit with `fit` on windows [0, k) and judge on window k, for each origin of `origins_of`.
    The overall rate of a window counts an assignment hot when any rank holds its expert hot
    (the plan's `hit_rate`); `rank_rates` gives each rank's (a placement's replicas)."""
    W = 0 if windows_WLE is None else int(np.shape(windows_WLE)[0])
    if W < MIN_WINDOWS:
        return no_forecast(W)
    windows_WLE = np.asarray(windows_WLE, dtype=np.float64)
    cum_WLE = np.cumsum(windows_WLE, axis=0)
    ks, hits, totals, rank_rows = [], [], [], []
    for k in origins_of(W):
        judged_LE = windows_WLE[k]
        if not cum_WLE[k - 1].any() or not judged_LE.any():
            continue  # nothing to fit on, or nothing to judge
        hot_RLE = fit(cum_WLE[k - 1])
        ks.append(k)
        hits.append(float((judged_LE * hot_RLE.any(axis=0)).sum()))
        totals.append(float(judged_LE.sum()))
        if rank_rates is not None:
            rank_rows.append(rank_rates(judged_LE, hot_RLE))
    if not ks:
        return HeldOut(f"no pair of windows to fit on and judge: the windows route no tokens; {HOW_TO_GET_WINDOWS}")
    rate_K = np.asarray(hits) / np.asarray(totals)
    overall = Band(float(sum(hits) / sum(totals)), float(rate_K.min()), float(rate_K.max()))
    if not rank_rows:
        return HeldOut(None, tuple(ks), rate_K, overall)
    rank_KR = np.asarray(rank_rows, dtype=np.float64)
    # A rank's figure is the mean of its held-out windows (`rank_rates` gives rates, not counts).
    ranks = tuple(Band(float(rank_KR[:, r].mean()), float(rank_KR[:, r].min()), float(rank_KR[:, r].max()))
                  for r in range(rank_KR.shape[1]))
    return HeldOut(None, tuple(ks), rate_K, overall, rank_KR, ranks)
