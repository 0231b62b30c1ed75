"""llama.cpp: whole expert tensors per layer on the GPU or in host memory.

llama.cpp stores a layer's routed experts as merged tensors (`blk.N.ffn_{gate,up,down}_exps`,
or `ffn_gate_up_exps`), so the unit it places is one layer's experts. With `-ngl 999` every
layer is on the GPU; `--n-cpu-moe N` adds one override per block i < N, `blk\\.i` followed by
`LLM_FFN_EXPS_REGEX` (common/common.h), to the CPU buffer; `-ot PATTERN=BUFFER,...`
(common/arg.cpp `parse_tensor_buffer_overrides`) lists overrides split at `,` and `=`, which a
pattern therefore cannot contain. The loader tries them in order with `std::regex_search` on the
full tensor name (`.weight` included) and the first match wins. Any override turns `--fit` off,
so `-ngl` is always given.

The plan's budget buys `budget // (E x expert bytes)` whole layers; the layers whose experts
serve the most routed assignments get them, and their hit rate is printed beside the per-expert
plan's at the same budget: the price of llama.cpp's coarser unit.
"""

from __future__ import annotations

import numpy as np

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.export.result import EngineExport, hit_rate
from hotsplit_cli.export.source import ExportRequest, PlanSource
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank

EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # LLM_FFN_EXPS_REGEX, common/common.h


def choose_gpu_layers(counts_LE: np.ndarray, num_gpu: int) -> np.ndarray:
    """bool [L]: the `num_gpu` layers serving the most assignments; ties go to later layers, so
    that equal layers give the set `--n-cpu-moe` expresses (the last ones)."""
    load = counts_LE.sum(axis=1)
    order = sorted(range(len(load)), key=lambda i: (-load[i], -i))
    on = np.zeros(len(load), dtype=bool)
    on[order[:num_gpu]] = True
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


def export_llamacpp(src: PlanSource, req: ExportRequest) -> EngineExport:
    recipe, m = src.recipe, src.recipe.model
    if recipe.parallel.tp > 1 or recipe.parallel.ep > 1:
        raise PlanError(f"llama.cpp places whole layers' expert tensors on one GPU and cannot express a "
                        f"tp={recipe.parallel.tp} ep={recipe.parallel.ep} plan's per-rank budget",
                        "plan with a recipe of tp: 1, ep: 1 (one GPU) for llama.cpp")
    size = expert_bytes_per_rank(recipe)
    layer_bytes = m.num_experts * size
    budget = src.plan.budget_bytes or 0
    num_gpu = min(m.num_moe_layers, budget // layer_bytes)
    counts = src.hist.counts_LE
    on_L = choose_gpu_layers(counts, num_gpu)
    args = ["-ngl", "999", *override_args(tuple(m.moe_layer_ids), on_L)]
    on_LE = np.repeat(on_L[:, None], m.num_experts, axis=1)
    experts = {layer: [list(range(m.num_experts)) if on_L[i] else []] for i, layer in enumerate(m.moe_layer_ids)}
    rate = hit_rate(counts, on_LE)
    plan_rate = src.plan.hit_rate if src.plan.hit_rate is not None else hit_rate(counts, src.hot_RLE[0])
    notes = [f"{num_gpu} of {m.num_moe_layers} MoE layers' expert tensors fit the plan's "
             f"{budget / 2**30:.2f} GiB ({layer_bytes / 2**30:.3f} GiB per layer): per-layer hit rate "
             f"{100 * rate:.2f}% vs {100 * plan_rate:.2f}% for the per-expert plan at the same budget",
             f"the attention and dense weights stay on the GPU too (-ngl 999); {req.out} holds the arguments "
             f"alone, for `llama-server -m MODEL.gguf $(cat {req.out})`"]
    return EngineExport("llama.cpp", " ".join(args) + "\n", [*SERVER, *args], experts, num_gpu * layer_bytes, rate,
                        plan_rate, notes, fill_in=FILL_IN)
