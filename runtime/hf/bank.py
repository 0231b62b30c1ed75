"""The expert bank of one MoE layer of a Hugging Face model, in that model's own expert layout.

It follows runtime/bank.py (cold bank of blobs in pinned host memory, hot slots on the device,
`expert2slot`, the same `SlotTable`), generalised to the layouts transformers uses:

- `w1`: gate and up projections, [2I, H] (`x @ w1.T`), or transposed [H, 2I] (`x @ w1`) for gpt-oss;
  gate/up concatenated ([gate; up]) or interleaved (gate0, up0, gate1, ...) as the experts
  module's own `_apply_gate` expects;
- `w2`: down projection, [H, I] or transposed [I, H];
- optional biases `b1` [2I] and `b2` [H] (gpt-oss).

One expert is one contiguous blob (w1, w2[, b1, b2]) so a swap is a single copy. The cold bank is
filled one expert part at a time (`load_part`), straight from a checkpoint tensor: the weights
never sit twice in host memory.

Shape letters: T = tokens, K = top_k, E = experts, S = hot slots, B = elements of one blob.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..bank import SlotTable, zero_copy_view
from ..device import DeviceInfo
from ..moe import expert_groups
from ..pinned import PinnedAllocator, plan_placement

PARTS = ("w1", "w2", "b1", "b2")


@dataclass(frozen=True)
class ExpertLayout:
    """How one expert's tensors look in this model (shapes as stored, per expert)."""

    w1_shape: tuple[int, int]  # [2I, H], or [H, 2I] when transposed
    w2_shape: tuple[int, int]  # [H, I], or [I, H] when transposed
    transposed: bool
    has_bias: bool
    hidden: int

    @property
    def part_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {"w1": self.w1_shape, "w2": self.w2_shape}
        if self.has_bias:
            two_i = self.w1_shape[1] if self.transposed else self.w1_shape[0]
            shapes.update(b1=(two_i,), b2=(self.hidden,))
        return shapes

    @property
    def blob_elems(self) -> int:
        return sum(math.prod(s) for s in self.part_shapes.values())

    @classmethod
    def of_module(cls, experts: torch.nn.Module) -> ExpertLayout:
        """Read the layout from a transformers experts module (works on a meta-device skeleton)."""
        transposed = bool(getattr(experts, "is_transposed", False))
        has_bias = bool(getattr(experts, "has_bias", False))
        if not getattr(experts, "has_gate", True) or not hasattr(experts, "gate_up_proj"):
            raise NotImplementedError(f"{type(experts).__name__}: experts without a fused gate_up_proj")
        w1 = tuple(experts.gate_up_proj.shape[1:])
        w2 = tuple(experts.down_proj.shape[1:])
        hidden = w1[0] if transposed else w1[1]
        return cls(w1, w2, transposed, has_bias, hidden)


