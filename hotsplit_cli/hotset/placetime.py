"""`hotsplit place --platform`: the token-balanced layout and a time-balanced one side by side,
each rank's predicted time per decode step by the plan's cost model (ranktime.py), and the
layout that `--balance` names written (numpy only)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import PlanError, UsageError
from hotsplit_cli.hotset.budget import choose_read_rate, resolve_hot_budget
from hotsplit_cli.hotset.planfile import PlanFile, check_plan_precision, load_plan, routing_probs, stored_sizes
from hotsplit_cli.hotset.ranktime import TimeModel, balance_time
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank, uniform_precision
from hotsplit_cli.placement.evaluate import duplicate_count, evaluate
from hotsplit_cli.placement.file import placement_doc
from hotsplit_cli.placement.report import PlaceReport, PlaceRequest, hist_windows, place_from_hist

BALANCES = ("tokens", "time")
HOT_WORK = ("a hot expert costs nothing per token in the cost model (the probe measures no device-memory "
            "rate): a rank's time is its cold reads")


def check_time_request(req: PlaceRequest, recipe: Recipe | None) -> None:
    """UsageError (exit 2) before any work for what `--platform` cannot time."""
    if req.balance not in BALANCES:
        raise UsageError(f"--balance: must be one of {', '.join(BALANCES)}, got {req.balance!r}")
    if recipe is None:
        raise UsageError("--platform times each rank with the recipe's expert sizes and budget and needs --recipe",
                         "pass --recipe NAME (e.g. deepseek-v3-ep8)")
    if recipe.parallel.tp != 1 or recipe.parallel.ep != req.ranks:
        raise UsageError(f"--platform times an expert-parallel layout of recipe {recipe.name!r} (tp="
                         f"{recipe.parallel.tp}, ep={recipe.parallel.ep}) on --ranks {req.ranks}",
                         f"use a recipe with tp: 1 and ep: {req.ranks} (e.g. deepseek-v3-ep8 with --ranks 8)")


def _plan_of(req: PlaceRequest, recipe: Recipe, knobs: Knobs) -> PlanFile | None:
    """The plan of --plan, made at the precision knob's value (its budget and, under auto, each
    expert's stored precision); precision auto without one is refused."""
    if req.plan_path is None:
        if knobs.precision == "auto":
            raise UsageError(f"{knobs.origin('precision')} auto: place times the precisions an auto plan chose, "
                             "and no --plan was given",
                             "pass --plan made with `hotsplit plan --precision auto --max-error E`, or a uniform "
                             "precision")
        return None
    plan = load_plan(req.plan_path)
    check_plan_precision(plan, knobs)
    return plan


def place_by_time(req: PlaceRequest, recipe: Recipe | None, knobs: Knobs,
                  warn: Callable[[str], None] = lambda message: None) -> PlaceReport:
    """`place_from_hist` plus the time-balanced layout; the report's `times` compares both, and
    the layout written is the one `req.balance` names. The request is checked first
    (`check_time_request`, by the command, before the recipe's knobs are resolved)."""
    platform = load_platform(req.platform_path)
    plan = _plan_of(req, recipe, knobs)
    budget = resolve_hot_budget(recipe, knobs, platform, plan)
    if budget.over_gpu:
        warn(f"{budget.over_gpu}; timed anyway (for a larger GPU?)")
    rate = choose_read_rate(recipe, platform)
    if not rate.gbps:
        raise PlanError(f"{req.platform_path} has no measured read rate to time cold experts at",
                        "re-run `hotsplit probe -o platform.json` on the serving machine")
    report = place_from_hist(req, recipe, warn)
    hist = report.hist
    if plan is not None and plan.precision == "auto":  # each logical expert at its plan's precision
        stored = stored_sizes(plan, recipe, hist.layers)
    else:  # HOTSPLIT_PRECISION or the recipe's, as a plan given was made at
        stored = expert_bytes_per_rank(recipe, uniform_precision(knobs))
    model = TimeModel(hist.counts_LE, routing_probs(hist), stored, budget.budget_bytes,
                      rate.gbps, recipe.traffic.batch)
    layouts = {"tokens": report.placement, "time": balance_time(model, report.placement)}
    later = report.later
    later_pi = routing_probs(later) if later is not None else None
    rows = {}
    for name, lay in layouts.items():
        fitted = model.times(lay)
        rows[name] = {"fitted": fitted.to_doc()}
        if later_pi is not None:
            rows[name]["eval"] = model.times(lay, later_pi).to_doc()
    times = {"batch": model.batch, "budget_bytes": budget.budget_bytes, "budget_source": budget.origin,
             "read_gbps": rate.gbps, "read_source": rate.source, "hot_work": HOT_WORK, "chosen": req.balance,
             "layouts": rows}
    chosen = layouts[req.balance]
    time_fitted = evaluate(hist_windows(hist), layouts["time"])
    compare = dict(report.compare)
    compare["hotsplit-time"] = {"fitted": time_fitted.to_doc(), "duplicate_ranks": duplicate_count(layouts["time"])}
    if later is not None:
        compare["hotsplit-time"]["eval"] = evaluate(hist_windows(later), layouts["time"]).to_doc()
    if req.balance == "time":
        doc = placement_doc(chosen, hist.num_experts, time_fitted, {**report.doc["source"], "balance": "time"})
    else:  # the token-balanced layout place_from_hist made, its document as it wrote it
        doc = {**report.doc, "source": {**report.doc["source"], "balance": "tokens"}}
    return replace(report, placement=chosen, doc=doc, compare=compare, times=times)

