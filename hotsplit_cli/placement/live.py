"""When a live rebalance (`eplb_steps`) may replace the current placement: the decision rule the
ranks apply, and an offline replay of it for checking it on recorded traffic.

A candidate placement fitted on some steps always looks best on those steps, so its score there
says nothing. The rule instead fits the candidate on the recent history *before* the newest
`holdout` steps and scores both maps on those newest steps, which the candidate never saw: the
candidate replaces the current map only when it wins there by REBALANCE_MARGIN. On stationary
traffic a fitted plan is already as good as a refit, so the margin keeps it; on drifting traffic
the held-out steps carry the drift and the candidate wins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .algorithm import Geometry, Placement, place_experts
from .evaluate import evaluate

REBALANCE_MARGIN = 0.01  # held-out balancedness a candidate must gain to be applied (a move costs copies)
HISTORY_STEPS = 64  # steps a candidate is fitted on at most: more than one batch, few enough to follow drift


def holdout_steps(window: int) -> int:
    """Newest steps kept out of the fit: a quarter of the window since the last rebalance, at
    least one (with a one-step window the rest of the history comes from earlier windows)."""
    return max(1, window // 4)


@dataclass(frozen=True)
class Verdict:
    apply: bool
    candidate: Placement | None  # fitted on the history before the held-out steps
    kept_heldout: float  # balancedness of the current map on the held-out steps
    candidate_heldout: float  # ... of the candidate (equal to kept when there is no candidate)
    fitted_steps: int
    heldout_steps: int


def judge_rebalance(history_SLE: np.ndarray, window: int, current: Placement, num_experts: int) -> Verdict:
    """history_SLE: per-step expert counts summed over ranks, oldest first, ending with the
    `window` steps since the last rebalance. Each step is one exchange per layer, as the ranks
    measure balancedness."""
    history_SLE = np.asarray(history_SLE, dtype=np.float64)[-HISTORY_STEPS:]
    held = min(holdout_steps(window), len(history_SLE))
    fit_LE, test_SLE = history_SLE[:-held].sum(axis=0), history_SLE[-held:]
    kept = evaluate(test_SLE, current).balancedness
    if len(history_SLE) <= held or not fit_LE.any():
        return Verdict(False, None, kept, kept, 0, held)
    geo = Geometry(current.num_ranks, current.num_physical - num_experts)
    cand = place_experts(fit_LE[None], current.layers, geo)
    score = evaluate(test_SLE, cand).balancedness
    return Verdict(score >= kept + REBALANCE_MARGIN, cand, kept, score, len(history_SLE) - held, held)


@dataclass(frozen=True)
class Replay:
    balancedness: float  # over every step, each on the map it ran with
    static_balancedness: float  # ... had the first map been kept
    applied_at: tuple[int, ...]  # steps after which a rebalance was applied


def replay_rebalancing(counts_SLE: np.ndarray, start: Placement, eplb_steps: int) -> Replay:
    """Replays per-step traffic with the ranks' schedule (a decision after every `eplb_steps`
    steps, none after the last) and measures the balancedness each step gets on its map."""
    counts_SLE = np.asarray(counts_SLE, dtype=np.float64)
    S, _, E = counts_SLE.shape
    placement, applied = start, []
    peak = mean = 0.0
    for s in range(S):
        peak_s, mean_s = _step_load(counts_SLE[s], placement)
        peak, mean = peak + peak_s, mean + mean_s
        step = s + 1
        if step % eplb_steps == 0 and step < S:
            v = judge_rebalance(counts_SLE[:step], eplb_steps, placement, E)
            if v.apply:
                placement = v.candidate
                applied.append(step)
    static = evaluate(counts_SLE, start).balancedness
    return Replay(mean / peak if peak > 0 else 1.0, static, tuple(applied))


def _step_load(counts_LE: np.ndarray, placement: Placement) -> tuple[float, float]:
    b = evaluate(counts_LE[None], placement)
    return b.bottleneck, (b.bottleneck / b.imbalance if b.bottleneck > 0 else 0.0)
