"""Stored precisions of routed experts (docs/precision.md): each expert is stored once, at one
precision, in the cold bank and in its hot copy (the same bytes), quantised once from its native
weights when a bank is filled and dequantised per expert as it is computed: `native`, `fp8`
(runtime/fp8.py) or `mxfp4` (OCP MX v1.0 6.3 in gpt-oss's layout: `*_blocks` uint8
[..., out, in/32, 16], two values per byte, the even input in the low nibble; `*_scales` uint8
[..., out, in/32], the scale 2^(byte - 127), 255 NaN)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from hotsplit_cli.config.checkpoint import stored_experts_of
from hotsplit_cli.config.knobs import PRECISIONS
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.precision_plan import uniform_layer_precisions

from .fp8 import RELEASE_FP8, Fp8Experts, Fp8Format

MX_GROUP = 32  # inputs per e8m0 scale
E8M0_BIAS = 127
E8M0_NAN = 255
# e2m1 magnitudes of codes 0..7 (1 sign, 2 exponent, 1 mantissa bit; no inf or NaN); code | 8 negates.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0


def _e2m1_values(dtype: torch.dtype) -> torch.Tensor:
    """The 16 values of the codes, in `dtype` (index = code)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32)
    return torch.cat([mags, -mags]).to(dtype)


def _nearest_code(mag: torch.Tensor) -> torch.Tensor:
    """Codes 0..7 of the e2m1 magnitudes nearest to `mag` (>= 0, at most E2M1_MAX), ties to the
    even code (round half to even, as the OCP spec's conversion rounds). The grid's step is 0.5
    below 2, 1 up to 4 and 2 up to 6, so one rounding per range gives the code; torch.round
    rounds half to even, which is the even code at every midpoint (0.25 -> 0, 1.75 -> 2.0,
    2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0)."""
    fine, mid, coarse = torch.round(mag * 2), torch.round(mag) + 2, torch.round(mag / 2) + 4
    return torch.where(mag < 2, fine, torch.where(mag < 4, mid, coarse)).to(torch.uint8)


def _finite_cap(scale: torch.Tensor) -> torch.Tensor:
    """Per group, the largest e2m1 magnitude whose value times `scale` is a finite float32: 6
    but for the top scales, where rounding a value up to the next code would overflow."""
    grid = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)
    limit = torch.finfo(torch.float32).max / scale.double()
    return grid[(torch.bucketize(limit, grid, right=True) - 1).clamp(min=0)].float()


