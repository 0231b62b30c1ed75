"""One expert bank per MoE layer: the cold bank in pinned host memory, hot slots on the device,
and `expert2slot` on the device. Slot bookkeeping (SlotTable) is kept apart from byte movement
(BlobBank), so the rules of a swap are testable without any memory at all.

An expert is one contiguous blob of B elements, so a swap is a single host->device copy.
`BlobBank` moves blobs and knows nothing of what they hold; `ExpertBank` is the SwiGLU layout of
the synthetic runtime (w13 [2I, H] then w2 [H, I]); runtime/hf/bank.py keeps a Hugging Face
model's own layout in the same kind of bank.

A swap runs in two phases so that a step never sees a half-applied swap:
1. on the compute stream the outgoing expert's map entry becomes -1 (it is now served cold,
   from the same weights, so results do not change);
2. the swap stream waits for the compute stream (no step still reads the slot), copies the
   incoming expert's blob into the slot with one host->device copy and records an event;
   at a later step boundary, once the event has completed, the compute stream waits on it and
   the incoming expert's map entry is set. Map writes are only ever issued between steps, so
   they never land inside a step or a CUDA-graph replay.
On a CPU both phases happen at once, with the same bookkeeping (hot slots are separate tensors).

Staging slots (prefetch, runtime/prefetch.py) are rows of `hot_SB` past the hot slots, filled for
one step and emptied after it, by the same two phases: between steps the swap stream waits for
the compute stream (no earlier step still reads the rows), copies the step's staged experts in
and records an event; the compute stream waits on that event before the layer runs and only
then writes their map entries (`publish_staged`), so no read ever sees a half-filled row. After
the step the entries are cleared (`unstage`). A staged expert is never a hot one. A bank given a
`staging_times` list times each step's staging there (`StagingTiming`: the copies on the swap
stream, the compute stream's wait for them), for benchmarks/bench_prefetch_gpu.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from hotsplit_probes.hostmem import uva_view

from .device import DeviceInfo
from .fp8 import Fp8Experts, FP8Meta
from .pinned import PinnedAllocator
from .precision import StoredExperts


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


def zero_copy_view(host: torch.Tensor, device: torch.device, device_address: int | None = None) -> torch.Tensor:
    """A CUDA tensor aliasing the page-locked host tensor `host` (same bytes, read in place over
    PCIe). `device_address`: where the device sees `host` (cudaHostGetDevicePointer; under UVA
    the host address, the default). The view holds `host`, so the pages live as long as it does."""
    if device_address is None and not host.is_pinned():
        raise ValueError("zero-copy needs pinned host memory")
    address = host.data_ptr() if device_address is None else device_address
    flat = uva_view(torch, address, host.numel() * host.element_size(), device, keep=host)
    return flat.view(host.dtype).view(host.shape)


@dataclass(frozen=True)
class BlobLayout:
    """Where each part of an expert blob sits. Parts of one dtype sit back to back in a blob of
    that dtype; parts of mixed dtypes (fp8 weights, float32 scales) in a blob of bytes, each
    16-byte aligned so that it can be viewed in its own dtype. Offsets are in blob elements."""

    storage: torch.dtype
    offsets: dict[str, tuple[int, tuple[int, ...], torch.dtype]]  # name -> (offset, shape, dtype)
    elems: int  # elements of one blob

    @classmethod
    def of(cls, parts: list[tuple[str, tuple[int, ...], torch.dtype]]) -> BlobLayout:
        dtypes = {d for _, _, d in parts}
        storage = dtypes.pop() if len(dtypes) == 1 else torch.uint8
        offsets, off = {}, 0
        for name, shape, dtype in parts:
            offsets[name] = (off, tuple(shape), dtype)
            n = math.prod(shape) * dtype.itemsize // storage.itemsize
            off += n if dtype == storage else -(-n // 16) * 16
        if storage == torch.uint8:
            off = -(-off // 16) * 16
        return cls(storage, offsets, off)

    @property
    def stored_bytes(self) -> int:
        """Bytes of one expert's parts, without the alignment between them (what plans charge)."""
        return sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in self.offsets.values())

    def view(self, blob: torch.Tensor, name: str) -> torch.Tensor:
        """Part `name` of one blob [B], or of every blob of a bank [E, B] ([E, *shape])."""
        off, shape, dtype = self.offsets[name]
        n = math.prod(shape) * dtype.itemsize // self.storage.itemsize
        part = blob[..., off:off + n]
        if dtype != self.storage:
            part = part.view(dtype)
        return part.reshape(*blob.shape[:-1], *shape) if blob.dim() > 1 else part.view(shape)

    def fp8_meta(self, fmt) -> FP8Meta:
        """The scales' places for the kernels (a w1/w2/s1/s2 fp8 layout; offsets in bytes)."""
        (s1, s1_shape, _), (s2, s2_shape, _) = self.offsets["s1"], self.offsets["s2"]
        bm, bn = fmt.block or (1 << 30, 1 << 30)
        return FP8Meta(bm, bn, s1, s1_shape[1], s1_shape[2], s2, s2_shape[1])


