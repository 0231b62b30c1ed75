"""The hot/cold MoE stack: per layer a router, shared experts on the device, and an ExpertBank.

`BankedModel`: what the one loop reads of any model (this one, a checkpoint's: hf/steps.py).
Counters live on the model's device and are updated without host synchronisation:
`counts_LE` (routed assignments of the current window), `hits_L` (served hot), `assigned_L`,
and `cold_reads_L` (distinct cold experts read per step, summed: what crosses PCIe); `cold_LE`,
the same per expert (its stored bytes are what crosses PCIe when experts differ in size).
"""

from __future__ import annotations

import numpy as np
import torch

from .bank import ExpertBank
from .cold_split import SplitExperts
from .device import DeviceInfo
from .mixed_bank import MixedBank
from .moe import LayerWeights, MoEGeometry, rms_norm, swiglu
from .pinned import PinnedAllocator


class BankedModel:
    """Banks, swaps and window counters; subclasses set `banks`, `_init_counters`, `_count` each step."""

    banks: list

    @property
    def num_layers(self) -> int:
        return len(self.banks)

    def hot_LE(self) -> np.ndarray:
        """The hot mask the slot tables hold (the target state of swaps in flight)."""
        return np.stack([b.hot_E for b in self.banks])

    def _init_counters(self, num_experts: int, device) -> None:
        L = self.num_layers
        self.counts_LE = torch.zeros(L, num_experts, dtype=torch.int64, device=device)
        self.hits_L, self.assigned_L, self.cold_reads_L = torch.zeros(3, L, dtype=torch.int64, device=device)
        self.cold_LE = torch.zeros(L, num_experts, dtype=torch.int64, device=device)  # steps each was read cold

    def _count(self, step_LE: torch.Tensor, hot_LE: torch.Tensor) -> None:
        """Add a step's assignments, counted against the map it read (it changes only between steps)."""
        self.counts_LE += step_LE
        self.assigned_L += step_LE.sum(dim=1)
        self.hits_L += (step_LE * hot_LE).sum(dim=1)
        cold_LE = (step_LE > 0) & ~hot_LE
        self.cold_reads_L += cold_LE.sum(dim=1)
        self.cold_LE += cold_LE

    def read_counters(self, reset_window: bool = True) -> dict[str, np.ndarray]:
        """Copy the counters to the host (one synchronisation) and clear them for the next window.
        Copies, because .numpy() of a CPU tensor aliases the memory zeroed below."""
        out = {"counts_LE": self.counts_LE.cpu().numpy().astype(np.float64),
               "hits_L": self.hits_L.cpu().numpy().copy(), "assigned_L": self.assigned_L.cpu().numpy().copy(),
               "cold_reads_L": self.cold_reads_L.cpu().numpy().copy(), "cold_LE": self.cold_LE.cpu().numpy().copy()}
        if reset_window:
            for t in (self.counts_LE, self.hits_L, self.assigned_L, self.cold_reads_L, self.cold_LE):
                t.zero_()
        return out

    def begin_swaps(self, moves_by_layer: dict[int, list[tuple[int, int]]]) -> float:
        return sum(self.banks[li].begin_swaps(moves) for li, moves in moves_by_layer.items())

    def publish_ready(self, wait: bool = False) -> tuple[int, float]:
        done = [b.publish_ready(wait) for b in self.banks]
        return sum(n for n, _ in done), sum((ms for _, ms in done), 0.0)

    def served_hot_LE(self) -> np.ndarray:
        """The hot mask the next step reads (swaps in flight not yet published are cold)."""
        return np.stack([b.served_hot_E for b in self.banks])

    def stage(self, staged_LE: np.ndarray) -> None:
        """Between steps: start copying each layer's staged experts (bool [L, E]) into its staging rows."""
        for bank, staged_E in zip(self.banks, staged_LE, strict=True):
            bank.stage(np.flatnonzero(staged_E).tolist())

    def publish_staged(self) -> None:
        """Every layer's staged experts published (before a CUDA graph replays the whole step)."""
        for bank in self.banks:
            bank.publish_staged()

    def unstage(self) -> None:
        for bank in self.banks:
            bank.unstage()

    def last_step_counts_LE(self) -> np.ndarray:
        """The last step's routed assignments per layer and expert (int64 [L, E], on the host)."""
        raise NotImplementedError