def mxfp4_quantize(w_RC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks uint8 [R, C/32, 16], scales uint8 [R, C/32]) of finite W [R, C], C a multiple of 32: per
    group the smallest power-of-two scale putting its largest magnitude within e2m1's 6, each value
    rounded to the nearest e2m1 value (never past float32's largest)."""
    R, C = w_RC.shape
    if C % MX_GROUP:
        raise ValueError(f"mxfp4 needs the input dimension a multiple of {MX_GROUP}, got {C}")
    w = w_RC.float().reshape(R, C // MX_GROUP, MX_GROUP)
    if not torch.isfinite(w).all():
        raise ValueError("mxfp4 quantisation needs finite weights")
    amax = w.abs().amax(dim=-1)
    # 2^ceil(log2(amax / 6)): amax / scale <= 6 and no smaller power of two would do. An all-zero
    # group takes the smallest scale; frexp is exact where log2 of a float rounds, and float64
    # keeps amax / 6 of a float32 subnormal from underflowing to 0.
    mant, exp = torch.frexp(amax.double() / E2M1_MAX)
    exp = torch.where(mant == 0.5, exp - 1, exp)  # an exact power of two is its own ceiling
    exp = torch.where(amax > 0, exp, -E8M0_BIAS).clamp(-E8M0_BIAS, E8M0_BIAS)
    scale = torch.ldexp(torch.ones_like(amax), exp)
    scaled = w / scale[..., None]
    sign = (scaled < 0).to(torch.uint8) << 3
    mag = scaled.abs()  # at most 6 by the choice of scale
    if bool((exp >= E8M0_BIAS - 1).any()):  # only scales of 2^126 and up can overflow float32
        mag = torch.minimum(mag, _finite_cap(scale)[..., None])
    code = _nearest_code(mag) | sign
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks.contiguous(), (exp + E8M0_BIAS).to(torch.uint8)


def e8m0_scales(scales: torch.Tensor) -> torch.Tensor:
    """float32 2^(byte - 127) of e8m0 scale bytes; 255 is NaN (OCP MX)."""
    s = torch.ldexp(torch.ones(scales.shape), scales.to(torch.int32) - E8M0_BIAS)
    return torch.where(scales == E8M0_NAN, torch.nan, s)


@functools.lru_cache(maxsize=8)  # a cache: one lookup table per (dtype, device), built at its first use
def _byte_pairs(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 2]: the two e2m1 values of each byte, the low nibble's first (one lookup per byte)."""
    values, byte = _e2m1_values(torch.float32), torch.arange(256)
    return torch.stack([values[byte & 0x0F], values[byte >> 4]], dim=-1).to(device, dtype)


def mxfp4_dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W [..., R, C] in `dtype` from blocks [..., R, C/32, 16] and scales [..., R, C/32], exact where
    representable. bfloat16 and float32 hold every scale, so they multiply in `dtype` (2x faster on
    a CPU); other dtypes in float32, then rounded."""
    work = dtype if dtype in (torch.bfloat16, torch.float32) else torch.float32
    pairs = _byte_pairs(work, blocks.device)[blocks.long()].flatten(-2)
    w = pairs * e8m0_scales(scales).to(blocks.device, work)[..., None]
    return w.flatten(-2).to(dtype)


@dataclass(frozen=True)
class Mxfp4Format:
    """MXFP4 experts (no parameters: the group is the spec's 32)."""

    def describe(self) -> str:
        return f"mxfp4 (e2m1, one e8m0 scale per {MX_GROUP} inputs)"

    def quantize_experts(self, w13_EIH: torch.Tensor, w2_EHI: torch.Tensor) -> Mxfp4Experts:
        return Mxfp4Experts.quantize(w13_EIH, w2_EHI)


MXFP4 = Mxfp4Format()


@dataclass(frozen=True)
class Mxfp4Experts:
    """A layer's experts in MXFP4, gate and up rows then down, in the release layout."""

    b13_EIGB: torch.Tensor  # uint8 [E, 2I, H/32, 16]
    s13_EIG: torch.Tensor  # uint8 [E, 2I, H/32]
    b2_EHGB: torch.Tensor  # uint8 [E, H, I/32, 16]
    s2_EHG: torch.Tensor  # uint8 [E, H, I/32]
    fmt: Mxfp4Format = MXFP4

    @classmethod
    def quantize(cls, w13_EIH: torch.Tensor, w2_EHI: torch.Tensor) -> Mxfp4Experts:
        (b13, s13), (b2, s2) = (_quantize_stack(w) for w in (w13_EIH, w2_EHI))
        return cls(b13, s13, b2, s2)

    def parts(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """Blob parts of one expert (runtime/bank.py BlobLayout): all bytes."""
        u8 = torch.uint8
        return [("w1", tuple(self.b13_EIGB.shape[1:]), u8), ("w2", tuple(self.b2_EHGB.shape[1:]), u8),
                ("s1", tuple(self.s13_EIG.shape[1:]), u8), ("s2", tuple(self.s2_EHG.shape[1:]), u8)]

    def sources(self) -> dict[str, torch.Tensor]:
        return {"w1": self.b13_EIGB, "w2": self.b2_EHGB, "s1": self.s13_EIG, "s2": self.s2_EHG}

    def decode(self, views: tuple[torch.Tensor, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """One expert's (w13 [2I, H], w2 [H, I]) in `dtype` from its blob's views (w1, w2, s1, s2)."""
        b1, b2, s1, s2 = views
        return mxfp4_dequantize(b1, s1, dtype), mxfp4_dequantize(b2, s2, dtype)

    def dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [E, 2I, H], w2 [E, H, I]) as the runtime computes with them."""
        return mxfp4_dequantize(self.b13_EIGB, self.s13_EIG, dtype), mxfp4_dequantize(self.b2_EHGB, self.s2_EHG, dtype)


def _quantize_stack(w_ERC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    blocks, scales = zip(*(mxfp4_quantize(w) for w in w_ERC), strict=True)
    return torch.stack(blocks).view(*w_ERC.shape[:2], -1, MX_GROUP // 2), torch.stack(scales)


StoredFormat = Fp8Format | Mxfp4Format  # how a bank stores its experts (None: natively)
StoredExperts = Fp8Experts | Mxfp4Experts


def precision_of(fmt: StoredFormat | None) -> str:
    """The precision a format stores at: fp8, mxfp4, or native for None."""
    return "fp8" if isinstance(fmt, Fp8Format) else "mxfp4" if isinstance(fmt, Mxfp4Format) else "native"


def stored_format(precision: str) -> StoredFormat | None:
    """The format of a stored precision (None for native)."""
    if precision not in PRECISIONS:
        raise UsageError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return {"native": None, "fp8": RELEASE_FP8, "mxfp4": MXFP4}[precision]


def check_precision_dims(precision: str, hidden: int, inter: int, where: str) -> None:
    """mxfp4 groups 32 inputs per scale: gate and up read `hidden` inputs, down `inter`."""
    if precision == "mxfp4" and (hidden % MX_GROUP or inter % MX_GROUP):
        raise UsageError(f"{where}: precision mxfp4 needs expert input dims divisible by {MX_GROUP}, got hidden "
                         f"{hidden} and moe_intermediate {inter}",
                         "use precision fp8 or native for this model")


def layer_formats(precision_LE, num_layers: int, num_experts: int) -> list[StoredFormat | None]:
    """Per MoE layer, the format its bank stores (None: native), from a per-(layer, expert)
    precision array [L, E]: what `make_layer_weights(..., stored=)` takes for each layer."""
    return [stored_format(p) for p in uniform_layer_precisions(precision_LE, num_layers, num_experts)]


def checkpoint_stored_format(released: StoredFormat | None, precision: str, where: str) -> StoredFormat | None:
    """How a checkpoint's routed experts are stored at `precision`, from how they are released
    (`released`: None for bf16 / fp16 / fp32). native keeps the release; a bf16 checkpoint is
    quantised once as its cold bank fills; an fp8 one stays as released at fp8, and at mxfp4 is
    dequantised then quantised (each value rounded twice: its error is against the fp8 release).
    An mxfp4 release at fp8 is refused: more bytes, and no accuracy the release does not have."""
    if precision == "native" or (precision == "fp8" and isinstance(released, Fp8Format)):
        return released
    if isinstance(released, Mxfp4Format) and precision == "fp8":
        raise UsageError(f"{where}: precision fp8: the checkpoint's experts are released in mxfp4, and fp8 would store "
                         "them in about twice the bytes with no more accuracy than the release",
                         "run it at precision native or mxfp4 (both: as released)")
    return stored_format(precision)


def stored_format_of(config, where: str) -> StoredFormat | None:
    """How a checkpoint stores its routed experts (config/checkpoint.py `stored_experts_of`):
    block-scaled fp8, MXFP4, or None when not quantised."""
    q = getattr(config, "quantization_config", None)
    precision, block = stored_experts_of(q if not q or isinstance(q, dict) else q.to_dict(), where)
    return {"native": None, "mxfp4": MXFP4, "fp8": Fp8Format(block)}[precision]
