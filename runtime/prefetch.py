"""Prefetch into staging slots, the runtime's side: what a step stages for each layer is decided
on the host from what is known while the layer before computes, and the banks copy those experts
into their staging rows on the swap stream, each layer waiting only for its own copies
(runtime/bank.py); the counters are kept under `simulate`'s names. `Stager`: a synthetic model
replaying a trace (`prefetch trace`), every layer decided before the step by the very code
`simulate` replays (`analysis/prefetch.stage_step`). `StepStager`: decided inside the step, layer
by layer, as each layer's predictor input exists: router lookahead (lookahead_stage.py) and the
trace predictor on a checkpoint (hf/trace_stage.py).

The staging rows are rows of each predicted layer's bank (layer index >= 1): `slots` of them per
layer whichever the pool. With a shared pool the decisions keep to `slots` experts staged for two
consecutive layers together, as `simulate` models it, but each bank holds its own `slots` rows,
so the device holds `slots x (L - 1)` rows (`StagingPool.device_rows`): more than the `slots` the
plan carves from the hot budget. Shape letters: L = MoE layers, T = tokens, K = top_k, E = experts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hotsplit_cli.analysis.prefetch import (
    StagingConfig,
    StagingTotals,
    carved_bytes,
    fit_staging_predictor,
    stage_step,
    staged_counts,
    staging_config,
    staging_doc,
)
from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.core.units import gib
from hotsplit_cli.hotset.budget import HotBudget
from hotsplit_cli.hotset.planfile import PlanFile
from hotsplit_cli.traffic.predict import NextLayerPredictor, members_NLE, token_members_NLE
from hotsplit_cli.traffic.trace import Trace


@dataclass(frozen=True)
class StagingPool:
    config: StagingConfig
    num_layers: int  # MoE layers
    expert_bytes: int  # real bytes of one expert

    @property
    def device_rows(self) -> int:
        """Staging rows the banks hold together: `slots` in each predicted layer's bank."""
        return self.config.slots * (self.num_layers - 1)

    @property
    def carved_bytes(self) -> int:
        """Real bytes the pool takes from the hot budget (what `plan` and `simulate` carve)."""
        return self.config.carved_slots(self.num_layers) * self.expert_bytes

    def notes(self) -> list[str]:
        """What the run says of the pool: a shared pool's rows are held in every predicted layer."""
        c = self.config
        if c.pool != "shared" or self.num_layers <= 2 or c.slots == 0:
            return []
        return [f"prefetch_pool shared: staging keeps to {c.slots} slots across consecutive layers, as planned, but "
                f"each bank holds its own {c.slots} rows ({self.device_rows} in all, {self.device_rows - c.slots} "
                "more than the budget carves)"]

    def carved_from(self, budget_bytes: int) -> int:
        """Bytes the pool takes from a hot budget of `budget_bytes`; PlanError when they do not fit."""
        return carved_bytes(self.config, self.num_layers, self.expert_bytes, budget_bytes)


def staging_pool(recipe: Recipe, knobs: Knobs, expert_bytes: int) -> StagingPool | None:
    """The staging pool the prefetch knobs ask of a run (None: prefetch off or auto, nothing staged)."""
    if knobs.prefetch not in ("trace", "lookahead"):
        return None
    m = recipe.model
    return StagingPool(staging_config(knobs, m.num_experts, m.num_moe_layers), m.num_moe_layers, expert_bytes)


def carve_budget(budget: Callable[[], HotBudget], pool: StagingPool | None) -> Callable[[], HotBudget]:
    """The hot budget a hot set is planned at: `budget()` less the staging pool."""
    if pool is None:
        return budget

    def less() -> HotBudget:
        b = budget()
        return replace(b, budget_bytes=b.budget_bytes - pool.carved_from(b.budget_bytes))
    return less


def check_plan_leaves_pool(pool: StagingPool | None, hot_bytes: int, plan: PlanFile | None) -> None:
    """A plan's hot set (`hot_bytes`) and the staging pool must fit the plan's budget together."""
    if pool is None or plan is None or plan.budget_bytes is None:
        return
    if hot_bytes + pool.carved_from(plan.budget_bytes) > plan.budget_bytes:
        raise PlanError(f"{plan.path}: its hot set ({gib(hot_bytes)}) fills the budget the staging slots are "
                        f"carved from ({gib(plan.budget_bytes)})",
                        "plan at the budget less the slots, or run without --plan (planned here, carved)")


