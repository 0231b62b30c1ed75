"""`hotsplit run RECIPE`: the embedded hot/cold runtime executing a plan, with hit-rate logs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import Interrupted, UsageError
from hotsplit_cli.core.jsonio import schema_tag
from hotsplit_cli.hotset.host_memory import check_host_fits
from hotsplit_cli.hotset.planfile import check_run_inputs
from hotsplit_cli.options import ColdPathOpt, HotGibOpt, JsonOpt, PlatformOpt, PlotOpt, RecipeArg, output_option
from hotsplit_cli.output import Output

from ._run_report import cold_path_rows as _cold_path_rows
from ._run_report import describe as _describe
from ._run_report import draw_hit_rates as _draw_hit_rates
from ._run_report import logged as _logged
from ._run_report import one_window_note as _one_window_note
from ._run_report import origin as _origin
from ._run_report import print_verdicts as _print_verdicts
from ._run_report import render_summary as _render_summary
from ._run_report import verdicts as _verdicts
from ._run_report import wrote as _wrote
from ._run_request import RunRequest

PlanFileOpt = Annotated[Path | None, typer.Option("--plan", help="plan.json from `hotsplit plan` (else planned here).")]
TraceOpt = Annotated[Path | None, typer.Option("--trace", help="Replay this routing trace (.npz).")]
StepsOpt = Annotated[int | None, typer.Option("--steps", help="Engine steps (default: the recipe's run.steps).")]
ScaleOpt = Annotated[float | None, typer.Option("--scale", help="Shrink tensors, (0, 1]; plans keep real bytes.")]
EplbStepsOpt = Annotated[int | None, typer.Option("--eplb-steps", help="EP: steps between live rebalances (0 = off).")]
EpExchangeOpt = Annotated[str | None, typer.Option("--ep-exchange", help="EP: a2a (all_to_all_single) or allgather "
                                                                         "(all-gather, then reduce-scatter).")]
LogJsonlOpt = Annotated[Path | None, output_option("--log-jsonl", help="Also write each record as a JSON line.",
                                                                suffix=".jsonl")]


def run(
    ctx: typer.Context,
    recipe: RecipeArg,
    plan: PlanFileOpt = None,
    trace: TraceOpt = None,
    steps: StepsOpt = None,
    scale: ScaleOpt = None,
    hot_gib: HotGibOpt = None,
    log_jsonl: LogJsonlOpt = None,
    json_out: JsonOpt = False,
    plot: PlotOpt = None,
    cold_path: ColdPathOpt = None,
    platform: PlatformOpt = None,
    eplb_steps: EplbStepsOpt = None,
    ep_exchange: EpExchangeOpt = None,
) -> None:
    """Run the recipe's MoE on the hot/cold runtime: hit rate per update, then a summary."""
    out, rec = Output(json_out), load_recipe(recipe)
    knobs = resolve_knobs(rec.knobs, os.environ, {"hot_gib": hot_gib, "cold_path": cold_path, "eplb_steps": eplb_steps,
                                                  "ep_exchange": ep_exchange})
    _check_options(rec, platform, (trace, steps, scale), plot)
    plan_file = check_run_inputs(rec, plan, trace, knobs)  # before anything is built
    check_host_fits(rec, platform, scale)  # the cold banks against the host memory given, before allocating
    request = RunRequest(rec, knobs, plan, trace, steps, scale, log_jsonl, plot, platform,
                         tuple((ctx.obj or {}).get("argv", ())))
    if rec.parallel.ep > 1:  # the ranks of an expert-parallel run
        from ._run_ep import run_expert_parallel

        return run_expert_parallel(out, request)
    if rec.model.kind == "hf":
        return _run_checkpoint(out, request, plan_file)
    return _run_synthetic(out, request, plan_file)


def _run_synthetic(out: Output, request: RunRequest, plan_file) -> None:
    """A synthetic model on one rank: build it (`plan_file`: the --plan file, read and checked)."""
    rec, knobs, plan, trace, log_jsonl, plot = (request.recipe, request.knobs, request.plan, request.trace,
                                                request.log_jsonl, request.plot)
    from hotsplit_runtime.from_recipe import prepare_run  # torch is imported only from here on
    from hotsplit_runtime.rank_context import RankContext

    with out.progress(f"building {rec.model.num_moe_layers} MoE layers", rec.model.num_moe_layers) as advance:
        prepared = prepare_run(rec, knobs, plan_path=plan, trace_path=trace, steps=request.steps, scale=request.scale,
                               advance=advance, platform_path=request.platform, rank=RankContext(plan_file))
    _ready(out, prepared)
    pdoc = prepared.to_doc()
    say = out.note if out.json_mode else out.print
    _describe(say, rec.name, prepared, pdoc)
    with out.progress(f"{rec.name}: steps", prepared.steps) as advance:
        summary = _logged(say, log_jsonl, lambda on_record: prepared.engine.run(prepared.steps, on_record, advance))

    doc = {"schema": schema_tag("run"), "recipe": rec.name, "knobs": knobs.to_doc(), **pdoc,
           "summary": summary.to_doc(), "verdicts": _verdicts(plan_file, summary.hit_rate, summary.cold_paths)}
    if plot is not None:
        _plot(plot, summary, rec.name)
        doc["plot"] = str(plot)
    origin = _origin(out, summary, prepared.plan.made_from, prepared.traffic,
                     rec.traffic.drift_every if trace is None else None, knobs.dynamic)

    def render():
        title = f"hotsplit run {rec.name}" + (" (interrupted)" if summary.interrupted else "")
        _render_summary(out, title, summary, [], [("copy time", f"{summary.copy_ms:,.2f} ms"),
                                                  *_cold_path_rows(summary.cold_paths)], origin)
        if plot is not None:
            out.print(f"plot: {plot}{_one_window_note(summary)}")
        _print_verdicts(out, doc["verdicts"])

    out.emit(doc, render)
    if summary.interrupted:
        raise Interrupted(f"interrupted at step {summary.steps} of {prepared.steps}",
                          _wrote(log_jsonl, len(summary.records), plot))


