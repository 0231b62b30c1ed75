"""`hotsplit run RECIPE`: the embedded hot/cold runtime executing a plan, with hit-rate logs."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated

import typer
from hotsplit_runtime import api
from rich.markup import escape

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import Interrupted, UsageError
from hotsplit_cli.hotset.fitted_traffic import run_fits
from hotsplit_cli.hotset.host_memory import check_host_fits
from hotsplit_cli.hotset.planfile import check_run_inputs
from hotsplit_cli.hotset.prefetch_plan import knobs_from_plan
from hotsplit_cli.options import (
    ColdPathOpt,
    HotGibOpt,
    JsonOpt,
    PlatformOpt,
    PlotOpt,
    PrecisionOpt,
    PrefetchGuessesOpt,
    PrefetchOpt,
    PrefetchPoolOpt,
    PrefetchSlotsOpt,
    RecipeArg,
    knob_option,
    output_option,
)
from hotsplit_cli.output import Output
from hotsplit_cli.plotting import require_matplotlib, save_png
from hotsplit_cli.traffic.trace import load_run_replay

from . import _run_report as report
from ._run_ep import ep_verdicts, render_job
from ._run_ep_plot import plot_ep_run
from ._run_report import draw_hit_rates as _draw_hit_rates
from ._run_watch import RunWatch

PlanFileOpt = Annotated[Path | None, typer.Option("--plan", show_default="planned here on the run's traffic",
                                                  help="plan.json from `hotsplit plan`.")]
TraceOpt = Annotated[Path | None, typer.Option("--trace", show_default="the recipe's traffic",
                                               help="Replay this routing trace (.npz).")]
StepsOpt = Annotated[int | None, typer.Option("--steps", show_default="the recipe's run.steps", help="Engine steps.")]
ScaleOpt = Annotated[float | None, typer.Option("--scale", show_default="1: full size",
                                               help="Shrink tensors, (0, 1]; plans keep real bytes.")]
EplbStepsOpt = Annotated[str | None, knob_option("eplb_steps")]
EpExchangeOpt = Annotated[str | None, knob_option("ep_exchange")]
PrefetchFitOpt = Annotated[Path | None, typer.Option(
    "--prefetch-fit", show_default="the replayed trace's first window; required on a checkpoint",
    help="Fit the prefetch predictor on this trace (prefetch trace).")]
LogJsonlOpt = Annotated[Path | None, output_option("--log-jsonl", help="Also write each record as a JSON line.",
                                                   show_default="none: not written",
                                                                suffix=".jsonl")]


def run(
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
    precision: PrecisionOpt = None,
    prefetch: PrefetchOpt = None, prefetch_slots: PrefetchSlotsOpt = None, prefetch_pool: PrefetchPoolOpt = None,
    prefetch_guesses: PrefetchGuessesOpt = None, prefetch_fit: PrefetchFitOpt = None,
) -> None:
    """Run the recipe's MoE on the hot/cold runtime: hit rate per update, then a summary."""
    out, rec = Output(json_out), load_recipe(recipe)
    knobs = resolve_knobs(rec.knobs, os.environ, {"hot_gib": hot_gib, "cold_path": cold_path, "eplb_steps": eplb_steps,
                                                  "ep_exchange": ep_exchange, "precision": precision,
                                                  "prefetch": prefetch, "prefetch_slots": prefetch_slots,
                                                  "prefetch_pool": prefetch_pool, "prefetch_guesses": prefetch_guesses})
    _check_options(rec, platform, (trace, steps, scale), plot)
    _check_prefetch_fit(prefetch_fit, knobs, rec.model.kind)
    request = api.RunRequest(rec, knobs, plan, trace, steps, scale, platform, prefetch_fit=prefetch_fit)
    plan_file = check_run_inputs(rec, plan, trace, knobs)  # before anything is built
    knobs, staged_by_plan = knobs_from_plan(knobs, plan_file)  # the plan's staging slots, unless a knob says
    if staged_by_plan:
        out.note(staged_by_plan)
    replay = load_run_replay(rec, trace, steps)  # read once: the run replays what is judged here
    fits = run_fits(plan_file, rec, replay)  # does the run replay the plan's (and placement's) histogram?
    check_host_fits(rec, platform, scale, knobs.precision, plan_file)  # stored banks vs the host, before allocating
    request = dataclasses.replace(request, knobs=knobs, plan_file=plan_file, replay=replay)
    watch = RunWatch(out, request)
    result = report.logged(log_jsonl, watch, lambda: api.run(request, watch))
    if result is None:  # another rank of a job: rank 0 reports for it
        return
    s = result.summary
    doc = {**result.to_doc(), "verdicts": _verdicts(request, result, fits)}
    if plot is not None:
        _plot(plot, result)
        doc["plot"] = str(plot)
    out.emit(doc, _renderer(out, request, result, doc, plot))
    if s.interrupted:
        at = (f"after {s.steps} steps" if rec.model.kind == "hf"  # a generation's length is open
              else f"at step {s.steps} of {result.header.steps}")
        raise Interrupted(f"interrupted {at}", report.wrote(log_jsonl, len(s.records), plot))


