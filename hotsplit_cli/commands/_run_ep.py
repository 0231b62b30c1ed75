"""`hotsplit run RECIPE` with parallel.ep > 1: the ranks of an expert-parallel run.

Started plainly it launches the recipe's ep local ranks (torch's elastic agent) and prints only
a failure; each rank is this same command. Under torchrun (RANK, WORLD_SIZE, ... set) it is one
rank: rank 0 prints the header, one hit-rate line per window for the whole job, and one summary
(or, with --json, one document); --log-jsonl is written by rank 0, one line per window with
every rank's fields.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rich.markup import escape

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.core.jsonio import schema_tag
from hotsplit_cli.core.units import duration
from hotsplit_cli.output import Output, debug_on, gib, pct

from ._run_request import RunRequest


def run_expert_parallel(out: Output, request: RunRequest) -> None:
    """Launch the ranks, or run this one; it prints in the single-rank run's terms (commands/_run_report.py)."""
    rec, plan, trace, steps = request.recipe, request.plan, request.trace, request.steps
    ep = rec.parallel.ep
    if rec.parallel.tp != 1:
        raise UsageError(f"parallel.tp is {rec.parallel.tp} with ep {ep}: the runtime runs tp 1 under ep",
                         "use tp: 1 for an expert-parallel run")
    from hotsplit_cli.commands._refusal import under_launcher

    started = time.time()  # the job's start, for the progress lines of its set-up
    if not under_launcher():  # before torch is imported: a refusal here takes well under a second
        _check_before_launch(rec, plan, trace, steps)
    from hotsplit_runtime.distributed.launch import in_group

    if not in_group():
        from hotsplit_runtime.distributed.launch import launch_local

        if debug_on():
            os.environ["HOTSPLIT_DEBUG"] = "1"
        _remove_ended_jobs(out)
        out.note(f"expert parallel: starting {ep} local ranks")
        return launch_local(ep, list(request.argv), started)
    _start_rank(out)
    world = int(os.environ["WORLD_SIZE"])
    if world != ep:  # every rank finds the same mismatch: rank 0 says it for the job (cli._say_error)
        raise UsageError(f"parallel.ep is {ep} but the launcher started {world} ranks",
                         f"launch {ep} ranks (torchrun --nproc-per-node, --nnodes), or change parallel.ep")
    _rank(out, request)


def _check_before_launch(rec, plan: Path | None, trace: Path | None, steps: int | None) -> None:
    """What every rank would refuse, refused once by the launcher before any rank starts, with
    the checks a single-rank run makes before it builds: the trace against the recipe and
    --steps, the plan's placement. A refusal names the input, not a rank."""
    from hotsplit_cli.hotset.planfile import load_plan, placement_of_plan
    from hotsplit_cli.traffic.trace import load_replay

    trace_file = trace or (rec.traffic.path if rec.traffic.kind == "trace" else None)
    if trace_file is not None:
        load_replay(trace_file, rec, steps)
    if plan is not None:  # its number of ranks is checked with the single-rank checks (check_run_inputs)
        m = rec.model
        placement_of_plan(load_plan(plan), m.moe_layer_ids, m.num_experts, rec.parallel.ep)


def _remove_ended_jobs(out: Output) -> None:
    """Before a job starts: remove what killed jobs left on this node, and say so in one line."""
    from hotsplit_runtime.distributed.leftovers import SHM_DIR, remove_ended

    removed, parts = remove_ended(), []
    if removed.segments:
        n = len(removed.segments)
        parts.append(f"{n} shared-memory segment{'s' * (n != 1)} ({removed.segment_bytes / 2**20:,.1f} MiB) "
                     f"from {SHM_DIR}")
    if removed.folders:
        n = len(removed.folders)
        parts.append(f"{n} log folder{'s' * (n != 1)} ({', '.join(removed.folders)})")
    if parts:
        out.note(escape(f"removed what ended expert-parallel jobs left: {' and '.join(parts)}"))


def _start_rank(out: Output) -> None:
    """First in a rank: die with the launcher; under a launcher not our own (torchrun), the
    node's local rank 0 removes what killed jobs left, as our launcher does."""
    from hotsplit_runtime.distributed.launch import ERROR_DIR_ENV, die_with_launcher

    die_with_launcher()
    if os.environ.get("LOCAL_RANK") == "0" and ERROR_DIR_ENV not in os.environ:
        _remove_ended_jobs(out)