def _ready(out: Output, prepared) -> None:
    """The CPU's threads set for the device chosen, and the notes the set-up left."""
    from hotsplit_runtime.device import tune_cpu_threads

    tune_cpu_threads(prepared.info)
    for note in prepared.notes:
        out.note(f"note: {note}")


def _check_options(rec, platform: Path | None, synthetic: tuple, plot: Path | None) -> None:
    """Refuse bad options before any work (and --plot when matplotlib is missing); `synthetic` is
    (--trace, --steps, --scale), the options of a synthetic model only."""
    _, steps, scale = synthetic
    if rec.model.kind == "hf" and any(x is not None for x in synthetic):
        raise UsageError("--trace, --steps and --scale apply to synthetic models",
                         "a checkpoint run generates from the recipe's prompts at full size")
    if platform is not None and not platform.is_file():
        raise UsageError(f"--platform {platform}: no such file", "write one with `hotsplit probe -o platform.json`")
    if steps is not None and steps < 1:
        raise UsageError(f"--steps: must be >= 1, got {steps}")
    if scale is not None and not 0 < scale <= 1:
        raise UsageError(f"--scale: must be in (0, 1], got {scale}")
    if plot is not None:
        from hotsplit_cli.plotting import require_matplotlib

        require_matplotlib()


def _run_checkpoint(out: Output, request: RunRequest, plan_file) -> None:
    """A real checkpoint: generate the recipe's prompts on the hot/cold banks, logging hit rates
    (`plan_file`: the --plan file, read and checked)."""
    rec, knobs, plan, log_jsonl, plot, platform = (request.recipe, request.knobs, request.plan, request.log_jsonl,
                                                   request.plot, request.platform)
    import importlib.util

    if importlib.util.find_spec("transformers") is None:  # found, not imported: the runtime imports it
        raise UsageError("a checkpoint recipe needs transformers", ".venv/bin/pip install -e '.[hf]'")
    from hotsplit_runtime.hf.run import checkpoint_prompts, run_checkpoint

    say = out.note if out.json_mode else out.print
    say(f"{rec.name}: {rec.model.family} checkpoint {rec.model.path}, prompts {rec.traffic.path}")
    prompts = checkpoint_prompts(rec)
    with out.progress(f"{rec.name}: prompts", len(prompts)) as advance:
        result = _logged(say, log_jsonl, lambda on_record: run_checkpoint(rec, knobs, prompts, plan, on_record,
                                                                          advance, platform))
    doc = {"schema": schema_tag("run"), "recipe": rec.name, "knobs": knobs.to_doc(), "summary": result.to_doc(),
           "verdicts": _verdicts(plan_file, result.summary.hit_rate, result.summary.cold_paths)}
    if plot is not None:
        _plot(plot, result.summary, rec.name)
        doc["plot"] = str(plot)
    prepared = result.prepared
    origin = _origin(out, result.summary, prepared.plan.made_from, f"prompts {rec.traffic.path}")

    def render():
        for i, text in enumerate(result.texts[:8]):
            out.print(escape(f"[{i}] {text!r}"))
        plan_row = ("plan", f"{int(prepared.plan.hot_LE.sum())} hot experts ({prepared.plan.source})")
        title = f"hotsplit run {rec.name}" + (" (interrupted)" if result.summary.interrupted else "")
        _render_summary(out, title, result.summary,
                        [("device", f"{prepared.info.name} ({prepared.kernel})"), plan_row,
                         ("cold bank", prepared.allocator.numa.describe())],
                        [("copy time", f"{result.summary.copy_ms:,.2f} ms"),
                         *_cold_path_rows(result.summary.cold_paths)], origin)
        _print_verdicts(out, doc["verdicts"])

    out.emit(doc, render)
    if result.summary.interrupted:
        raise Interrupted(f"interrupted after {result.summary.steps} steps",
                          _wrote(log_jsonl, len(result.summary.records), plot))


def _plot(path: Path, summary, title: str) -> None:
    """Hit rate per window over steps, swap moments marked; written atomically."""
    from hotsplit_cli.plotting import save_png

    save_png(path, lambda fig, ax: _draw_hit_rates(ax, summary, title), figsize=(8, 4), dpi=100)


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("run")(run)
