"""Live rebalancing (`eplb_steps`): the runtime side of EPLB, with the node's cold bank as the
source of every expert a rank gains.

Every `eplb_steps` steps, after the same step on every rank:
1. the ranks sum the per-expert assignments they received since the last rebalance
   (all_reduce: exact integer counts) and gather their loads, so each rank knows the live
   balancedness (mean / max rank load over those exchanges);
2. above EPLB_SKIP_ABOVE the layout is kept (the report says so);
3. otherwise every rank fits a candidate with the code of `hotsplit place` (`place_experts`, the
   same number of physical slots) on the recent steps before the newest ones, and scores it and
   the current map on those newest steps, which it never saw (placement/live.py); the candidate
   is applied only when it wins there by a margin. The same input and deterministic numpy give
   every rank the same verdict and map, and each rank switches to it before the next step, so no
   step sees mixed maps and dispatch and hit accounting use the map each step read;
4. each rank keeps the slots that do not change; a hot expert it no longer holds gives its slot
   to the strongest expert it now holds cold (a gained expert is served from the node's shared
   cold bank at once, and hot once its copy lands on the swap stream, exactly like a swap). No
   weight crosses between ranks: every node's cold bank holds every expert.

Each rebalance reports the balancedness before (live) and after (predicted on the held-out steps,
achieved on the next window of exchanges, and what the replaced map would have had on that same
window: `lowered` flags a rebalance that did worse than keeping the map), the bytes each rank copied, its time and the
steps it disturbed (steps until every copy landed: 0 on a CPU, where copies are synchronous).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist

from hotsplit_cli.placement.dispatch import ReplicaMap, balancedness
from hotsplit_cli.placement.evaluate import evaluate
from hotsplit_cli.placement.live import HISTORY_STEPS, judge_rebalance

from .summary import gather_rows

EPLB_SKIP_ABOVE = 0.95  # live balancedness at or above which a rebalance is skipped


@dataclass
class RebalanceReport:
    step: int
    skipped: str | None
    before: float  # live balancedness of the exchanges since the last rebalance
    predicted_before: float  # the held-out steps, on the old placement (evaluation by placement/evaluate.py)
    predicted_after: float  # ... on the candidate (applied only when it wins by a margin)
    achieved_after: float | None  # the next window of exchanges (set when it closes)
    experts_moved: int  # slots refilled, all ranks
    bytes_moved_R: list[int]  # real expert bytes each rank copied into its hot slots
    ms: float  # the rebalance on rank 0: reduce, placement, publication and the copies it waited for
    steps_disturbed: int = 0
    kept_after: float | None = None  # the next window's traffic on the map this one replaced
    lowered: bool = False  # the next window did worse than the replaced map would have

    def to_doc(self) -> dict:
        return asdict(self)


class Rebalancer:
    """Runs on every rank; `maybe(step)` is a collective."""

    def __init__(self, hooks, model, control, expert_bytes: int):
        self.hooks, self.model, self.control, self.expert_bytes = hooks, model, control, expert_bytes
        self.reports: list[RebalanceReport] = []
        self._loads_from = 0  # first step of the exchanges since the last rebalance
        self._pending: RebalanceReport | None = None  # awaiting its achieved balancedness
        self._replaced = None  # the placement the pending rebalance replaced
        self._copying: RebalanceReport | None = None  # its copies still in flight
        self._window: list = []  # this rank's per-step counts since the last rebalance
        self._history_SLE: np.ndarray | None = None  # per-step counts summed over ranks, newest last

    def maybe(self, step: int) -> RebalanceReport | None:
        t0 = time.perf_counter()
        live, window_SLE = self._close_window()
        old = self.hooks.placement
        E = window_SLE.shape[2]
        if live >= EPLB_SKIP_ABOVE or not window_SLE.any():
            why = f"balancedness {live:.3f} >= {EPLB_SKIP_ABOVE}" if window_SLE.any() else "no traffic"
            return self._skip(step, why, live, evaluate(window_SLE, old).balancedness, t0)
        v = judge_rebalance(self._history_SLE, len(window_SLE), old, E)
        if not v.apply:
            why = "too few steps to judge" if v.candidate is None else (
                f"a refit would reach {v.candidate_heldout:.3f} on the {v.heldout_steps} newest steps it did not "
                f"see, the current map {v.kept_heldout:.3f}")
            return self._skip(step, why, live, v.kept_heldout, t0, v.candidate_heldout)
        new = v.candidate
        self.hooks.placement, self.hooks.replicas = new, ReplicaMap.of(new, E)
        self.model.exchange.set_replicas(self.hooks.replicas)
        self.model.held_LE = held = self.hooks.held_LE()
        moves = self._refill(window_SLE.sum(axis=0) / np.maximum(new.logcnt_LE(E), 1), held)
        self.model.begin_swaps(moves)  # on a CPU the copies are done here; on a GPU they land later
        moved = gather_rows([sum(len(m) for m in moves.values())], self.control)[:, 0]
        rep = RebalanceReport(step, None, live, v.kept_heldout, v.candidate_heldout, None,
                              int(moved.sum()), [int(n) * self.expert_bytes for n in moved],
                              (time.perf_counter() - t0) * 1e3)
        self.reports.append(rep)
        self._pending, self._replaced = rep, old
        self._copying = rep if any(b.in_flight for b in self.model.banks) else None
        return rep

    def _skip(self, step, why, live, kept, t0, candidate=None) -> RebalanceReport:
        R = self.hooks.placement.num_ranks
        rep = RebalanceReport(step, why, live, kept, kept if candidate is None else candidate, None, 0, [0] * R,
                              (time.perf_counter() - t0) * 1e3)
        self.reports.append(rep)
        return rep

    def _close_window(self) -> tuple[float, np.ndarray]:
        """A collective: the live balancedness of the exchanges since the last rebalance; the
        window's per-step counts summed over ranks join the history; the pending rebalance gets
        its achieved balancedness and what the replaced map would have had."""
        stats = self.model.exchange.stats
        loads = gather_rows(np.asarray(stats.loads[self._loads_from:], dtype=np.float64).ravel(), self.control)
        self._loads_from = len(stats.loads)
        local = (torch.stack(self._window) if self._window
                 else torch.zeros((0, *self.model.live_counts_LE.shape), dtype=self.model.live_counts_LE.dtype))
        dist.all_reduce(local, group=self.control)
        window_SLE = local.numpy().astype(np.float64)
        self._window = []
        prev = self._history_SLE if self._history_SLE is not None else window_SLE[:0]
        self._history_SLE = np.concatenate([prev, window_SLE])[-HISTORY_STEPS:]
        live = balancedness(loads.T) if loads.size else 1.0
        if self._pending is not None and loads.size:
            self._pending.achieved_after = live
            self._pending.kept_after = evaluate(window_SLE, self._replaced).balancedness
            self._pending.lowered = evaluate(window_SLE, self.hooks.placement).balancedness < self._pending.kept_after
        self._pending = None
        return live, window_SLE

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
        self._close_window()

    def after_step(self, step: int) -> None:
        """Between steps: keeps the step's counts; once the last rebalance's copies have all
        landed, the steps they took."""
        self._window.append(self.model.live_counts_LE.clone())
        self.model.live_counts_LE.zero_()
        if self._copying is not None and not any(b.in_flight for b in self.model.banks):
            self._copying.steps_disturbed = step - self._copying.step
            self._copying = None
