"""An expert-parallel job's figures reduced from its ranks' (numpy only; the runtime gathers them
to rank 0: runtime/distributed/summary.py). One rank's reduce to its own figures. Per window a
`JobRecord`: the job's hit rate (all hits / all assignments), swaps and copies summed, the
window's balancedness (sum over its (step, layer) exchanges of the mean rank load / sum of the
max, vLLM's form) and each rank's load, hit rate and cold reads. For the run the job's
`RunSummary` and `EPFigures`: each rank's figures and cold paths, balancedness, the bottleneck
rank and how far it leads, and the exchange measured.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from hotsplit_cli.hotset.verdict import prediction_error
from hotsplit_cli.hotset.windows import HitRateRecord, RunSummary, layer_rates, ratio
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.dispatch import balancedness, window_balancedness


@dataclass(frozen=True)
class JobRecord(HitRateRecord):
    """A window of the whole job; `ranks` gives each rank's part."""

    balancedness: float = 1.0
    ranks: list[dict] = field(default_factory=list)


@dataclass
class RankWindow:
    """One rank's closed window: its record and the counts the job's record is reduced from."""

    record: HitRateRecord
    hits_L: np.ndarray  # float64 [L] assignments served hot, this window
    assigned_L: np.ndarray  # float64 [L] assignments, this window
    cold_reads: int  # distinct cold experts read, summed over the window's steps
    hits_total: float  # since the start
    assigned_total: float
    loads_WL: np.ndarray  # int64 [W, L] assignments received, per (step, layer) exchange of the window


def reduce_windows(windows: list[RankWindow]) -> JobRecord:
    """The job's window from its ranks' (one rank: that rank's own figures): hit rates over all
    assignments, swaps and copies summed, the slowest copy, balancedness over the exchanges."""
    recs = [w.record for w in windows]
    hits_L, assigned_L = sum(w.hits_L for w in windows), sum(w.assigned_L for w in windows)
    ranks = [{"rank": r, "assignments": int(w.assigned_L.sum()), "hit_rate": ratio(w.hits_L.sum(), w.assigned_L.sum()),
              "cold_reads": int(w.cold_reads)} for r, w in enumerate(windows)]
    return JobRecord(
        step=recs[0].step, hit_rate_window=ratio(hits_L.sum(), assigned_L.sum()),
        hit_rate_total=ratio(sum(w.hits_total for w in windows), sum(w.assigned_total for w in windows)),
        swaps=sum(r.swaps for r in recs), swaps_total=sum(r.swaps_total for r in recs),
        bytes_copied=sum(r.bytes_copied for r in recs), copy_ms=float(max(r.copy_ms for r in recs)),
        cold_bytes_per_step=float(sum(r.cold_bytes_per_step for r in recs)),
        layer_hit_rate=layer_rates(hits_L, assigned_L), planner_error=recs[0].planner_error,
        balancedness=balancedness(np.concatenate([w.loads_WL.reshape(-1, 1) for w in windows], axis=1)),
        ranks=ranks)


@dataclass
class EPFigures:
    """The EP part of the job's summary (rank 0)."""

    ranks: list[dict]
    balancedness: float
    predicted_balancedness: float | None
    bottleneck: dict
    exchange: dict
    placement: dict
    rebalances: list[dict] = field(default_factory=list)
    # balancedness over windows of the placement's histogram ({"steps_per_window", "balancedness"}):
    # what the placement's prediction is judged on; None without a placement file that predicts one
    window_balancedness: dict | None = None
    # how far each moved rebalance's predicted_after was from the next window's (verdict.prediction_error)
    rebalance_error: dict | None = None

    def to_doc(self) -> dict:
        return dataclasses.asdict(self)


_COLD_SCALARS = ("cpu_share", "layers", "layers_with_cpu")
_COLD_PATH_FIELDS = ("experts", "bytes", "allocated_bytes", "ms", "predicted_ms")  # and "spread": None or float


def _cold_doc(paths: dict | None) -> dict | None:
    """One rank's cold paths (runtime/cold_split.py `report`) in the job's summary: the mode,
    the CPU's share and the per-path figures (None: the gpu path)."""
    if paths is None:
        return None
    doc: dict = {"mode": paths["mode"], "cpu_share": float(paths["cpu_share"]), "layers": int(paths["layers"]),
                 "layers_with_cpu": int(paths["layers_with_cpu"]), "rates": str(paths["rates"])}
    for path in ("gpu", "cpu"):
        doc[path] = {k: (float(paths[path][k]) if k.endswith("ms") else int(paths[path][k]))
                     for k in _COLD_PATH_FIELDS}
        spread = paths[path].get("spread")
        doc[path]["spread"] = None if spread is None else float(spread)
    return doc


@dataclass
class RankTotals:
    """One rank's finished run: the figures the job's summary is reduced from."""

    summary: RunSummary  # the rank's own (its records stay on the rank: the job's are JobRecords)
    loads_SL: np.ndarray  # int64 [steps, L] assignments received
    cold_reads: int
    expected_hit_rate: float | None  # of this rank's hot set on its placed experts
    act_bytes: int  # exchange totals (dispatch.ExchangeStats)
    meta_bytes: int
    exchange_ms: float
    exchanges: int


