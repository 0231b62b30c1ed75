"""One MoE layer whose experts an auto plan stores at different precisions (docs/precision.md):
one `ExpertBank` per precision present, each over that precision's experts (ids remapped), each
with the plan's hot experts of that precision in its slots. Hot copies are the stored bytes, a
swap stays within one sub-bank (an expert only replaces a hot one of its own precision, as
`simulate` replays it), and the layer's routed output is the sum of each sub-bank's output on the
assignments routed to its experts (the others are padding there).

The model's [L, E] map row of the layer says which experts are hot (the run's counters read it);
it is written from the sub-banks' own maps between steps, whenever one of them changes.
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

    def __init__(self, parts: list[tuple[np.ndarray, StoredExperts | None]], w13_EIH: torch.Tensor,
                 w2_EHI: torch.Tensor, hot_E: np.ndarray, info: DeviceInfo, allocator: PinnedAllocator,
                 expert2slot_E: torch.Tensor, swap_stream=None):
        """`parts`: (expert ids, their stored experts or None for native) per precision;
        `w13_EIH`, `w2_EHI`: every expert's values (native experts are read from them)."""
        E = w13_EIH.shape[0]
        self.info, self.num_experts, self.expert2slot_E = info, E, expert2slot_E
        self.ids = [np.asarray(ids, dtype=np.int64) for ids, _ in parts]
        self.subs = [ExpertBank(w13_EIH[ids], w2_EHI[ids], np.asarray(hot_E, dtype=bool)[ids], info, allocator,
                                None, swap_stream, stored) for ids, stored in zip(self.ids, [s for _, s in parts],
                                                                                   strict=True)]
        self.owner_E = np.full(E, -1, dtype=np.int64)  # which sub-bank holds each expert
        self.local_E = np.full(E, -1, dtype=np.int64)  # its id there
        for b, ids in enumerate(self.ids):
            self.owner_E[ids], self.local_E[ids] = b, np.arange(len(ids))
        if (self.owner_E < 0).any():
            raise ValueError("every expert of a mixed layer needs a precision")
        # Per sub-bank, global id -> local id on the device (-1: another sub-bank's expert).
        self.local_of = [torch.as_tensor(np.where(self.owner_E == b, self.local_E, -1), device=info.device)
                         for b in range(len(self.subs))]
        self.compute_dtype = self.subs[0].compute_dtype
        self.served_E = np.full(E, -1, dtype=np.int64)
        self._sync_map()

    @property
    def precision(self) -> str:
        return "auto"

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