class Stager:
    """The staging decisions of a run, and its counters per window and in all."""

    def __init__(self, pool: StagingPool, predictor: NextLayerPredictor | None, fit_source: str, num_experts: int,
                 expert_bytes: int):
        self.pool, self.predictor, self.fit_source = pool, predictor, fit_source  # fit: as printed
        self.num_experts, self.expert_bytes = num_experts, expert_bytes  # real bytes of one expert
        self._window = np.zeros(3)  # prefetched, useful, staged hits: this window's
        self._total = np.zeros(3)

    def before_step(self, model, routed, use_graph: bool) -> np.ndarray | None:
        """Start copying what the step of `routed` (ids [L, T, K], weights) stages (bool [L, E]),
        decided from its routing before it runs; with a CUDA graph published before the replay."""
        if routed is None:
            return None
        staged_LE = self.choose(routed[0], model.served_hot_LE())
        model.stage(staged_LE)
        if use_graph:  # a replay runs no Python between layers: publish (after the copies) before it
            model.publish_staged()
        return staged_LE

    def after_step(self, model, routed, staged_LE: np.ndarray) -> None:
        """Count the step's staged experts against the routing it read."""
        self.count(routed[0], staged_LE)

    def choose(self, ids_LTK: np.ndarray, hot_LE: np.ndarray) -> np.ndarray:
        """bool [L, E]: what the step of routing `ids_LTK` (-1 = padding) stages, given the hot set it reads."""
        member_TLE = members_NLE(np.moveaxis(np.asarray(ids_LTK), 0, 1), self.num_experts)
        return stage_step(member_TLE, hot_LE, self.predictor, self.pool.config)

    def count(self, ids_LTK: np.ndarray, staged_LE: np.ndarray) -> None:
        """Add one step's staged experts against the routing it then read."""
        ids = np.asarray(ids_LTK, dtype=np.int64).reshape(len(staged_LE), -1)
        self.count_LE(np.stack([np.bincount(row[row >= 0], minlength=self.num_experts) for row in ids]), staged_LE)

    def count_LE(self, counts_LE: np.ndarray, staged_LE: np.ndarray) -> None:
        """Add one step's staged experts against its routed assignments per layer and expert [L, E]."""
        self._window += [x.sum() for x in staged_counts(counts_LE, staged_LE)]

    def close_window(self, steps: int, cold_reads: int, copies: int, hits: float, assigned: float) -> dict:
        """The window's counters (`simulate`'s names); `cold_reads`: distinct cold experts read,
        summed over its steps; `copies`: the swaps made after it; `hits`: served hot or staged."""
        doc = self._doc(self._window, steps, cold_reads, copies, hits, assigned)
        self._total += self._window
        self._window[:] = 0
        return doc

    def summary(self, steps: int, cold_reads: int, copies: int, hits: float, assigned: float) -> dict:
        """The whole run's counters, what the staging was and what it was fitted on."""
        c = self.pool.config
        return {"predictor": "cooccur", "fit": self.fit_source, "slots": c.slots, "pool": c.pool,
                "guesses": c.guesses, "carved_bytes": self.pool.carved_bytes,
                **self._doc(self._total, steps, cold_reads, copies, hits, assigned)}

    def _doc(self, sums: np.ndarray, steps: int, cold_reads: int, copies: int, hits: float, assigned: float) -> dict:
        totals = StagingTotals(int(sums[0]), int(sums[1]), float(sums[2]), int(cold_reads), int(copies), steps)
        return staging_doc(totals, hits, assigned, self.expert_bytes)


class StepStager(Stager):
    """A stager that decides inside the step, layer by layer, as each layer's input to its
    predictor exists (router lookahead, lookahead_stage.py; the trace predictor on a checkpoint,
    hf/trace_stage.py): `staged_LE` fills as the step runs and is counted after it."""

    def __init__(self, pool: StagingPool, predictor: NextLayerPredictor | None, fit_source: str, num_experts: int,
                 expert_bytes: int):
        super().__init__(pool, predictor, fit_source, num_experts, expert_bytes)
        self.staged_LE = np.zeros((pool.num_layers, num_experts), dtype=bool)

    def before_step(self, model, routed, use_graph: bool) -> np.ndarray:
        self.staged_LE = np.zeros_like(self.staged_LE)
        return self.staged_LE  # filled as the step runs

    def after_step(self, model, routed, staged_LE: np.ndarray) -> None:
        self.count_LE(model.last_step_counts_LE(), staged_LE)

    def stage_row(self, row: int, bank, experts: list[int]) -> None:
        """Copy `experts` (cold) into layer `row`'s bank's staging rows, for this step."""
        bank.stage(experts)
        self.staged_LE[row, experts] = True


def make_stager(trace: Trace, fit_path: Path | None, pool: StagingPool, num_experts: int, expert_bytes: int,
                window_steps: int) -> Stager:
    """The run's stager: the co-activation table fitted on `fit_path`'s trace, else on the
    replayed trace's first `window_steps` steps (as `simulate` fits it)."""
    member_NLE = token_members_NLE(trace, num_experts)
    predictor, source = fit_staging_predictor(trace, fit_path, member_NLE, min(window_steps, trace.num_steps))
    return Stager(pool, predictor, source, num_experts, expert_bytes)