def _check_options(rec, platform: Path | None, synthetic: tuple, plot: Path | None) -> None:
    """Refuse bad options before any work (and --plot when matplotlib is missing); `synthetic` is
    (--trace, --steps, --scale), the options of a synthetic model only."""
    if rec.model.kind == "hf" and any(x is not None for x in synthetic):
        raise UsageError("--trace, --steps and --scale apply to synthetic models",
                         "a checkpoint run generates from the recipe's prompts at full size")
    if platform is not None and not platform.is_file():
        raise UsageError(f"--platform {platform}: no such file", "write one with `hotsplit probe -o platform.json`")
    if plot is not None:
        require_matplotlib()


def _check_prefetch_fit(fit: Path | None, knobs, model_kind: str) -> None:
    """--prefetch-fit fits the predictor `prefetch trace` stages with: refused without it, or missing;
    required for it on a checkpoint (no replayed trace to fit on)."""
    if fit is None:
        if knobs.prefetch == "trace" and model_kind == "hf":
            raise UsageError(f"prefetch trace ({knobs.origin('prefetch')}) on a checkpoint stages with a table fitted "
                             "on a routing trace of it: --prefetch-fit is missing",
                             "record one with `hotsplit balance --model DIR --prompts FILE --trace FIT.npz`")
        return
    if knobs.prefetch != "trace":
        raise UsageError(f"--prefetch-fit fits the predictor of prefetch trace, but prefetch is {knobs.prefetch} "
                         f"({knobs.origin('prefetch')})", "add --prefetch trace, or drop --prefetch-fit")
    if not fit.is_file():
        raise UsageError(f"--prefetch-fit {fit}: no such file", "give a routing trace (.npz) of the same model")


def _verdicts(request, result, fits) -> list[dict]:
    """Every prediction the run was given, judged: a job's, or one rank's."""
    s = result.summary
    if result.figures is not None:
        return ep_verdicts(request.plan_file, s, result.figures, fits)
    return report.verdicts(request.plan_file, s.hot_hit_rate, s.cold_paths, fit=fits.hit_rate.after(s.swaps))


def _renderer(out: Output, request, result, doc: dict, plot: Path | None):
    """The human report of the run: a checkpoint's texts, the summary, the verdicts."""
    rec, s, h = request.recipe, result.summary, result.header
    synthetic_one = rec.model.kind != "hf" and result.figures is None
    origin = report.origin(out, s, h.doc["plan"]["made_from"], h.doc["traffic"],
                           *((rec.traffic.drift_every if request.trace is None else None, request.knobs.dynamic)
                             if synthetic_one else ()))

    def render():
        for i, text in enumerate((result.texts or [])[:8]):
            out.print(escape(f"[{i}] {text!r}"))
        if result.figures is not None:
            return render_job(out, rec.name, s, result.figures, origin, plot, doc["verdicts"])
        title = f"hotsplit run {rec.name}" + (" (interrupted)" if s.interrupted else "")
        first = [] if synthetic_one else [
            ("device", f"{h.device_name} ({h.doc['kernel']})"),
            ("plan", f"{h.doc['plan']['hot_experts']} hot experts ({h.doc['plan']['source']})"),
            ("cold bank", h.cold_bank["numa"])]
        report.render_summary(out, title, s, first, [("copy time", f"{s.copy_ms:,.2f} ms"),
                                                     *report.cold_path_rows(s.cold_paths),
                                                     *report.prefetch_rows(s.prefetch),
                                                     *report.precision_rows(doc["precision"])], origin)
        if plot is not None and synthetic_one:
            out.print(f"plot: {plot}{report.one_window_note(s)}")
        report.print_verdicts(out, doc["verdicts"])
    return render


def _plot(path: Path, result) -> None:
    """Hit rate per window over steps, swap moments marked (a job: with each rank's load);
    written atomically."""
    if result.figures is not None:
        return plot_ep_run(path, result.summary, result.figures, result.recipe)
    save_png(path, lambda fig, ax: _draw_hit_rates(ax, result.summary, result.recipe), figsize=(8, 4), dpi=100)


def say_error(line: str, exit_code: int) -> None:
    """The entry point's one error line, said once for the ranks of a job (runtime/api.py)."""
    api.say_error(line, exit_code)


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("run")(run)
