"""Each rank of an expert-parallel job: join the group, settle its `Rank` (rank.py `ep_rank`), build
it with expert parallelism applied (apply.py), step in lockstep, reduce the job's figures on
rank 0 (the others get None), leave."""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack

import numpy as np
import torch.distributed as dist

from hotsplit_cli.analysis.ledger import exchange_prediction
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.ep_figures import judged_figures
from hotsplit_cli.hotset.planfile import load_plan, placement_of_plan
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.file import placement_prediction
from hotsplit_cli.placement.rebalance_rule import trace_predictions

from .. import driver
from ..ranks import Rank
from ..request import Agreement, PrecisionReport, RunHeader, RunRequest, RunResult, Watch
from . import launch
from .apply import expert_parallel
from .checkpoint import job_trace
from .leftovers import removed_words
from .rank import ep_rank, run_rank
from .rebalance import Rebalancer
from .summary import RankWindow, gather_rows, gather_to_rank0, job_record, job_summary


def run_in_group(request: RunRequest, watch: Watch, placement: Placement | None = None,
                 environ=os.environ) -> RunResult | None:
    """This process as one rank of the job its launcher set up (ours, or torchrun): rank 0's `watch`
    sees the job's windows and gets its result. `placement` overrides the plan's (tests)."""
    ep, world = request.recipe.parallel.ep, int(environ["WORLD_SIZE"])
    if world != ep:  # every rank finds the same mismatch: rank 0 says it for the job
        raise UsageError(f"parallel.ep is {ep} but the launcher started {world} ranks",
                         f"launch {ep} ranks (torchrun --nproc-per-node, --nnodes), or change parallel.ep")
    launch.die_with_launcher()
    if environ.get("LOCAL_RANK") == "0" and launch.ERROR_DIR_ENV not in environ:  # torchrun: no launcher of ours
        words = removed_words()  # removed what killed jobs left on this node
        if words:
            watch.note(words)
    launch.stop_on_signal()
    group = launch.join()
    try:
        return _run(group, request, watch, placement)
    except BaseException as exc:  # noqa: BLE001 - every failure of a rank is reported for the job
        launch.report_rank_error(group.rank, exc)
        raise
    finally:
        launch.leave()


def _build(group, request: RunRequest, rank: Rank, watch: Watch):
    """The rank built (no progress bars on N ranks); rank 0 says so for the job, with its header."""
    with ExitStack() as stack:
        prepared = driver.build(request, rank, Watch(), stack, expert_parallel)
    header = prepared.header(RunHeader.parallel_of(group.world, group.backend, group.local_world))
    if group.rank == 0:
        watch.note(f"expert parallel: every rank's banks built after {launch.seconds_since_start():.1f} s")
        watch.ready(header)
    return prepared, header


def _run(group, request: RunRequest, watch: Watch, placement: Placement | None) -> RunResult | None:
    recipe, knobs = request.recipe, request.knobs
    m = recipe.model
    E, layers = m.num_experts, m.moe_layer_ids
    plan_file = request.plan_file or (load_plan(request.plan) if request.plan is not None else None)
    placement = placement_of_plan(plan_file, layers, E, group.world) if placement is None else placement
    rank = ep_rank(request, group, placement, plan_file)
    prepared, header = _build(group, request, rank, watch)
    engine, control = prepared.engine, group.control
    book = engine.book
    records = []

    def on_window(rec, loads_WL):
        hits_L, assigned_L, cold_reads = engine.window_counts
        job = job_record(RankWindow(rec, hits_L, assigned_L, cold_reads, book.hits, book.assigned, loads_WL), control)
        if job is not None:
            records.append(job)
            watch.record(job)

    rebalancer = (Rebalancer(placement, engine.model, control, prepared.expert_bytes, knobs.eplb_steps)
                  if knobs.eplb_steps else None)
    totals = run_rank(engine, prepared.steps, on_window, rebalancer, prepared.plan.rank_hit_rate)
    hot_RLE = gather_rows(engine.model.hot_LE().astype(np.float64), control)  # for the prediction (static runs)
    prediction = _placement_prediction(plan_file)
    ran = engine.step_count if m.kind == "hf" else prepared.steps  # a generation's length is known at its end
    window_steps = prediction.window_steps(ran) if prediction is not None else None
    trace_SLTK, texts = _served(prepared, control, totals.summary.interrupted)  # for the predictions
    out = job_summary(totals, control, window_steps)
    dist.barrier(group=control)
    if out is None:
        return None
    summary, figures = out
    rebalances = [r.to_doc() for r in rebalancer.reports] if rebalancer else None
    predicted = None
    if trace_SLTK is not None:
        moved = any(r["skipped"] is None for r in rebalances or [])  # a rebalance that changed the layout
        predicted = trace_predictions(trace_SLTK[:summary.steps], placement, E,
                                      hot_RLE.reshape(group.world, engine.model.num_layers, E) > 0.5,
                                      knobs.eplb_steps if rebalancer is not None else 0, moved)
    tokens_per_rank = summary.tokens / max(summary.steps, 1) / group.world  # this run's mean
    exchange = exchange_prediction(recipe, knobs.ep_exchange, tokens_per_rank, prepared.hidden,
                                   engine.model.banks[0].compute_dtype.itemsize)
    figures = judged_figures(figures, placement, rebalances, exchange, predicted)
    summary = dataclasses.replace(summary, records=records,
                                  hit_rate_last_window=records[-1].hit_rate_window if records else None)
    check = None if m.kind != "hf" else lambda: Agreement(None, 0, "not compared under expert parallelism")
    return RunResult(recipe.name, knobs, header, summary, figures, texts,
                     PrecisionReport.of_run(knobs.precision, plan_file, check, summary.interrupted))


def _served(prepared, control, interrupted: bool) -> tuple[np.ndarray | None, list[str] | None]:
    """What the job served, on rank 0 (collective for a checkpoint): its routing ids [S, L, T, K] (None
    for untraced traffic) and a checkpoint's texts in rank order (None for a synthetic model)."""
    sent = getattr(prepared.engine.model, "trace_steps", None)
    if sent is None:
        return (None if prepared.trace is None else prepared.trace.topk_ids_SLTK), None
    ranks = gather_to_rank0(prepared.texts(interrupted), control)
    return job_trace(sent, control), None if ranks is None else [t for r in ranks for t in r]


def _placement_prediction(plan_file):
    """What the plan's placement file predicts for the run's balancedness (None: no placement file)."""
    if plan_file is None or plan_file.placement is None:
        return None
    return placement_prediction(plan_file.placement["path"])
