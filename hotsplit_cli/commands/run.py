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
from hotsplit_cli.core.jsonio import schema_tag, write_atomic
from hotsplit_cli.hotset.planfile import check_run_inputs
from hotsplit_cli.options import ColdPathOpt, HotGibOpt, JsonOpt, PlatformOpt, PlotOpt, RecipeArg, output_option
from hotsplit_cli.output import Output, gib, pct

MIB = 1 << 20
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
    if rec.parallel.ep > 1:  # the ranks of an expert-parallel run
        return _expert_parallel(out, rec, knobs, plan, trace, steps, scale, log_jsonl, plot, platform)
    if rec.model.kind == "hf":
        return _run_checkpoint(out, rec, knobs, plan, log_jsonl, plot, json_out, platform)

    from hotsplit_runtime.from_recipe import prepare_run  # torch is imported only from here on

    with out.progress(f"building {rec.model.num_moe_layers} MoE layers", rec.model.num_moe_layers) as advance:
        prepared = prepare_run(rec, knobs, plan_path=plan, trace_path=trace, steps=steps, scale=scale,
                               advance=advance, platform_path=platform, plan_file=plan_file)
    _ready(out, prepared)
    pdoc = prepared.to_doc()
    say = out.note if json_out else out.print
    _describe(say, rec.name, prepared, pdoc)
    with out.progress(f"{rec.name}: steps", prepared.steps) as advance:
        summary = _logged(say, log_jsonl, lambda on_record: prepared.engine.run(prepared.steps, on_record, advance))

    doc = {"schema": schema_tag("run"), "recipe": rec.name, "knobs": knobs.to_doc(), **pdoc,
           "summary": summary.to_doc(), "verdicts": _plan_verdicts(plan_file, summary.hit_rate)}
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


def _plan_verdicts(plan_file, achieved: float) -> list[dict]:
    """The plan's hit-rate predictions judged on this run (hotset/verdict.py); none without a plan file."""
    from hotsplit_cli.hotset.verdict import hit_rate_verdicts

    if plan_file is None:
        return []
    return [v.to_doc() for v in hit_rate_verdicts(plan_file.hit_rate, plan_file.out_of_sample, achieved)]


def _print_verdicts(out: Output, verdicts: list[dict]) -> None:
    for v in verdicts:
        out.print(f"{v['figure']}: achieved {pct(v['achieved'], 2)}, predicted {pct(v['predicted'], 2)} "
                  f"(band {100 * v['low']:.2f}-{pct(v['high'], 2)}): {v['verdict']}")


def _expert_parallel(out: Output, rec, knobs, *options) -> None:
    """parallel.ep > 1: launch the local ranks, or be one of them (commands/_run_ep.py), reporting
    for the job with this command's own lines and tables."""
    from types import SimpleNamespace

    from ._run_ep import run_expert_parallel

    report = SimpleNamespace(describe=_describe, logged=_logged, origin=_origin, draw_hit_rates=_draw_hit_rates,
                             render_summary=_render_summary, wrote=_wrote)
    return run_expert_parallel(out, rec, knobs, *options, report=report)


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


def _describe(say, name: str, prepared, pdoc: dict) -> None:
    """What a synthetic run is about to do: device and kernel, traffic, cold bank, plan, cold path."""
    say(f"{name}: {prepared.steps} steps on {prepared.info.name} ({pdoc['kernel']}"
        f"{', CUDA graph' if pdoc['cuda_graph'] else ''}; experts {prepared.expert_format}),"
        f" traffic: {prepared.traffic}")
    alloc = prepared.allocator
    how = alloc.method + (f"; {alloc.fallback}" if alloc.fallback else "")
    say(f"cold bank: {gib(alloc.requested_bytes)} of host memory ({how}), {alloc.numa.describe()}")
    say(f"plan: {pdoc['plan']['hot_experts']} hot experts, {gib(prepared.plan.hot_bytes)} real"
        f" ({prepared.plan.source}); expected hit rate {pct(prepared.plan.expected_hit_rate)}")
    if pdoc["cold_path"]["rates"]:
        say(escape(f"cold path: {pdoc['cold_path']['mode']} ({pdoc['cold_path']['rates']})"))