def _rank(out: Output, request: RunRequest) -> None:
    from hotsplit_runtime.distributed.job import run_ep_rank

    from . import _run_report as report  # the single-rank run's lines and tables

    rec, knobs, plot, log_jsonl = request.recipe, request.knobs, request.plot, request.log_jsonl
    say = out.note if out.json_mode else out.print
    header = {}
    on_ready = _header(out, say, request, header, report)

    def runner(on_record):
        return run_ep_rank(rec, knobs, plan_path=request.plan, trace_path=request.trace, steps=request.steps,
                           scale=request.scale, platform_path=request.platform, on_record=on_record,
                           on_ready=on_ready)

    if int(os.environ["RANK"]) != 0:
        runner(None)
        return
    result = report.logged(say, log_jsonl, runner, line=report.format_job_line)
    s, fig = result.summary, result.figures
    doc = {"schema": schema_tag("run"), "recipe": rec.name, "knobs": knobs.to_doc(), **header["doc"],
           "parallel": {"ep": result.group.world, "backend": result.group.backend,
                        "nodes": result.group.world // result.group.local_world},
           "summary": {**s.to_doc(), **fig.to_doc()}, "verdicts": _ep_verdicts(request.plan, s, fig, report)}
    if plot is not None:
        from ._run_ep_plot import plot_ep_run

        plot_ep_run(plot, s, fig, rec.name)
        doc["plot"] = str(plot)
    origin = report.origin(out, s, result.prepared.plan.made_from, result.prepared.traffic)
    if result.texts is not None:  # a checkpoint's greedy texts, every rank's in prompt order
        doc["texts"] = result.texts
    def render():
        for i, text in enumerate((result.texts or [])[:8]):  # as a single-rank checkpoint run shows them
            out.print(escape(f"[{i}] {text!r}"))
        _render(out, rec.name, s, fig, origin, plot, report, doc["verdicts"])
    out.emit(doc, render)
    if s.interrupted:  # Ctrl-C: every rank stopped at the same window; said here once, for the job
        from hotsplit_cli.core.errors import Interrupted

        of = "" if rec.model.kind == "hf" else f" of {result.prepared.steps}"  # a generation's length is open
        raise Interrupted(f"interrupted at step {s.steps}{of}", report.wrote(log_jsonl, len(s.records), plot))


def _header(out: Output, say, request: RunRequest, header: dict, report):
    """`on_ready(prepared, group)`: rank 0's lines once every rank is built (and the document's
    part that describes the rank), for either model source."""
    from hotsplit_cli.hotset.ep_layout import layout_words

    rec = request.recipe

    def on_ready(prepared, group):
        from hotsplit_runtime.distributed.launch import seconds_since_start

        out.note(f"expert parallel: every rank's banks built after {seconds_since_start():.1f} s")
        header["doc"] = pdoc = prepared.to_doc()
        if rec.model.kind == "hf":
            p = prepared.plan
            say(escape(f"{rec.name}: {rec.model.family} checkpoint {rec.model.path}, prompts {rec.traffic.path}; "
                       f"rank 0: {pdoc['kernel']}, {int(p.hot_LE.sum())} hot experts ({p.source})"))
            share = "each rank generates its share of the prompts"
        else:
            report.describe(say, rec.name, prepared, pdoc, ranks=group.world)
            source = prepared.engine.source
            share = rank_tokens_words(rec, source.name, source.tokens_per_step, group.world)
        say(f"expert parallel: {group.world} ranks on {group.world // group.local_world} node(s), {group.backend}; "
            f"{share}; cold bank shared by each node's ranks; {layout_words(request.plan)}")
    return on_ready


def _ep_verdicts(plan: Path | None, s, fig, report) -> list[dict]:
    """The plan's hit rates, the placement's balancedness (while its layout held: no rebalance
    moved it) and each rank's cold paths, judged (hotset/verdict.py)."""
    from hotsplit_cli.hotset.planfile import load_plan
    from hotsplit_cli.hotset.verdict import balancedness_verdicts

    plan_file = load_plan(plan) if plan is not None else None
    balance = []
    moved = any(r["skipped"] is None for r in fig.rebalances)
    if fig.window_balancedness is not None and not moved:
        from hotsplit_cli.placement.file import placement_prediction

        pred = placement_prediction(plan_file.placement["path"])
        w = fig.window_balancedness
        balance = balancedness_verdicts(pred.fitted, pred.out_of_sample, w["balancedness"], w["steps_per_window"])
    docs = report.verdicts(plan_file, s.hit_rate, None, balance)
    for r in fig.ranks:
        docs += report.verdicts(None, s.hit_rate, r["cold_paths"], who=f" rank {r['rank']}")
    return docs


def rank_tokens_words(rec, source: str, tokens: int, world: int) -> str:
    """What each rank steps; a trace whose steps give a rank other than the recipe's batch (one
    captured for a single rank, say) is named, with the capture that replays at that batch."""
    words = f"each rank steps {tokens} tokens"
    batch = rec.traffic.batch
    if source == "trace" and tokens != batch:
        words += (f" (the trace's steps shared by {world} ranks; traffic.batch is {batch} per rank: "
                  f"`hotsplit balance {rec.name} --trace` records {world} x {batch} per step)")
    return words


def _exchange_words(ex: dict, s) -> str:
    """Measured bytes and time of one exchange (one MoE layer's dispatch and combine) next to the
    ledger's, and the share of a step that a step's exchanges took."""
    layers = ex["exchanges_per_rank"] / s.steps if s.steps else 0  # exchanges per step: one per MoE layer
    words = (f"{gib(ex['measured_bytes_per_layer'])} measured vs {gib(ex['predicted_bytes_per_layer'])} by the "
             f"ledger; {duration(ex['ms_per_layer'])} measured")
    if ex.get("predicted_ms_per_layer") is not None:
        words += f" vs {duration(ex['predicted_ms_per_layer'])} by the ledger at {ex['predicted_at_gbps']:g} GB/s"
    step_ms = 1e3 * s.elapsed_s / s.steps if s.steps else 0.0
    if layers and step_ms > 0:
        words += f"; {pct(ex['ms_per_layer'] * layers / step_ms)} of a step ({duration(step_ms)})"
    return words


def _render(out: Output, name: str, s, fig, origin, plot, report, verdicts: list[dict]) -> None:
    ex = fig.exchange
    pred = "" if fig.predicted_balancedness is None else f" (predicted {fig.predicted_balancedness:.4f})"
    b = fig.bottleneck
    rows = [("balancedness (per exchange)", f"{fig.balancedness:.4f}{pred}: each step and layer's mean / max rank "
                                             "load, summed"),
            ("bottleneck rank (run totals)", f"rank {b['rank']}: {b['load']} assignments, {b['lead']:.2f}x the mean "
                                             f"of the ranks' totals (totals even out over steps and layers: 1 / "
                                             f"{b['lead']:.2f} = {1 / b['lead']:.3f} is above the per-exchange "
                                             f"{fig.balancedness:.3f})"),
            (f"exchange ({ex['mode']}) per layer and rank", _exchange_words(ex, s))]
    for r in fig.rebalances:
        if r["skipped"]:
            rows.append((f"rebalance at step {r['step']}", f"skipped: {r['skipped']}"))
            continue
        after = "" if r["achieved_after"] is None else f", achieved {r['achieved_after']:.3f}"
        after += " (WORSE than before it)" if r.get("worse") else ""
        rows.append((f"rebalance at step {r['step']}",
                     f"balancedness {r['before']:.3f} -> {r['predicted_after']:.3f} predicted on unseen counts{after}; "
                     f"{r['experts_moved']} slots refilled, up to {max(r['bytes_moved_R']) / 2**20:.2f} MiB per rank "
                     f"from the shared cold bank, {r['ms']:.1f} ms, {r['steps_disturbed']} steps disturbed"))
    worse = [r["step"] for r in fig.rebalances if r.get("worse")]
    if worse:
        rows.append(("rebalances that lowered the balance", f"at step {', '.join(map(str, worse))}"))
    if fig.rebalance_error is not None:
        rows.append(("rebalance predictions vs the next window", _error_words(fig.rebalance_error)))
    title = f"hotsplit run {name} (ep {len(fig.ranks)})" + (" (interrupted)" if s.interrupted else "")
    report.render_summary(out, title, s, [], rows, origin)
    split = any(r["cold_paths"] for r in fig.ranks)  # cold_path cpu / split: where each rank's cold work went
    t = out.table("rank", "assignments", "hit rate", "expected", "cold reads", "swaps",
                  *(("cold on CPU",) if split else ()), title="ranks")
    for r in fig.ranks:
        want = r.get("predicted_hit_rate", r["expected_hit_rate"])
        cpu = () if not split else (pct(r["cold_paths"]["cpu_share"]),)  # share of its distinct cold experts
        t.add_row(str(r["rank"]), str(r["tokens"]), pct(r["hit_rate"]), pct(want), str(r["cold_reads"]),
                  str(r["swaps"]), *cpu)
    out.print(t)
    if plot is not None:
        out.print(escape(f"plot: {plot}"))
    report.print_verdicts(out, verdicts)


def _error_words(err: dict) -> str:
    """How far the moves' predicted_after was from the balancedness the next window achieved."""
    if not err["count"]:
        return "no move was followed by a window to judge it on"
    return (f"off by {err['mean_abs']:.4f} on average, {err['max_abs']:.4f} at most, over {err['count']} "
            f"move{'s' * (err['count'] != 1)} (predicted on counts, achieved per exchange)")
