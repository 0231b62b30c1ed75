"""llama.cpp: whole expert tensors per layer on the GPU or in host memory.

llama.cpp stores a layer's routed experts as merged tensors (`blk.N.ffn_{gate,up,down}_exps`,
or `ffn_gate_up_exps`), so the unit it places is one layer's experts. With `-ngl 999` every
layer is on the GPU; `--n-cpu-moe N` adds one override per block i < N, `blk\\.i` followed by
`LLM_FFN_EXPS_REGEX` (common/common.h), to the CPU buffer; `-ot PATTERN=BUFFER,...`
(common/arg.cpp `parse_tensor_buffer_overrides`) lists overrides split at `,` and `=`, which a
pattern therefore cannot contain. The loader tries them in order with `std::regex_search` on the
full tensor name (`.weight` included) and the first match wins. Any override turns `--fit` off,
so `-ngl` is always given.

The plan's budget buys whole layers, the busiest first while they fit; their hit rate is printed
beside the per-expert plan's at the same budget: the price of llama.cpp's coarser unit. A plan
that stores experts at fp8 or mxfp4 also gets the `llama-quantize --tensor-type` command giving
each layer its type (export/precision.py), and the layers are counted at those types' bytes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.export.precision import all_native, ggml_expert_bytes, llamacpp_layer_types, tensor_type_args
from hotsplit_cli.export.result import EngineExport, hit_rate
from hotsplit_cli.export.source import ExportRequest, PlanSource
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank

EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # LLM_FFN_EXPS_REGEX, common/common.h


def choose_gpu_layers(counts_LE: np.ndarray, layer_bytes_L: np.ndarray, budget: int) -> np.ndarray:
    """bool [L]: the layers serving the most assignments whose expert tensors fit the budget, taken
    busiest first while they fit (skip, don't stop); ties go to later layers, so that equal layers
    give the set `--n-cpu-moe` expresses (the last ones)."""
    load = counts_LE.sum(axis=1)
    on = np.zeros(len(load), dtype=bool)
    room = budget
    for i in sorted(range(len(load)), key=lambda i: (-load[i], -i)):
        if layer_bytes_L[i] <= room:
            on[i], room = True, room - int(layer_bytes_L[i])
    return on


def override_args(layer_ids: tuple[int, ...], on_gpu_L: np.ndarray) -> list[str]:
    """`--n-cpu-moe N` when the GPU layers are the last ones, else `-ot` with one CUDA0 group
    naming the GPU layers, then every other layer's experts to the CPU."""
    gpu = [layer for layer, on in zip(layer_ids, on_gpu_L, strict=True) if on]
    if len(gpu) == len(layer_ids):
        return []
    if not gpu or all(on_gpu_L[len(layer_ids) - len(gpu):]):
        first_gpu_block = gpu[0] if gpu else layer_ids[-1] + 1  # blocks below it keep their experts on the CPU
        return ["--n-cpu-moe", str(first_gpu_block)]
    group = "|".join(str(layer) for layer in gpu)
    return ["-ot", rf"blk\.({group}){EXPS_REGEX}=CUDA0,{EXPS_REGEX}=CPU"]


SERVER = ["llama-server", "-m", "MODEL.gguf"]  # tools/server: llama.cpp's OpenAI-compatible server
FILL_IN = {"MODEL.gguf": "the model's GGUF file (its first part, when split)"}
QUANTIZE_FILL_IN = {"MODEL-BF16.gguf": "the model converted to GGUF unquantised (convert_hf_to_gguf.py --outtype bf16)",
                    "BASE_TYPE": "the type of every tensor the plan does not cover (attention, dense; e.g. Q8_0): "
                                 "llama-quantize applies --tensor-type only over a quantized base type"}


def layer_bytes(src: PlanSource) -> tuple[np.ndarray, list[str] | None]:
    """Bytes of each MoE layer's expert tensors, and their ggml types when the plan stores experts
    at another precision than the checkpoint's (None: the GGUF as converted)."""
    recipe, m = src.recipe, src.recipe.model
    if all_native(src.precision_LE):
        return np.full(m.num_moe_layers, m.num_experts * expert_bytes_per_rank(recipe)), None
    types = llamacpp_layer_types(recipe, src.precision_LE)
    return np.array([m.num_experts * ggml_expert_bytes(recipe, t) for t in types]), types


def quantize_command(src: PlanSource, types: list[str]) -> tuple[list[str], list[str]]:
    """llama-quantize with one --tensor-type per MoE layer, and what it means for the plan."""
    layers = src.recipe.model.moe_layer_ids
    mixed = sum(len(set(row)) > 1 for row in src.precision_LE)
    command = ["llama-quantize", *tensor_type_args(layers, types, EXPS_REGEX), "MODEL-BF16.gguf", "MODEL.gguf",
               "BASE_TYPE"]
    kinds = ", ".join(f"{n} layers {t}" for t, n in sorted(Counter(types).items()))
    notes = [f"llama.cpp stores a layer's experts at one type: {kinds}; {mixed} layers with experts at several "
             "precisions take their most accurate one; fp8 becomes q8_0 (8.5 bits per weight, llama.cpp has no "
             "e4m3 type) and mxfp4 stays mxfp4, so the layers are counted at llama.cpp's bytes"]
    return command, notes


def export_llamacpp(src: PlanSource, req: ExportRequest) -> EngineExport:
    recipe, m = src.recipe, src.recipe.model
    if recipe.parallel.tp > 1 or recipe.parallel.ep > 1:
        raise PlanError(f"llama.cpp places whole layers' expert tensors on one GPU and cannot express a "
                        f"tp={recipe.parallel.tp} ep={recipe.parallel.ep} plan's per-rank budget",
                        "plan with a recipe of tp: 1, ep: 1 (one GPU) for llama.cpp")
    bytes_L, types = layer_bytes(src)
    budget = src.plan.budget_bytes or 0
    counts = src.hist.counts_LE
    on_L = choose_gpu_layers(counts, bytes_L, budget)
    num_gpu = int(on_L.sum())
    args = ["-ngl", "999", *override_args(tuple(m.moe_layer_ids), on_L)]
    on_LE = np.repeat(on_L[:, None], m.num_experts, axis=1)
    experts = {layer: [list(range(m.num_experts)) if on_L[i] else []] for i, layer in enumerate(m.moe_layer_ids)}
    rate = hit_rate(counts, on_LE)
    plan_rate = src.plan.hit_rate if src.plan.hit_rate is not None else hit_rate(counts, src.hot_RLE[0])
    prepare, notes = quantize_command(src, types) if types else (None, [])
    per_layer = f"{bytes_L[0] / 2**30:.3f} GiB per layer" if len(set(bytes_L)) == 1 else "per-layer bytes by type"
    notes = [f"{num_gpu} of {m.num_moe_layers} MoE layers' expert tensors fit the plan's "
             f"{budget / 2**30:.2f} GiB ({per_layer}): per-layer hit rate "
             f"{100 * rate:.2f}% vs {100 * plan_rate:.2f}% for the per-expert plan at the same budget",
             f"the attention and dense weights stay on the GPU too (-ngl 999); {req.out} holds the arguments "
             f"alone, for `llama-server -m MODEL.gguf $(cat {req.out})`", *notes]
    fill_in = FILL_IN if prepare is None else {**FILL_IN, **QUANTIZE_FILL_IN}
    return EngineExport("llama.cpp", " ".join(args) + "\n", [*SERVER, *args], experts,
                        int(bytes_L[on_L].sum()), rate, plan_rate, notes, fill_in=fill_in, prepare=prepare)
