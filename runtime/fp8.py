"""Block-scaled fp8 checkpoints (DeepSeek-V3 / R1, Qwen3 "FP8", GLM-4.5-FP8; docs/real-models.md):
each quantised weight W [rows, cols] is float8_e4m3fn next to `weight_scale_inv`
[ceil(rows / bm), ceil(cols / bn)] (`weight_block_size`; one scale per tensor without it), and W
= fp8 value x its block's scale. Routed experts stay fp8 in the banks (half the bytes a bf16
expert crosses PCIe with) and are dequantised per tile as they are computed; every other
quantised weight is dequantised once, at load. Synthetic fp8 experts are quantised the same way."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotsplit_cli.hotset.sizes import FP8_BLOCK

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value


@dataclass(frozen=True)
class Fp8Format:
    block: tuple[int, int] | None  # (bm, bn) rows x columns per scale; None: one scale per tensor

    def scale_shape(self, rows: int, cols: int) -> tuple[int, int]:
        if self.block is None:
            return (1, 1)
        bm, bn = self.block
        return (-(-rows // bm), -(-cols // bn))

    def describe(self) -> str:
        """How the experts are stored, for people: `fp8 e4m3, 128x128 block scales`."""
        return "fp8 e4m3, " + ("one scale per tensor" if self.block is None else
                               f"{self.block[0]}x{self.block[1]} block scales")

    def quantize_experts(self, w13_EIH: torch.Tensor, w2_EHI: torch.Tensor) -> Fp8Experts:
        return Fp8Experts.quantize(w13_EIH, w2_EHI, self)


RELEASE_FP8 = Fp8Format(FP8_BLOCK)  # the format of the fp8 releases, and of recipes' fp8 experts


def dequantize(w: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format, dtype: torch.dtype) -> torch.Tensor:
    """W [rows, cols] in `dtype` from its fp8 values and block scales, as transformers dequantises
    (value x scale, computed in `dtype`)."""
    rows, cols = w.shape
    s = scale.to(dtype)
    if fmt.block is None:
        return w.to(dtype) * s.reshape(())
    want = fmt.scale_shape(rows, cols)
    if tuple(s.shape) != want:
        raise ValueError(f"scale shape {tuple(s.shape)} does not match weight {rows} x {cols} in blocks of "
                         f"{fmt.block} (want {want})")
    bm, bn = fmt.block
    s_full = s.repeat_interleave(bm, dim=0)[:rows].repeat_interleave(bn, dim=1)[:, :cols]
    return w.to(dtype) * s_full


def dequantize_swiglu(w1: torch.Tensor, s1: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor, fmt: Fp8Format,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One SwiGLU expert from e4m3: (w13 [2I, H], w2 [H, I]) in `dtype`. Gate and up rows of
    `w1` carry their own scales (`s1` [2, ...]): I need not be a whole block."""
    inter = w1.shape[0] // 2
    w13 = torch.cat([dequantize(w1[:inter], s1[0], fmt, dtype), dequantize(w1[inter:], s1[1], fmt, dtype)])
    return w13, dequantize(w2, s2, fmt, dtype)


def quantize(w: torch.Tensor, fmt: Fp8Format) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 values and float32 scales of W [rows, cols], one scale per block (amax / 448, the
    releases' recipe): the inverse of `dequantize` up to fp8 rounding."""
    rows, cols = w.shape
    bm, bn = fmt.block or (rows, cols)
    R, C = -(-rows // bm), -(-cols // bn)
    pad = torch.zeros(R * bm, C * bn, dtype=torch.float32)
    pad[:rows, :cols] = w.float()
    blocks = pad.view(R, bm, C, bn)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).view(R * bm, C * bn)[:rows, :cols].to(FP8)
    return q, scale if fmt.block is not None else scale.reshape(1)


def swiglu_fp8_parts(two_inter: int, hidden: int, fmt: Fp8Format) -> list[tuple]:
    """Blob parts of a SwiGLU expert in block-scaled fp8: w1 [2I, H] and w2 [H, I] in e4m3, the
    scales of gate and up [2, ...] (kept apart: I need not be a whole block) and of w2."""
    inter = two_inter // 2
    return [("w1", (two_inter, hidden), FP8), ("w2", (hidden, inter), FP8),
            ("s1", (2, *fmt.scale_shape(inter, hidden)), torch.float32),
            ("s2", fmt.scale_shape(hidden, inter), torch.float32)]


@dataclass(frozen=True)
class FP8Meta:
    """Where a block-scaled fp8 blob keeps its parts, for the kernels (byte offsets): w13 e4m3 [2I, H]
    at 0, w2 e4m3 [H, I] at w2_offset, float32 scales of gate and up [2, s1_rows, s1_cols] at
    s1_offset and of w2 [.., s2_cols] at s2_offset; a scale covers bm x bn (per tensor: all)."""

    bm: int
    bn: int
    s1_offset: int
    s1_rows: int
    s1_cols: int
    s2_offset: int
    s2_cols: int


@dataclass(frozen=True)
class Fp8Experts:
    """A layer's experts quantised to block-scaled fp8: e4m3 values and float32 scales (gate and
    up scaled apart, as in the checkpoints' per-projection tensors)."""

    fmt: Fp8Format
    q13_EIH: torch.Tensor  # e4m3 [E, 2I, H]
    s13_E2RC: torch.Tensor  # float32 [E, 2, ceil(I / bm), ceil(H / bn)]
    q2_EHI: torch.Tensor  # e4m3 [E, H, I]
    s2_ERC: torch.Tensor  # float32 [E, ceil(H / bm), ceil(I / bn)]

    @classmethod
    def quantize(cls, w13_EIH: torch.Tensor, w2_EHI: torch.Tensor, fmt: Fp8Format) -> Fp8Experts:
        inter = w13_EIH.shape[1] // 2
        q13, s13, q2, s2 = [], [], [], []
        for w13, w2 in zip(w13_EIH, w2_EHI, strict=True):
            (qg, sg), (qu, su), (qd, sd) = quantize(w13[:inter], fmt), quantize(w13[inter:], fmt), quantize(w2, fmt)
            q13.append(torch.cat([qg, qu]))
            s13.append(torch.stack([sg, su]).reshape(2, *fmt.scale_shape(inter, w13.shape[1])))
            q2.append(qd)
            s2.append(sd.reshape(fmt.scale_shape(*w2.shape)))
        return cls(fmt, torch.stack(q13), torch.stack(s13), torch.stack(q2), torch.stack(s2))

    def parts(self) -> list[tuple]:
        """Blob parts of one expert (runtime/bank.py BlobLayout)."""
        return swiglu_fp8_parts(self.q13_EIH.shape[1], self.q13_EIH.shape[2], self.fmt)

    def sources(self) -> dict[str, torch.Tensor]:
        return {"w1": self.q13_EIH, "w2": self.q2_EHI, "s1": self.s13_E2RC, "s2": self.s2_ERC}

    def decode(self, views: tuple[torch.Tensor, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """One expert's (w13 [2I, H], w2 [H, I]) in `dtype` from its blob's views (w1, w2, s1, s2)."""
        w1, w2, s1, s2 = views
        return dequantize_swiglu(w1, s1, w2, s2, self.fmt, dtype)

    def dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [E, 2I, H], w2 [E, H, I]) as the kernels and the torch path compute with them."""
        w13, w2 = zip(*(dequantize_swiglu(*e, self.fmt, dtype) for e in zip(
            self.q13_EIH, self.s13_E2RC, self.q2_EHI, self.s2_ERC, strict=True)), strict=True)
        return torch.stack(w13), torch.stack(w2)
