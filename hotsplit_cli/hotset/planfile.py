"""From a histogram and a recipe to a `hotsplit.plan/1` document (numpy only).

Everything the plan command prints and writes is computed here; the command only renders.
The document is deterministic: no timestamps, sorted ids, the same inputs give the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hotsplit_cli.config.knobs import PRECISIONS as PRECISION_KNOBS
from hotsplit_cli.config.knobs import PREFETCH_POOLS, Knobs, check_ep_knobs, check_prefetch_runs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import Recipe, recipe_file
from hotsplit_cli.core.errors import PlanError, UsageError
from hotsplit_cli.core.jsonio import read_json_doc, schema_tag
from hotsplit_cli.hotset.budget import HotBudget, ReadRate, check_plan_budget, choose_read_rate, resolve_hot_budget
from hotsplit_cli.hotset.coldpath import fit_rates, predict_cold_paths
from hotsplit_cli.hotset.forecast import Band, HeldOut, rolling_origin
from hotsplit_cli.hotset.layer_compute import layer_compute_ms, slowest_compute
from hotsplit_cli.hotset.lookahead import load_lookahead
from hotsplit_cli.hotset.planner import Plan, contiguous_owner, plan_hot_set
from hotsplit_cli.hotset.precision_plan import (
    PrecisionChoice,
    auto_plan,
    check_auto_inputs,
    routed_probs,
    uniform_choice,
)
from hotsplit_cli.hotset.prefetch_plan import PrefetchPlan, carved_for_run, prefetch_for_plan
from hotsplit_cli.hotset.ranktime import hot_slots, physical_plan, rank_times, slot_probs
from hotsplit_cli.hotset.sizes import (
    PRECISIONS,
    check_mxfp4_shape,
    expert_bytes_per_rank,
    expert_compute_shape,
    precision_bytes,
)
from hotsplit_cli.placement.dispatch import contiguous_placement, placed_hit_rates
from hotsplit_cli.placement.file import load_placement
from hotsplit_cli.traffic.hist import Histogram, file_sha256, load_hist
from hotsplit_cli.traffic.recipe_match import check_hist_matches_recipe
from hotsplit_cli.traffic.trace import check_trace_file, replay_file

if TYPE_CHECKING:
    from hotsplit_cli.placement.algorithm import Placement

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class ColdCost:
    """Predicted cold traffic per decode step at one batch size (tokens per step)."""

    batch: int
    cold_experts: float  # expected distinct cold experts touched per step, all layers
    cold_bytes: float  # bytes read over PCIe per step per rank
    cold_ms: float | None  # cold_bytes at the measured zero-copy read rate


def plan_for_recipe(hist: Histogram, recipe: Recipe, budget_bytes: int, precision: str = "native") -> Plan:
    """TP: one hot set for every rank. EP: each EP group ranks only the experts it owns. Every
    expert stored at `precision`. `hist` is already checked against the recipe (make_plan)."""
    return plan_counts_for_recipe(hist.counts_LE, recipe, budget_bytes, precision)


def plan_counts_for_recipe(counts_LE: np.ndarray, recipe: Recipe, budget_bytes: int, precision: str = "native") -> Plan:
    """`plan_for_recipe` on counts [L, E] (a histogram's, or some of its windows')."""
    size = expert_bytes_per_rank(recipe, precision)
    ep = recipe.parallel.ep
    if ep == 1:
        return plan_hot_set(counts_LE, size, budget_bytes)
    owner = contiguous_owner(*np.shape(counts_LE), ep)
    return plan_hot_set(counts_LE, size, budget_bytes, rank_of_LE=owner, num_ranks=ep)


def physical_plan_for(hist: Histogram, recipe: Recipe, budget_bytes: int, placement, precision: str = "native") -> Plan:
    """EP with a placement (replicas): each rank plans among the physical experts placed on it, a
    logical expert's traffic split evenly over its replicas; hot_RLE is [R, L, P] (logical_plan
    names the hot sets by logical ids). `hist` is already checked against the recipe (make_plan)."""
    check_placement_fits(hist, recipe, placement)
    return physical_plan(hist.counts_LE, placement, expert_bytes_per_rank(recipe, precision), budget_bytes)


def logical_plan(phys: Plan, placement, num_experts: int) -> Plan:
    """A physical plan's hot sets in logical ids: e is hot on r when any of r's replicas of e is."""
    R, L = placement.num_ranks, placement.phy2log_LP.shape[0]
    hot = np.zeros((R, L, num_experts), dtype=bool)
    r_idx, l_idx, p_idx = np.nonzero(phys.hot_RLE)
    hot[r_idx, l_idx, placement.phy2log_LP[l_idx, p_idx]] = True
    return replace(phys, hot_RLE=hot)


def check_placement_fits(hist: Histogram, recipe: Recipe, placement) -> None:
    """PlanError unless the placement is of this histogram's layers, for an EP recipe of as many ranks."""
    if tuple(placement.layers) != tuple(hist.layers):
        raise PlanError(f"placement layers {placement.layers[:3]}... differ from the histogram's "
                        f"{hist.layers[:3]}...", "create the placement from this histogram with `hotsplit place`")
    if recipe.parallel.tp != 1:
        raise PlanError(f"--placement is for expert parallelism, but recipe {recipe.name!r} "
                        f"has tp={recipe.parallel.tp}",
                        "use a recipe with tp: 1 and ep > 1 (e.g. the shipped deepseek-v3-ep8)")
    if placement.num_ranks != recipe.parallel.ep:
        # The recipe's hardware and dense weights are per rank of its own layout: its budget
        # would not fit a placement on another number of ranks.
        raise PlanError(f"the placement spreads the experts over {placement.num_ranks} ranks, recipe "
                        f"{recipe.name!r} has ep={recipe.parallel.ep}",
                        f"place with --ranks {recipe.parallel.ep}, or use a recipe with ep: {placement.num_ranks}")