def expert_blob_layout(two_inter: int, hidden: int, dtype: torch.dtype,
                       stored: StoredExperts | None) -> BlobLayout:
    """The blob of one SwiGLU expert: w13 [2I, H] then w2 [H, I] in `dtype`, or its stored parts."""
    inter = two_inter // 2
    return BlobLayout.of([("w1", (two_inter, hidden), dtype), ("w2", (hidden, inter), dtype)] if stored is None
                         else stored.parts())


@dataclass
class _InFlight:
    moves: list[tuple[int, int]]  # (in_expert, slot) awaiting publication
    start: torch.cuda.Event
    done: torch.cuda.Event


@dataclass(frozen=True)
class StagingTiming:
    """Timing events of one layer's staging in one step (a bank's `staging_times`, when timed):
    `start` and `ready` on the swap stream around its copies, `arrive` and `resume` on the
    compute stream around its wait for them. Read once every event has completed."""

    start: torch.cuda.Event
    ready: torch.cuda.Event
    arrive: torch.cuda.Event
    resume: torch.cuda.Event

    def copy_ms(self) -> float:
        """The staging copies' time on the swap stream."""
        return self.start.elapsed_time(self.ready)

    def exposed_ms(self) -> float:
        """How long the compute stream waited for them: the copy time it did not hide."""
        return self.arrive.elapsed_time(self.resume)


