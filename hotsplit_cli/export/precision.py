"""What an engine does with the stored precisions a plan chose (docs/export.md cites each rule).

llama.cpp keeps a layer's routed experts as one tensor per projection, so a layer has one ggml
type. `llama-quantize --tensor-type REGEX=TYPE` sets it (tools/quantize/quantize.cpp
`parse_tensor_type`: the regex lowercased, the type by its ggml name). src/llama-quant.cpp tries
every regex with `std::regex_search` on the tensor name; the last match wins, and only over a
quantized base type. fp8 has no ggml type: q8_0, 34 bytes per 32 weights, is the nearest. mxfp4
is GGML_TYPE_MXFP4, 17 bytes per 32: the same bytes as hotsplit's. A layer whose experts were
planned at different precisions takes its most accurate one, so that no expert is stored less
precisely than planned, and its bytes are counted at that type.

KTransformers (SGLang-kt with kt-kernel 0.7.2) computes its CPU experts in the format
`--kt-method` names (kt_kernel/experts.py `INFERENCE_METHODS`: BF16, FP8 block e4m3, MXFP4 e2m1
with a ue8m0 scale per 32 among them), one method for every CPU expert: the most accurate
precision among the plan's cold experts. Its GPU experts are the checkpoint's own weights, so
they stay at the checkpoint's precision whatever the plan chose.
"""

from __future__ import annotations

import numpy as np

from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.hotset.sizes import stored_dtype

ACCURACY = ("native", "fp8", "mxfp4")  # most accurate first
GGML_TYPES = {"bf16": "bf16", "fp16": "f16", "fp32": "f32", "fp8": "q8_0", "mxfp4": "mxfp4"}  # stored dtype -> ggml
GGML_BLOCKS = {"bf16": (2, 1), "f16": (2, 1), "f32": (4, 1), "q8_0": (34, 32), "mxfp4": (17, 32)}  # bytes, weights
KT_METHODS = {"bf16": "BF16", "fp16": "BF16", "fp32": "BF16", "fp8": "FP8", "mxfp4": "MXFP4"}  # stored dtype -> kt


def most_accurate(names) -> str:
    """The most accurate of the precisions named (native before fp8 before mxfp4)."""
    present = set(names)
    return next(p for p in ACCURACY if p in present)


def all_native(precision_LE: np.ndarray) -> bool:
    return bool((precision_LE == "native").all())


def llamacpp_layer_types(recipe: Recipe, precision_LE: np.ndarray) -> list[str]:
    """The ggml type of each MoE layer's expert tensors: its most accurate expert's precision."""
    return [GGML_TYPES[stored_dtype(recipe, most_accurate(row))] for row in precision_LE]


def ggml_expert_bytes(recipe: Recipe, ggml_type: str) -> int:
    """Bytes of one expert's gate, up and down weights at a ggml type (ggml/src/ggml.c type
    traits: bytes per block of weights), biases at the checkpoint's dtype."""
    m = recipe.model
    block_bytes, block = GGML_BLOCKS[ggml_type]
    weights = 3 * m.hidden_size * m.moe_intermediate_size
    bias = (2 * m.moe_intermediate_size + m.hidden_size) * 2 if m.expert_bias else 0
    return -(-weights // block) * block_bytes + bias


def tensor_type_args(layer_ids, types: list[str], exps_regex: str) -> list[str]:
    """`--tensor-type blk\\.N<experts>=TYPE`, one per MoE layer, for llama-quantize."""
    out = []
    for layer, ggml_type in zip(layer_ids, types, strict=True):
        out += ["--tensor-type", rf"blk\.{layer}{exps_regex}={ggml_type}"]
    return out


def kt_cpu_method(recipe: Recipe, precision_LE: np.ndarray, cold_LE: np.ndarray) -> tuple[str, str]:
    """(kt-kernel method, precision) of the CPU experts: the most accurate cold precision, or the
    checkpoint's own when nothing is cold."""
    cold = precision_LE[cold_LE]
    precision = most_accurate(cold) if cold.size else "native"
    return KT_METHODS[stored_dtype(recipe, precision)], precision
