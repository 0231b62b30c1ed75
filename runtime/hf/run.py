"""`hotsplit run` on a real checkpoint: load it onto the hot/cold banks, plan, generate, log.

The hot set comes from `--plan` or is planned here from the routing of the prompts' prefill
(one calibration pass, counted exactly), with the recipe's real expert bytes and budget.
Shape letters: L = MoE layers, E = experts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.hotset.budget import resolve_hot_budget
from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.prompts import read_prompts

from ..cold_split import make_split
from ..log import HitRateRecord
from ..pinned import NumaPolicy
from ..rank_context import PlanChoice, plan_from_file
from ..run_setup import setup_run
from ..windows import RunSummary
from .capture import Generation, capture
from .loader import load_model, load_tokenizer
from .steps import CheckpointEngine, CheckpointMoE


@dataclass
class CheckpointRun:
    """What a checkpoint run produced: the texts, the same summary a synthetic run gives, and
    how the run was set up."""

    texts: list[str]
    summary: RunSummary
    plan_source: str
    plan_made_from: str  # the routing the hot set was chosen on
    hot_experts: int
    device: str
    kernel: str  # how the routed experts were computed
    numa: NumaPolicy  # where the cold bank was placed, and where its pages are

    def to_doc(self) -> dict:
        return {**self.summary.to_doc(), "plan_source": self.plan_source, "plan_made_from": self.plan_made_from,
                "hot_experts": self.hot_experts,
                "device": self.device, "kernel": self.kernel, "numa": self.numa.to_doc(), "texts": self.texts}


def checkpoint_prompts(recipe: Recipe) -> list:
    """The prompts a checkpoint run of `recipe` generates from, read once (the caller sizes its
    progress bar from them and passes them to run_checkpoint)."""
    t = recipe.traffic
    if t.kind != "prompts" or t.path is None:
        raise UsageError(f"recipe {recipe.name!r}: a checkpoint run needs traffic.kind: prompts with a path",
                         "name a .jsonl or text file of prompts")
    return read_prompts(t.path)


def run_checkpoint(recipe: Recipe, knobs: Knobs, prompts: list, plan_path: str | Path | None = None,
                   on_record: Callable[[HitRateRecord], None] | None = None,
                   advance: Callable[[int], None] | None = None, platform_path: str | Path | None = None
                   ) -> CheckpointRun:
    """Generate greedy text for `prompts` (checkpoint_prompts) on the hot/cold banks through the
    one loop, logging hit rates; `advance(n)` after each batch of n prompts is generated.
    Ctrl-C keeps the windows so far (the summary says `interrupted`), not the texts."""
    m, t = recipe.model, recipe.traffic
    # The banks keep a checkpoint's fp8 experts on every device; refused before gigabytes are loaded.
    setup = setup_run(recipe, knobs, platform_path, recipe.run.device, fp8_kept=lambda info: True)
    allocator = setup.allocator()
    hm = load_model(m.path, setup.info, allocator=allocator)
    _check_geometry(recipe, hm)
    tok = load_tokenizer(m.path)
    expert_bytes = expert_bytes_per_rank(recipe)
    plan = _plan(recipe, knobs, setup.platform, hm, tok, prompts, expert_bytes, plan_path)
    split = make_split(knobs.cold_path, setup.info, hm.banks[0], setup.platform)
    for row, bank in enumerate(hm.banks):
        bank.set_hot(plan.hot_LE[row])
        bank.cold_split = split
    model = CheckpointMoE(hm, setup.info)
    engine = CheckpointEngine(model, Generation(hm, tok, prompts, t.max_new_tokens, t.batch, advance), knobs,
                              expert_bytes, expected_hit_rate=plan.expected_hit_rate)
    summary = engine.run(math.inf, on_record)
    return CheckpointRun(
        texts=[] if summary.interrupted else engine.source.texts(), summary=summary, plan_source=plan.source,
        plan_made_from=plan.made_from, hot_experts=int(plan.hot_LE.sum()), device=setup.info.name,
        kernel=model.compute.name, numa=allocator.numa)


def _check_geometry(recipe: Recipe, hm) -> None:
    m = recipe.model
    if hm.layer_ids != m.moe_layer_ids or hm.num_experts != m.num_experts or hm.top_k != m.top_k:
        raise InputFileError(
            f"{m.path}: the checkpoint has MoE layers {list(hm.layer_ids)}, {hm.num_experts} experts, top-{hm.top_k}; "
            f"recipe {recipe.name!r} says {list(m.moe_layer_ids)}, {m.num_experts}, top-{m.top_k}",
            "make the recipe's geometry match the checkpoint's config.json")


def _plan(recipe: Recipe, knobs: Knobs, platform, hm, tok, prompts: list, expert_bytes: int,
          plan_path: str | Path | None) -> PlanChoice:
    """The hot set from `--plan`, or planned on the prefill of the prompts (counts only, no
    generation: one calibration pass)."""
    if plan_path is not None:
        return plan_from_file(load_plan(plan_path), plan_path, recipe, expert_bytes)
    steps_LE: list[np.ndarray] = []
    capture(hm, tok, prompts, 0, recipe.traffic.batch, on_step=steps_LE.append)
    budget = resolve_hot_budget(recipe, knobs, platform).budget_bytes
    p = plan_hot_set(np.sum(steps_LE, axis=0), expert_bytes, budget)
    return PlanChoice(p.hot_RLE[0], p.hit_rate, "planned from the prompts' prefill routing", budget,
                      int(p.hot_bytes_R[0]), f"the prefill routing of {recipe.traffic.path}")