def _recorded_event() -> torch.cuda.Event:
    """A timing event recorded now on the current stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class BlobBank:
    """Cold blobs [E, B] in (pinned) host memory, hot blobs [S, B] on the device, expert2slot [E].

    `table` is the target state (swaps in flight included); `served_E` mirrors on the host the
    `expert2slot_E` that steps read right now, so host-side compute and hit accounting never
    read the device map back."""

    def __init__(self, num_experts: int, blob_elems: int, dtype: torch.dtype, info: DeviceInfo,
                 allocator: PinnedAllocator, expert2slot_E: torch.Tensor | None = None, swap_stream=None):
        E, B = num_experts, blob_elems
        self.info, self.dtype, self.num_experts = info, dtype, E
        self.compute_dtype = dtype  # what experts compute in (a bank of fp8 bytes says otherwise)
        self.fp8_meta: FP8Meta | None = None
        n_bytes = E * B * dtype.itemsize
        self.cold_EB = allocator.alloc(n_bytes)[:n_bytes].view(dtype).view(E, B)  # in host memory
        # What kernels read for a cold expert: the zero-copy device view on CUDA, else the host rows.
        self.cold_read_EB = (zero_copy_view(self.cold_EB, info.device, allocator.device_address(self.cold_EB))
                             if info.zero_copy else self.cold_EB)
        # A device row (int32 [E]); the synthetic model owns one [L, E] map and passes its rows.
        self.expert2slot_E = (torch.empty(E, dtype=torch.int32, device=info.device)
                              if expert2slot_E is None else expert2slot_E)
        self.swap_stream = swap_stream
        self.in_flight: list[_InFlight] = []
        self.staging_rows = 0  # rows of hot_SB past the hot slots, for staged experts (reserve_staging)
        self.staged: list[int] = []  # this step's staged experts, in row order
        self._staged_ready = None  # the event their copies recorded; None once published (or on a CPU)
        # A list: each step's staging is timed into it (StagingTiming, CUDA only; benchmarks).
        self.staging_times: list[StagingTiming] | None = None
        self._staged_start = None  # the timing event before the copies, when timed
        self.table = SlotTable(np.zeros(E, dtype=bool))
        self.served_E = self.table.expert2slot_E.copy()
        # At least one row so kernels always get a valid pointer, even with no hot expert.
        self.hot_SB = torch.empty(1, B, dtype=dtype, device=info.device)
        self.expert2slot_E.fill_(-1)

    @property
    def expert_bytes(self) -> int:
        """Allocated bytes of one expert blob (scaled in a synthetic run; the plan uses the real size)."""
        return self.cold_EB.shape[1] * self.cold_EB.element_size()

    @property
    def hot_E(self) -> np.ndarray:
        """The hot set once the swaps in flight land."""
        return self.table.hot_E

    @property
    def served_hot_E(self) -> np.ndarray:
        """The experts a step served hot right now."""
        return self.served_E >= 0

    def set_hot(self, hot_E: np.ndarray) -> None:
        """(Re)build the hot slots for this hot set, one copy per hot expert, between steps and
        before any CUDA graph captures `hot_SB` (the slots are reallocated)."""
        self.publish_ready(wait=True)
        self.table = SlotTable(hot_E)
        S = self.table.num_slots
        self.hot_SB = torch.empty(max(S + self.staging_rows, 1), self.cold_EB.shape[1], dtype=self.dtype,
                                  device=self.info.device)
        for slot, e in enumerate(self.table.slot2expert_S.tolist()):
            self.hot_SB[slot].copy_(self.cold_EB[e], non_blocking=True)  # pinned source: no staging copy
        if self.info.is_cuda:
            torch.cuda.current_stream(self.info.device).synchronize()
        self.served_E = self.table.expert2slot_E.copy()
        self.expert2slot_E.copy_(torch.from_numpy(self.served_E.astype(np.int32)))

    def begin_swaps(self, moves: list[tuple[int, int]]) -> float:
        """Start swaps [(out_expert, in_expert)]; returns copy ms when done synchronously (CPU),
        else 0 (the time is reported by `publish_ready` when the copies land)."""
        if not moves:
            return 0.0
        planned = [(in_e, self.table.swap(out_e, in_e)) for out_e, in_e in moves]
        for out_e, _ in moves:
            self._set_map(out_e, -1)  # served cold from now on (same weights)
        if self.swap_stream is None:
            t0 = time.perf_counter()
            for in_e, slot in planned:
                self.hot_SB[slot].copy_(self.cold_EB[in_e])
                self._set_map(in_e, slot)
            return (time.perf_counter() - t0) * 1e3
        compute = torch.cuda.current_stream(self.info.device)
        self.swap_stream.wait_stream(compute)  # no earlier step still reads these slots
        start, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
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
        for i, f in enumerate(self.in_flight):
            if not (wait or f.done.query()):
                still.append(f)
                continue
            torch.cuda.current_stream(self.info.device).wait_event(f.done)
            # An expert swapped out again while its copy was in flight is not published: its slot
            # belongs to a later swap, which publishes it once that copy has landed.
            refilled = {slot for g in self.in_flight[i + 1:] for _, slot in g.moves}
            for in_e, slot in f.moves:
                if slot not in refilled and self.table.expert2slot_E[in_e] == slot:
                    self._set_map(in_e, slot)
            if wait:
                f.done.synchronize()
            published += len(f.moves)
            copy_ms += f.start.elapsed_time(f.done)
        self.in_flight = still
        return published, copy_ms

    def reserve_staging(self, rows: int) -> None:
        """Give the bank `rows` staging rows past its hot slots (reallocated: before any capture)."""
        self.staging_rows = rows
        self.set_hot(self.hot_E)

    def stage(self, experts: list[int]) -> None:
        """Between steps: copy this step's staged (cold) experts into the staging rows."""
        if len(experts) > self.staging_rows or self.served_hot_E[experts].any():
            raise ValueError(f"cannot stage {experts}: {self.staging_rows} rows, staged experts must be cold")
        self.staged = list(experts)
        if not experts:
            return
        rows = range(self.table.num_slots, self.table.num_slots + len(experts))
        if self.swap_stream is None:
            for e, row in zip(experts, rows, strict=True):
                self.hot_SB[row].copy_(self.cold_EB[e])
            return
        timed = self.staging_times is not None
        self.swap_stream.wait_stream(torch.cuda.current_stream(self.info.device))  # the rows' last readers
        with torch.cuda.stream(self.swap_stream):
            self._staged_start = _recorded_event() if timed else None
            for e, row in zip(experts, rows, strict=True):
                self.hot_SB[row].copy_(self.cold_EB[e], non_blocking=True)
            self._staged_ready = torch.cuda.Event(enable_timing=timed)
            self._staged_ready.record()

    def publish_staged(self) -> None:
        """On the compute stream, before the layer reads: wait for the staging copies, then map the
        staged experts to their rows (a no-op once done, or with nothing staged)."""
        if not self.staged or self.served_E[self.staged[0]] >= 0:
            return
        if self._staged_ready is not None:
            arrive = _recorded_event() if self._staged_start is not None else None
            torch.cuda.current_stream(self.info.device).wait_event(self._staged_ready)
            if arrive is not None:
                self.staging_times.append(StagingTiming(self._staged_start, self._staged_ready, arrive,
                                                        _recorded_event()))
            self._staged_ready = self._staged_start = None
        for row, e in enumerate(self.staged, start=self.table.num_slots):
            self._set_map(e, row)

    def unstage(self) -> None:
        """After the step: the staged experts are served cold again; their rows are free."""
        for e in self.staged:
            self._set_map(e, -1)
        self.staged, self._staged_ready, self._staged_start = [], None, None

    def _set_map(self, e: int, slot: int) -> None:
        """One map entry, on the device and in the host mirror. A slice fill is a kernel on the
        current stream; `tensor[e] = slot` would be a blocking host->device copy."""
        self.expert2slot_E[e:e + 1].fill_(slot)
        self.served_E[e] = slot

    def swap(self, out_expert: int, in_expert: int) -> float:
        """One swap, applied before returning (between steps); returns its copy ms."""
        ms = self.begin_swaps([(out_expert, in_expert)])
        return ms + self.publish_ready(wait=True)[1]


