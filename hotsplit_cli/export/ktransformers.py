"""KTransformers / SGLang-kt (sglang-kt 0.7.2, kt-kernel 0.7.2): the GPU experts from an
activation file.

With `--kt-expert-placement-strategy frequency` and `--init-expert-location FILE.pt`,
`_init_kt_gpu_experts_masks` (sglang/srt/layers/moe/kt_ep_wrapper.py) loads
`{"logical_count": [buffer, num_hidden_layers, E]}`, sums dim 0 as float32 and calls
`kt_kernel.experts_base.generate_gpu_experts_masks`: one `torch.topk` of
`int(num_moe_layers * E * --kt-gpu-experts-ratio)` over every layer flattened, dense rows
included, after which dense rows are set all-GPU. So the file written holds 1.0 for each planned
hot expert and 0.0 everywhere else: the top N values are then exactly the plan's N experts (no
tie at the cut, nothing float32 cannot hold), and the ratio is chosen so that the engine's
integer budget is exactly N. The engine is SGLang-kt's server: `--kt-weight-path` turns the
KTransformers path on (without it `create_kt_config_from_server_args` returns None and no expert
runs on the CPU) and `--kt-cpuinfer` gives its CPU threads (sglang/srt/server_args.py).
"""

from __future__ import annotations

import numpy as np

from hotsplit_cli.core.errors import PlanError, UnsupportedModelError
from hotsplit_cli.export.precision import all_native, kt_cpu_method
from hotsplit_cli.export.result import MODEL, EngineExport, hit_rate
from hotsplit_cli.export.sglang import SERVER
from hotsplit_cli.export.source import ExportRequest, PlanSource
from hotsplit_cli.hotset.planfile import plan_counts_for_recipe
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank


def exact_ratio(num_gpu: int, total: int) -> str:
    """The shortest decimal r with int(total * float(r)) == num_gpu: the engine's own arithmetic.
    N / T itself can lose one (T = 49, N = 1: int(49 * (1 / 49)) is 0), the midpoint cannot."""
    if num_gpu == total:
        return "1"
    for digits in range(1, 18):
        text = f"{(num_gpu + 0.5) / total:.{digits}g}"
        if int(total * float(text)) == num_gpu:
            return text
    raise AssertionError(f"no decimal ratio gives {num_gpu} of {total}")  # unreachable: 17 digits round-trip


FILL_IN = {**MODEL, "CPU_WEIGHTS": "the folder of the experts' CPU weights, in the format --kt-method names",
           "CPU_THREADS": "CPU threads for the cold experts"}


def engine_hot_set(src: PlanSource) -> tuple[np.ndarray, list[str]]:
    """bool [L, E]: the GPU experts the engine can hold. SGLang-kt's GPU experts are the checkpoint's
    own weights: a plan that stores hot experts at fp8 or mxfp4 is re-planned at the checkpoint's
    bytes under the same budget, and the notes say so."""
    hot_LE = src.hot_RLE[0]
    if all_native(src.precision_LE[hot_LE]) or src.plan.budget_bytes is None:
        return hot_LE, []
    native = plan_counts_for_recipe(src.hist.counts_LE, src.recipe, src.plan.budget_bytes).hot_RLE[0]
    return native, [f"SGLang-kt keeps its GPU experts at the checkpoint's precision ({src.recipe.model.expert_dtype}): "
                    f"the plan's {src.plan.budget_bytes / 2**30:.2f} GiB hold {int(native.sum())} of them, not the "
                    f"plan's {int(hot_LE.sum())} experts at fp8 / mxfp4; the predicted hit rate is at the engine's "
                    "bytes"]


def export_ktransformers(src: PlanSource, req: ExportRequest) -> EngineExport:
    recipe, m = src.recipe, src.recipe.model
    if recipe.parallel.ep > 1:
        raise PlanError(f"ktransformers keeps one GPU expert mask for every rank and has no expert parallelism "
                        f"(KTransformers #2002), but {src.path} is an ep={recipe.parallel.ep} plan",
                        "plan with a recipe of ep: 1 (tensor parallel ranks share the mask)")
    first = m.moe_layer_ids[0]
    if tuple(m.moe_layer_ids) != tuple(range(first, m.num_hidden_layers)):
        raise UnsupportedModelError(f"ktransformers counts MoE layers as first_k_dense_replace..num_hidden_layers, "
                                    f"but {m.name}'s MoE layers are {list(m.moe_layer_ids)}")
    hot_LE, kept = engine_hot_set(src)
    method, cold_precision = kt_cpu_method(recipe, src.precision_LE, ~hot_LE)
    counts = np.zeros((1, m.num_hidden_layers, m.num_experts), dtype=np.float32)
    counts[0, list(m.moe_layer_ids)] = hot_LE.astype(np.float32)
    n, total = int(hot_LE.sum()), hot_LE.size
    ratio = exact_ratio(n, total)
    tp = ["--tp-size", str(recipe.parallel.tp)] if recipe.parallel.tp > 1 else []
    flags = [*SERVER, *tp, "--kt-weight-path", "CPU_WEIGHTS", "--kt-cpuinfer", "CPU_THREADS",
             "--init-expert-location", req.out, "--kt-expert-placement-strategy", "frequency",
             "--kt-gpu-experts-ratio", ratio, "--kt-method", method]
    experts = {layer: [np.flatnonzero(hot_LE[i]).tolist()] * recipe.parallel.tp
               for i, layer in enumerate(m.moe_layer_ids)}
    rate = hit_rate(src.hist.counts_LE, hot_LE)
    notes = [f"{n} of {total} experts on the GPU: int({total} x {ratio}) = {n}; --kt-gpu-experts-ratio overrides "
             f"--kt-num-gpu-experts, and the default strategy (uniform) would ignore the file",
             "one mask serves every tensor-parallel rank; expert parallelism is not supported (KTransformers #2002)",
             f"--kt-method {method}: one kt-kernel method serves every CPU expert, so it takes the most accurate "
             f"precision the plan gives one ({cold_precision})", *kept]
    return EngineExport("ktransformers", counts, flags, experts, n * expert_bytes_per_rank(recipe), rate,
                        src.plan.hit_rate if src.plan.hit_rate is not None else rate, notes, fill_in=FILL_IN)
