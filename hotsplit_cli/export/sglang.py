"""SGLang: the `--init-expert-location` map `place --format sglang` writes, one row per model
layer of `physical_to_logical_map` (placement/file.py `sglang_doc`). SGLang's server refuses an
expert-parallel size above its tensor-parallel size (`ep_size * moe_dp_size <= tp_size`,
sglang/srt/server_args.py), so the line sets both to the placement's ranks."""

from __future__ import annotations

from hotsplit_cli.export.placed import rank_slots, slot_bytes
from hotsplit_cli.export.result import MODEL, EngineExport
from hotsplit_cli.export.source import ExportRequest, PlacementSource
from hotsplit_cli.placement.file import sglang_doc

SERVER = ["python", "-m", "sglang.launch_server", "--model-path", "MODEL"]  # sglang/launch_server.py


def export_sglang(src: PlacementSource, req: ExportRequest) -> EngineExport:
    p, m = src.placement, src.recipe.model
    doc = sglang_doc(p, m.num_hidden_layers, src.num_experts)
    ranks = str(p.num_ranks)
    flags = [*SERVER, "--tp-size", ranks, "--ep-size", ranks, "--init-expert-location", req.out,
             "--ep-num-redundant-experts", str(p.num_physical - src.num_experts)]
    notes = [f"{m.num_hidden_layers} rows (dense layers get the trivial row); rank r serves slots "
             f"[r*{p.slots_per_rank}, (r+1)*{p.slots_per_rank})"]
    return EngineExport("sglang", doc, flags, rank_slots(src), slot_bytes(src), 1.0, 1.0, notes, fill_in=MODEL)
