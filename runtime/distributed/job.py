"""What `hotsplit run` does in each rank of an expert-parallel job: join the group, build the
rank (prepare_run with its EPRankContext), step in lockstep, gather the job's figures to rank 0, leave.

Rank 0 gets every window's `JobRecord` (through `on_record`) and the job's `EPResult`; the other
ranks get None. An error on any rank goes to the launcher (launch.report_rank_error).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch.distributed as dist

from hotsplit_cli.analysis.ledger import exchange_prediction
from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.hotset.planfile import load_plan, placement_of_plan
from hotsplit_cli.hotset.verdict import prediction_error
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.dispatch import predict_trace
from hotsplit_cli.placement.rebalance_rule import replay_rebalancing

from ..from_recipe import Prepared, prepare_run
from . import launch
from .rank import EPRankContext, run_rank
from .rebalance import Rebalancer
from .summary import EPFigures, RankWindow, gather_rows, gather_to_rank0, job_record, job_summary


@dataclass
class EPResult:
    """Rank 0's view of the finished job."""

    prepared: Prepared  # rank 0's
    group: launch.Group
    summary: object  # the job's RunSummary
    figures: EPFigures
    records: list = field(default_factory=list)
    texts: list[str] | None = None  # a checkpoint's: every rank's texts, in rank order


def run_ep_rank(recipe: Recipe, knobs: Knobs, *, plan_path: Path | None = None, trace_path: Path | None = None,
                steps: int | None = None, scale: float | None = None, platform_path: Path | None = None,
                on_record: Callable | None = None, on_ready: Callable[[Prepared, launch.Group], None] | None = None,
                placement: Placement | None = None) -> EPResult | None:
    """Run this rank (RANK etc. set by the launcher). `on_ready(prepared, group)` is called on
    rank 0 once the rank is built; `placement` overrides the plan's (tests use random ones)."""
    launch.stop_on_signal()
    group = launch.join()
    try:
        return _run(group, recipe, knobs, plan_path, trace_path, steps, scale, platform_path, on_record, on_ready,
                    placement)
    except BaseException as exc:  # noqa: BLE001 - every failure of a rank is reported for the job
        launch.report_rank_error(group.rank, exc)
        raise
    finally:
        launch.leave()


def _run(group, recipe, knobs, plan_path, trace_path, steps, scale, platform_path, on_record, on_ready, placement):
    m = recipe.model
    E, layers = m.num_experts, m.moe_layer_ids
    plan_file = load_plan(plan_path) if plan_path is not None else None
    placement = placement_of_plan(plan_file, layers, E, group.world) if placement is None else placement
    hooks = EPRankContext(group, placement, E, plan_file, knobs.ep_exchange)
    prepared = _prepare(recipe, knobs, plan_path, trace_path, steps, scale, platform_path, hooks)
    from ..device import tune_cpu_threads

    tune_cpu_threads(prepared.info)
    if group.rank == 0 and on_ready is not None:
        on_ready(prepared, group)
    engine, control = prepared.engine, group.control
    book = engine.book
    records = []

    def on_window(rec, loads_WL):
        hits_L, assigned_L, cold_reads = engine.window_counts
        job = job_record(RankWindow(rec, hits_L, assigned_L, cold_reads, book.hits, book.assigned, loads_WL), control)
        if job is not None:
            records.append(job)
            if on_record is not None:
                on_record(job)

    rebalancer = (Rebalancer(hooks, engine.model, control, prepared.expert_bytes, knobs.eplb_steps)
                  if knobs.eplb_steps else None)
    totals = run_rank(engine, prepared.steps, on_window, rebalancer, hooks.expected_rank_hit_rate)
    hot_RLE = gather_rows(engine.model.hot_LE().astype(np.float64), control)  # for the prediction (static runs)
    prediction = _placement_prediction(plan_file)
    ran = engine.step_count if m.kind == "hf" else prepared.steps  # a generation's length is known at its end
    window_steps = prediction.window_steps(ran) if prediction is not None else None
    trace_SLTK, texts = _served(hooks, engine, control, totals.summary.interrupted)  # for the predictions, the output
    out = job_summary(totals, control, window_steps)
    dist.barrier(group=control)
    if out is None:
        return None
    summary, figures = out
    summary.hit_rate_last_window = records[-1].hit_rate_window if records else None
    summary.records = records
    tokens_per_rank = summary.tokens / max(summary.steps, 1) / group.world  # this run's mean
    figures.exchange.update(exchange_prediction(recipe, knobs.ep_exchange, tokens_per_rank, prepared.hidden,
                                                prepared.engine.model.banks[0].compute_dtype.itemsize))
    figures.placement = {"method": placement.method, "physical_experts": placement.num_physical,
                         "slots_per_rank": placement.slots_per_rank}
    figures.rebalances = [r.to_doc() for r in rebalancer.reports] if rebalancer else []
    if rebalancer is not None:  # each move's prediction, judged on the window after it
        figures.rebalance_error = prediction_error([(r["predicted_after"], r["achieved_after"])
                                                    for r in figures.rebalances if r["skipped"] is None])
    if trace_SLTK is not None:
        _trace_predictions(figures, trace_SLTK[:summary.steps], placement, E,
                           hot_RLE.reshape(group.world, engine.model.num_layers, E) > 0.5,
                           knobs.eplb_steps if rebalancer is not None else 0)
    return EPResult(prepared, group, summary, figures, records, texts)


