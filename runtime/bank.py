"""One expert bank per MoE layer: the cold bank in pinned host memory, hot slots on the device,
and `expert2slot` on the device. Slot bookkeeping (SlotTable) is kept apart from byte movement
(ExpertBank), so the rules of a swap are testable without any memory at all.

A swap runs in two phases so that a step never sees a half-applied swap:
1. on the compute stream the outgoing expert's map entry becomes -1 (it is now served cold,
   from the same weights, so results do not change);
2. the swap stream waits for the compute stream (no step still reads the slot), copies the
   incoming expert's blob into the slot with one host->device copy and records an event;
   at a later step boundary, once the event has completed, the compute stream waits on it and
   the incoming expert's map entry is set. Map writes are only ever issued between steps, so
   they never land inside a step or a CUDA-graph replay.
On a CPU both phases happen at once, with the same bookkeeping (hot slots are separate tensors).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .device import DeviceInfo
from .pinned import PinnedAllocator


class SlotTable:
    """Which expert sits in which hot slot (host side; the target state once copies land)."""

    def __init__(self, hot_E: np.ndarray):
        hot_E = np.asarray(hot_E, dtype=bool)
        self.slot2expert_S = np.flatnonzero(hot_E).astype(np.int64)  # slot s holds this expert
        self.expert2slot_E = np.full(len(hot_E), -1, dtype=np.int64)
        self.expert2slot_E[self.slot2expert_S] = np.arange(len(self.slot2expert_S))

    @property
    def num_slots(self) -> int:
        return len(self.slot2expert_S)

    @property
    def hot_E(self) -> np.ndarray:
        return self.expert2slot_E >= 0

    def swap(self, out_expert: int, in_expert: int) -> int:
        """Give `out_expert`'s slot to `in_expert`; returns the slot. Both maps stay inverses."""
        slot = int(self.expert2slot_E[out_expert])
        if slot < 0:
            raise ValueError(f"expert {out_expert} is not hot")
        if self.expert2slot_E[in_expert] >= 0:
            raise ValueError(f"expert {in_expert} is already hot")
        self.expert2slot_E[out_expert] = -1
        self.expert2slot_E[in_expert] = slot
        self.slot2expert_S[slot] = in_expert
        return slot


