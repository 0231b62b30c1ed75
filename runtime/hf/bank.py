"""The expert bank of one MoE layer of a Hugging Face model, in that model's own expert layout.

A `BlobBank` (runtime/bank.py: cold blobs in pinned host memory, hot slots on the device,
`expert2slot`, swaps on a side stream published between steps) whose blobs hold the layouts
transformers uses:

- `w1`: gate and up projections, [2I, H] (`x @ w1.T`), or transposed [H, 2I] (`x @ w1`) for gpt-oss;
  gate/up concatenated ([gate; up]) or interleaved (gate0, up0, gate1, ...) as the experts
  module's own `_apply_gate` expects;
- `w2`: down projection, [H, I] or transposed [I, H];
- optional biases `b1` [2I] and `b2` [H] (gpt-oss).

When the layout is the plain one (w1 [2I, H] concatenated, w2 [H, I], no bias, SiLU gate) a blob
is byte for byte the synthetic runtime's (or its block-scaled fp8 form: e4m3 weights, then the
float32 scales), and where Triton runs the bank computes with the same expert-grouped kernels
(device-side map, no host sync, fp8 tiles dequantised as they are read); otherwise, per expert
in torch with the module's own `_apply_gate`. The cold bank is filled one expert part at a time (`load_part`),
straight from a checkpoint tensor: the weights never sit twice in host memory.

A bank stored at fp8 or mxfp4 keeps its weights as [out, in] (whatever way the model's own are
transposed) and its biases in the model dtype; native weights are quantised once, as they enter
the cold bank (`load_native`), so a hot copy and every swap move the same stored bytes.

Shape letters: T = tokens, K = top_k, E = experts, S = hot slots, B = elements of one blob.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from hotsplit_probes.cpu_expert import expert_groups

from hotsplit_cli.core.errors import UnsupportedModelError

from ..bank import BlobBank, BlobLayout
from ..device import DeviceInfo
from ..fp8 import FP8, Fp8Format, dequantize_swiglu, swiglu_fp8_parts
from ..fp8 import quantize as fp8_quantize
from ..pinned import PinnedAllocator, numa_policy_for
from ..precision import MX_GROUP, MXFP4, Mxfp4Format, check_precision_dims, mxfp4_dequantize, mxfp4_quantize

_SUPPORTED = "hotsplit runs experts with a fused gate_up_proj and a down_proj (docs/real-models.md lists the families)"


@dataclass(frozen=True)
class ExpertLayout:
    """How one expert's tensors look in this model (shapes as stored, per expert)."""

    w1_shape: tuple[int, int]  # [2I, H], or [H, 2I] when transposed
    w2_shape: tuple[int, int]  # [H, I], or [I, H] when transposed
    transposed: bool
    has_bias: bool
    hidden: int
    plain_swiglu: bool = False  # w1 [2I, H] = [gate; up], w2 [H, I], no bias, silu(gate) * up
    fp8: Fp8Format | None = None  # block-scaled fp8 weights (and their scales) instead of the model dtype
    mxfp4: bool = False  # MXFP4 blocks and scales in the release layout (runtime/precision.py)

    def blob_layout(self, dtype: torch.dtype) -> BlobLayout:
        """One expert's blob: its tensors as stored, in `dtype`; or fp8 weights and their scales, or
        MXFP4 blocks and scales ([out, in/32, 16] and [out, in/32]), then biases in `dtype`."""
        two_i, H = 2 * self.inter, self.hidden
        parts = [("w1", self.w1_shape, dtype), ("w2", self.w2_shape, dtype)]
        if self.fp8 is not None:
            parts = swiglu_fp8_parts(two_i, H, self.fp8)
        if self.mxfp4:
            g1, g2, u8 = H // MX_GROUP, self.inter // MX_GROUP, torch.uint8
            parts = [("w1", (two_i, g1, MX_GROUP // 2), u8), ("w2", (H, g2, MX_GROUP // 2), u8),
                     ("s1", (two_i, g1), u8), ("s2", (H, g2), u8)]
        if self.has_bias:
            parts += [("b1", (two_i,), dtype), ("b2", (H,), dtype)]
        return BlobLayout.of(parts)

    @property
    def inter(self) -> int:
        return (self.w1_shape[1] if self.transposed else self.w1_shape[0]) // 2

    @property
    def precision(self) -> str:
        return "fp8" if self.fp8 is not None else "mxfp4" if self.mxfp4 else "native"

    def describe(self, dtype_name: str) -> str:
        """How the experts are stored, for people."""
        return self.fp8.describe() if self.fp8 is not None else MXFP4.describe() if self.mxfp4 else dtype_name

    @classmethod
    def of_module(cls, experts: torch.nn.Module, stored: Fp8Format | Mxfp4Format | None = None) -> ExpertLayout:
        """Read the layout from a transformers experts module (works on a meta-device skeleton);
        `stored`: the experts are stored block-scaled in fp8, or in MXFP4, rather than natively."""
        transposed = bool(getattr(experts, "is_transposed", False))
        has_bias = bool(getattr(experts, "has_bias", False))
        name = type(experts).__name__
        if not getattr(experts, "has_gate", True) or not hasattr(experts, "gate_up_proj"):
            raise UnsupportedModelError(f"{name}: experts without a fused gate_up_proj are not supported", _SUPPORTED)
        if getattr(experts, "has_post_expert_norm", False):
            raise UnsupportedModelError(f"{name}: experts with a norm after each expert are not supported",
                                        _SUPPORTED)
        w1 = tuple(experts.gate_up_proj.shape[1:])
        w2 = tuple(experts.down_proj.shape[1:])
        hidden = w1[0] if transposed else w1[1]
        plain = (not transposed and not has_bias and bool(getattr(experts, "is_concatenated", True))
                 and _default_gate(experts) and _is_silu(getattr(experts, "act_fn", None)))
        layout = cls(w1, w2, transposed, has_bias, hidden, plain)
        if isinstance(stored, Mxfp4Format):
            check_precision_dims("mxfp4", layout.hidden, layout.inter, name)
            return dataclasses.replace(layout, mxfp4=True)  # the kernels read mxfp4 tiles of the plain layout
        return layout if stored is None else dataclasses.replace(layout, fp8=stored)


def _default_gate(experts: torch.nn.Module) -> bool:
    """True when the module gates with transformers' default `act_fn(gate) * up` (gpt-oss has its own)."""
    from transformers.integrations.moe import _default_apply_gate

    return getattr(type(experts), "_apply_gate", None) is _default_apply_gate


def _is_silu(act) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


class HFExpertBank(BlobBank):
    """A layer's experts as blobs (w1, w2[, b1, b2]) in a `BlobBank`, all cold until `set_hot`.

    `kernel`: the expert-grouped Triton compute (runtime/kernels.py), used only for the plain
    SwiGLU layout; None computes per expert in torch."""

    def __init__(self, layout: ExpertLayout, num_experts: int, dtype: torch.dtype, info: DeviceInfo,
                 allocator: PinnedAllocator | None = None, swap_stream=None, kernel=None):
        allocator = allocator or PinnedAllocator(pin=info.pinned, numa=numa_policy_for("off", None))
        if kernel is not None and not layout.plain_swiglu:
            raise ValueError("the Triton experts compute the plain SwiGLU layout only")
        self.blob_layout = layout.blob_layout(dtype)
        super().__init__(num_experts, self.blob_layout.elems, self.blob_layout.storage, info, allocator,
                         swap_stream=swap_stream)
        self.layout, self.kernel, self.compute_dtype = layout, kernel, dtype
        # What the kernels read (the plain layout only): sizes, where w2 starts in a blob, and
        # for fp8 where the scales are.
        self.hidden, self.inter = layout.hidden, layout.inter
        self.w2_offset = self.blob_layout.offsets["w2"][0]
        if layout.fp8 is not None:
            self.fp8_meta = self.blob_layout.fp8_meta(layout.fp8)

    # ---- filling the cold bank ----

    def load_part(self, e: int, part: str, tensor: torch.Tensor, rows: slice | int | None = None) -> None:
        """Copy one checkpoint tensor into expert e's blob (`rows`: a slice or index of the part's
        first dim: gate or up rows of w1, or the gate / up scales of s1)."""
        view = self.blob_layout.view(self.cold_EB[e], part)
        want = view.dtype
        if tensor.dtype != want and (want == FP8 or tensor.dtype == FP8):
            raise ValueError(f"{part} holds {want}, the checkpoint gives {tensor.dtype}")
        target = view if rows is None else view[rows]
        if part in ("s1", "s2") and tensor.numel() == target.numel():
            tensor = tensor.reshape(target.shape)  # a per-tensor scale may be stored as [] or [1]
        if tuple(tensor.shape) != tuple(target.shape):  # copy_ would broadcast a short tensor silently
            raise ValueError(f"{part} of expert {e}: shape {tuple(tensor.shape)}, the model's layout holds "
                             f"{tuple(target.shape)}")
        target.copy_(tensor)

    # ---- compute ----

    def parts_of(self, e: int, host: bool = False) -> dict[str, torch.Tensor]:
        """Expert e's tensors from the slot it is served from, or read in place from the cold bank
        (`host`: where the cold bank lies in host memory, for the CPU cold path)."""
        slot = int(self.served_E[e])
        if host:
            blob = self.cold_EB[e]
        else:
            blob = self.hot_SB[slot] if slot >= 0 else self.cold_read_EB[e]
            if blob.device != self.info.device:  # CUDA without zero-copy: an explicit copy
                blob = blob.to(self.info.device, non_blocking=True)
        return {name: self.blob_layout.view(blob, name) for name in self.blob_layout.offsets}

    def weights_of(self, e: int, host: bool = False) -> dict[str, torch.Tensor]:
        """Expert e's tensors ready to compute with: fp8 or mxfp4 weights dequantised (in the model
        dtype, as transformers does) and turned back to the model's own orientation, the rest as stored."""
        p, lay = self.parts_of(e, host), self.layout
        if lay.fp8 is not None:
            w1, w2 = dequantize_swiglu(p["w1"], p["s1"], p["w2"], p["s2"], lay.fp8, self.compute_dtype)
        elif lay.mxfp4:
            w1, w2 = (mxfp4_dequantize(p[w], p[s], self.compute_dtype) for w, s in (("w1", "s1"), ("w2", "s2")))
        else:
            return p
        p["w1"], p["w2"] = (w1.T, w2.T) if lay.transposed else (w1, w2)
        return p

    def load_native(self, e: int, part: str, tensor: torch.Tensor, rows: slice | None = None) -> None:
        """Like `load_part`, for a checkpoint tensor at the model's own precision: weights (w1, w2)
        quantised once to the bank's stored format, gate and up rows of w1 each with their own fp8
        scales (`rows`: the gate or up rows a per-expert checkpoint gives apart); biases as they are."""
        lay = self.layout
        if lay.precision == "native" or part not in ("w1", "w2"):
            return self.load_part(e, part, tensor, rows)
        w_RC = tensor.T if lay.transposed else tensor  # stored as [out, in]
        inter, scales = self.inter, "s1" if part == "w1" else "s2"
        if rows is None and part == "w1":
            pieces = [(slice(0, inter), w_RC[:inter]), (slice(inter, 2 * inter), w_RC[inter:])]
        else:
            pieces = [(rows, w_RC)]
        for at, w in pieces:
            if lay.mxfp4:
                (values, scale), scale_at = mxfp4_quantize(w), at
            else:
                (values, scale), scale_at = fp8_quantize(w, lay.fp8), None if at is None else at.start // inter
            self.load_part(e, part, values, at)
            self.load_part(e, scales, scale, scale_at)

    @property
    def precision(self) -> str:
        """How this bank stores its experts: native, fp8 or mxfp4."""
        return self.layout.precision

    def forward(self, experts: torch.nn.Module, x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor,
                host: bool = False) -> torch.Tensor:
        """The routed experts' output [T, H]. In torch this is transformers' eager experts:
        per expert, gate/up, the module's own `_apply_gate`, down, times the routing weight
        (fp32 routing weights promote, as in transformers), summed per token. `host`: from the
        host cold bank, on the CPU (the CPU cold path: runtime/cold_split.py `SplitBank`)."""
        self.publish_staged()  # its staged experts (prefetch lookahead), once their copies have landed
        if self.kernel is not None and not host:
            return self.kernel(x_TH, ids_TK, w_TK, self)
        def project(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            y = a @ w if self.layout.transposed else torch.nn.functional.linear(a, w)
            return y if bias is None else y + bias

        out_TH = torch.zeros_like(x_TH)
        w_flat = w_TK.reshape(-1)
        for e, tok, idx in expert_groups(ids_TK, self.num_experts):
            p = self.weights_of(e, host)
            h = experts._apply_gate(project(x_TH[tok], p["w1"], p.get("b1")))
            y = project(h, p["w2"], p.get("b2")) * w_flat[idx, None]
            out_TH.index_add_(0, tok, y.to(out_TH.dtype))
        return out_TH
