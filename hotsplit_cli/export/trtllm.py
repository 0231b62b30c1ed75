"""TensorRT-LLM: `moe_load_balancer.yaml`, read by `MoeLoadBalancerConfig`
(tensorrt_llm/llmapi/llm_args.py): a strict model of exactly `num_slots`,
`layer_updates_per_iter` (0 = static; N = N layers re-balanced per iteration online) and
`initial_global_assignments` {MoE layer_idx: [expert of each slot]}. `setup(ep_rank, ep_size)`
refuses `num_slots % ep_size`; rank r owns slots [r * S / ep, (r + 1) * S / ep); the MoE module
asserts each layer's list has `num_slots` entries, `num_slots >= E`, and names every expert.
The layer keys are the decoder layer indices the MoE modules are built with (model layer ids).
"""

from __future__ import annotations

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.export.placed import rank_slots, slot_bytes
from hotsplit_cli.export.result import EngineExport
from hotsplit_cli.export.source import PlacementSource


def export_trtllm(src: PlacementSource, out: str, online: int = 0) -> EngineExport:
    p = src.placement
    if online < 0:
        raise UsageError(f"--online {online}: must be >= 0 (layers re-balanced per iteration; 0 = static)")
    doc = {"num_slots": p.num_physical, "layer_updates_per_iter": online,
           "initial_global_assignments": {int(layer): p.phy2log_LP[i].tolist() for i, layer in enumerate(p.layers)}}
    snippet = f"moe_config:\n  load_balancer: {out}\n"
    flags = ["--ep_size", str(p.num_ranks), "--extra_llm_api_options", "extra_llm_api_options.yaml"]
    notes = ["put the snippet below in extra_llm_api_options.yaml; TensorRT-LLM applies a load balancer only to "
             "the MoE architectures its PyTorch backend builds with one (DeepSeek-V3/R1, Qwen3-MoE among them) "
             "and only with expert parallelism (ep > 1)",
             "static layout (layer_updates_per_iter 0)" if online == 0 else
             f"online: {online} layer(s) re-balanced per iteration, starting from this layout"]
    if p.num_ranks == 1:
        notes.append("this placement has 1 rank: TensorRT-LLM's load balancer does nothing without ep > 1")
    return EngineExport("trtllm", doc, flags, rank_slots(src), slot_bytes(src), 1.0, 1.0, notes, snippet)
