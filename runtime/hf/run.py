"""`hotsplit run` on a real checkpoint: load it onto the hot/cold banks, plan, generate, log.

The hot set comes from `--plan` or is planned here from the routing of the prompts' prefill
(one calibration pass, counted exactly), with the recipe's real expert bytes and budget.
Shape letters: L = MoE layers, E = experts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hotsplit_cli.errors import InputFileError, UsageError
from hotsplit_cli.knobs import Knobs
from hotsplit_cli.planfile import load_plan
from hotsplit_cli.planner import plan_hot_set
from hotsplit_cli.prompts import read_prompts
from hotsplit_cli.recipe import GIB, Recipe
from hotsplit_cli.sizes import derive_hot_budget, expert_bytes_per_rank

from ..device import choose_device
from ..log import HitRateRecord
from ..pinned import PinnedAllocator, plan_placement
from .capture import capture
from .loader import load_model, load_tokenizer
from .serve import HFServe


@dataclass
class CheckpointRun:
    """What a checkpoint run produced, in the same terms as a synthetic run's summary."""

    texts: list[str]
    steps: int
    tokens: int
    elapsed_s: float
    hit_rate: float
    hit_rate_last_window: float | None
    expected_hit_rate: float | None
    swaps: int
    bytes_copied: int  # real bytes
    copy_ms: float
    cold_bytes_per_step: float  # real bytes of distinct cold experts read per step
    plan_source: str
    hot_experts: int
    device: str
    kernel: str  # how the routed experts were computed
    numa: dict  # where the cold bank was placed
    records: list[HitRateRecord] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_doc(self) -> dict:
        return {
            "steps": self.steps, "tokens": self.tokens, "elapsed_s": self.elapsed_s, "tokens_per_s": self.tokens_per_s,
            "hit_rate": self.hit_rate, "hit_rate_last_window": self.hit_rate_last_window,
            "expected_hit_rate": self.expected_hit_rate, "swaps": self.swaps, "bytes_copied": self.bytes_copied,
            "copy_ms": self.copy_ms, "cold_bytes_per_step": self.cold_bytes_per_step, "plan_source": self.plan_source,
            "hot_experts": self.hot_experts, "device": self.device, "kernel": self.kernel, "numa": self.numa,
            "texts": self.texts,
        }


def run_checkpoint(recipe: Recipe, knobs: Knobs, plan_path: str | Path | None = None,
                   on_record: Callable[[HitRateRecord], None] | None = None) -> CheckpointRun:
    """Generate greedy text for the recipe's prompts on the hot/cold banks, logging hit rates."""
    m, t = recipe.model, recipe.traffic
    if t.kind != "prompts" or t.path is None:
        raise UsageError(f"recipe {recipe.name!r}: a checkpoint run needs traffic.kind: prompts with a path",
                         "name a .jsonl or text file of prompts")
    prompts = read_prompts(t.path)
    info = choose_device(recipe.run.device)
    allocator = PinnedAllocator(pin=info.pinned, placement=plan_placement(
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
        plan = load_plan(plan_path)
        hot_LE, expected, source = plan.hot_LE(hm.layer_ids, hm.num_experts, model=recipe.name), plan.hit_rate, \
            str(plan_path)
    else:
        # Calibrate on the prefill of the prompts (counts only, no generation), then plan.
        steps_LE: list[np.ndarray] = []
        capture(hm, tok, prompts, 0, t.batch, on_step=steps_LE.append)
        counts_LE = np.sum(steps_LE, axis=0)
        budget = int((knobs.hot_gib if knobs.hot_gib is not None
                      else derive_hot_budget(recipe, knobs.vram_reserve_gib).hot_gib) * GIB)
        p = plan_hot_set(counts_LE, expert_bytes, budget)
        hot_LE, expected, source = p.hot_RLE[0], p.hit_rate, "planned from the prompts' prefill routing"
    for row, bank in enumerate(hm.banks):
        bank.set_hot(hot_LE[row])
    serve = HFServe(hm, knobs, expert_bytes, on_record)
    tokens_before = hm.counter.tokens
    t0 = time.perf_counter()
    texts = serve.generate(tok, prompts, t.max_new_tokens, t.batch)
    elapsed = time.perf_counter() - t0
    recs = serve.records
    # Records hold per-window averages; weight each by its window's steps.
    ends = [r.step for r in recs]
    lengths = np.diff([0, *ends])
    cold = float(np.dot(lengths, [r.cold_bytes_per_step for r in recs]) / max(1, serve.steps))
    return CheckpointRun(
        texts=texts, steps=serve.steps, tokens=hm.counter.tokens - tokens_before, elapsed_s=elapsed,
        hit_rate=recs[-1].hit_rate_total if recs else 0.0,
        hit_rate_last_window=recs[-1].hit_rate_window if recs else None, expected_hit_rate=expected,
        swaps=serve.swaps_total, bytes_copied=serve.bytes_total, copy_ms=serve.copy_ms_total,
        cold_bytes_per_step=cold, plan_source=source, hot_experts=int(hot_LE.sum()), device=info.name,
        kernel="triton" if hm.banks[0].kernel is not None else "torch per expert",
        numa=allocator.placement.to_doc(), records=recs)
