"""TensorRT-LLM: `moe_load_balancer.yaml`, read by `MoeLoadBalancerConfig`
(tensorrt_llm/llmapi/llm_args.py): a strict model of exactly `num_slots`,
`layer_updates_per_iter` (0 = static; N = N layers re-balanced per iteration online) and
`initial_global_assignments` {MoE layer_idx: [expert of each slot]}. `setup(ep_rank, ep_size)`
refuses `num_slots % ep_size`; rank r owns slots [r * S / ep, (r + 1) * S / ep); the MoE module
asserts each layer's list has `num_slots` entries, `num_slots >= E`, and names every expert.
The layer keys are the decoder layer indices the MoE modules are built with (model layer ids).
`trtllm-serve MODEL --tp_size T --ep_size E --extra_llm_api_options FILE` starts it
(docs/source/commands/trtllm-serve.rst); the MoE's expert-parallel size divides the
tensor-parallel size, so both are the placement's ranks.
"""

from __future__ import annotations

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.export.placed import rank_slots, slot_bytes
from hotsplit_cli.export.result import MODEL, EngineExport
from hotsplit_cli.export.source import ExportRequest, PlacementSource


def export_trtllm(src: PlacementSource, req: ExportRequest) -> EngineExport:
    p, online = src.placement, req.online
    if not 0 <= online <= len(p.layers):
        raise UsageError(f"--online {online}: must be 0 (static) to {len(p.layers)}, the placement's MoE layers "
                         f"(layers re-balanced per iteration)")
    doc = {"num_slots": p.num_physical, "layer_updates_per_iter": online,
           "initial_global_assignments": {int(layer): p.phy2log_LP[i].tolist() for i, layer in enumerate(p.layers)}}
    options = str(req.output.absolute().with_name("extra_llm_api_options.yaml"))
    snippet = f"moe_config:\n  load_balancer: {req.out}\n"
    ranks = str(p.num_ranks)
    flags = ["trtllm-serve", "MODEL", "--backend", "pytorch", "--tp_size", ranks, "--ep_size", ranks,
             "--extra_llm_api_options", options]
    notes = [f"put the snippet below in {options}; TensorRT-LLM applies a load balancer only to "
             "the MoE architectures its PyTorch backend builds with one (DeepSeek-V3/R1, Qwen3-MoE among them) "
             "and only with expert parallelism (ep > 1)",
             "static layout (layer_updates_per_iter 0)" if online == 0 else
             f"online: {online} layer(s) re-balanced per iteration, starting from this layout"]
    if p.num_ranks == 1:
        notes.append("this placement has 1 rank: TensorRT-LLM's load balancer does nothing without ep > 1")
    return EngineExport("trtllm", doc, flags, rank_slots(src), slot_bytes(src), 1.0, 1.0, notes, snippet, MODEL)
