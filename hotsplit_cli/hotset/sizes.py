"""Bytes of experts and dense weights per rank, and the automatic hot budget.

Always computed from a recipe's true geometry: `run.scale` shrinks only what a CPU run
allocates, so a scaled run plans with the same bytes as the full-size one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import GIB, Recipe
from hotsplit_cli.core.errors import HotsplitError, PlanError, UsageError

# What a recipe's `expert_dtype: fp8` means: e4m3 values with one fp32 scale per block of this
# many rows x columns, the `weight_block_size` of DeepSeek-V3's and Qwen3's fp8 releases.
FP8_BLOCK = (128, 128)


def _fp8_block_scale_bytes(rows: int, cols: int) -> int:
    """fp8 weights carry one fp32 scale per FP8_BLOCK block (DeepSeek-V3 `weight_scale_inv`)."""
    return math.ceil(rows / FP8_BLOCK[0]) * math.ceil(cols / FP8_BLOCK[1]) * 4


def _mxfp4_bytes(rows: int, cols: int) -> int:
    """MXFP4: 4-bit values packed two per byte, one e8m0 scale byte per 32 along the input."""
    return rows * cols // 2 + rows * math.ceil(cols / 32)


# What one expert computes in on a CPU: fp8 and mxfp4 experts are dequantised to bf16 first.
COMPUTE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16", "mxfp4": "bfloat16"}


def expert_compute_shape(recipe: Recipe) -> tuple[int, int, str]:
    """(hidden, this rank's moe_intermediate, torch dtype name) of one routed expert as computed."""
    m = recipe.model
    return m.hidden_size, m.moe_intermediate_size // recipe.parallel.tp, COMPUTE_DTYPES[m.expert_dtype]


# Precisions an expert can be stored at, the same bytes in both banks: the checkpoint's own
# (`native`, the recipe's expert_dtype), or converted once when the cold bank is filled.
PRECISIONS = ("native", "fp8", "mxfp4")
MXFP4_GROUP = 32  # inputs sharing one e8m0 scale (OCP MX v1.0, gpt-oss's `*_scales`)


def stored_dtype(recipe: Recipe, precision: str = "native") -> str:
    """The dtype an expert is stored in at `precision`: the recipe's expert_dtype when native."""
    if precision not in PRECISIONS:
        raise PlanError(f"unknown stored precision {precision!r}", f"use one of {', '.join(PRECISIONS)}")
    return recipe.model.expert_dtype if precision == "native" else precision


def check_mxfp4_shape(recipe: Recipe, error: type[HotsplitError] = PlanError) -> None:
    """`error` (a plan's PlanError, a run's UsageError) unless both input dims of an expert
    (gate/up: hidden, down: this rank's moe_intermediate) are multiples of MXFP4_GROUP, as one
    scale per 32 inputs needs."""
    m = recipe.model
    dims = {"hidden_size": m.hidden_size, "moe_intermediate_size / tp": m.moe_intermediate_size // recipe.parallel.tp}
    bad = {name: n for name, n in dims.items() if n % MXFP4_GROUP}
    if bad:
        name, n = next(iter(bad.items()))
        raise error(f"mxfp4 needs input dims divisible by {MXFP4_GROUP} (one scale per {MXFP4_GROUP} inputs), "
                        f"but recipe {recipe.name!r} has {name} = {n}", "store its experts at fp8 or native")


def expert_bytes_per_rank(recipe: Recipe, precision: str = "native") -> int:
    """Bytes one rank stores of one routed expert at `precision` (PRECISIONS): gate, up [I/tp, H]
    and down [H, I/tp] (+ scales, + biases kept at the checkpoint's dtype). The one source of an
    expert's stored bytes: plan, simulate, ledger, place and the cost models all count these.

    Under TP each rank holds a 1/tp slice of every expert; under EP a whole expert.
    """
    m = recipe.model
    hidden = m.hidden_size
    inter = m.moe_intermediate_size // recipe.parallel.tp
    dtype = stored_dtype(recipe, precision)
    if dtype in ("bf16", "fp16", "fp32"):
        total = 3 * hidden * inter * (4 if dtype == "fp32" else 2)
    elif dtype == "fp8":
        total = 3 * hidden * inter + 2 * _fp8_block_scale_bytes(inter, hidden) + _fp8_block_scale_bytes(hidden, inter)
    elif dtype == "mxfp4":
        check_mxfp4_shape(recipe)
        total = _mxfp4_bytes(2 * inter, hidden) + _mxfp4_bytes(hidden, inter)
    else:  # recipe.py refuses anything else
        raise PlanError(f"unknown expert dtype {dtype!r}")
    if m.expert_bias:
        total += (2 * inter + hidden) * (4 if m.expert_dtype == "fp32" else 2)  # biases of gate_up and down
    return int(total)


def uniform_precision(knobs: Knobs) -> str:
    """The precision knob where one precision is counted for every expert (simulate, ledger,
    place); `auto` is a per-expert choice only `plan` makes."""
    if knobs.precision == "auto":
        raise UsageError(f"{knobs.origin('precision')} auto: each expert's precision is chosen by `hotsplit plan`, "
                         "and this command counts one precision for every expert",
                         "pass --precision native, fp8 or mxfp4")
    return knobs.precision


def precision_bytes(recipe: Recipe) -> dict[str, int]:
    """Stored bytes of one expert per rank at each precision the recipe's shape allows."""
    out = {}
    for precision in PRECISIONS:
        try:
            out[precision] = expert_bytes_per_rank(recipe, precision)
        except PlanError:
            continue  # mxfp4 of a shape it cannot take
    return out


@dataclass(frozen=True)
class BudgetDerivation:
    """How the automatic hot budget was derived, every term in GiB per rank."""

    gpu_mem_gib: float
    gpu_mem_source: str  # "recipe" | "platform.json (free memory of GPU N)"
    dense_gib: float
    kv_cache_gib: float
    reserve_gib: float
    bank_gib: float  # every routed expert of this rank: the budget never needs more
    hot_gib: float

    def to_doc(self) -> dict:
        return dict(self.__dict__)

    def explain(self) -> str:
        capped = " (capped at the full bank)" if self.hot_gib >= self.bank_gib else ""
        return (
            f"hot budget {self.hot_gib:.2f} GiB = GPU {self.gpu_mem_gib:.2f} ({self.gpu_mem_source})"
            f" - dense weights {self.dense_gib:.2f} - KV cache {self.kv_cache_gib:.2f}"
            f" - reserve {self.reserve_gib:.2f}{capped}"
        )


def dense_bytes_per_rank(recipe: Recipe) -> float:
    """Non-expert weights each rank keeps on its GPU (attention, embeddings, dense/shared MLP), /tp."""
    return recipe.model.dense_weight_bytes / recipe.parallel.tp


def bank_bytes_per_rank(recipe: Recipe, precision: str = "native") -> int:
    m = recipe.model
    return expert_bytes_per_rank(recipe, precision) * m.num_experts // recipe.parallel.ep * m.num_moe_layers


def over_gpu(recipe: Recipe, hot_gib: float, reserve_gib: float, gpu_mem_gib: float | None = None,
             gpu_mem_source: str = "recipe hardware.gpu_mem_gib") -> str | None:
    """Why a given hot budget cannot fit next to what must stay on the GPU (dense weights, KV
    cache, reserve), or None when it fits or the GPU's memory is unknown."""
    mem = gpu_mem_gib if gpu_mem_gib is not None else recipe.hardware.gpu_mem_gib
    if mem is None:
        return None
    dense, kv = dense_bytes_per_rank(recipe) / GIB, recipe.hardware.kv_cache_gib
    need = hot_gib + dense + kv + reserve_gib
    if need <= mem:
        return None
    return (f"hot budget {hot_gib:.2f} GiB + dense {dense:.2f} + KV {kv:.2f} + reserve {reserve_gib:.2f} "
            f"= {need:.2f} GiB exceeds GPU memory {mem:.2f} GiB ({gpu_mem_source})")


def derive_hot_budget(recipe: Recipe, reserve_gib: float, gpu_mem_gib: float | None = None,
                      gpu_mem_source: str = "recipe") -> BudgetDerivation:
    """Auto budget: GPU memory - dense weights - KV cache - reserve; never more than the bank.
    When a budget is derived at all, and from which GPU memory: `budget.resolve_hot_budget`."""
    mem = gpu_mem_gib if gpu_mem_gib is not None else recipe.hardware.gpu_mem_gib
    if mem is None:
        raise PlanError(
            f"no hot budget: recipe {recipe.name!r} gives no hardware.gpu_mem_gib",
            "pass --hot-gib, set HOTSPLIT_HOT_GIB, or give --platform platform.json from `hotsplit probe`",
        )
    dense = dense_bytes_per_rank(recipe) / GIB
    bank = bank_bytes_per_rank(recipe) / GIB
    hot = mem - dense - recipe.hardware.kv_cache_gib - reserve_gib
    if hot <= 0:
        raise PlanError(
            f"no room for hot experts: GPU {mem:.2f} GiB - dense {dense:.2f} - KV cache "
            f"{recipe.hardware.kv_cache_gib:.2f} - reserve {reserve_gib:.2f} = {hot:.2f} GiB",
            "use more ranks (tp/ep), a smaller KV cache, or pass --hot-gib",
        )
    return BudgetDerivation(mem, gpu_mem_source, dense, recipe.hardware.kv_cache_gib, reserve_gib,
                            bank, min(hot, bank))


def scaled_dim(n: int, scale: float, multiple: int = 8) -> int:
    """A dimension shrunk by `scale` (`run --scale`), kept a multiple of `multiple` (>= `multiple`)."""
    if scale >= 1.0:
        return n
    return max(multiple, int(round(n * scale / multiple)) * multiple)