class ExpertBank(BlobBank):
    """The synthetic runtime's SwiGLU experts: a blob is w13 [2I, H] (gate rows, then up rows)
    followed by w2 [H, I]; with `stored` (the same experts quantised: fp8 or mxfp4,
    runtime/precision.py) their stored bytes, values then scales, in both banks."""

    def __init__(self, w13_EIH: torch.Tensor, w2_EHI: torch.Tensor, hot_E: np.ndarray, info: DeviceInfo,
                 allocator: PinnedAllocator, expert2slot_E: torch.Tensor | None = None, swap_stream=None,
                 stored: StoredExperts | None = None):
        E, two_i, H = w13_EIH.shape
        inter = two_i // 2
        dt = w13_EIH.dtype
        self.blob_layout = expert_blob_layout(two_i, H, dt, stored)
        super().__init__(E, self.blob_layout.elems, self.blob_layout.storage, info, allocator, expert2slot_E,
                         swap_stream)
        self.compute_dtype, self.stored = dt, stored
        self.hidden, self.inter = H, inter
        self.w2_offset = self.blob_layout.offsets["w2"][0]  # elements into a blob where w2 starts
        if isinstance(stored, Fp8Experts):
            self.fp8_meta = self.blob_layout.fp8_meta(stored.fmt)
        # A cold bank shared by a node's ranks is written once, by the rank that created it.
        if allocator.fills:
            sources = {"w1": w13_EIH, "w2": w2_EHI} if stored is None else stored.sources()
            for name, t in sources.items():
                self.blob_layout.view(self.cold_EB, name).copy_(t)
        self.cold_views = [self._views(self.cold_read_EB[e]) for e in range(E)]
        # Made once, as the device's are: the CPU cold path fetches them per expert and call, and
        # making them there (an index and a view per weight) was a cost no rate measured, the
        # larger the smaller the expert (docs/benchmarks.md, "Predicted vs achieved per path").
        self.host_views = (self.cold_views if self.cold_read_EB is self.cold_EB
                           else [self._views(self.cold_EB[e]) for e in range(E)])
        # Every expert's (w13 [E, 2I, H], w2 [E, H, I]) as two views of the host cold bank, for the
        # CPU cold path's one grouped matmul per projection (probes/cpu_expert.py `stacked_experts`):
        # no per-call gather or copy. Native experts only; stored ones are dequantised per expert.
        self.host_stack = (None if stored is not None else
                           (self.blob_layout.view(self.cold_EB, "w1"), self.blob_layout.view(self.cold_EB, "w2")))
        self.set_hot(hot_E)

    @property
    def precision(self) -> str:
        """The stored precision of every expert of this bank (runtime/precision.py)."""
        return "native" if self.stored is None else "fp8" if isinstance(self.stored, Fp8Experts) else "mxfp4"

    def _views(self, blob_B: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.blob_layout.view(blob_B, name) for name in self.blob_layout.offsets)

    def set_hot(self, hot_E: np.ndarray) -> None:
        super().set_hot(hot_E)  # reallocates the slots: their views are made again
        self.hot_views = [self._views(self.hot_SB[s]) for s in range(self.table.num_slots + self.staging_rows)]

    def weights_of(self, e: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [2I, H], w2 [H, I]) of expert e from its slot, or in place from the cold bank;
        stored experts dequantised (in the compute dtype), one expert at a time."""
        return self._weights(self.hot_views[slot] if slot >= 0 else self.cold_views[e])

    def host_weights_of(self, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13, w2) of expert e read where it lies in the host cold bank (the CPU cold path)."""
        return self._weights(self.host_views[e])

    def _weights(self, views: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        return views if self.stored is None else self.stored.decode(views, self.compute_dtype)