def plan_on_placement(counts_LE: np.ndarray, placement, expert_bytes: int, budget_bytes: int) -> Plan:
    """Each rank's hot set among the physical experts placed on it, `counts_LE` split evenly over
    the replicas; hot_RLE in logical ids (e hot on rank r when r's replica of e is hot)."""
    return logical_plan(physical_plan(counts_LE, placement, expert_bytes, budget_bytes), placement,
                        np.shape(counts_LE)[1])


def routing_probs(hist: Histogram) -> np.ndarray:
    """pi [L, E]: the chance one token routes to expert e of layer l (top_k x its share in the layer)."""
    return routed_probs(hist.counts_LE, hist.top_k)


def rank0_experts(hist: Histogram, recipe: Recipe, placement=None) -> np.ndarray:
    """bool [L, E]: the logical experts rank 0 holds (all of them under TP; its share under EP:
    the contiguous default layout, or the experts of its replicas in `placement`)."""
    L, E = hist.num_layers, hist.num_experts
    if placement is not None:
        return placement.held_LE(0, E)
    return contiguous_owner(L, E, recipe.parallel.ep) == 0


def cold_costs(hist: Histogram, hot_LE: np.ndarray, expert_bytes: int | np.ndarray, read_gbps: float | None,
               batches=BATCH_SIZES) -> list[ColdCost]:
    """Expected distinct cold experts per decode step: sum over cold e of 1 - (1 - pi_e)^B,
    where pi_e = top_k x share of e in its layer is the chance one token routes to e; their
    bytes at each expert's stored bytes (`expert_bytes`: one figure, or [L, E])."""
    cold_pi = routing_probs(hist)[~hot_LE]
    cold_size = np.broadcast_to(np.asarray(expert_bytes, dtype=np.float64), hot_LE.shape)[~hot_LE]
    out = []
    for b in batches:
        touched = 1.0 - (1.0 - cold_pi) ** b
        n = float(touched.sum())
        nbytes = float((touched * cold_size).sum())
        ms = nbytes / (read_gbps * 1e9) * 1e3 if read_gbps else None
        out.append(ColdCost(b, n, nbytes, ms))
    return out


@dataclass(frozen=True)
class PlanResult:
    """A plan and everything it was made from: what `plan` prints and writes (`plan_doc`)."""

    hist: Histogram
    hist_path: Path
    recipe: Recipe
    knobs: Knobs
    plan: Plan
    budget: HotBudget
    rate: ReadRate  # what the cold reads are predicted at
    costs: list[ColdCost] | None  # predicted cold reads per decode step, with a platform or a stated rate
    platform_path: Path | None = None
    placement: Placement | None = None
    placement_path: Path | None = None
    cold_paths: dict | None = None  # each cold path's predicted time per decode step (with a platform)
    rank_times: list | None = None  # ranktime.RankTimes per batch: every rank's cold reads (placement + rate)
    held_out: HeldOut | None = None  # the hit rate on traffic the plan has not seen (rolling origin)
    precision: PrecisionChoice | None = None  # every expert's stored precision and its expected error
    prefetch: PrefetchPlan | None = None  # whether staging slots pay, and how many (a platform, one rank)


