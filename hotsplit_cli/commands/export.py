"""`hotsplit export FILE --to ENGINE -o OUT`: a plan or placement in a serving engine's own format."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from hotsplit_runtime import api

from hotsplit_cli.core.jsonio import write_atomic, write_json_atomic
from hotsplit_cli.export.targets import ExportRequest, engines_text, export, recipe_engines
from hotsplit_cli.options import JsonOpt, output_option
from hotsplit_cli.output import Output, pct

if TYPE_CHECKING:
    from hotsplit_cli.export.result import EngineExport


def export_cmd(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="plan.json (hotsplit.plan/1) or placement.json "
                                                              "(hotsplit.placement/1), whichever the engine takes.")],
    engine: Annotated[str, typer.Option("--to", metavar="ENGINE", help=f"The engine: {engines_text()}.")],
    output: Annotated[Path, output_option(
        "--output", "-o", help="The engine's file (.json, .pt, .yaml or .txt, as the engine reads).")],
    recipe: Annotated[str | None, typer.Option("--recipe", "-r", metavar="RECIPE", show_default="the file's own", help=(
        f"Recipe YAML file or shipped recipe name. Needed by {', '.join(recipe_engines())} for a placement that "
        "records none (made without `place --recipe`); a plan names its own."))] = None,
    hist: Annotated[Path | None, typer.Option(
        "--hist", show_default="where the plan says",
        help="The histogram the plan was made from, when it is no longer where the plan says "
                       "(its sha256 must be the one the plan records).")] = None,
    online: Annotated[int, typer.Option(
        "--online", min=0, help="trtllm: layers re-balanced per iteration (layer_updates_per_iter; 0 = static; at "
                                "most the MoE layers).")] = 0,
    json: JsonOpt = False,
) -> None:
    """Write a plan or placement for another engine, with the flags to start it and what it keeps on the GPU."""
    out = Output(json)
    result = export(ExportRequest(file, engine, output, recipe, hist, online))
    _write(output, result.payload)
    if result.gpu is not None and result.gpu.warning():
        out.warn(result.gpu.warning())
    if result.plan_hit_rate - result.predicted_hit_rate > 1e-9:
        out.warn(f"{engine} cannot express the plan exactly: predicted hit rate {pct(result.predicted_hit_rate, 2)} "
                 f"vs the plan's {pct(result.plan_hit_rate, 2)}")
    out.emit(result.to_doc(str(output)), lambda: _render(out, result))
    out.note(f"wrote {output} ({engine})")


def _write(path: Path, payload) -> None:
    """The engine's file, atomically: JSON, YAML, text, or torch's .pt (written by the runtime, where torch is)."""
    suffix = path.suffix
    if suffix == ".json":
        write_json_atomic(path, payload)
    elif suffix in (".yaml", ".yml"):
        import yaml

        text = yaml.safe_dump(payload, sort_keys=False, default_flow_style=None, width=1 << 20)
        write_atomic(path, lambda fh: fh.write(text.encode()))
    elif suffix == ".pt":
        api.save_tensors(path, {"logical_count": payload})
    else:
        write_atomic(path, lambda fh: fh.write(payload.encode()))


def _render(out: Output, result: EngineExport) -> None:
    """The copyable flags, what the engine keeps on the GPU per layer, and the two hit rates."""
    if result.prepare and not out.json_mode:
        out.print("first, store the experts at the plan's precisions:")
        out.out.print(shlex.join(result.prepare), soft_wrap=True, markup=False, highlight=False)
    out.print(f"start {result.engine} with:")
    if not out.json_mode:  # one line however wide, to copy as it is
        out.out.print(shlex.join(result.flags), soft_wrap=True, markup=False, highlight=False)
    for placeholder, what in result.fill_in.items():
        out.print(f"  {placeholder}: {what}")
    for note in result.notes:  # before the snippet: the first note says where it goes
        out.print(f"note: {note}")
    if result.snippet:
        out.print(result.snippet.rstrip())
    ranks = len(next(iter(result.gpu_experts.values()), []))
    t = out.table("layer", *(f"rank {r} GPU experts" for r in range(min(ranks, 4))))
    for layer, per_rank in result.gpu_experts.items():
        t.add_row(str(layer), *(_ids(ids) for ids in per_rank[:4]))
    out.print(t)
    if ranks > 4:
        out.print(f"(ranks 4..{ranks - 1} in --json's gpu_experts)")
    out.print(f"GPU expert bytes per rank: {result.gpu_bytes / 2**30:.2f} GiB; predicted hit rate of the engine's "
              f"set {pct(result.predicted_hit_rate, 2)}, the plan's {pct(result.plan_hit_rate, 2)}")


def _ids(ids: list[int]) -> str:
    """A rank's experts in one cell: all of them as a count, else the ids (long lists shortened)."""
    shown = ",".join(map(str, ids[:12]))
    return f"{len(ids)}: {shown}{',...' if len(ids) > 12 else ''}" if ids else "0"


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("export")(export_cmd)
