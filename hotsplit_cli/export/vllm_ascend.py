"""vllm-ascend (0.23.0.post1): the `expert_map_path` JSON of `eplb_config`.

`expert_file_to_tensor` (vllm_ascend/eplb/core/eplb_utils.py) gives the k-th MoE layer built
(`AscendFusedMoE.moe_counter`) `layer_list[k]`, stacks its `device_list[r]["device_expert"]`
into one int32 tensor (so every device lists as many experts) and reads the position in
`device_list` as the EP rank; `init_eplb_config` then maps expert e of rank r to its local slot
by `expert_map[device_expert] = arange`, so an expert listed twice on one device would keep
only its last slot. `EplbConfig` wants the path to end in `.json`. The map lists one entry per
rank of the expert-parallel group, which vLLM makes of tensor-parallel x data-parallel ranks: the
line starts it on as many (`vllm serve MODEL --tensor-parallel-size R --enable-expert-parallel
--additional-config ...`, docs/source/user_guide/feature_guide/expert_parallelism_load_balancer.md).
"""

from __future__ import annotations

import json

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.export.placed import rank_slots, slot_bytes
from hotsplit_cli.export.result import MODEL, EngineExport
from hotsplit_cli.export.source import ExportRequest, PlacementSource


def export_vllm_ascend(src: PlacementSource, req: ExportRequest) -> EngineExport:
    slots = rank_slots(src)
    for layer, ranks in slots.items():
        for r, experts in enumerate(ranks):
            if len(set(experts)) != len(experts):
                raise PlanError(f"{src.path}: layer {layer} places two replicas of one expert on rank {r}; "
                                f"vllm-ascend maps each expert to one slot per device",
                                "re-create the placement with `hotsplit place` (it never doubles an expert on a rank)")
    doc = {"moe_layer_count": len(slots), "layer_list": [
        {"layer_id": k, "device_count": len(ranks),
         "device_list": [{"device_id": r, "device_expert": experts} for r, experts in enumerate(ranks)]}
        for k, ranks in enumerate(slots.values())]}
    config = json.dumps({"eplb_config": {"expert_map_path": req.out}})
    ranks = src.placement.num_ranks
    flags = ["vllm", "serve", "MODEL", "--tensor-parallel-size", str(ranks), "--enable-expert-parallel",
             "--additional-config", config]
    notes = [f"the map needs {ranks} expert-parallel ranks: tensor-parallel size x data-parallel size = {ranks}",
             f"layer_list[k] is the k-th MoE layer (model layers {list(slots)[0]}..{list(slots)[-1]}); "
             f"device_list[r] is EP rank r of {ranks}; "
             f"{src.placement.num_physical - src.num_experts} redundant expert(s) per layer"]
    return EngineExport("vllm-ascend", doc, flags, slots, slot_bytes(src), 1.0, 1.0, notes, fill_in=MODEL)
