"""What `hotsplit run` shows of an expert-parallel job (parallel.ep > 1), in the single-rank
run's terms (commands/_run_report.py): rank 0's header once every rank is built, one hit-rate
line per window for the whole job, and one summary with each rank's row (or, with --json, one
document). The runtime starts or joins the ranks (hotsplit_runtime.api.run); --log-jsonl is
written here, one line per window with every rank's fields.
"""

from __future__ import annotations

from rich.markup import escape

from hotsplit_cli.core.units import duration
from hotsplit_cli.hotset.ep_layout import layout_words
from hotsplit_cli.hotset.fitted_traffic import RunFits
from hotsplit_cli.hotset.verdict import balancedness_verdicts
from hotsplit_cli.output import Output, gib, pct
from hotsplit_cli.placement.file import placement_prediction

from . import _run_report as report


def job_header(say, request, header) -> None:
    """Rank 0's lines once every rank is built, for either model source."""
    rec, p, world = request.recipe, header.doc["plan"], header.parallel["ep"]
    if rec.model.kind == "hf":
        say(escape(f"{report.checkpoint_words(rec, header)}; rank 0: {header.doc['kernel']}, {p['hot_experts']} "
                   f"hot experts ({p['source']})"))
        share = "each rank generates its share of the prompts"
    else:
        report.describe(say, rec.name, header, ranks=world)
        share = rank_tokens_words(rec, header.source, header.tokens_per_step, world)
    say(f"expert parallel: {world} ranks on {header.parallel['nodes']} node(s), {header.parallel['backend']}; "
        f"{share}; cold bank shared by each node's ranks; {layout_words(request.plan)}")


def ep_verdicts(plan_file, s, fig, fits=None) -> list[dict]:
    """The plan's hit rates, the placement's balancedness (while its layout held: no rebalance
    moved it) and each rank's cold paths, judged (hotset/verdict.py); `fits`: whether the job
    replayed the routing the plan's and the placement's histograms counted (fitted_traffic.RunFits)."""
    fits = fits or RunFits()
    balance = []
    moved = any(r["skipped"] is None for r in fig.rebalances)
    if fig.window_balancedness is not None and not moved:
        pred = placement_prediction(plan_file.placement["path"])
        w = fig.window_balancedness
        balance = balancedness_verdicts(pred.fitted, pred.out_of_sample, w["balancedness"], w["steps_per_window"],
                                        fits.balancedness)  # swaps move no load between ranks
    docs = report.verdicts(plan_file, s.hit_rate, None, balance, fit=fits.hit_rate.after(s.swaps))
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


def render_job(out: Output, name: str, s, fig, origin, plot, verdicts: list[dict]) -> None:
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
        t.add_row(str(r["rank"]), str(r["assignments"]), pct(r["hit_rate"]), pct(want), str(r["cold_reads"]),
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
