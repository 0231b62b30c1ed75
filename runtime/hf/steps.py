"""A checkpoint as a model of the one loop (runtime/engine.py `Engine.run`): its steps are the
forward passes of greedy generation (capture.py `Generation`), its banks the loaded model's. The
windows, swap rule, hit accounting and summary are the engine's, as for a synthetic model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..device import DeviceInfo
from ..engine import Engine
from ..model import BankedModel
from .capture import Forward
from .loader import HFModel


@dataclass
class CheckpointCompute:  # how the routed experts are computed, as the loop reads a model's
    name: str
    split: object | None  # a runtime.cold_split.ColdSplit: cold experts shared with the CPU


class CheckpointMoE(BankedModel):
    """A loaded checkpoint (hot sets, CPU cold path set by the caller); counters on the host."""

    def __init__(self, hm: HFModel, info: DeviceInfo):
        self.hm, self.info, self.banks = hm, info, hm.banks
        split = hm.banks[0].cold_split
        kernel = "triton" if hm.banks[0].kernel is not None else "torch per expert"
        self.compute = CheckpointCompute(kernel + (f" + CPU cold path ({split.mode}; {split.rates_source})"
                                                   if split else ""), split)
        self._init_counters(hm.num_experts, "cpu")

    def step(self, forward: Forward) -> None:
        hot_LE = torch.from_numpy(np.stack([b.served_hot_E for b in self.banks]))  # what this forward reads
        self._count(self._run(forward), hot_LE)

    def _run(self, forward: Forward) -> torch.Tensor:
        """Run the forward; its routing counts [L, E]."""
        return torch.from_numpy(forward())


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
