"""`hotsplit run` on a real checkpoint: load it onto the hot/cold banks, plan, generate, log.

The hot set comes from `--plan` or is planned here from the routing of the prompts' prefill
(one calibration pass, counted exactly), with the recipe's real expert bytes and budget.
Shape letters: L = MoE layers, E = experts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.hotset.budget import resolve_hot_budget
from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.prompts import read_prompts

from ..cold_split import FP8_REFUSAL, make_split
from ..device import choose_device
from ..log import HitRateRecord
from ..pinned import NumaPolicy, PinnedAllocator, numa_policy_for
from ..rank_context import plan_from_file
from ..windows import RunSummary
from .capture import capture
from .loader import load_model, load_tokenizer
from .serve import HFServe


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
    """Generate greedy text for `prompts` (checkpoint_prompts) on the hot/cold banks, logging hit
    rates; `advance(n)` after each batch of n prompts is generated."""
    m, t = recipe.model, recipe.traffic
    if m.expert_dtype == "fp8" and knobs.cold_path != "gpu":  # before gigabytes are loaded
        raise UsageError(FP8_REFUSAL.format(mode=knobs.cold_path))
    platform = load_platform(platform_path) if platform_path is not None else None  # read once, before the work
    info = choose_device(recipe.run.device)
    allocator = PinnedAllocator(pin=info.pinned, numa=numa_policy_for(
        knobs.numa_policy, info.numa_node, info.reasons.get("numa_node")))
    hm = load_model(m.path, info, allocator=allocator)
    if hm.layer_ids != m.moe_layer_ids or hm.num_experts != m.num_experts or hm.top_k != m.top_k:
        raise InputFileError(
            f"{m.path}: the checkpoint has MoE layers {list(hm.layer_ids)}, {hm.num_experts} experts, top-{hm.top_k}; "
            f"recipe {recipe.name!r} says {list(m.moe_layer_ids)}, {m.num_experts}, top-{m.top_k}",
            "make the recipe's geometry match the checkpoint's config.json")
    tok = load_tokenizer(m.path)
    expert_bytes = expert_bytes_per_rank(recipe)
    if plan_path is not None:
        c = plan_from_file(load_plan(plan_path), plan_path, recipe, expert_bytes)
        hot_LE, expected, source, made_from = c.hot_LE, c.expected_hit_rate, c.source, c.made_from
    else:
        # Calibrate on the prefill of the prompts (counts only, no generation), then plan.
        steps_LE: list[np.ndarray] = []
        capture(hm, tok, prompts, 0, t.batch, on_step=steps_LE.append)
        counts_LE = np.sum(steps_LE, axis=0)
        budget = resolve_hot_budget(recipe, knobs, platform).budget_bytes
        p = plan_hot_set(counts_LE, expert_bytes, budget)
        hot_LE, expected, source = p.hot_RLE[0], p.hit_rate, "planned from the prompts' prefill routing"
        made_from = f"the prefill routing of {t.path}"
    split = make_split(knobs.cold_path, info, hm.banks[0], platform)
    for row, bank in enumerate(hm.banks):
        bank.set_hot(hot_LE[row])
        bank.cold_split = split
    serve = HFServe(hm, knobs, expert_bytes, on_record)
    tokens_before = hm.counter.tokens
    t0 = time.perf_counter()
    texts = serve.generate(tok, prompts, t.max_new_tokens, t.batch, advance)
    elapsed = time.perf_counter() - t0
    return CheckpointRun(
        texts=texts, summary=serve.summary(hm.counter.tokens - tokens_before, elapsed, expected),
        plan_source=source, plan_made_from=made_from, hot_experts=int(hot_LE.sum()), device=info.name,
        kernel=("triton" if hm.banks[0].kernel is not None else "torch per expert")
        + (f" + CPU cold path ({split.mode}; {split.rates_source})" if split else ""),
        numa=allocator.numa)
