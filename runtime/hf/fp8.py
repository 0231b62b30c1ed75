"""Block-scaled fp8 checkpoints (DeepSeek-V3 / R1, Qwen3 "FP8" releases, GLM-4.5-FP8).

Format (config.json `quantization_config`: `quant_method: fp8`, `fmt: e4m3`,
`weight_block_size: [bm, bn]`): each quantised linear weight `W` [rows, cols] is stored as
float8_e4m3fn next to `weight_scale_inv` [ceil(rows / bm), ceil(cols / bn)] (float32, or
float8_e8m0fnu in newer releases), and W = fp8 value x the scale of its block. Without
`weight_block_size`, one scale per tensor.

hotsplit keeps routed experts in fp8 in the cold bank (half the bytes a bf16 expert crosses
PCIe with) and dequantises an expert's tiles when it computes; every other quantised weight is
dequantised once, at load, to the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotsplit_cli.errors import UsageError

FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Fp8Format:
    block: tuple[int, int] | None  # (bm, bn) rows x columns per scale; None: one scale per tensor

    def scale_shape(self, rows: int, cols: int) -> tuple[int, int]:
        if self.block is None:
            return (1, 1)
        bm, bn = self.block
        return (-(-rows // bm), -(-cols // bn))


def fp8_format_of(config, where: str) -> Fp8Format | None:
    """The checkpoint's fp8 format, None when it is not quantised; UsageError for any other
    quantisation (MXFP4, GPTQ, AWQ, bitsandbytes, static activation scales)."""
    q = getattr(config, "quantization_config", None)
    if not q:
        return None
    q = q if isinstance(q, dict) else q.to_dict()
    method = q.get("quant_method", "?")
    if method != "fp8":
        raise UsageError(f"{where}: quantised checkpoint ({method}) is not supported",
                         "use a bf16 or block-scaled fp8 checkpoint")
    fmt = q.get("fmt", "e4m3")
    if fmt not in ("e4m3", "float8_e4m3fn"):
        raise UsageError(f"{where}: fp8 format {fmt!r} is not supported", "only e4m3 weights are read")
    if q.get("activation_scheme", "dynamic") != "dynamic":
        raise UsageError(f"{where}: fp8 with static activation scales is not supported")
    block = q.get("weight_block_size")
    if block is not None:
        if len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
            raise UsageError(f"{where}: weight_block_size must be two positive ints, got {block!r}")
        block = (int(block[0]), int(block[1]))
    return Fp8Format(block)


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
