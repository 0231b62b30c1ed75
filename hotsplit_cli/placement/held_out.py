"""What a placement's balancedness will be on traffic it has not seen: rolling-origin refits
(numpy only). A placement's `fitted` balancedness is measured on the windows it was fitted on,
so it is the best case; here the same fit is redone on windows [0, k) and judged on window k for
each origin of core/holdout.py, as the plan's hit-rate forecast is (hotset/forecast.py).

Shape letters: W = windows, L = MoE layers, E = logical experts, K = origins judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.holdout import HOW_TO_GET_WINDOWS, MIN_WINDOWS, Band, origins_of
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.evaluate import evaluate

FitLayout = Callable[[np.ndarray], Placement]  # windows [k, L, E] -> the layout fitted on them


@dataclass(frozen=True)
class HeldOutBalance:
    """Rolling-origin balancedness of a placement (a `reason` instead when it cannot be had)."""

    reason: str | None  # why there is no band; None when there is one
    origins: tuple[int, ...] = ()
    balancedness_K: tuple[float, ...] = ()  # of each judged window, on the layout fitted before it
    band: Band | None = None  # pooled over the judged windows; lowest and highest window

    def to_doc(self) -> dict:
        if self.reason is not None:
            return {"available": False, "reason": self.reason}
        return {"available": True, "method": "rolling origin: refit on windows [0, k), judged on window k",
                "origins": list(self.origins), "window_balancedness": list(self.balancedness_K),
                **self.band.to_doc()}


def held_out_balance(windows_WLE: np.ndarray, fit: FitLayout) -> HeldOutBalance:
    """Refit the layout with `fit` on windows [0, k) and judge it on window k. The pooled figure
    is EPLB's measure over every judged (window, layer): sum of mean rank loads / sum of max."""
    windows_WLE = np.asarray(windows_WLE, dtype=np.float64)
    W = windows_WLE.shape[0]
    if W < MIN_WINDOWS:
        return HeldOutBalance(f"the histogram has {W} window{'s' * (W != 1)}; a held-out band needs at least "
                              f"{MIN_WINDOWS} (fit on earlier, judge on later); {HOW_TO_GET_WINDOWS}")
    ks, rates, means, peaks = [], [], 0.0, 0.0
    for k in origins_of(W):
        if not windows_WLE[:k].any() or not windows_WLE[k].any():
            continue  # nothing to fit on, or nothing to judge
        b = evaluate(windows_WLE[k:k + 1], fit(windows_WLE[:k]))
        ks.append(k)
        rates.append(b.balancedness)
        peaks += b.bottleneck
        means += b.bottleneck * b.balancedness  # the window's sum of mean rank loads
    if not ks:
        return HeldOutBalance(f"no pair of windows to fit on and judge: the windows route no tokens; "
                              f"{HOW_TO_GET_WINDOWS}")
    band = Band(means / peaks if peaks > 0 else 1.0, min(rates), max(rates))
    return HeldOutBalance(None, tuple(ks), tuple(float(x) for x in rates), band)


def band_of_doc(doc: dict | None) -> Band | None:
    """The band of a placement file's `out_of_sample` (None: absent, as in older files, or not available)."""
    if not doc or not doc.get("available"):
        return None
    return Band(float(doc["expected"]), float(doc["low"]), float(doc["high"]))