def _prepare(recipe, knobs, plan_path, trace_path, steps, scale, platform_path, hooks: EPRankContext):
    """This rank built from the recipe's model source: a checkpoint generating its share of the
    prompts, or a synthetic model."""
    if recipe.model.kind == "hf":
        from ..hf.run import checkpoint_prompts, prepare_checkpoint

        return prepare_checkpoint(recipe, knobs, checkpoint_prompts(recipe), plan_path, None, platform_path, hooks)
    return prepare_run(recipe, knobs, plan_path=plan_path, trace_path=trace_path, steps=steps, scale=scale,
                       platform_path=platform_path, rank=hooks)


def _served(hooks: EPRankContext, engine, control, interrupted: bool) -> tuple[np.ndarray | None, list[str] | None]:
    """What the job served, on rank 0 (collective for a checkpoint): the routing, ids [S, L, T, K]
    (a checkpoint's as each rank sent it, a replayed trace's as read; None for other traffic),
    and a checkpoint's texts in rank order (None for a synthetic model; none when interrupted)."""
    sent = getattr(engine.model, "trace_steps", None)
    if sent is None:
        return (None if hooks.trace is None else hooks.trace.topk_ids_SLTK), None
    from ..hf.ep import job_trace

    ranks = gather_to_rank0([] if interrupted else engine.source.texts(), control)
    return job_trace(sent, control), None if ranks is None else [t for r in ranks for t in r]


def _trace_predictions(figures: EPFigures, topk_ids_SLTK, placement: Placement, num_experts: int,
                       hot_RLE: np.ndarray, eplb_steps: int) -> None:
    """What replaying the run's trace predicts: the balancedness (with the rebalances' moves,
    replayed by the same rule), and each rank's hit rate while the layout it began with holds."""
    moved = any(r["skipped"] is None for r in figures.rebalances)  # a rebalance that changed the layout
    if eplb_steps:
        figures.predicted_balancedness = replay_rebalancing(topk_ids_SLTK, placement, num_experts,
                                                            eplb_steps).balancedness
    if moved:
        return
    pred = predict_trace(topk_ids_SLTK, placement, num_experts, hot_RLE)
    if not eplb_steps:
        figures.predicted_balancedness = pred.balancedness
    for r, rate in enumerate(pred.hit_rate_R):
        if figures.ranks[r]["swaps"] == 0:  # its final hot set is the one it served with
            figures.ranks[r]["predicted_hit_rate"] = float(rate)


def _placement_prediction(plan_file):
    """What the plan's placement file predicts for the run's balancedness (None: no placement file)."""
    if plan_file is None or plan_file.placement is None:
        return None
    from hotsplit_cli.placement.file import placement_prediction

    return placement_prediction(plan_file.placement["path"])