def _wrote(log_jsonl: Path | None, records: int, plot: Path | None) -> str:
    """What an interrupted run leaves on disk: the records so far and the plot of them."""
    files = ([f"{log_jsonl} ({records} records)"] if log_jsonl else []) + ([str(plot)] if plot else [])
    return f"wrote {' and '.join(files)}" if files else "nothing was written"


def _logged(say, log_jsonl: Path | None, runner, line=None):
    """Run `runner(on_record)`: each hit-rate record as a human line (`line(record)`, by default
    runtime.log's), and as a JSON line in `log_jsonl` (streamed into a temp file that is renamed
    when the run ends, even by Ctrl-C)."""
    from hotsplit_runtime.log import format_line, write_jsonl

    line = line or format_line

    def go(fh=None):
        def on_record(r):
            say(line(r))
            if fh is not None:
                write_jsonl(fh, r)
        return runner(on_record)

    if log_jsonl is None:
        return go()
    box = {}
    write_atomic(log_jsonl, lambda fh: box.setdefault("result", go(fh)))
    return box["result"]


def _run_checkpoint(out: Output, rec, knobs, plan: Path | None, log_jsonl: Path | None, plot: Path | None,
                    json_out: bool, platform: Path | None = None) -> None:
    """A real checkpoint: generate the recipe's prompts on the hot/cold banks, logging hit rates."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError("a checkpoint recipe needs transformers", "pip install 'hotsplit[hf]'") from None
    from hotsplit_runtime.hf.run import checkpoint_prompts, run_checkpoint

    say = out.note if json_out else out.print
    say(f"{rec.name}: {rec.model.family} checkpoint {rec.model.path}, prompts {rec.traffic.path}")
    prompts = checkpoint_prompts(rec)
    with out.progress(f"{rec.name}: prompts", len(prompts)) as advance:
        result = _logged(say, log_jsonl, lambda on_record: run_checkpoint(rec, knobs, prompts, plan, on_record,
                                                                          advance, platform))
    doc = {"schema": schema_tag("run"), "recipe": rec.name, "knobs": knobs.to_doc(), "summary": result.to_doc()}
    if plot is not None:
        _plot(plot, result.summary, rec.name)
        doc["plot"] = str(plot)
    origin = _origin(out, result.summary, result.plan_made_from, f"prompts {rec.traffic.path}")

    def render():
        for i, text in enumerate(result.texts[:8]):
            out.print(f"[{i}] {text!r}")
        plan_row = ("plan", f"{result.hot_experts} hot experts ({result.plan_source})")
        title = f"hotsplit run {rec.name}" + (" (interrupted)" if result.summary.interrupted else "")
        _render_summary(out, title, result.summary,
                        [("device", f"{result.device} ({result.kernel})"), plan_row,
                         ("cold bank", result.numa.describe())],
                        [("copy time", f"{result.summary.copy_ms:,.2f} ms"),
                         *_cold_path_rows(result.summary.cold_paths)], origin)

    out.emit(doc, render)
    if result.summary.interrupted:
        raise Interrupted(f"interrupted after {result.summary.steps} steps",
                          _wrote(log_jsonl, len(result.summary.records), plot))


def _cold_path_rows(paths: dict | None) -> list[tuple[str, str]]:
    """Summary rows of a CPU cold path: per path the cold bytes served (as allocated, and at full
    size), and the time achieved vs predicted for the tensors as allocated."""
    if not paths:
        return []
    rows = [("cold path", f"{paths['mode']}: the CPU computed {100 * paths['cpu_share']:.1f}% of the distinct cold "
                          f"experts, in {paths['layers_with_cpu']} of {paths['layers']} layer calls")]
    for key, label in (("gpu", "device"), ("cpu", "CPU")):
        p = paths[key]
        share = ("its hot and cold experts" if paths.get("hot_modelled") else "its cold share (hot experts not "
                 "modelled)") if key == "gpu" else "its cold share"
        allocated = p.get("allocated_bytes", p["bytes"])
        full = "" if allocated == p["bytes"] else f"; {gib(p['bytes'])} at full size"
        rows.append((f"  {label}", f"read {gib(allocated)} of experts (tensors as allocated{full}); "
                                   f"{p['ms']:,.2f} ms achieved vs "
                                   f"{p['predicted_ms']:,.2f} ms predicted for {share}"))
    if paths.get("rates_not_used"):
        rows.append(("  rates not used", paths["rates_not_used"]))
    return rows


def _origin(out: Output, summary, made_from: str, traffic: str, drift_every: int | None = None,
            dynamic: bool = True) -> list[tuple[str, str]]:
    """Summary rows naming the routing the plan was made from next to this run's traffic; a
    warning when the achieved hit rate is far from the plan's expectation."""
    from hotsplit_runtime.windows import expectation_warning

    warning = expectation_warning(summary, made_from, traffic, drift_every, dynamic)
    if warning:
        out.warn(warning)
    return [("plan made from", made_from), ("this run's traffic", traffic)]