class _ZeroCopyArray:
    """Presents a host pointer through __cuda_array_interface__ so torch wraps it as a CUDA
    tensor without copying (UVA: pinned memory is mapped at the same address on the device)."""

    def __init__(self, ptr: int, n_bytes: int):
        self.__cuda_array_interface__ = {"shape": (n_bytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def zero_copy_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CUDA tensor aliasing the pinned host tensor `host` (same bytes, read in place over PCIe).
    The caller keeps `host` alive for as long as the view is used."""
    if not host.is_pinned():
        raise ValueError("zero-copy needs pinned host memory")
    n_bytes = host.numel() * host.element_size()
    flat = torch.as_tensor(_ZeroCopyArray(host.data_ptr(), n_bytes), device=device)
    return flat.view(host.dtype).view(host.shape)


@dataclass
class _InFlight:
    moves: list[tuple[int, int]]  # (in_expert, slot) awaiting publication
    start: torch.cuda.Event
    done: torch.cuda.Event


class ExpertBank:
    """Cold bank [E, B] in (pinned) host memory, hot bank [S, B] on the device, expert2slot [E]."""

    def __init__(self, w13_EIH: torch.Tensor, w2_EHI: torch.Tensor, hot_E: np.ndarray, info: DeviceInfo,
                 allocator: PinnedAllocator, expert2slot_E: torch.Tensor, swap_stream=None):
        E, two_i, H = w13_EIH.shape
        inter = two_i // 2
        self.info = info
        self.dtype = w13_EIH.dtype
        self.num_experts, self.hidden, self.inter = E, H, inter
        self.w2_offset = 2 * inter * H  # elements into a blob where w2 starts
        B = 3 * inter * H
        n_bytes = E * B * w13_EIH.element_size()
        slab = allocator.alloc(n_bytes)
        self.cold_EB = slab[:n_bytes].view(self.dtype).view(E, B)  # in host memory
        self.cold_EB[:, :self.w2_offset].copy_(w13_EIH.reshape(E, -1))
        self.cold_EB[:, self.w2_offset:].copy_(w2_EHI.reshape(E, -1))
        # What kernels read for a cold expert: the zero-copy device view on CUDA, else the host rows.
        self.cold_read_EB = zero_copy_view(self.cold_EB, info.device) if info.zero_copy else self.cold_EB
        self.table = SlotTable(hot_E)
        S = self.table.num_slots
        # At least one row so kernels always get a valid pointer, even with no hot expert.
        self.hot_SB = torch.empty(max(S, 1), B, dtype=self.dtype, device=info.device)
        if S:
            self.hot_SB[:S].copy_(self.cold_EB[torch.from_numpy(self.table.slot2expert_S)])
        self.expert2slot_E = expert2slot_E  # a device row owned by the model, int32 [E]
        self.expert2slot_E.copy_(torch.from_numpy(self.table.expert2slot_E.astype(np.int32)))
        self.swap_stream = swap_stream
        self.in_flight: list[_InFlight] = []
        self.hot_views = [self._views(self.hot_SB[s]) for s in range(S)]
        self.cold_views = [self._views(self.cold_read_EB[e]) for e in range(E)]

    def _views(self, blob_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        H, inter = self.hidden, self.inter
        return blob_B[:self.w2_offset].view(2 * inter, H), blob_B[self.w2_offset:].view(H, inter)

    @property
    def expert_bytes(self) -> int:
        """Allocated bytes of one expert blob (scaled; the plan uses the real size)."""
        return self.cold_EB.shape[1] * self.cold_EB.element_size()

    def begin_swaps(self, moves: list[tuple[int, int]]) -> float:
        """Start swaps [(out_expert, in_expert)]; returns copy ms when done synchronously (CPU),
        else 0 (the time is reported by `publish_ready` when the copies land)."""
        if not moves:
            return 0.0
        planned = [(in_e, self.table.swap(out_e, in_e)) for out_e, in_e in moves]
        for out_e, _ in moves:
            self.expert2slot_E[out_e] = -1  # served cold from now on (same weights)
        if self.swap_stream is None:
            t0 = time.perf_counter()
            for in_e, slot in planned:
                self.hot_SB[slot].copy_(self.cold_EB[in_e])
            for in_e, slot in planned:
                self.expert2slot_E[in_e] = slot
            return (time.perf_counter() - t0) * 1e3
        compute = torch.cuda.current_stream(self.info.device)
        self.swap_stream.wait_stream(compute)  # no earlier step still reads these slots
        start = torch.cuda.Event(enable_timing=True)
        done = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.swap_stream):
            start.record()
            for in_e, slot in planned:
                self.hot_SB[slot].copy_(self.cold_EB[in_e], non_blocking=True)
            done.record()
        self.in_flight.append(_InFlight(planned, start, done))
        return 0.0

    def publish_ready(self, wait: bool = False) -> tuple[int, float]:
        """Between steps: publish the swaps whose copies have landed (all of them when `wait`).
        Returns (swaps published, their copy ms)."""
        published, copy_ms = 0, 0.0
        still = []
        for f in self.in_flight:
            if not (wait or f.done.query()):
                still.append(f)
                continue
            torch.cuda.current_stream(self.info.device).wait_event(f.done)
            for in_e, slot in f.moves:
                self.expert2slot_E[in_e] = slot
            if wait:
                f.done.synchronize()
            published += len(f.moves)
            copy_ms += f.start.elapsed_time(f.done)
        self.in_flight = still
        return published, copy_ms

    def weights_of(self, e: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [2I, H], w2 [H, I]) of expert e from its slot, or in place from the cold bank."""
        return self.hot_views[slot] if slot >= 0 else self.cold_views[e]