class HFExpertBank:
    """Cold blobs [E, B] in (pinned) host memory, hot blobs [S, B] on the device, expert2slot [E]."""

    def __init__(self, layout: ExpertLayout, num_experts: int, dtype: torch.dtype, info: DeviceInfo,
                 allocator: PinnedAllocator | None = None):
        self.layout, self.info, self.dtype = layout, info, dtype
        self.num_experts = num_experts
        allocator = allocator or PinnedAllocator(pin=info.pinned, placement=plan_placement("off", None))
        B = layout.blob_elems
        n_bytes = num_experts * B * torch.empty((), dtype=dtype).element_size()
        self.cold_EB = allocator.alloc(n_bytes)[:n_bytes].view(dtype).view(num_experts, B)
        self.cold_read_EB = zero_copy_view(self.cold_EB, info.device) if info.zero_copy else self.cold_EB
        self._offsets: dict[str, tuple[int, tuple[int, ...]]] = {}
        off = 0
        for name, shape in layout.part_shapes.items():
            self._offsets[name] = (off, shape)
            off += math.prod(shape)
        self.table = SlotTable(np.zeros(num_experts, dtype=bool))
        self.hot_SB = torch.empty(1, B, dtype=dtype, device=info.device)
        self.expert2slot_E = torch.full((num_experts,), -1, dtype=torch.int32, device=info.device)
        self._slots_host = self.table.expert2slot_E.copy()  # what forward reads (CPU grouping path)

    # ---- filling the cold bank ----

    def load_part(self, e: int, part: str, tensor: torch.Tensor, rows: slice | None = None) -> None:
        """Copy one checkpoint tensor into expert e's blob (`rows`: a slice of the part's first dim)."""
        off, shape = self._offsets[part]
        view = self.cold_EB[e, off:off + math.prod(shape)].view(shape)
        (view if rows is None else view[rows]).copy_(tensor)

    @property
    def expert_bytes(self) -> int:
        return self.cold_EB.shape[1] * self.cold_EB.element_size()

    # ---- hot set ----

    def set_hot(self, hot_E: np.ndarray) -> None:
        """(Re)build the hot slots for this hot set (one copy per hot expert)."""
        self.table = SlotTable(np.asarray(hot_E, dtype=bool))
        S = self.table.num_slots
        self.hot_SB = torch.empty(max(S, 1), self.cold_EB.shape[1], dtype=self.dtype, device=self.info.device)
        if S:
            idx = torch.from_numpy(self.table.slot2expert_S)
            self.hot_SB[:S].copy_(self.cold_EB[idx].to(self.info.device))
        self._publish()

    def swap(self, out_expert: int, in_expert: int) -> None:
        """Give a hot expert's slot to a cold one (synchronous copy; between steps only)."""
        slot = self.table.swap(out_expert, in_expert)
        self.hot_SB[slot].copy_(self.cold_EB[in_expert])
        self._publish()

    def _publish(self) -> None:
        self._slots_host = self.table.expert2slot_E.copy()
        self.expert2slot_E.copy_(torch.from_numpy(self._slots_host.astype(np.int32)))

    @property
    def hot_E(self) -> np.ndarray:
        return self.table.hot_E

    # ---- compute ----

    def parts_of(self, e: int) -> dict[str, torch.Tensor]:
        """Expert e's tensors from its hot slot, or read in place from the cold bank."""
        slot = int(self._slots_host[e])
        blob = self.hot_SB[slot] if slot >= 0 else self.cold_read_EB[e]
        if blob.device != self.info.device:  # CUDA without zero-copy: an explicit copy
            blob = blob.to(self.info.device, non_blocking=True)
        return {name: blob[off:off + math.prod(shape)].view(shape) for name, (off, shape) in self._offsets.items()}

    def forward(self, experts: torch.nn.Module, x_TH: torch.Tensor, ids_TK: torch.Tensor,
                w_TK: torch.Tensor) -> torch.Tensor:
        """The routed experts' output [T, H], computed as transformers' eager experts do:
        per expert, gate/up, the module's own `_apply_gate`, down, times the routing weight
        (fp32 routing weights promote, as in transformers), summed per token."""
        lay = self.layout
        out_TH = torch.zeros_like(x_TH)
        w_flat = w_TK.reshape(-1)
        for e, tok, idx in expert_groups(ids_TK, self.num_experts):
            p = self.parts_of(e)
            x = x_TH[tok]
            if lay.transposed:
                gu = x @ p["w1"]
            else:
                gu = torch.nn.functional.linear(x, p["w1"])
            if lay.has_bias:
                gu = gu + p["b1"]
            h = experts._apply_gate(gu)
            y = h @ p["w2"] if lay.transposed else torch.nn.functional.linear(h, p["w2"])
            if lay.has_bias:
                y = y + p["b2"]
            y = y * w_flat[idx, None]
            out_TH.index_add_(0, tok, y.to(out_TH.dtype))
        return out_TH
