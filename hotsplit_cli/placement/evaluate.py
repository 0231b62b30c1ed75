"""How evenly an expert-parallel layout spreads routed traffic, the held-out choice of what to
fit a layout on, and the baselines `hotsplit place` compares against (numpy only).

Shape letters as in placement.py: W = windows, L = MoE layers, E = logical experts,
P = physical experts (slots), R = ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.errors import PlanError, UsageError
from hotsplit_cli.placement.algorithm import (
    Geometry,
    Placement,
    check_geometry,
    check_windows,
    hierarchical_phy2log,
    place_experts,
)

# ---- evaluation ------------------------------------------------------------------------------


def rank_loads(windows_WLE: np.ndarray, placement: Placement) -> np.ndarray:
    """Load of each rank (float [W, L, R]): sum over its slots of count / replicas."""
    windows_WLE = np.asarray(windows_WLE, dtype=np.float64)
    W, L, E = windows_WLE.shape
    phy = placement.phy2log_LP
    cnt = placement.logcnt_LE(E)
    per_slot = np.take_along_axis(windows_WLE, phy[None], 2) / np.take_along_axis(cnt, phy, 1)[None]
    return per_slot.reshape(W, L, placement.num_ranks, placement.slots_per_rank).sum(axis=3)


@dataclass(frozen=True)
class Balance:
    """How evenly a layout spreads some traffic. Every (window, layer) is one all-to-all step."""

    bottleneck: float  # sum over windows and layers of the busiest rank's load
    imbalance: float  # bottleneck / sum of mean rank loads (1.0 = perfect)
    balancedness: float  # 1 / imbalance: mean / max, EPLB's measure

    def to_doc(self) -> dict:
        return dict(self.__dict__)


def evaluate(windows_WLE: np.ndarray, placement: Placement) -> Balance:
    loads = rank_loads(windows_WLE, placement)
    peak = float(loads.max(axis=2).sum())
    mean = float(loads.mean(axis=2).sum())
    if peak <= 0:
        return Balance(0.0, 1.0, 1.0)
    return Balance(peak, peak / mean, mean / peak)


def duplicate_count(placement: Placement) -> int:
    """Number of (layer, rank) pairs that hold two or more replicas of one expert."""
    L = placement.phy2log_LP.shape[0]
    per_rank = np.sort(placement.phy2log_LP.reshape(L, placement.num_ranks, placement.slots_per_rank), axis=2)
    return int((np.diff(per_rank, axis=2) == 0).any(axis=2).sum())


def physical_counts(counts_LE: np.ndarray, placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    """Traffic of each physical expert (float [L, P]: count / replicas) and its rank (int [L, P]).

    Feeds `plan_hot_set(values_LP, expert_bytes, budget, rank_of_LE=rank_LP, num_ranks=R)`: each
    rank then chooses hot experts among the physical experts placed on it.
    """
    counts_LE = np.asarray(counts_LE, dtype=np.float64)
    L, E = counts_LE.shape
    if placement.phy2log_LP.shape[0] != L:
        raise PlanError(f"placement has {placement.phy2log_LP.shape[0]} layers, counts have {L}")
    if placement.phy2log_LP.max() >= E:
        raise PlanError(f"placement names expert {int(placement.phy2log_LP.max())}, counts have {E} experts")
    phy = placement.phy2log_LP
    values = np.take_along_axis(counts_LE, phy, 1) / np.take_along_axis(placement.logcnt_LE(E), phy, 1)
    return values, np.broadcast_to(placement.rank_P, phy.shape).copy()


# ---- which traffic to fit on -----------------------------------------------------------------


FIT_MODES = ("auto", "windows", "totals")
MIN_WINDOWS_TO_VALIDATE = 4  # below this a held-out part is too small to choose on


@dataclass(frozen=True)
class FitChoice:
    """Which traffic the layout is fitted on, and why."""

    mode: str  # windows | totals
    reason: str
    held_out: dict | None  # {"windows": n, "windows_balancedness": b, "totals_balancedness": b}

    def to_doc(self) -> dict:
        return dict(self.__dict__)


def choose_fit(windows_WLE: np.ndarray, layers, geo: Geometry, requested: str = "auto") -> FitChoice:
    """Fit on every window (splits experts that peak together) or on the totals (robust to noisy
    windows)? `auto` decides on held-out traffic: both are fitted on the earlier windows and
    scored on the last quarter (windows are in time order), and the better one wins (ties:
    totals, the simpler). With fewer than MIN_WINDOWS_TO_VALIDATE windows, totals."""
    if requested not in FIT_MODES:
        raise UsageError(f"--fit: must be one of {', '.join(FIT_MODES)}, got {requested!r}")
    W = np.asarray(windows_WLE).shape[0]
    if requested != "auto":
        return FitChoice(requested, f"--fit {requested}", None)
    if W < MIN_WINDOWS_TO_VALIDATE:
        why = "one window" if W == 1 else f"{W} windows are too few to hold some out"
        return FitChoice("totals", why, None)
    n_out = max(1, W // 4)
    early_WLE, late_WLE = windows_WLE[:W - n_out], windows_WLE[W - n_out:]
    by_windows = evaluate(late_WLE, place_experts(early_WLE, layers, geo)).balancedness
    by_totals = evaluate(late_WLE, place_experts(early_WLE.sum(axis=0, keepdims=True), layers, geo)).balancedness
    mode = "windows" if by_windows > by_totals else "totals"
    held = {"windows": n_out, "windows_balancedness": by_windows, "totals_balancedness": by_totals}
    return FitChoice(mode, f"better on the last {n_out} of {W} windows held out "
                           f"({by_windows:.4f} windows vs {by_totals:.4f} totals)", held)


# ---- baselines -------------------------------------------------------------------------------


def eplb_layout(counts_LE: np.ndarray, layers, geo: Geometry) -> Placement:
    """The EPLB-style baseline: totals only, greedy replication without a cap, LPT packing that
    may put two replicas of one expert on a rank, no refinement. Hierarchical when nodes > 1."""
    windows = check_windows(np.asarray(counts_LE, dtype=np.float64)[None])
    check_geometry(windows.shape[2], geo, no_duplicates=False)
    phy2log = hierarchical_phy2log(windows, geo, no_duplicates=False, replicate_cap=False, refine=False)
    return Placement(tuple(int(x) for x in layers), geo.num_ranks, phy2log, "totals-only", geo.num_nodes)


def trivial_layout(num_experts: int, layers, geo: Geometry) -> Placement:
    """Slot p holds expert p mod E: experts in id order, redundant slots wrap around."""
    P = num_experts + geo.num_redundant
    phy2log = np.broadcast_to(np.arange(P) % num_experts, (len(layers), P)).copy()
    return Placement(tuple(int(x) for x in layers), geo.num_ranks, phy2log, "trivial")


def random_layout(num_experts: int, layers, geo: Geometry, seed: int = 0) -> Placement:
    """Every expert once plus uniformly random redundant replicas, shuffled over the slots."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in layers:
        extra = rng.choice(num_experts, size=geo.num_redundant, replace=geo.num_redundant > num_experts)
        rows.append(rng.permutation(np.concatenate([np.arange(num_experts), extra])))
    return Placement(tuple(int(x) for x in layers), geo.num_ranks, np.stack(rows).astype(np.int64), "random")
