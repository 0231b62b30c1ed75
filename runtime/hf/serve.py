"""Generate text from a Hugging Face checkpoint on the hot/cold banks, logging hit rates and
applying dynamic swaps exactly as the synthetic engine does (the same `WindowBook`: swap rule,
checks, records).

Every `dyn_steps` steps the window's live counts go to the swap rule; the swaps start between
steps (on the swap stream on a GPU: the outgoing expert is served cold at once, the incoming one
from its slot once its copy has landed, published at a later step boundary), and one
`HitRateRecord` is emitted per window. Hits are counted against the map each step actually
read. Shape letters: L = MoE layers, E = experts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hotsplit_cli.config.knobs import Knobs

from ..log import HitRateRecord
from ..windows import RunSummary, WindowBook, moves_by_layer
from .capture import capture
from .loader import HFModel


class HFServe:
    """Window bookkeeping over a loaded model's banks (hot sets set by the caller or a plan)."""

    def __init__(self, hm: HFModel, knobs: Knobs, expert_bytes: int,
                 on_record: Callable[[HitRateRecord], None] | None = None):
        self.hm, self.knobs, self.on_record = hm, knobs, on_record
        L, E = len(hm.banks), hm.num_experts
        self.book = WindowBook(L, knobs, expert_bytes)
        self.window_LE = np.zeros((L, E))
        self.hits_L, self.assigned_L = np.zeros(L), np.zeros(L)
        self.cold_reads = 0
        self.steps = 0
        self.interrupted = False  # Ctrl-C stopped the generation

    @property
    def records(self) -> list[HitRateRecord]:
        return self.book.records

    def hot_LE(self) -> np.ndarray:
        """The hot sets once the swaps in flight land (what the swap rule reasons about)."""
        return np.stack([b.hot_E for b in self.hm.banks])

    def served_hot_LE(self) -> np.ndarray:
        """What the last step read: the map only changes between steps."""
        return np.stack([b.served_hot_E for b in self.hm.banks])

    def publish_ready(self, wait: bool = False) -> None:
        for b in self.hm.banks:
            self.book.landed(b.publish_ready(wait)[1])

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
            swaps, error = self.book.decide(self.window_LE, self.hot_LE(), self.steps)
            for li, moves in moves_by_layer(swaps).items():
                copy_ms += self.hm.banks[li].begin_swaps(moves)
        split = self.hm.banks[0].cold_split
        rec = self.book.close(self.steps, self.hits_L, self.assigned_L, self.cold_reads, len(swaps), copy_ms, error,
                              split.counters.cpu_experts if split else None)
        self.window_LE[:] = 0
        self.hits_L[:] = 0
        self.assigned_L[:] = 0
        self.cold_reads = 0
        if self.on_record is not None:
            self.on_record(rec)
        return rec

    def generate(self, tokenizer, prompts: list, max_new_tokens: int, batch_size: int,
                 advance: Callable[[int], None] | None = None) -> list[str]:
        """Greedy text for each prompt; a last partial window is closed without swaps. Ctrl-C stops
        it between steps: the windows so far are kept (`interrupted`), the texts are not."""
        try:
            ids = capture(self.hm, tokenizer, prompts, max_new_tokens, batch_size, advance, self.on_step)
        except KeyboardInterrupt:
            self.interrupted, ids = True, []
        self.publish_ready(wait=True)
        if self.steps > self.book.window_start:
            self.close_window(update=False)
        return [tokenizer.decode(x, skip_special_tokens=True) for x in ids]

    def summary(self, tokens: int, elapsed_s: float, expected_hit_rate: float | None) -> RunSummary:
        summary = self.book.summary(self.steps, tokens, elapsed_s, expected_hit_rate, self.interrupted)
        split = self.hm.banks[0].cold_split
        if split is not None:
            summary.cold_paths = split.report(self.book.expert_bytes)
        return summary
