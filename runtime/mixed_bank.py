"""One MoE layer whose experts an auto plan stores at different precisions (docs/precision.md):
one bank per precision present (a synthetic model's `ExpertBank`, a checkpoint's `HFExpertBank`),
each over that precision's experts (ids remapped), each with the plan's hot experts of that
precision in its slots. Hot copies are the stored bytes, a
swap stays within one sub-bank (an expert only replaces a hot one of its own precision, as
`simulate` replays it), and the layer's routed output is the sum of each sub-bank's output on the
assignments routed to its experts (the others are padding there).

The layer's map row (a synthetic model's [L, E] map row, which the run's counters read) is written
from the sub-banks' own maps between steps, whenever one of them changes.
"""

from __future__ import annotations

import numpy as np
import torch

from .bank import ExpertBank
from .device import DeviceInfo
from .pinned import PinnedAllocator
from .precision import StoredExperts


class MixedBank:
    """Sub-banks over disjoint expert sets, presented as one bank of E experts."""

    def __init__(self, ids: list[np.ndarray], subs: list, info: DeviceInfo,
                 expert2slot_E: torch.Tensor | None = None):
        """`subs[b]`: the bank of the experts `ids[b]` (global ids; its own ids are their positions
        there), one per precision; `expert2slot_E`: the layer's map row (None: its own)."""
        E = sum(len(i) for i in ids)
        self.info, self.num_experts, self.subs = info, E, subs
        self.expert2slot_E = (torch.empty(E, dtype=torch.int32, device=info.device) if expert2slot_E is None
                              else expert2slot_E)
        self.ids = [np.asarray(i, dtype=np.int64) for i in ids]
        self.owner_E = np.full(E, -1, dtype=np.int64)  # which sub-bank holds each expert
        self.local_E = np.full(E, -1, dtype=np.int64)  # its id there
        for b, i in enumerate(self.ids):
            self.owner_E[i], self.local_E[i] = b, np.arange(len(i))
        if (self.owner_E < 0).any():
            raise ValueError("every expert of a mixed layer needs a precision")
        # Per sub-bank, global id -> local id on the device (-1: another sub-bank's expert).
        self.local_of = [torch.as_tensor(np.where(self.owner_E == b, self.local_E, -1), device=info.device)
                         for b in range(len(self.subs))]
        self.compute_dtype = self.subs[0].compute_dtype
        self.served_E = np.full(E, -2, dtype=np.int64)  # differs from any map: the first sync writes the row
        self._sync_map()

    @classmethod
    def of_weights(cls, parts: list[tuple[np.ndarray, StoredExperts | None]], w13_EIH: torch.Tensor,
                   w2_EHI: torch.Tensor, hot_E: np.ndarray, info: DeviceInfo, allocator: PinnedAllocator,
                   expert2slot_E: torch.Tensor, swap_stream=None) -> MixedBank:
        """A synthetic layer's: `parts`, (expert ids, their stored experts or None for native) per
        precision; `w13_EIH`, `w2_EHI`: every expert's values (native experts are read from them)."""
        hot = np.asarray(hot_E, dtype=bool)
        subs = [ExpertBank(w13_EIH[ids], w2_EHI[ids], hot[ids], info, allocator, None, swap_stream, stored)
                for ids, stored in parts]
        return cls([ids for ids, _ in parts], subs, info, expert2slot_E)

    def sub_of(self, e: int) -> tuple[object, int]:
        """The sub-bank holding expert e, and its id there."""
        return self.subs[int(self.owner_E[e])], int(self.local_E[e])

    def set_hot(self, hot_E: np.ndarray) -> None:
        """Each sub-bank's hot slots for its experts of `hot_E` (between steps)."""
        hot = np.asarray(hot_E, dtype=bool)
        for ids, sub in zip(self.ids, self.subs, strict=True):
            sub.set_hot(hot[ids])
        self._sync_map()

    @property
    def precision(self) -> str:
        return "auto"

    @property
    def kernel(self):
        """A checkpoint's sub-banks' compute (their layouts differ only in precision: all or none plain)."""
        return self.subs[0].kernel

    @property
    def precisions(self) -> list[str]:
        return [s.precision for s in self.subs]

    @property
    def hot_E(self) -> np.ndarray:
        return self._merged(lambda s: s.hot_E, False)

    @property
    def served_hot_E(self) -> np.ndarray:
        return self.served_E >= 0

    def _merged(self, part, fill) -> np.ndarray:
        out = np.full(self.num_experts, fill, dtype=np.asarray(part(self.subs[0])).dtype)
        for ids, s in zip(self.ids, self.subs, strict=True):
            out[ids] = part(s)
        return out

    def _sync_map(self) -> None:
        """The layer's row of the model's map from the sub-banks' host mirrors, where it changed
        (between steps only: a CUDA graph never sees this copy)."""
        served = self._merged(lambda s: s.served_E, -1)
        if not np.array_equal(served, self.served_E):
            self.served_E = served
            self.expert2slot_E.copy_(torch.from_numpy(served.astype(np.int32)))

    def begin_swaps(self, moves: list[tuple[int, int]]) -> float:
        """Swaps [(out_expert, in_expert)] of global ids, each within one sub-bank."""
        by_sub: dict[int, list[tuple[int, int]]] = {}
        for out_e, in_e in moves:
            b = int(self.owner_E[out_e])
            if self.owner_E[in_e] != b:
                raise ValueError(f"swap {out_e}->{in_e} crosses precisions ({self.subs[b].precision} out, "
                                 f"{self.subs[self.owner_E[in_e]].precision} in)")
            by_sub.setdefault(b, []).append((int(self.local_E[out_e]), int(self.local_E[in_e])))
        ms = sum(self.subs[b].begin_swaps(m) for b, m in by_sub.items())
        self._sync_map()
        return ms

    def publish_ready(self, wait: bool = False) -> tuple[int, float]:
        done = [s.publish_ready(wait) for s in self.subs]
        self._sync_map()
        return sum(n for n, _ in done), sum((ms for _, ms in done), 0.0)

    def publish_staged(self) -> None:
        """Nothing is staged in a mixed layer (prefetch is refused at precision auto)."""

    def unstage(self) -> None:
        """Nothing is staged in a mixed layer (prefetch is refused at precision auto)."""

    def routed(self, compute, x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor) -> torch.Tensor:
        """The layer's routed output [T, H]: each sub-bank computes the assignments routed to its
        experts (the others are padding, -1, there), and their outputs add up."""
        y = None
        for local, sub in zip(self.local_of, self.subs, strict=True):
            local_TK = torch.where(ids_TK >= 0, local[ids_TK.clamp(min=0)], -1)
            part = compute(x_TH, local_TK, w_TK, sub)
            y = part if y is None else y + part
        return y

    def forward(self, experts: torch.nn.Module, x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor,
                host: bool = False) -> torch.Tensor:
        """A checkpoint layer's routed output (the adapter's seam, runtime/hf/bank.py `forward`)."""
        return self.routed(lambda x, ids, w, sub: sub.forward(experts, x, ids, w, host), x_TH, ids_TK, w_TK)
