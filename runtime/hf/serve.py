"""Generate text from a Hugging Face checkpoint on the hot/cold banks, logging hit rates and
applying dynamic swaps exactly as the synthetic engine does (same planner rule, same records).

Every `dyn_steps` steps the window's live counts go to `planner.propose_swaps`; the swaps start
between steps (on the swap stream on a GPU: the outgoing expert is served cold at once, the
incoming one from its slot once its copy has landed, published at a later step boundary), and
one `HitRateRecord` is emitted per window. Hits are counted against the map each step actually
read. Shape letters: L = MoE layers, E = experts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hotsplit_cli.errors import PlanError, RuntimeFailure
from hotsplit_cli.knobs import Knobs
from hotsplit_cli.planner import propose_swaps

from ..log import HitRateRecord
from .capture import capture
from .loader import HFModel

MAX_PLANNER_FAILURES = 3


class HFServe:
    """Window bookkeeping over a loaded model's banks (hot sets set by the caller or a plan)."""

    def __init__(self, hm: HFModel, knobs: Knobs, expert_bytes: int,
                 on_record: Callable[[HitRateRecord], None] | None = None):
        self.hm, self.knobs, self.expert_bytes, self.on_record = hm, knobs, expert_bytes, on_record
        L, E = len(hm.banks), hm.num_experts
        self.window_LE = np.zeros((L, E))
        self.hits_L, self.assigned_L = np.zeros(L), np.zeros(L)
        self.cold_reads = 0
        self.steps = self._window_start = 0
        self.total_hits = self.total_assigned = 0.0
        self.swaps_total = 0
        self.bytes_total = 0
        self.copy_ms_total = 0.0
        self._pending_ms = 0.0  # copy time of swaps published since the last record
        self.failures = 0
        self.records: list[HitRateRecord] = []

    def hot_LE(self) -> np.ndarray:
        """The hot sets once the swaps in flight land (what the planner reasons about)."""
        return np.stack([b.hot_E for b in self.hm.banks])

    def served_hot_LE(self) -> np.ndarray:
        """What the last step read: the map only changes between steps."""
        return np.stack([b.served_hot_E for b in self.hm.banks])

    def publish_ready(self, wait: bool = False) -> None:
        for b in self.hm.banks:
            self._pending_ms += b.publish_ready(wait)[1]

    def on_step(self, step_LE: np.ndarray) -> None:
        hot = self.served_hot_LE()
        self.window_LE += step_LE
        self.hits_L += (step_LE * hot).sum(axis=1)
        self.assigned_L += step_LE.sum(axis=1)
        self.cold_reads += int(((step_LE > 0) & ~hot).sum())
        self.steps += 1
        if self.steps % self.knobs.dyn_steps == 0:
            self.close_window(update=self.knobs.dynamic)
        self.publish_ready()  # swaps whose copies have landed serve hot from the next step

    def close_window(self, update: bool) -> HitRateRecord:
        swaps, error, copy_ms = [], None, 0.0
        if update:
            try:
                swaps = propose_swaps(self.window_LE, self.hot_LE(), self.knobs.dyn_max_swaps, self.knobs.dyn_margin)
                self.failures = 0
            except PlanError as exc:
                self.failures += 1
                error = exc.message
                if self.failures >= MAX_PLANNER_FAILURES:
                    raise RuntimeFailure(f"the planner failed {self.failures} updates in a row at step "
                                         f"{self.steps}: {exc.message}", "run with HOTSPLIT_DYNAMIC=0") from None
            by_layer: dict[int, list[tuple[int, int]]] = {}
            for s in swaps:
                by_layer.setdefault(s.layer, []).append((s.out_expert, s.in_expert))
            for li, moves in by_layer.items():
                copy_ms += self.hm.banks[li].begin_swaps(moves)
        copy_ms += self._pending_ms
        self._pending_ms = 0.0
        hits, assigned = float(self.hits_L.sum()), float(self.assigned_L.sum())
        self.total_hits += hits
        self.total_assigned += assigned
        self.swaps_total += len(swaps)
        self.bytes_total += len(swaps) * self.expert_bytes
        self.copy_ms_total += copy_ms
        n_steps = max(1, self.steps - self._window_start)
        layer = np.divide(self.hits_L, self.assigned_L, out=np.zeros_like(self.hits_L), where=self.assigned_L > 0)
        rec = HitRateRecord(
            step=self.steps, hit_rate_window=hits / assigned if assigned else 0.0,
            hit_rate_total=self.total_hits / self.total_assigned if self.total_assigned else 0.0,
            swaps=len(swaps), swaps_total=self.swaps_total, bytes_copied=len(swaps) * self.expert_bytes,
            copy_ms=copy_ms, cold_bytes_per_step=self.cold_reads * self.expert_bytes / n_steps,
            layer_hit_rate=[float(x) for x in layer], planner_error=error)
        self.records.append(rec)
        self.window_LE[:] = 0
        self.hits_L[:] = 0
        self.assigned_L[:] = 0
        self.cold_reads = 0
        self._window_start = self.steps
        if self.on_record is not None:
            self.on_record(rec)
        return rec

    def generate(self, tokenizer, prompts: list, max_new_tokens: int, batch_size: int,
                 advance: Callable[[int], None] | None = None) -> list[str]:
        """Greedy text for each prompt; a last partial window is closed without swaps."""
        ids = capture(self.hm, tokenizer, prompts, max_new_tokens, batch_size, advance, self.on_step)
        self.publish_ready(wait=True)
        if self.steps > self._window_start:
            self.close_window(update=False)
        elif self._pending_ms:
            self.copy_ms_total += self._pending_ms
            self._pending_ms = 0.0
        return [tokenizer.decode(x, skip_special_tokens=True) for x in ids]
