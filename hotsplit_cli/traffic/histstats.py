"""What an engineer checks in a routing histogram before launch (numpy only).

Load balance per layer, experts far above the mean, how concentrated the traffic is, and how
many bytes of hot experts it takes to serve a given share of routed assignments.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotsplit_cli.traffic.hist import Histogram

TOP_FRACTIONS = (0.05, 0.10, 0.25, 0.50)
COVERAGE_TARGETS = (0.50, 0.80, 0.90, 0.95, 0.99)
HOT_FLAG_RATIO = 2.0  # an expert above 2x its layer's mean load is flagged


@dataclass(frozen=True)
class LayerLoad:
    layer: int  # model layer id
    total: float
    mean: float
    max: float
    max_over_mean: float
    flagged: tuple[int, ...]  # expert ids above HOT_FLAG_RATIO x mean
    top10_share: float  # share of this layer's traffic on its hottest 10% of experts


@dataclass(frozen=True)
class HistReport:
    model: str
    source: str
    top_k: int
    tokens: int
    num_layers: int
    num_experts: int
    total: float
    layers: tuple[LayerLoad, ...]
    top_share: dict[float, float]  # fraction of all experts (hottest first) -> share of traffic
    cover_experts: dict[float, int]  # coverage target -> hottest experts needed
    cover_bytes: dict[float, int] | None  # coverage target -> bytes per rank needed (needs sizes)
    expert_bytes: int | None
    curve_bytes: np.ndarray | None  # coverage curve: cumulative bytes and share, best first
    curve_share: np.ndarray
    ranks: int = 1  # EP ranks the experts are split over, evenly and contiguously (per-rank figures)
    cover_rank_experts: dict[float, int] | None = None  # target -> experts the neediest rank holds hot
    curve_rank_share: np.ndarray | None = None  # the neediest rank's coverage by its k hottest experts

    def to_doc(self) -> dict:
        return {
            "model": self.model,
            "source": self.source,
            "top_k": self.top_k,
            "tokens": self.tokens,
            "num_layers": self.num_layers,
            "num_experts": self.num_experts,
            "routed_assignments": self.total,
            "expert_bytes": self.expert_bytes,
            "layers": [
                {"layer": x.layer, "total": x.total, "mean": x.mean, "max": x.max,
                 "max_over_mean": x.max_over_mean, "flagged_experts": list(x.flagged),
                 "top10_share": x.top10_share}
                for x in self.layers
            ],
            "top_share": {f"{k:g}": v for k, v in self.top_share.items()},
            "cover_experts": {f"{k:g}": v for k, v in self.cover_experts.items()},
            "cover_gib": None if self.cover_bytes is None
            else {f"{k:g}": v / (1 << 30) for k, v in self.cover_bytes.items()},
            "ranks": self.ranks,
            "cover_rank_experts": None if self.cover_rank_experts is None
            else {f"{k:g}": v for k, v in self.cover_rank_experts.items()},
        }


def top_count(fraction: float, n: int) -> int:
    """How many of `n` experts "the hottest `fraction`" is: ceil(fraction x n), at least one. The
    cut is whole experts, so its real share of the experts can exceed `fraction` (4 of 32 for 10%)."""
    return max(1, int(np.ceil(fraction * n - 1e-9)))


def hist_report(hist: Histogram, expert_bytes: int | None = None, ranks: int = 1) -> HistReport:
    """Summarise `hist`; with `expert_bytes` (per rank, one expert) also the GiB per coverage. With
    `ranks` > 1 (an EP recipe) the GiB are per rank: each rank holds E/ranks experts of every layer
    (the contiguous split) and must cover the target of its own traffic; the neediest rank sets it."""
    c = hist.counts_LE
    total = float(c.sum())
    L, E = c.shape
    layers = []
    for i, layer in enumerate(hist.layers):
        row = c[i]
        s = float(row.sum())
        mean = s / E
        top_n = top_count(0.10, E)
        layers.append(LayerLoad(
            layer=int(layer),
            total=s,
            mean=mean,
            max=float(row.max()),
            max_over_mean=float(row.max() / mean) if mean > 0 else 0.0,
            flagged=tuple(int(e) for e in np.flatnonzero(row > HOT_FLAG_RATIO * mean)) if mean > 0 else (),
            top10_share=float(np.sort(row)[::-1][:top_n].sum() / s) if s > 0 else 0.0,
        ))
    # Hottest first, ties by (layer, expert): the planner's order when sizes are equal.
    flat = c.ravel()
    order = np.lexsort((np.arange(flat.size), -flat))
    cum_share = np.cumsum(flat[order]) / total
    n = flat.size
    top_share = {f: float(cum_share[top_count(f, n) - 1]) for f in TOP_FRACTIONS}
    cover_experts = {t: int(np.searchsorted(cum_share, t - 1e-12) + 1) for t in COVERAGE_TARGETS}
    cover_bytes = None
    curve_bytes = None
    rank_experts = rank_curve = None
    if ranks > 1:
        rank_curve = _neediest_rank_curve(c, ranks)
        rank_experts = {t: int(np.searchsorted(rank_curve, t - 1e-12) + 1) for t in COVERAGE_TARGETS}
    if expert_bytes is not None:
        per_rank = rank_experts or cover_experts
        cover_bytes = {t: k * int(expert_bytes) for t, k in per_rank.items()}
        curve_bytes = np.arange(1, len(rank_curve if rank_curve is not None else cum_share) + 1,
                                dtype=np.float64) * expert_bytes
    return HistReport(hist.model, hist.source, hist.top_k, hist.tokens, L, E, total, tuple(layers),
                      top_share, cover_experts, cover_bytes, expert_bytes, curve_bytes, cum_share,
                      ranks, rank_experts, rank_curve)


def _neediest_rank_curve(counts_LE: np.ndarray, ranks: int) -> np.ndarray:
    """float [L*E/ranks]: the lowest, over ranks, share of a rank's own assignments served by its k
    hottest experts (k = 1, 2, ...), with rank r holding experts r*E/ranks .. (r+1)*E/ranks-1."""
    L, E = counts_LE.shape
    if E % ranks:
        raise ValueError(f"{E} experts do not split evenly over {ranks} ranks")
    per = counts_LE.reshape(L, ranks, E // ranks).transpose(1, 0, 2).reshape(ranks, -1)
    best = -np.sort(-per, axis=1)
    totals = np.maximum(best.sum(axis=1, keepdims=True), 1e-300)
    return (np.cumsum(best, axis=1) / totals).min(axis=0)
