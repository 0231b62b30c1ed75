"""A checkpoint as a model of the one loop (runtime/engine.py `Engine.run`): its steps are the
forward passes of greedy generation (capture.py `Generation`), its banks the loaded model's, its
counters each forward's routing counts read against the map that forward served. The windows,
swap rule, hit accounting and summary are the engine's, as for a synthetic model.

Shape letters: L = MoE layers, E = experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..device import DeviceInfo
from ..engine import Engine
from .capture import Forward
from .loader import HFModel


@dataclass
class CheckpointCompute:
    """How the routed experts are computed: what the loop reads of a model's `compute`."""

    name: str
    split: object | None  # a runtime.cold_split.ColdSplit: cold experts shared with the CPU


class CheckpointMoE:
    """The loop's view of a loaded checkpoint (hot sets and CPU cold path set by the caller)."""

    def __init__(self, hm: HFModel, info: DeviceInfo):
        self.hm, self.info, self.banks = hm, info, hm.banks
        split = hm.banks[0].cold_split
        kernel = "triton" if hm.banks[0].kernel is not None else "torch per expert"
        self.compute = CheckpointCompute(kernel + (f" + CPU cold path ({split.mode}; {split.rates_source})"
                                                   if split else ""), split)
        self._new_window()

    @property
    def num_layers(self) -> int:
        return len(self.banks)

    def hot_LE(self) -> np.ndarray:
        """The hot sets once the swaps in flight land (what the swap rule reasons about)."""
        return np.stack([b.hot_E for b in self.banks])

    def step(self, forward: Forward) -> None:
        hot_LE = np.stack([b.served_hot_E for b in self.banks])  # the map only changes between steps
        step_LE = forward()
        self.counts_LE += step_LE
        self.hits_L += (step_LE * hot_LE).sum(axis=1)
        self.assigned_L += step_LE.sum(axis=1)
        self.cold_reads_L += ((step_LE > 0) & ~hot_LE).sum(axis=1)

    def read_counters(self, reset_window: bool = True) -> dict[str, np.ndarray]:
        """The window's counts (on the host already: each forward's were read as it ended)."""
        out = {"counts_LE": self.counts_LE.copy(), "hits_L": self.hits_L.copy(),
               "assigned_L": self.assigned_L.copy(), "cold_reads_L": self.cold_reads_L.copy()}
        if reset_window:
            self._new_window()
        return out

    def _new_window(self) -> None:
        L = self.num_layers
        self.counts_LE = np.zeros((L, self.hm.num_experts))
        self.hits_L, self.assigned_L, self.cold_reads_L = np.zeros(L), np.zeros(L), np.zeros(L, dtype=np.int64)

    def begin_swaps(self, layer_moves: dict[int, list[tuple[int, int]]]) -> float:
        return sum(self.banks[li].begin_swaps(moves) for li, moves in layer_moves.items())

    def publish_ready(self, wait: bool = False) -> tuple[int, float]:
        done = [b.publish_ready(wait) for b in self.banks]
        return sum(n for n, _ in done), sum(ms for _, ms in done)


class CheckpointEngine(Engine):
    """The one loop over a checkpoint: `Engine(CheckpointMoE, Generation, knobs, expert_bytes,
    expected_hit_rate=...)`, whose step is one forward of the generation. Only the step is its
    own; `run`, the windows and the summary are Engine's."""

    def _init_forward(self, seed: int, use_graph: bool | None) -> None:
        self.use_graph = False  # a generation's shapes change every step
        self._tokens_before = self.model.hm.counter.tokens  # a calibration pass counted before

    def _forward(self, forward: Forward) -> None:
        self.model.step(forward)

    def tokens(self) -> int:
        return self.model.hm.counter.tokens - self._tokens_before
