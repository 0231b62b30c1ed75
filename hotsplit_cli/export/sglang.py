"""SGLang: the `--init-expert-location` map `place --format sglang` writes, one row per model
layer of `physical_to_logical_map` (placement/file.py `sglang_doc`)."""

from __future__ import annotations

from hotsplit_cli.export.placed import rank_slots, slot_bytes
from hotsplit_cli.export.result import EngineExport
from hotsplit_cli.export.source import PlacementSource
from hotsplit_cli.placement.file import sglang_doc


def export_sglang(src: PlacementSource, out: str) -> EngineExport:
    p, m = src.placement, src.recipe.model
    doc = sglang_doc(p, m.num_hidden_layers, src.num_experts)
    flags = ["--init-expert-location", out, "--ep-size", str(p.num_ranks),
             "--ep-num-redundant-experts", str(p.num_physical - src.num_experts)]
    notes = [f"{m.num_hidden_layers} rows (dense layers get the trivial row); rank r serves slots "
             f"[r*{p.slots_per_rank}, (r+1)*{p.slots_per_rank})"]
    return EngineExport("sglang", doc, flags, rank_slots(src), slot_bytes(src), 1.0, 1.0, notes)
