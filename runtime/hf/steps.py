"""A checkpoint as a model of the one loop (runtime/engine.py `Engine.run`): its steps are the
forward passes of greedy generation (capture.py `Generation`), its banks the loaded model's. The
windows, swap rule, hit accounting and summary are the engine's, as for a synthetic model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..cold_split import SplitBank
from ..device import DeviceInfo
from ..engine import Engine
from ..model import BankedModel
from .adapter import install
from .capture import Forward
from .loader import HFModel


@dataclass
class CheckpointCompute:  # how the routed experts are computed, as the loop reads a model's
    name: str
    split: object | None  # a runtime.cold_split.ColdSplit: cold experts shared with the CPU


class CheckpointMoE(BankedModel):
    """A loaded checkpoint serving `hot_LE` (None: the banks as they are), its cold experts
    shared with the CPU by `split` (cold_split.py); counters on the host. `experts_L`: what
    computes each MoE layer's routed experts (`.forward(experts, x, ids, w)`, the adapter's seam)."""

    def __init__(self, hm: HFModel, info: DeviceInfo, hot_LE: np.ndarray | None = None, split=None):
        self.hm, self.info, self.banks = hm, info, hm.banks
        if hot_LE is not None:
            for bank, hot_E in zip(hm.banks, hot_LE, strict=True):
                bank.set_hot(hot_E)
        self.experts_L = hm.banks if split is None else [SplitBank(b, split) for b in hm.banks]
        if split is not None:
            install(hm.model, hm.counter, self.experts_L)
        kernel = "triton" if hm.banks[0].kernel is not None else "torch per expert"
        self.compute = CheckpointCompute(kernel + (f" + CPU cold path ({split.mode}; {split.rates_source})"
                                                   if split else ""), split)
        self._init_counters(hm.num_experts, "cpu")
        self._last_step_LE = np.zeros((len(self.banks), hm.num_experts), dtype=np.int64)

    def step(self, forward: Forward, run=None) -> None:
        """One forward, counted against the hot sets it read; `run(forward)`: its counts [L, E]
        (default: its own routing; distributed/apply.py's, what an EP rank received)."""
        step_LE = torch.from_numpy(forward()) if run is None else run(forward)
        # The maps this forward read: the hot slots (swaps publish only between steps) and the
        # experts staged for it (prefetch), published as their layers ran and cleared after the step.
        hot_LE = torch.from_numpy(self.served_hot_LE())
        self._count(step_LE, hot_LE)
        self._last_step_LE = step_LE.numpy().copy()

    def last_step_counts_LE(self) -> np.ndarray:
        """What the last step computed here: its counted tokens' routing (no padding, no finished
        sequence), or an expert-parallel rank's received assignments."""
        return self._last_step_LE


class CheckpointEngine(Engine):
    """`CheckpointEngine(CheckpointMoE, Generation, knobs, expert_bytes, expected_hit_rate=...)`: a
    step is one forward of the generation; `run`, the windows and the summary are Engine's."""

    def _init_forward(self, seed: int, use_graph: bool | None) -> None:
        self.use_graph = False  # a generation's shapes change every step
        self._tokens_before = self.model.hm.counter.tokens  # a calibration pass counted before

    def _forward(self, forward: Forward) -> None:
        self.model.step(forward)

    def tokens(self) -> int:
        return self.model.hm.counter.tokens - self._tokens_before