def reduce_summaries(ranks: list[RankTotals]) -> RunSummary:
    """The job's summary from its ranks' (one rank: its own figures, hit rates by loads)."""
    s0 = ranks[0].summary
    received = np.array([float(t.loads_SL.sum()) for t in ranks])
    loads_LR = np.stack([t.loads_SL.sum(0) for t in ranks], axis=1).astype(np.float64)
    layer_RL = np.array([t.summary.layer_hit_rate for t in ranks])
    hits = np.array([t.summary.hit_rate for t in ranks]) * received
    tokens, elapsed = sum(t.summary.tokens for t in ranks), float(max(t.summary.elapsed_s for t in ranks))
    return RunSummary(
        steps=s0.steps, tokens=tokens, elapsed_s=elapsed, tokens_per_s=ratio(tokens, elapsed),
        hit_rate=ratio(hits.sum(), received.sum()), hit_rate_last_window=None,
        expected_hit_rate=s0.expected_hit_rate, swaps=sum(t.summary.swaps for t in ranks),
        bytes_copied=sum(t.summary.bytes_copied for t in ranks), copy_ms=float(max(t.summary.copy_ms for t in ranks)),
        cold_bytes_per_step=float(sum(t.summary.cold_bytes_per_step for t in ranks)),
        layer_hit_rate=[float(x) for x in (layer_RL * loads_LR.T).sum(0) / np.maximum(loads_LR.sum(1), 1)],
        interrupted=s0.interrupted)  # Ctrl-C stops every rank at the same window


def ep_figures(ranks: list[RankTotals], window_steps: int | None = None) -> EPFigures:
    """Each rank's load, hit rate and cold paths, balancedness (and over windows of `window_steps`
    steps, when given), the bottleneck, the exchange."""
    received = np.array([float(t.loads_SL.sum()) for t in ranks])
    docs = [{"rank": r, "assignments": int(received[r]), "hit_rate": float(t.summary.hit_rate),
             "expected_hit_rate": t.expected_hit_rate, "cold_reads": t.cold_reads, "swaps": int(t.summary.swaps),
             "cold_paths": _cold_doc(t.summary.cold_paths),
             "prefetch": t.summary.prefetch} for r, t in enumerate(ranks)]  # its staging counters (None: off)
    loads_SLR = np.stack([t.loads_SL for t in ranks], axis=2)
    mean, top = received.mean(), int(np.argmax(received))
    exchanges = sum(t.exchanges for t in ranks)

    def per_exchange(total: float) -> float:
        return float(total / exchanges) if exchanges else 0.0
    return EPFigures(
        ranks=docs, balancedness=balancedness(loads_SLR.reshape(-1, len(ranks))), predicted_balancedness=None,
        bottleneck={"rank": top, "load": int(received[top]), "lead": float(received[top] / mean) if mean else 1.0},
        exchange={"measured_bytes_per_layer": per_exchange(sum(t.act_bytes for t in ranks)),
                  "ms_per_layer": per_exchange(sum(t.exchange_ms for t in ranks)),
                  "meta_bytes_per_layer": per_exchange(sum(t.meta_bytes for t in ranks)),
                  "exchanges_per_rank": int(ranks[0].exchanges)},
        placement={},
        window_balancedness=None if not window_steps else {
            "steps_per_window": int(window_steps), "balancedness": window_balancedness(loads_SLR, window_steps)})


def judged_figures(figures: EPFigures, placement: Placement, rebalances: list[dict] | None, exchange: dict,
                   predicted: tuple[float | None, np.ndarray | None] | None) -> EPFigures:
    """The job's figures with what they are judged against: the ledger's `exchange` prediction,
    the placement, each rebalance (None: not rebalancing) and how far its prediction was from the
    window after it, and what the run's trace predicts (`predicted`: balancedness and each rank's
    hit rate, trace_predictions's; None without a trace). A rank's predicted hit rate is kept only
    where it made no swap: its final hot set is the one it served with."""
    ranks, balanced = figures.ranks, figures.predicted_balancedness
    if predicted is not None:
        balanced, rates = predicted
        if rates is not None:
            ranks = [{**d, "predicted_hit_rate": float(rate)} if d["swaps"] == 0 else d
                     for d, rate in zip(ranks, rates, strict=True)]
    moves = [(r["predicted_after"], r["achieved_after"]) for r in rebalances or [] if r["skipped"] is None]
    return dataclasses.replace(
        figures, ranks=ranks, predicted_balancedness=balanced, exchange={**figures.exchange, **exchange},
        placement={"method": placement.method, "physical_experts": placement.num_physical,
                   "slots_per_rank": placement.slots_per_rank},
        rebalances=rebalances or [], rebalance_error=None if rebalances is None else prediction_error(moves))