def make_plan(hist_path: Path, recipe: Recipe, knobs: Knobs, platform_path: Path | None = None,
              placement_path: Path | None = None, warn: Callable[[str], None] = lambda message: None,
              max_error: float | None = None) -> PlanResult:
    """Plan the hot set of every rank and each expert's stored precision (the `precision` knob;
    `auto` within `max_error`): the histogram checked against the recipe, the budget and
    the read rate by the one rule (`budget.py`), a placement's physical experts when given, and
    the predicted cold cost. `warn(message)` is told each warning as it arises."""
    hist = load_hist(hist_path)
    for warning in check_hist_matches_recipe(hist, recipe, hist_path):
        warn(warning)
    quality = hist.quality  # read strictly with the histogram
    lookahead = load_lookahead(hist, str(hist_path))
    if knobs.precision == "auto":
        check_auto_inputs(quality, max_error, hist_path, placement_path)
    platform = None
    if platform_path is not None:
        platform = load_platform(platform_path)
    budget = resolve_hot_budget(recipe, knobs, platform)
    if budget.over_gpu:
        warn(f"{budget.over_gpu}; planned anyway (for a larger GPU?)")
    layout = None
    if placement_path is not None:
        layout = load_placement(placement_path)
    plan, phys, choice = _plan_precision(hist, recipe, knobs.precision, budget.budget_bytes, layout,
                                         (quality, max_error))
    rate = choose_read_rate(recipe, platform)
    size = choice.sizes_LE if knobs.precision == "auto" else expert_bytes_per_rank(recipe, knobs.precision)
    # Rank 0 reads cold only the experts placed on it: under EP the others are another rank's reads.
    not_cold_LE = plan.hot_RLE[0] | ~rank0_experts(hist, recipe, layout)
    prefetch = None  # staging slots are priced for one rank at one stored precision
    if platform is not None and layout is None and recipe.parallel.ep == 1 and rate.zero_copy_gbps \
            and knobs.precision != "auto":
        prefetch = prefetch_for_plan(hist, lookahead, knobs, rate, budget.budget_bytes,
                                     ColdAt(hist, recipe, size, rate.gbps, precision=knobs.precision),
                                     compute_for_prefetch(platform, recipe, hist, not_cold_LE, size))
    hot_budget = budget.budget_bytes - carved_for_run(prefetch, knobs, hist.num_layers, size)
    if hot_budget < budget.budget_bytes:  # a run that stages takes the planned slots from this budget
        plan, phys, choice = _plan_precision(hist, recipe, knobs.precision, hot_budget, layout, (quality, max_error))
        plan = replace(plan, budget_bytes=budget.budget_bytes)  # the budget the slots are carved from
        not_cold_LE = plan.hot_RLE[0] | ~rank0_experts(hist, recipe, layout)
    for warning in plan_warnings(hist, recipe, plan, layout, knobs.precision):
        warn(warning)
    timed = platform is not None or rate.gbps
    costs = times = None
    if timed and layout is not None and rate.gbps:
        times = placement_times(hist, layout, phys, size, rate.gbps)
        # One model for every rank: rank 0's reads are its row of the per-rank times (replicas
        # read at their share of the expert's traffic).
        costs = [ColdCost(t.batch, float(t.cold_experts_R[0]), float(t.cold_experts_R[0]) * size,
                          float(t.rank_ms_R[0])) for t in times]
    elif timed:
        costs = cold_costs(hist, not_cold_LE, size, rate.gbps)
    cold_paths = None
    if platform is not None:
        # Rank 0's experts as they are read: its physical slots, a replica at its share of the traffic.
        pi, hot = (routing_probs(hist), not_cold_LE) if layout is None else rank0_slots(hist, layout, phys)
        cold_paths = cold_path_prediction(hist, hot, recipe, platform, warn, pi_LE=pi, stored_bytes=size)
    held = held_out_hit_rates(hist, recipe, hot_budget, layout, choice)
    return PlanResult(hist, hist_path, recipe, knobs, plan, budget, rate, costs, platform_path, layout,
                      placement_path, cold_paths, times, held, choice, prefetch)


def compute_for_prefetch(platform, recipe: Recipe, hist: Histogram, hot_LE: np.ndarray,
                         expert_bytes: int) -> list[float] | None:
    """A layer's compute ms at each planned batch on the platform's slowest GPU (layer_compute.py);
    None when the platform file records no compute rate."""
    gpu, _ = slowest_compute(platform)
    return None if gpu is None else layer_compute_ms(gpu, recipe, hist, hot_LE, expert_bytes, BATCH_SIZES)


@dataclass(frozen=True)
class ColdAt:
    """Cold experts per step at each batch for the hot set planned at a budget (prefetch's carving)."""

    hist: Histogram
    recipe: Recipe
    expert_bytes: int
    read_gbps: float
    batches: tuple[int, ...] = BATCH_SIZES
    precision: str = "native"  # the stored precision the hot set is planned at

    def __call__(self, budget_bytes: int) -> list[float]:
        hot = plan_counts_for_recipe(self.hist.counts_LE, self.recipe, budget_bytes, self.precision).hot_RLE[0]
        return [c.cold_experts for c in cold_costs(self.hist, hot, self.expert_bytes, self.read_gbps, self.batches)]


def _plan_precision(hist: Histogram, recipe: Recipe, precision: str, budget_bytes: int, layout,
                    errors: tuple) -> tuple[Plan, Plan | None, PrecisionChoice]:
    """The plan (logical ids), its physical plan on a placement, and every expert's precision:
    `auto` chosen with the hot set, else one precision for all. `errors`: (quality, max_error)."""
    quality, max_error = errors
    if precision == "auto":
        plan, choice = auto_plan(hist.counts_LE, hist.top_k, recipe, budget_bytes, quality, max_error)
        return plan, None, choice
    choice = uniform_choice(hist.counts_LE, recipe, precision, quality, max_error)
    if layout is None:
        return plan_for_recipe(hist, recipe, budget_bytes, precision), None, choice
    phys = physical_plan_for(hist, recipe, budget_bytes, layout, precision)
    return logical_plan(phys, layout, hist.num_experts), phys, choice


def held_out_hit_rates(hist: Histogram, recipe: Recipe, budget_bytes: int, placement=None,
                       choice: PrecisionChoice | None = None) -> HeldOut:
    """The plan's planner refitted on the histogram's earlier windows and judged on later ones
    (forecast.rolling_origin); per rank with a placement (its replicas' hot sets refitted, the
    placement itself kept as given). `choice`: the precision plan (auto refits the joint plan)."""
    precision = choice.knob if choice is not None else "native"
    if precision == "auto":
        return rolling_origin(hist.windows_WLE, lambda c: auto_plan(
            c, hist.top_k, recipe, budget_bytes, choice.quality, choice.max_error)[0].hot_RLE)
    if placement is None:
        return rolling_origin(hist.windows_WLE,
                              lambda c: plan_counts_for_recipe(c, recipe, budget_bytes, precision).hot_RLE)

    size = expert_bytes_per_rank(recipe, precision)
    return rolling_origin(hist.windows_WLE, lambda c: plan_on_placement(c, placement, size, budget_bytes).hot_RLE,
                          lambda c, hot: placed_hit_rates(c, placement, hot))


