"""What the placement engines (SGLang, TensorRT-LLM, vllm-ascend) keep on the GPU: every slot of
the placement, each rank its own contiguous range, so every routed assignment is served on a GPU."""

from __future__ import annotations

from hotsplit_cli.export.result import slots_by_rank
from hotsplit_cli.export.source import PlacementSource
from hotsplit_cli.hotset.gpu_fit import placement_expert_bytes


def rank_slots(src: PlacementSource) -> dict[int, list[list[int]]]:
    """Model layer id -> one list per EP rank of the experts in its slots, in slot order."""
    p = src.placement
    return {layer: slots_by_rank(p.phy2log_LP[i], p.num_ranks) for i, layer in enumerate(p.layers)}


def slot_bytes(src: PlacementSource) -> int:
    """Bytes of one rank's expert slots over every MoE layer (whole experts under EP)."""
    return placement_expert_bytes(src.placement, src.recipe)
