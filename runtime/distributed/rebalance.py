"""Live rebalancing (`eplb_steps`; docs/runtime.md, "Live rebalancing"): every `eplb_steps` steps
the ranks sum what they received and apply `hotsplit_cli.placement.rebalance_rule` to the same
counts, so all switch map before the same step; a hot expert a rank no longer holds gives its
slot to the strongest one it now holds cold, copied from the node's cold bank like a swap."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist

from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.dispatch import ReplicaMap, balancedness
from hotsplit_cli.placement.rebalance_rule import (
    RebalanceReport,
    chunk_ends,
    decide_rebalance,
    refill_moves,
    split_chunks,
)

from .summary import gather_rows


class Rebalancer:
    """Runs on every rank; `maybe(step)` is a collective."""

    def __init__(self, placement: Placement, model, control, expert_bytes: int, eplb_steps: int):
        """`placement`: the one the rank began with; the rebalancer's own from then on."""
        self.placement, self.model, self.control, self.expert_bytes = placement, model, control, expert_bytes
        self.eplb_steps = eplb_steps
        self.reports: list[RebalanceReport] = []
        self._loads_from = 0  # first step of the exchanges since the last rebalance
        self._local_chunks: list = []  # this rank's counts per chunk since the last rebalance, not yet summed
        self._chunks: list[np.ndarray] = []  # every rank's counts per chunk since the map last moved
        self._pending: int | None = None  # the report awaiting its achieved balancedness
        self._copying: int | None = None  # the report whose copies are still in flight

    def maybe(self, step: int) -> RebalanceReport | None:
        t0 = time.perf_counter()
        live = balancedness(self._loads_since().T)
        self._settle(live)
        self._loads_from = len(self.model.exchange.stats.loads)
        chunks = torch.stack(self._local_chunks)
        self._local_chunks = []
        dist.all_reduce(chunks, group=self.control)
        self._chunks += list(chunks.numpy().astype(np.float64))
        old = self.placement
        d = decide_rebalance(*split_chunks(self._chunks), old, live)
        if d.placement is None:
            rep = RebalanceReport(step, d.kept, live, d.current_held_out, d.current_held_out, None, 0,
                                  [0] * old.num_ranks, (time.perf_counter() - t0) * 1e3)
            self.reports.append(rep)
            return rep
        new, E, recent_LE = d.placement, int(self.model.exchange.replicas.logcnt_LE.shape[1]), sum(self._chunks)
        self._chunks = []
        self.placement = new
        self.model.exchange.set_replicas(ReplicaMap.of(new, E))
        held = self.model.held_LE  # by the new map
        moves = refill_moves(self.model.hot_LE(), held, recent_LE / np.maximum(new.logcnt_LE(E), 1))
        self.model.begin_swaps(moves)  # on a CPU the copies are done here; on a GPU they land later
        moved = gather_rows([sum(len(m) for m in moves.values())], self.control)[:, 0]
        rep = RebalanceReport(step, None, live, d.current_held_out, d.candidate_held_out, None,
                              int(moved.sum()), [int(n) * self.expert_bytes for n in moved],
                              (time.perf_counter() - t0) * 1e3)
        self.reports.append(rep)
        self._pending = len(self.reports) - 1
        self._copying = self._pending if any(b.in_flight for b in self.model.banks) else None
        return rep

    def _loads_since(self) -> np.ndarray:
        """Collective: every rank's loads [R, exchanges] since the last rebalance."""
        loads = self.model.exchange.stats.loads[self._loads_from:]
        return gather_rows(np.asarray(loads, dtype=np.float64).ravel(), self.control)

    def _settle(self, achieved: float) -> None:
        """The last move's achieved balancedness: the exchanges since it."""
        if self._pending is not None:
            rep = self.reports[self._pending]
            self.reports[self._pending] = replace(rep, achieved_after=achieved, worse=achieved < rep.before)
            self._pending = None

    def finish(self) -> None:
        """At the end of the run (a collective): the last rebalance's achieved balancedness."""
        loads = self._loads_since()
        if loads.size:
            self._settle(balancedness(loads.T))

    def after_step(self, step: int) -> None:
        """Between steps: close a chunk of counts at the middle and end of each interval; once the
        last rebalance's copies have all landed, the steps they took."""
        if (step - 1) % self.eplb_steps + 1 in chunk_ends(self.eplb_steps):
            self._local_chunks.append(self.model.live_counts_LE.clone())
            self.model.live_counts_LE.zero_()
        if self._copying is not None and not any(b.in_flight for b in self.model.banks):
            rep = self.reports[self._copying]
            self.reports[self._copying] = replace(rep, steps_disturbed=step - rep.step)
            self._copying = None