def rank0_slots(hist: Histogram, placement, phys: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Rank 0's physical slots [L, S]: the chance one token reaches each, and whether it is hot."""
    S = placement.slots_per_rank
    return slot_probs(routing_probs(hist), placement)[:, :S], hot_slots(phys, placement)[:, :S]


def placement_times(hist: Histogram, placement, phys: Plan, expert_bytes: int, read_gbps: float,
                    batches=BATCH_SIZES) -> list:
    """ranktime.RankTimes of every rank at each batch size, for a physical plan of `placement`."""
    hot_LP, pi_LE = hot_slots(phys, placement), routing_probs(hist)
    return [rank_times(pi_LE, placement, hot_LP, expert_bytes, read_gbps, b) for b in batches]


def plan_warnings(hist: Histogram, recipe: Recipe, plan: Plan, placement=None, precision: str = "native") -> list[str]:
    """What a planner should say about a plan that looks better or worse than it is: experts the
    histogram never saw (a small sample), an empty budget, and replicas that cost hot bytes."""
    out = []
    unseen = int((hist.counts_LE == 0).sum())
    if unseen:
        out.append(f"the histogram never saw {unseen} of {hist.counts_LE.size} experts ({hist.tokens} tokens): "
                   f"the hit rate counts only the routing it saw; capture more tokens for a plan to trust")
    if plan.budget_bytes == 0:
        out.append("hot budget 0: no expert is hot and every routed assignment is read cold (hit rate 0%)")
    if placement is not None and placement.num_physical > hist.num_experts:
        plain = plan_for_recipe(hist, recipe, plan.budget_bytes, precision)
        out.append(f"the placement's {placement.num_physical - hist.num_experts} redundant replicas per layer take "
                   f"hot bytes on their ranks: hit rate {100 * plan.hit_rate:.2f}% vs {100 * plain.hit_rate:.2f}% "
                   f"for the same budget without replicas")
    return out


def _ranks_doc(plan, layers, tp: int, ep: int) -> list[dict]:
    """Each rank's hot experts per layer; the TP shards of one EP group hold the same experts."""
    ranks = []
    for r in range(tp * ep):
        group = r // tp
        hot = plan.hot_RLE[group]
        ranks.append({
            "rank": r,
            "ep_group": group,
            "hot": {str(layer): np.flatnonzero(hot[i]).tolist() for i, layer in enumerate(layers)},
            "hot_experts": int(hot.sum()),
            "hot_bytes": int(plan.hot_bytes_R[group]),
            "method": plan.methods[group],
        })
    return ranks


def plan_doc(result: PlanResult) -> dict:
    """The plan.json document. Layer keys are model layer ids as strings; expert ids ascending."""
    hist, recipe, plan, placement = result.hist, result.recipe, result.plan, result.placement
    choice = result.precision
    auto = choice is not None and choice.knob == "auto"
    # One figure when every expert is stored alike; per expert in `precision.by_layer` under auto.
    size = None if auto else expert_bytes_per_rank(recipe, choice.knob if choice else "native")
    tp, ep = recipe.parallel.tp, (placement.num_ranks if placement is not None else recipe.parallel.ep)
    ranks = _ranks_doc(plan, hist.layers, tp, ep)
    budget = result.budget
    doc = {
        "schema": schema_tag("plan"),
        "histogram": {"path": str(result.hist_path), "sha256": file_sha256(result.hist_path), "model": hist.model,
                      "source": hist.source, "tokens": hist.tokens},
        "recipe": recipe.name,
        **({"recipe_path": path} if (path := recipe_file(recipe)) else {}),  # a recipe YAML of the user's
        "model": recipe.model.name,
        "parallel": {"tp": tp, "ep": ep, "ranks": tp * ep},
        "hot_gib": budget.hot_gib,
        "budget_bytes": plan.budget_bytes,
        "budget_source": budget.origin,
        "budget_derivation": budget.derivation.to_doc() if budget.derivation else None,
        "knobs": result.knobs.to_doc(),
        "expert_bytes": size,
        "expert_dtype": recipe.model.expert_dtype,
        "layers": list(hist.layers),
        "ranks": ranks,
        "hit_rate": plan.hit_rate,  # in-sample: on the histogram it was fitted on
        "out_of_sample": result.held_out.to_doc() if result.held_out else None,
        "layer_hit_rate": {str(layer): float(plan.layer_hit_rate_L[i]) for i, layer in enumerate(hist.layers)},
        "greedy_hit_rate": plan.greedy_hit_rate,
        "certified_optimal": plan.certified,
        "bound": {"hit_rate": plan.bound_hit_rate, "gap": plan.gap, "kind": "LP relaxation (fractional knapsack)"},
    }
    if choice is not None:
        doc["precision"] = choice.to_doc(plan.hot_RLE.any(axis=0), hist.layers, routing_probs(hist))
    if auto:  # the joint plan is bounded in bytes per step, not in hit rate
        doc["bound"] = doc["precision"]["bound"]
    if placement is not None:
        doc["placement"] = {"path": str(result.placement_path), "sha256": file_sha256(result.placement_path),
                            "physical_experts": placement.num_physical}
        # What each rank is expected to serve hot of what it receives (traffic split evenly over replicas).
        for r, rate in enumerate(placed_hit_rates(hist.counts_LE, placement, plan.hot_RLE)):
            ranks[r]["hit_rate"] = float(rate)
            if result.held_out is not None and result.held_out.ranks:
                ranks[r]["out_of_sample"] = result.held_out.ranks[r].to_doc()
    doc.update(_platform_doc(result))
    return doc


def _platform_doc(result: PlanResult) -> dict:
    """What plan.json predicts from a platform: decode cost, cold paths, rank times, prefetch."""
    doc = {}
    if result.costs is not None:
        doc["platform"] = str(result.platform_path) if result.platform_path else None
        doc["decode_cost_read_gbps"] = {"gbps": result.rate.gbps, "source": result.rate.source}
        doc["decode_cost"] = [  # expected distinct cold experts read per step, per rank
            {"batch": c.batch, "cold_experts": c.cold_experts, "cold_bytes": c.cold_bytes, "cold_read_ms": c.cold_ms}
            for c in result.costs
        ]
    if result.cold_paths is not None:
        doc["cold_paths"] = result.cold_paths
    if result.rank_times is not None:
        doc["rank_times"] = [t.to_doc() for t in result.rank_times]  # step_ms: sum over layers of the slowest rank
    if result.prefetch is not None:
        doc["prefetch"] = result.prefetch.to_doc()
    return doc


def recipe_cold_rates(recipe: Recipe, platform, warn: Callable[[str], None], stored_bytes=None):
    """platform.json's cold-path rates for the recipe's experts (coldpath.fit_rates) and the bytes
    of one expert they time (the probe's, else `stored_bytes`: one figure or [L, E], else the
    native bytes); `warn` is told, in one line, when the probe timed other experts."""
    fitted = fit_rates(platform, *expert_compute_shape(recipe))
    if fitted.mismatch:
        warn(f"{fitted.mismatch}: the cpu and split times are for other experts; re-probe with "
             f"`hotsplit probe --recipe {recipe.name} -o {platform.path}`")
    if fitted.compute_bytes:
        return fitted, fitted.compute_bytes
    return fitted, expert_bytes_per_rank(recipe) if stored_bytes is None else stored_bytes


def cold_path_prediction(hist: Histogram, hot_LE: np.ndarray, recipe: Recipe, platform,
                         warn: Callable[[str], None] = lambda message: None, pi_LE: np.ndarray | None = None,
                         stored_bytes=None) -> dict:
    """plan.json's `cold_paths`: predicted cold time per decode step of gpu / cpu / split at each
    batch size, from platform.json's measured rates (coldpath.fit_rates), and the fastest path at
    each. `warn` is told when the probe timed experts of another shape than the recipe's."""
    fitted, size = recipe_cold_rates(recipe, platform, warn, stored_bytes)
    pi = routing_probs(hist) if pi_LE is None else pi_LE  # [L, E], or [L, slots] of a placed rank
    times = predict_cold_paths(pi, hot_LE, size, fitted.rates, BATCH_SIZES)
    doc = {"rates": fitted.where, "spread": fitted.rates.spread, "by_batch": [t.to_doc() for t in times]}
    if fitted.compute_bytes:
        doc["compute_expert_bytes"] = fitted.compute_bytes
    return doc


@dataclass(frozen=True)
class PlanFile:
    """A plan read back (for `run --plan` and `simulate --plan`)."""

    path: Path
    layers: tuple[int, ...]  # model layer ids with a hot set
    hot_by_rank: tuple[dict[int, tuple[int, ...]], ...]  # rank -> model layer id -> expert ids
    hit_rate: float | None  # in-sample: on the histogram the plan was fitted on
    expert_bytes: int | None
    budget_bytes: int | None
    made_from: str | None = None  # the histogram the plan was made from, as a user reads it
    recipe: str | None = None  # the recipe it was made with
    placement: dict | None = None  # {"path", "sha256"} of the placement an EP plan was made on
    rank_hit_rates: tuple[float | None, ...] = ()  # each rank's in-sample hit rate (EP plans)
    out_of_sample: Band | None = None  # the forecast on new traffic; None: the plan has none (no windows, older plan)
    rank_out_of_sample: tuple[Band | None, ...] = ()  # each rank's (plans on a placement)
    histogram: dict | None = None  # {"path", "sha256", ...} of the histogram it was fitted on
    precision: str = "native"  # the precision knob it was planned at (plans without one: native)
    precision_by_layer: dict[int, dict[str, tuple[int, ...]]] | None = None  # auto: layer id -> precision -> ids
    expected_error: float | None = None  # routing-share-weighted expert error at its precisions; None: not measured
    prefetch: tuple[int, str, str] | None = None  # (slots, pool, reason) `plan --platform` chose; None: not judged

    @property
    def expected_hit_rate(self) -> float | None:
        """What the plan expects on traffic it has not seen (never the in-sample figure)."""
        return None if self.out_of_sample is None else self.out_of_sample.expected

    def precision_LE(self, layers, num_experts: int) -> np.ndarray:
        """str [L, E]: each expert's stored precision (native, fp8 or mxfp4), rows in the order of
        `layers`; PlanError when an auto plan leaves an expert out or names one twice."""
        if self.precision_by_layer is None:
            return np.full((len(layers), num_experts), self.precision, dtype=object)
        out = np.full((len(layers), num_experts), None, dtype=object)
        for i, lid in enumerate(layers):
            for name, ids in self.precision_by_layer.get(int(lid), {}).items():
                if any(e >= num_experts or out[i, e] is not None for e in ids):
                    raise PlanError(f"{self.path}: `precision.by_layer[{lid}]` names an expert twice or beyond "
                                    f"{num_experts - 1}", "re-create it with `hotsplit plan`")
                out[i, list(ids)] = name
            if (out[i] == None).any():  # noqa: E711 (elementwise)
                raise PlanError(f"{self.path}: `precision.by_layer[{lid}]` leaves experts without a precision",
                                "re-create it with `hotsplit plan`")
        return out

    def hot_LE(self, layers, num_experts: int, rank: int = 0, model: str = "the model") -> np.ndarray:
        """Boolean hot mask [L, E] of one rank, rows in the order of `layers` (model layer ids)."""
        rows = {int(lid): i for i, lid in enumerate(layers)}
        top = max((max(ids) for ids in self.hot_by_rank[rank].values() if ids), default=-1)
        misfit = top >= num_experts or not set(self.hot_by_rank[rank]) <= set(rows)
        if self.recipe and self.recipe != model and misfit:
            raise PlanError(f"{self.path}: a plan for recipe {self.recipe!r} (expert ids up to {top}, MoE layers "
                            f"{min(self.layers)}..{max(self.layers)}) but recipe {model!r} has {num_experts} experts "
                            f"per layer in MoE layers {min(rows)}..{max(rows)}",
                            f"use the recipe the plan was made for, or plan for {model!r} with `hotsplit plan`")
        hot = np.zeros((len(rows), num_experts), dtype=bool)
        for lid, ids in self.hot_by_rank[rank].items():
            if lid not in rows:
                raise PlanError(f"{self.path}: `ranks[{rank}].hot[{lid}]`: layer {lid} is not a MoE layer of "
                                f"{model} ({list(rows)})", "was the plan made for this recipe?")
            bad = [e for e in ids if e >= num_experts]
            if bad:
                raise PlanError(f"{self.path}: `ranks[{rank}].hot[{lid}]` names {bad[0]}, which is not an expert id "
                                f"in [0, {num_experts})")
            hot[rows[lid], list(ids)] = True
        return hot


def load_plan(path: str | os.PathLike) -> PlanFile:
    """Read and check a `hotsplit.plan/1` file; errors name the field."""
    doc = read_json_doc(path, "plan")
    ranks = doc.get("ranks")
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        raise PlanError(f"{path}: `ranks` must be a non-empty list of objects", "re-create it with `hotsplit plan`")
    hot_by_rank = []
    for r, rank in enumerate(ranks):
        hot = rank.get("hot")
        if not isinstance(hot, dict):
            raise PlanError(f"{path}: `ranks[{r}].hot` must map layer ids to expert lists")
        by_layer: dict[int, tuple[int, ...]] = {}
        for key, ids in hot.items():
            try:
                lid = int(key)
            except ValueError:
                raise PlanError(f"{path}: `ranks[{r}].hot` key {key!r} is not a layer id") from None
            if not isinstance(ids, list) or not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0
                                                    for e in ids):
                raise PlanError(f"{path}: `ranks[{r}].hot[{key}]` must be a list of expert ids (ints >= 0)")
            by_layer[lid] = tuple(ids)
        hot_by_rank.append(by_layer)

    def number(key: str, kind):
        v = doc.get(key)
        return kind(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    layers = doc.get("layers")
    layers = tuple(int(x) for x in layers) if isinstance(layers, list) else tuple(sorted(hot_by_rank[0]))
    placement = doc.get("placement")
    if placement is not None and not (isinstance(placement, dict) and isinstance(placement.get("path"), str)):
        raise PlanError(f"{path}: `placement` must be an object with the placement's `path`")
    if placement is not None:
        placement = {**placement, "path": str(find_beside(Path(path), placement["path"], placement.get("sha256")))}
    rates = tuple(float(r["hit_rate"]) if isinstance(r.get("hit_rate"), int | float) else None for r in ranks)
    return PlanFile(Path(path), layers, tuple(hot_by_rank), number("hit_rate", float),
                    number("expert_bytes", int), number("budget_bytes", int), _made_from(doc.get("histogram")),
                    doc.get("recipe") if isinstance(doc.get("recipe"), str) else None, placement, rates,
                    _band(doc.get("out_of_sample")), tuple(_band(r.get("out_of_sample")) for r in ranks),
                    hist if isinstance(hist := doc.get("histogram"), dict) and isinstance(hist.get("path"), str)
                    else None, *_precision_of(doc.get("precision"), path),
                    prefetch=_prefetch_of(doc.get("prefetch"), path))


def _prefetch_of(block: object, path) -> tuple[int, str, str] | None:
    """(slots, pool, reason) of a plan's `prefetch` block (plans judged without a platform have none)."""
    if block is None:
        return None
    slots, pool = (block.get("slots"), block.get("pool")) if isinstance(block, dict) else (None, None)
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 0 or pool not in PREFETCH_POOLS:
        raise PlanError(f"{path}: `prefetch` must hold `slots` (an int >= 0) and `pool` "
                        f"({' or '.join(PREFETCH_POOLS)})", "re-create it with `hotsplit plan --platform`")
    return slots, pool, str(block.get("reason", ""))


def _precision_of(block: object, path) -> tuple[str, dict[int, dict[str, tuple[int, ...]]] | None, float | None]:
    """(the knob, under auto each model layer's expert ids per precision, the expected error) of a
    plan's `precision` block; ("native", None, None) for plans made before precisions were planned."""
    if block is None:
        return "native", None, None
    knob = block.get("knob") if isinstance(block, dict) else None
    if knob not in PRECISION_KNOBS:
        raise PlanError(f"{path}: `precision.knob` must be one of {', '.join(PRECISION_KNOBS)}",
                        "re-create it with `hotsplit plan`")
    error = block.get("expected_error")
    if error is not None and (not isinstance(error, int | float) or isinstance(error, bool) or not error >= 0):
        raise PlanError(f"{path}: `precision.expected_error` must be a number >= 0 or null, got {error!r}",
                        "re-create it with `hotsplit plan`")
    if knob != "auto":
        return knob, None, error
    by_layer = block.get("by_layer")
    if not isinstance(by_layer, dict):
        raise PlanError(f"{path}: an auto plan must list each layer's experts per precision in `precision.by_layer`",
                        "re-create it with `hotsplit plan`")
    out = {}
    for key, groups in by_layer.items():
        if not key.isdigit() or not isinstance(groups, dict) or not set(groups) <= set(PRECISIONS) or not all(
                isinstance(ids, list) and all(type(e) is int and e >= 0 for e in ids) for ids in groups.values()):
            raise PlanError(f"{path}: `precision.by_layer[{key}]` must map {', '.join(PRECISIONS)} to expert ids",
                            "re-create it with `hotsplit plan`")
        out[int(key)] = {p: tuple(ids) for p, ids in groups.items()}
    return knob, out, error


def check_plan_precision(plan: PlanFile, knobs: Knobs) -> None:
    """UsageError when a plan made at one precision is used at another: its hot set was sized for
    the bytes of that precision, so it would overflow or waste the budget."""
    if plan.precision != knobs.precision:
        where = knobs.origin("precision")
        raise UsageError(f"{plan.path} was planned at precision {plan.precision}, but experts are stored at "
                         f"{knobs.precision} ({where})",
                         f"pass --precision {plan.precision} (or HOTSPLIT_PRECISION={plan.precision}), "
                         f"or re-plan at {knobs.precision}")


def stored_sizes(plan: PlanFile, recipe: Recipe, layers) -> np.ndarray:
    """int64 [L, E]: each expert's stored bytes per rank at the precision `plan` gives it (an auto
    plan's `precision.by_layer`, else its one precision), rows in the order of `layers`; the
    one-line reason when the recipe's shape cannot take one of them."""
    by_precision = precision_bytes(recipe)
    names_LE = plan.precision_LE(layers, recipe.model.num_experts)
    for name in sorted(set(names_LE.ravel()) - set(by_precision)):
        expert_bytes_per_rank(recipe, name)  # raises: says why the shape cannot take it
    return np.array([[by_precision[n] for n in row] for row in names_LE], dtype=np.int64)


def find_beside(plan_path: Path, recorded: str, sha256: str | None) -> Path:
    """The file a plan names (its placement): as recorded (relative to the folder the plan was
    made in), else relative to the plan's own folder, else beside the plan by name, so that a plan
    moved with its placement still finds it. With a recorded sha256 the first copy that matches
    wins; with none that exists, the recorded path (its reader then says it cannot be read)."""
    given = Path(recorded)
    here = plan_path.parent
    candidates = [given] if given.is_absolute() else [given, here / given]
    candidates.append(here / given.name)
    existing = [c for c in dict.fromkeys(candidates) if c.is_file()]
    for c in existing:
        if sha256 is None or file_sha256(c) == sha256:
            return c
    return existing[0] if existing else given


def check_run_inputs(recipe: Recipe, plan_path: Path | None, trace_path: Path | None,
                     knobs: Knobs | None = None) -> PlanFile | None:
    """What `run` reads, checked before anything is built: the EP-only flags fit the recipe
    (`knobs`), the plan exists, is a plan, fits the recipe and its number of ranks, and agrees
    with a budget the user gave; the trace
    exists and is a trace (its contents are checked as it is loaded). Returns the plan read, so
    that the run uses it instead of reading the file again."""
    plan = None
    if knobs is not None:
        check_ep_knobs(knobs, recipe.parallel.ep, recipe.name)
        if knobs.precision == "auto":
            check_auto_run(recipe, knobs, plan_path)
        if knobs.precision == "mxfp4":  # before the host check sizes the banks at mxfp4
            check_mxfp4_shape(recipe, UsageError)
        check_prefetch_runs(knobs, recipe.model.kind, recipe.parallel.ep,
                            replay_file(recipe, trace_path) is not None)
    if plan_path is not None:
        m = recipe.model
        plan = load_plan(plan_path)
        plan.hot_LE(m.moe_layer_ids, m.num_experts, model=recipe.name)
        check_plan_ranks(plan, recipe)
        if plan.placement is not None:  # the placement it names is there, unchanged, and fits
            placement_of_plan(plan, m.moe_layer_ids, m.num_experts, recipe.parallel.ep)
        if knobs is not None:
            check_plan_budget(knobs, plan)
            check_plan_precision(plan, knobs)
            if knobs.precision == "auto":
                check_auto_layout(plan, recipe)
    if trace_path is not None:
        check_trace_file(trace_path)
    return plan


AUTO_NEEDS_PLAN = ("{where} auto: run stores each expert at the precision an auto plan chose for it, "
                   "and no --plan was given")


def check_auto_run(recipe: Recipe, knobs: Knobs, plan_path: Path | None) -> None:
    """UsageError unless a run at precision auto can store an auto plan's precisions: on one rank,
    with the plan, the device reading cold experts (no CPU cold path) and no staging rows (sized
    for one stored precision)."""
    where = knobs.origin("precision")
    if plan_path is None:
        raise UsageError(AUTO_NEEDS_PLAN.format(where=where),
                         "pass --plan made with `hotsplit plan --precision auto --max-error E`")
    if recipe.parallel.ep > 1:
        raise UsageError(f"{where} auto runs on one rank, and recipe {recipe.name!r} has ep {recipe.parallel.ep}",
                         "run a uniform --precision under expert parallelism, or a recipe with ep: 1")
    if knobs.cold_path != "gpu":
        raise UsageError(f"cold_path {knobs.cold_path}: the CPU cold path computes experts of one stored precision, "
                         f"and precision auto ({where}) stores several", "use cold_path gpu")
    if knobs.prefetch != "off":
        raise UsageError(f"prefetch {knobs.prefetch}: staging slots are sized for one stored precision, and "
                         f"precision auto ({where}) stores several", "run prefetch with a uniform --precision")


def check_auto_layout(plan: PlanFile, recipe: Recipe) -> None:
    """PlanError unless an auto plan gives a precision to every expert of the recipe's MoE layers
    and to no other layer (a plan for another model would store the wrong experts)."""
    m = recipe.model
    plan.precision_LE(m.moe_layer_ids, m.num_experts)  # raises: an expert left out, named twice or beyond E
    extra = sorted(set(plan.precision_by_layer or {}) - {int(lid) for lid in m.moe_layer_ids})
    if extra:
        raise PlanError(f"{plan.path}: `precision.by_layer` names layer {extra[0]}, which recipe {recipe.name!r} has "
                        f"no MoE layer at (its MoE layers: {min(m.moe_layer_ids)}..{max(m.moe_layer_ids)})",
                        "re-create the plan with `hotsplit plan --precision auto` for this model")


def _band(block: object) -> Band | None:
    """A forecast block of plan.json (`out_of_sample`); None when absent (older plans), not
    available (no windows) or not three numbers."""
    if not isinstance(block, dict):
        return None
    values = [block.get(k) for k in ("expected", "low", "high")]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return None
    return Band(*(float(v) for v in values))


def check_plan_ranks(plan: PlanFile, recipe: Recipe) -> None:
    """PlanError unless the plan has one hot set per rank of the recipe: an EP plan's rank 0 holds
    only the experts placed on it, so on one rank it would serve a fraction of what it promises."""
    tp, ep = recipe.parallel.tp, recipe.parallel.ep
    have, want = len(plan.hot_by_rank), tp * ep  # `plan` writes one hot set per rank, tp x ep of them
    if have != want:
        shape = f" (tp {tp} x ep {ep})" if tp > 1 else ""
        raise PlanError(f"{plan.path}: a plan for {have} ranks; recipe {recipe.name!r} runs on {want}{shape}",
                        f"plan with a recipe of ep {ep}" if ep > 1 else "plan with this recipe")


def _made_from(hist: object) -> str | None:
    """`histogram PATH (its source)` from a plan's `histogram` block; None when it has none."""
    if not isinstance(hist, dict) or not isinstance(hist.get("path"), str):
        return None
    source = hist.get("source")
    return f"histogram {hist['path']}" + (f" ({source})" if isinstance(source, str) and source else "")


def placement_of_plan(plan: PlanFile | None, layers, num_experts: int, ep: int) -> Placement:
    """The placement an EP plan was made on (its recorded file, unchanged), else (or without a
    plan) the contiguous layout. One-line errors when the file is gone, changed, or does not fit
    the recipe."""
    if plan is None or plan.placement is None:
        return contiguous_placement(layers, num_experts, ep)
    where = plan.placement["path"]
    try:
        sha = file_sha256(where)
    except OSError:
        raise PlanError(f"{plan.path}: its placement {where} cannot be read",
                        "keep the placement beside the plan (or where it was), or re-plan with --placement") from None
    if plan.placement.get("sha256") not in (None, sha):
        raise PlanError(f"{plan.path}: its placement {where} changed since the plan was made",
                        "re-plan with `hotsplit plan --placement`")
    placement = load_placement(where)
    if placement.num_ranks != ep or tuple(placement.layers) != tuple(layers):
        raise PlanError(f"{plan.path}: its placement {where} spreads layers {list(placement.layers)[:3]}... over "
                        f"{placement.num_ranks} ranks; the recipe has ep={ep} and MoE layers {list(layers)[:3]}...",
                        "place and plan for this recipe")
    return placement
