"""The routed-expert compute over a bank: hot experts from their slots, cold experts read in
place from the cold bank (zero-copy on a GPU). Two implementations of one computation:

- `TritonExperts`: expert-grouped kernels (runtime/triton_kernels.py). The A = T*K routed
  assignments of a step are sorted by expert on the device and cut into blocks of at most
  BLOCK_T assignments of one expert (`align_blocks`); each program of the two kernels takes one
  such block and one block of weight rows, so it reads each weight tile once for all the
  assignments of its block. An expert chosen by n tokens is read ceil(n / BLOCK_T) times per
  step instead of n times; for a cold expert those reads cross PCIe, so grouping is what keeps a
  step's cold traffic close to one read per distinct expert. Each program looks up
  `expert2slot` on the device and takes its weight pointer from the hot bank or the cold bank,
  and every size (sort, counts, the grid) is fixed by T, K and E alone, so there is no host
  synchronisation and a step can be captured in a CUDA graph. Tiles are read at the bank's
  stored precision and dequantised as they are read: fp8 values times their block scale, mxfp4
  codes one 32-input group at a time with the group's scale on its partial sums
  (docs/precision.md). With TRITON_INTERPRET=1 the same kernels run on a CPU (how the tests
  check them).
- `TorchExperts`: tokens grouped by expert on the host, each expert's weights taken from its
  slot or the cold bank; the CPU path (and the GPU fallback without Triton).

Both compute, per assignment a = (t, k) of expert e with weight w:
    y[t] += w * w2_e (silu(gate_e x_t) * up_e x_t)
accumulating in float32. Shape letters: T, K, A = T*K assignments, H, I (INTER in the kernels),
E, B (blob elements), N (blocks of the grouped launch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from hotsplit_probes.cpu_expert import grouped_experts

from .bank import ExpertBank
from .device import DeviceInfo
from .fp8 import FP8Meta
from .moe import expert_counts
from .precision import MX_GROUP


class TorchExperts:
    name = "torch-grouped"
    capturable = False

    def __call__(self, x_TH, ids_TK, w_TK, bank: ExpertBank, counts_E=None) -> torch.Tensor:
        slots = bank.served_E.tolist()  # the host mirror of expert2slot: no device read
        return grouped_experts(x_TH, ids_TK, w_TK, lambda e: bank.weights_of(e, slots[e]), bank.num_experts)


@dataclass
class ExpertBlocks:
    """Routed assignments grouped by expert in blocks of at most `block_t` (device tensors).

    Block n covers `order_A[start_N[n] : start_N[n] + count_N[n]]`, all routed to `expert_N[n]`.
    Blocks past the last used one have count 0 and expert -1 (the grid is sized for the worst case)."""

    order_A: torch.Tensor  # int64 [A]: assignment indices (t * K + k) sorted by expert, padding last
    expert_N: torch.Tensor  # int32 [N]
    start_N: torch.Tensor  # int64 [N]: offset into order_A
    count_N: torch.Tensor  # int32 [N]: 0..block_t

    @property
    def num_blocks(self) -> int:
        return self.expert_N.shape[0]


def max_blocks(num_assignments: int, num_experts: int, block_t: int) -> int:
    """Upper bound on the blocks of one step: each expert used adds at most one partial block, and
    at most min(E, A) experts are used. Static in the shapes, so the grid never depends on data."""
    return -(-num_assignments // block_t) + min(num_experts, num_assignments)


def align_blocks(ids_A: torch.Tensor, num_experts: int, block_t: int) -> ExpertBlocks:
    """Sort the assignments `ids_A` (int [A], -1 = padding) by expert and cut them into per-expert
    blocks of at most `block_t`, with device ops of static sizes only (no host synchronisation)."""
    E = num_experts
    A = ids_A.shape[0]
    ids = ids_A.long()
    valid = ids >= 0
    key = torch.where(valid, ids, E).to(torch.int32)  # padding sorts after every expert, in no block
    order_A = torch.sort(key, stable=True).indices  # a device sort: no data-dependent size
    counts_E = expert_counts(ids, E)  # not bincount: it reads its max on the host
    blocks_E = (counts_E + block_t - 1) // block_t
    block_end_E = torch.cumsum(blocks_E, 0)
    block_begin_E = block_end_E - blocks_E
    row_begin_E = torch.cumsum(counts_E, 0) - counts_E
    n = torch.arange(max_blocks(A, E, block_t), dtype=torch.int64, device=ids.device)
    # Block n belongs to the first expert whose blocks end after n; experts without blocks are skipped.
    e_N = torch.searchsorted(block_end_E, n, right=True).clamp_(max=E - 1)
    live = n < block_end_E[-1]
    local = n - block_begin_E[e_N]  # this block's index within its expert
    count_N = torch.where(live, (counts_E[e_N] - local * block_t).clamp(0, block_t), 0)
    start_N = torch.where(live, row_begin_E[e_N] + local * block_t, 0)
    expert_N = torch.where(live, e_N, -1)
    return ExpertBlocks(order_A, expert_N.to(torch.int32), start_N, count_N.to(torch.int32))


# Programs the gate/up launch aims for per multiprocessor: a cold expert is read over PCIe, and
# only many reads in flight at once come near the link's rate.
PROGRAMS_PER_SM = 4


def split_for(programs: int, h_tiles: int, target: int) -> int:
    """How many chunks to cut the H reduction of the gate/up launch into so that `programs`
    (blocks x I tiles) become at least `target` (never more chunks than H tiles). Depends on the
    shapes only, so the grid stays fixed for a CUDA graph."""
    if programs >= target:
        return 1
    return max(1, min(h_tiles, -(-target // max(programs, 1))))


_NO_FP8 = FP8Meta(1, 1, 0, 0, 0, 0, 0)  # the scale arguments of a bank in its model dtype (unused)


def scale_places(bank) -> FP8Meta:
    """Where a bank's blobs keep their scales, for the kernels (bytes into a blob): an fp8 bank's
    block scales; an mxfp4 bank's e8m0 bytes (s1 [2I, H/32] and s2 [H, I/32] of its blob layout,
    of which the kernels take the offsets); none for experts in the model dtype."""
    if getattr(bank, "precision", "native") == "mxfp4":
        offsets = bank.blob_layout.offsets
        return replace(_NO_FP8, s1_offset=offsets["s1"][0], s2_offset=offsets["s2"][0])
    return bank.fp8_meta or _NO_FP8


class TritonExperts:
    name = "triton"
    capturable = True

    def __init__(self, block_t: int = 16, block_i: int = 32, block_h: int = 128, block_i_down: int = 64,
                 split_h: int | None = None):
        """`block_i_down`: the I tile the down projection reduces over; w2 rows are contiguous
        along I, so it sets the bytes of each contiguous read (64 bf16 = 128 B). `split_h`: chunks
        of the gate/up reduction over H (None: enough for PROGRAMS_PER_SM programs per
        multiprocessor on a GPU, 1 elsewhere)."""
        for name, v in (("block_t", block_t), ("block_i", block_i), ("block_h", block_h),
                        ("block_i_down", block_i_down)):
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")  # tl.arange needs one
        if split_h is not None and split_h < 1:
            raise ValueError(f"split_h must be >= 1, got {split_h}")
        self.block_t, self.block_i, self.block_h, self.block_i_down = block_t, block_i, block_h, block_i_down
        self.split_h = split_h
        self._sms: int | None = None  # multiprocessors of the GPU, read once
        self.use_dot = min(block_t, block_i, block_h) >= 16  # tl.dot's smallest shape
        self.use_dot_down = min(block_t, block_i_down, block_h) >= 16
        # Triton is optional (a machine without it runs TorchExperts): imported here, not at the first step.
        from . import triton_kernels

        self.kernels = triton_kernels

    def _split(self, programs: int, H: int, device: torch.device) -> int:
        h_tiles = -(-H // self.block_h)
        if self.split_h is not None:
            return min(self.split_h, h_tiles)
        if device.type != "cuda":
            return 1
        if self._sms is None:
            self._sms = torch.cuda.get_device_properties(device).multi_processor_count
        return split_for(programs, h_tiles, PROGRAMS_PER_SM * self._sms)

    def tile_scaled(self, fp8: FP8Meta) -> tuple[bool, bool]:
        """Whether every weight tile of (gate/up, down) lies inside one fp8 scale block, so that one
        scale per tile multiplies its partial sums: the gate/up tile is BLOCK_I rows x BLOCK_H
        columns of w13, the down tile BLOCK_H rows x BLOCK_I_DOWN columns of w2, each starting at a
        multiple of its size. True for 128x128 blocks and the default tiles."""
        return (fp8.bm % self.block_i == 0 and fp8.bn % self.block_h == 0,
                fp8.bm % self.block_h == 0 and fp8.bn % self.block_i_down == 0)

    def reads_mxfp4(self, bank) -> bool:
        """Whether `bank` stores MXFP4 experts. The kernels read those one 32-input group at a time,
        so a tile along the inputs (block_h for gate/up, block_i_down for down) holds whole groups."""
        if getattr(bank, "precision", "native") != "mxfp4":
            return False
        if min(self.block_h, self.block_i_down) < MX_GROUP:
            raise ValueError(f"mxfp4 experts are read {MX_GROUP} inputs at a time: block_h and block_i_down must "
                             f"be >= {MX_GROUP}, got {self.block_h} and {self.block_i_down}")
        return True

    def native_dot(self, dtype: torch.dtype) -> bool:
        """16-bit weights multiply in their own dtype on tensor cores (float32 accumulation; the
        activation is rounded to that dtype before the down projection, as the reference rounds it),
        float32 weights exactly. Not bfloat16 in the interpreter: its tl.dot would multiply bfloat16
        as raw 16-bit integers."""
        if dtype == torch.float16:
            return True
        return dtype == torch.bfloat16 and not self.kernels.INTERPRET

    def __call__(self, x_TH, ids_TK, w_TK, bank: ExpertBank, counts_E=None) -> torch.Tensor:
        k = self.kernels
        T, K = ids_TK.shape
        H, INTER = bank.hidden, bank.inter
        A = T * K
        if A == 0:
            return torch.zeros_like(x_TH)
        out = torch.zeros(A, H, dtype=torch.float32, device=x_TH.device)  # padding rows stay zero
        x = x_TH.contiguous()
        wts = w_TK.reshape(-1).float().contiguous()
        blocks = align_blocks(ids_TK.reshape(-1), bank.num_experts, self.block_t)
        blob_stride = bank.hot_SB.stride(0)
        compute_dtype = bank.compute_dtype
        native = self.native_dot(compute_dtype)
        fp8 = scale_places(bank)  # where an fp8 or mxfp4 blob keeps its scales
        f8 = dict(FP8=bank.fp8_meta is not None, BM=fp8.bm, BN=fp8.bn, MX=self.reads_mxfp4(bank))
        tile_gu, tile_down = self.tile_scaled(fp8)
        N = blocks.num_blocks
        i_tiles, h_tiles = -(-INTER // self.block_i), -(-H // self.block_h)
        split = self._split(N * i_tiles, H, x.device)
        if split == 1:
            gu = act = torch.empty(A, INTER, dtype=torch.float32, device=x.device)
        else:  # partial sums of gate and up land here; the activation follows in torch
            gu = torch.zeros(A, 2 * INTER, dtype=torch.float32, device=x.device)
        meta = (blocks.order_A, blocks.expert_N, blocks.start_N, blocks.count_N)
        tiles_per_split = -(-h_tiles // split)
        k.gate_up_kernel[(N, i_tiles, split)](
            x, *meta, bank.expert2slot_E, bank.hot_SB, bank.cold_read_EB, gu, H, INTER, blob_stride, tiles_per_split,
            fp8.s1_offset, fp8.s1_rows, fp8.s1_cols,
            K=K, BLOCK_T=self.block_t, BLOCK_I=self.block_i, BLOCK_H=self.block_h, USE_DOT=self.use_dot,
            NATIVE=native, SPLIT=split, TILE_SCALE=tile_gu, **f8)
        if split > 1:
            act = (F.silu(gu[:, :INTER]) * gu[:, INTER:]).contiguous()
        k.down_kernel[(N, h_tiles)](
            act, blocks.order_A, wts, *meta[1:], bank.expert2slot_E, bank.hot_SB, bank.cold_read_EB, out, H, INTER,
            blob_stride, bank.w2_offset, fp8.s2_offset, fp8.s2_cols,
            BLOCK_T=self.block_t, BLOCK_H=self.block_h, BLOCK_I=self.block_i_down, USE_DOT=self.use_dot_down,
            NATIVE=native, BF16=compute_dtype == torch.bfloat16, TILE_SCALE=tile_down, **f8)
        return out.view(T, K, H).sum(dim=1).to(x_TH.dtype)


def choose_compute(info: DeviceInfo):
    """Triton where it can run on the chosen device, else the torch path (decided once). The
    kernels read every stored precision (native, fp8 and mxfp4 tiles, dequantised as they are
    read) and the torch path dequantises per expert, so the choice depends on the device alone."""
    return TritonExperts() if info.triton else TorchExperts()