class HotColdMoE(BankedModel):
    def __init__(self, layers: list[LayerWeights], geom: MoEGeometry, hot_LE: np.ndarray, info: DeviceInfo,
                 allocator: PinnedAllocator, compute, cold_path=None, lookahead=None):
        """`cold_path(bank)`: the CPU cold path made on the first layer's bank (cold_split.py), or None;
        `lookahead`: a LookaheadStager (lookahead_stage.py) that stages from the next router, or None."""
        dev = info.device
        L, E = len(layers), geom.num_experts
        self.geom, self.info, self.lookahead = geom, info, lookahead
        self.swap_stream = torch.cuda.Stream(dev) if info.is_cuda else None
        # One [L, E] map so the counters read every layer's map in one operation.
        self.expert2slot_LE = torch.full((L, E), -1, dtype=torch.int32, device=dev)
        self.banks = [MixedBank.of_weights(lw.parts, lw.w13_EIH, lw.w2_EHI, hot_LE[li], info, allocator,
                                           self.expert2slot_LE[li], self.swap_stream) if lw.parts
                      else ExpertBank(lw.w13_EIH, lw.w2_EHI, hot_LE[li], info, allocator, self.expert2slot_LE[li],
                                      self.swap_stream, lw.stored) for li, lw in enumerate(layers)]
        self.routers = [lw.router.to(dev) for lw in layers]
        self.shared = [None if lw.shared_w13 is None else (lw.shared_w13.to(dev), lw.shared_w2.to(dev))
                       for lw in layers]
        split = None if cold_path is None else cold_path(self.banks[0])
        self.compute = compute if split is None else SplitExperts(compute, split)
        self.step_counts_LE = torch.zeros(L, E, dtype=torch.int64, device=dev)
        self._init_counters(E, dev)

    def layer(self, li: int, x_TH: torch.Tensor, ids_TK: torch.Tensor | None = None,
              w_TK: torch.Tensor | None = None, routed=None) -> torch.Tensor:
        """One MoE layer's output [T, H]; counts this step's assignments into step_counts_LE.
        `routed`: how the routed experts are reached (default `_routed`; distributed/apply.py's exchange)."""
        self.banks[li].publish_staged()  # its staged experts, once their copies have landed
        if ids_TK is None:
            ids_TK, w_TK = self.routers[li](x_TH)
        if self.lookahead is not None:  # what the guesses made from the layer before are judged on
            self.lookahead.book.routed(li, ids_TK, ids_TK[:, 0] >= 0)
        y = (routed or self._routed)(li, x_TH, ids_TK, w_TK, self.step_counts_LE[li])
        if self.shared[li] is not None:
            y = y + swiglu(x_TH, *self.shared[li])
        return y

    def _routed(self, li: int, x_TH, ids_TK, w_TK, counts_E: torch.Tensor) -> torch.Tensor:
        """The routed experts' output [T, H], counting into `counts_E` the assignments computed
        here (an expert-parallel rank's: those it receives)."""
        counts_E.scatter_add_(0, ids_TK.reshape(-1).clamp(min=0), (ids_TK.reshape(-1) >= 0).long())
        if isinstance(self.banks[li], MixedBank):  # an auto plan's layer: one sub-bank per precision
            return self.banks[li].routed(self.compute, x_TH, ids_TK, w_TK)
        return self.compute(x_TH, ids_TK, w_TK, self.banks[li], counts_E)

    def step(self, x_TH: torch.Tensor, ids_LTK: torch.Tensor | None = None,
             w_LTK: torch.Tensor | None = None, routed=None, held_LE: np.ndarray | None = None) -> torch.Tensor:
        """One engine step through every layer: h = h + moe(rms_norm(h)). Device-only work, but
        for router lookahead's choices. `held_LE` (bool [L, E]): the experts this rank serves (an
        expert-parallel rank's; None: all), the only ones lookahead stages."""
        self.step_counts_LE.zero_()
        h = x_TH
        for li in range(self.num_layers):
            n_TH = rms_norm(h)
            if self.lookahead is not None and li > 0:  # layer li - 1's output, through layer li's router
                self.lookahead.ahead_router(li, n_TH, self.routers[li], self.banks[li],
                                            None if held_LE is None else held_LE[li])
            h = h + self.layer(li, n_TH, None if ids_LTK is None else ids_LTK[li],
                               None if w_LTK is None else w_LTK[li], routed)
        self._count(self.step_counts_LE, self.expert2slot_LE >= 0)  # the map this step read
        return h

    def last_step_counts_LE(self) -> np.ndarray:
        return self.step_counts_LE.cpu().numpy().copy()