def _render_summary(out: Output, title: str, s, first: list, extra: list, origin: list) -> None:
    """The summary table shared by synthetic and checkpoint runs (`s`: a RunSummary), then the
    `origin` lines (what the plan was made from, this run's traffic)."""
    from hotsplit_runtime.windows import gap_flagged

    expected = pct(s.expected_hit_rate)
    if gap_flagged(s):
        side = "lower" if s.expected_gap < 0 else "higher"
        expected += f" (achieved {100 * abs(s.expected_gap):.1f} points {side}: see below)"
    t = out.table("summary", "value", title=title)
    for row in [*first,
                ("steps", f"{s.steps}"),
                ("tokens", f"{s.tokens}"),
                ("tokens/s", f"{s.tokens_per_s:,.1f}"),
                ("hit rate (overall)", pct(s.hit_rate)),
                ("hit rate (last window)", pct(s.hit_rate_last_window)),
                ("hit rate expected by the plan", expected),
                ("swaps", f"{s.swaps}"),
                ("bytes copied (real)", f"{s.bytes_copied / MIB:,.2f} MiB"),
                *extra,
                ("cold bytes read per step (real)", f"{s.cold_bytes_per_step / MIB:,.2f} MiB")]:
        t.add_row(*row)
    out.print(t)
    for label, text in origin:
        out.print(escape(f"{label}: {text}"))


def _plot(path: Path, summary, title: str) -> None:
    """Hit rate per window over steps, swap moments marked; written atomically."""
    from hotsplit_cli.plotting import save_png

    save_png(path, lambda fig, ax: _draw_hit_rates(ax, summary, title), figsize=(8, 4), dpi=100)


def _draw_hit_rates(ax, summary, title: str) -> None:
    recs = summary.records
    if len(recs) <= 1:  # one window has no curve: bars of what it can show, and why there is one
        return _draw_one_window(ax, summary, title)
    steps = [r.step for r in recs]
    ax.plot(steps, [100 * r.hit_rate_window for r in recs], marker="o", label="window")
    ax.plot(steps, [100 * r.hit_rate_total for r in recs], label="cumulative")
    if summary.expected_hit_rate is not None:
        ax.axhline(100 * summary.expected_hit_rate, linestyle=":", color="gray", label="plan expected")
    for i, r in enumerate(recs):
        if r.swaps:
            ax.axvline(r.step, color="tab:red", alpha=0.3, label="swaps" if i == next(
                j for j, q in enumerate(recs) if q.swaps) else None)
    ax.set_xlabel("engine step")
    ax.set_ylabel("hit rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"hotsplit run {title}")
    ax.legend(loc="lower right")


def _one_window_note(summary) -> str:
    """Why the plot of a run with one window has bars, not a curve."""
    if len(summary.records) > 1:
        return ""
    return f" (one window: bars, not a curve; HOTSPLIT_DYN_STEPS below {summary.steps} gives more points)"


def _draw_one_window(ax, summary, title: str) -> None:
    """A run shorter than two windows (steps <= dyn_steps): its one hit rate next to the plan's."""
    labels = [f"run (steps 1-{summary.steps})"]
    values = [100 * summary.hit_rate]
    if summary.expected_hit_rate is not None:
        labels.append("plan expected")
        values.append(100 * summary.expected_hit_rate)
    bars = ax.bar(labels, values, color=["tab:blue", "gray"][:len(values)])
    ax.bar_label(bars, fmt="%.1f%%")
    ax.set_ylabel("hit rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"hotsplit run {title}: one window ({summary.steps} steps, updates every dyn_steps): no curve")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("run")(run)
