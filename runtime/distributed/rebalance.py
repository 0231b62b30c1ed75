"""Live rebalancing (`eplb_steps`): the runtime side of EPLB, with the node's cold bank as the
source of every expert a rank gains.

Every `eplb_steps` steps, after the same step on every rank:
1. the ranks sum the per-expert assignments they received since the last rebalance
   (all_reduce: exact integer counts) and gather their loads, so each rank knows the live
   balancedness (mean / max rank load over those exchanges);
2. above EPLB_SKIP_ABOVE the layout is kept (the report says so);
3. otherwise every rank computes the new placement from the summed counts with the code of
   `hotsplit place` (`place_experts`, the same number of physical slots): the same input and
   deterministic numpy give every rank the same map, and each rank switches to it before the
   next step, so no step sees mixed maps and dispatch and hit accounting use the map each step
   read;
4. each rank keeps the slots that do not change; a hot expert it no longer holds gives its slot
   to the strongest expert it now holds cold (a gained expert is served from the node's shared
   cold bank at once, and hot once its copy lands on the swap stream, exactly like a swap). No
   weight crosses between ranks: every node's cold bank holds every expert.

Each rebalance reports the balancedness before (live) and after (predicted on the counts that
drove it, achieved on the next window of exchanges), the bytes each rank copied, its time and the
steps it disturbed (steps until every copy landed: 0 on a CPU, where copies are synchronous).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch.distributed as dist

from hotsplit_cli.placement.algorithm import Geometry, place_experts
from hotsplit_cli.placement.dispatch import ReplicaMap, balancedness
from hotsplit_cli.placement.evaluate import evaluate

from .summary import gather_rows

EPLB_SKIP_ABOVE = 0.95  # live balancedness at or above which a rebalance is skipped


@dataclass
class RebalanceReport:
    step: int
    skipped: str | None
    before: float  # live balancedness of the exchanges since the last rebalance
    predicted_before: float  # the counts that drove it, on the old placement (evaluation by placement/evaluate.py)
    predicted_after: float  # ... on the new one
    achieved_after: float | None  # the next window of exchanges (set when it closes)
    experts_moved: int  # slots refilled, all ranks
    bytes_moved_R: list[int]  # real expert bytes each rank copied into its hot slots
    ms: float  # the rebalance on rank 0: reduce, placement, publication and the copies it waited for
    steps_disturbed: int = 0

    def to_doc(self) -> dict:
        return asdict(self)


class Rebalancer:
    """Runs on every rank; `maybe(step)` is a collective."""

    def __init__(self, hooks, model, control, expert_bytes: int):
        self.hooks, self.model, self.control, self.expert_bytes = hooks, model, control, expert_bytes
        self.reports: list[RebalanceReport] = []
        self._loads_from = 0  # first step of the exchanges since the last rebalance
        self._pending: RebalanceReport | None = None  # awaiting its achieved balancedness
        self._copying: RebalanceReport | None = None  # its copies still in flight

    def maybe(self, step: int) -> RebalanceReport | None:
        t0 = time.perf_counter()
        stats = self.model.exchange.stats
        loads = gather_rows(np.asarray(stats.loads[self._loads_from:], dtype=np.float64).ravel(), self.control)
        live = balancedness(loads.T)
        if self._pending is not None:
            self._pending.achieved_after = live
            self._pending = None
        self._loads_from = len(stats.loads)
        counts = self.model.live_counts_LE.clone()
        self.model.live_counts_LE.zero_()
        dist.all_reduce(counts, group=self.control)
        counts_LE = counts.numpy().astype(np.float64)
        old = self.hooks.placement
        E = counts_LE.shape[1]
        before_pred = evaluate(counts_LE[None], old).balancedness
        if live >= EPLB_SKIP_ABOVE or not counts_LE.any():
            why = f"balancedness {live:.3f} >= {EPLB_SKIP_ABOVE}" if counts_LE.any() else "no traffic"
            rep = RebalanceReport(step, why, live, before_pred, before_pred, None, 0, [0] * old.num_ranks,
                                  (time.perf_counter() - t0) * 1e3)
            self.reports.append(rep)
            return rep
        new = place_experts(counts_LE[None], old.layers, Geometry(old.num_ranks, old.num_physical - E))
        self.hooks.placement, self.hooks.replicas = new, ReplicaMap.of(new, E)
        self.model.exchange.set_replicas(self.hooks.replicas)
        self.model.held_LE = held = self.hooks.held_LE()
        moves = self._refill(counts_LE / np.maximum(new.logcnt_LE(E), 1), held)
        self.model.begin_swaps(moves)  # on a CPU the copies are done here; on a GPU they land later
        moved = gather_rows([sum(len(m) for m in moves.values())], self.control)[:, 0]
        rep = RebalanceReport(step, None, live, before_pred, evaluate(counts_LE[None], new).balancedness, None,
                              int(moved.sum()), [int(n) * self.expert_bytes for n in moved],
                              (time.perf_counter() - t0) * 1e3)
        self.reports.append(rep)
        self._pending = rep
        self._copying = rep if any(b.in_flight for b in self.model.banks) else None
        return rep

    def _refill(self, share_LE: np.ndarray, held: np.ndarray) -> dict[int, list[tuple[int, int]]]:
        """Swaps that give each hot slot of an expert this rank no longer holds (`held`: bool
        [L, E] of the new placement) to the strongest expert it holds cold; every other slot
        stays put."""
        hot = self.model.hot_LE()
        moves: dict[int, list[tuple[int, int]]] = {}
        for li in range(hot.shape[0]):
            lost = np.flatnonzero(hot[li] & ~held[li])
            if not len(lost):
                continue
            cand = np.flatnonzero(held[li] & ~hot[li])
            cand = cand[np.lexsort((cand, -share_LE[li, cand]))]  # strongest first, ties by id
            moves[li] = [(int(o), int(i)) for o, i in zip(lost, cand, strict=False)]
        return {li: m for li, m in moves.items() if m}

    def finish(self) -> None:
        """At the end of the run (a collective): the last rebalance's achieved balancedness."""
        loads = gather_rows(np.asarray(self.model.exchange.stats.loads[self._loads_from:], dtype=np.float64).ravel(),
                            self.control)
        if self._pending is not None and loads.size:
            self._pending.achieved_after = balancedness(loads.T)
            self._pending = None

    def after_step(self, step: int) -> None:
        """Between steps: once the last rebalance's copies have all landed, the steps they took."""
        if self._copying is not None and not any(b.in_flight for b in self.model.banks):
            self._copying.steps_disturbed = step - self._copying.step
            self._copying = None
