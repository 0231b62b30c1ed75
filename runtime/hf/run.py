"""`hotsplit run` on a real checkpoint: load it onto the hot/cold banks, plan, generate, log.

The hot set comes from `--plan` or is planned (`RankContext.plan`, as for a synthetic model) on
the prompts' prefill routing (one calibration pass), with the recipe's real bytes and budget.
Shape letters: L = MoE layers, E = experts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.hotset.budget import resolve_hot_budget
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.prompts import read_prompts

from ..cold_split import make_split
from ..device import DeviceInfo
from ..precision import check_checkpoint_precision
from ..rank_context import PlanChoice, RankContext
from ..request import RunHeader, cold_bank_fields, make_header, setup_doc
from .capture import Generation, capture
from .loader import load_tokenizer
from .steps import CheckpointEngine


def checkpoint_prompts(recipe: Recipe) -> list:
    """The prompts a checkpoint run of `recipe` generates from, read once (the caller sizes its
    progress bar from them and passes them to prepare_checkpoint)."""
    t = recipe.traffic
    if t.kind != "prompts" or t.path is None:
        raise UsageError(f"recipe {recipe.name!r}: a checkpoint run needs traffic.kind: prompts with a path",
                         "name a .jsonl or text file of prompts")
    return read_prompts(t.path)


@dataclass
class PreparedCheckpoint:
    """A checkpoint rank built for the one loop: its engine (model, generation), plan and setup."""

    engine: CheckpointEngine
    plan: PlanChoice
    info: DeviceInfo
    allocator: object  # the cold bank's (a PinnedAllocator, or an EP node's SharedAllocator)
    expert_bytes: int  # real
    traffic: str  # what the rank generates from
    steps: float = math.inf  # the generation ends the loop
    notes: list[str] = field(default_factory=list)

    @property
    def hidden(self) -> int:
        return self.engine.model.banks[0].hidden

    def header(self, parallel: dict | None = None) -> RunHeader:
        """This rank's set-up as the run document and its header lines say it."""
        bank, hm = self.engine.model.banks[0], self.engine.model.hm
        dtype = str(bank.compute_dtype).replace("torch.", "")
        allocated = {"hidden": bank.hidden, "inter": bank.inter, "experts": hm.num_experts, "top_k": hm.top_k,
                     "dtype": dtype, "expert_format": bank.layout.describe(dtype),
                     **cold_bank_fields(self.allocator)}
        doc = setup_doc(self.info, self.engine, self.traffic, None, 1.0, allocated, self.allocator,
                        self.plan.to_doc(self.expert_bytes))
        return make_header(doc, None, self, self.engine.source, parallel, hm.family)

    def texts(self, interrupted: bool) -> list[str]:
        """The greedy texts of this rank's prompts (none when interrupted)."""
        return [] if interrupted else self.engine.source.texts()


def prepare_checkpoint(recipe: Recipe, knobs: Knobs, prompts: list, plan_path: str | Path | None = None,
                       advance: Callable[[int], None] | None = None, platform_path: str | Path | None = None,
                       rank: RankContext | None = None) -> PreparedCheckpoint:
    """Load the checkpoint onto the hot/cold banks and plan for the rank's share of `prompts`
    (`rank`: the single-rank default, or an expert-parallel rank)."""
    check_checkpoint_precision(knobs.precision, recipe.name)
    m, t = recipe.model, recipe.traffic
    rank = RankContext() if rank is None else rank
    # The banks keep a checkpoint's fp8 experts on every device; refused before gigabytes are loaded.
    setup = rank.setup(recipe, knobs, platform_path, fp8_kept=lambda info: True)
    hm, allocator = rank.load_checkpoint(m.path, setup)
    _check_geometry(recipe, hm)
    tok = load_tokenizer(m.path)
    expert_bytes = expert_bytes_per_rank(recipe)
    prompts = rank.share(prompts)
    if plan_path is None:  # calibrate on the prefill of the prompts (counts only, no generation)
        capture(hm, tok, prompts, 0, t.batch)
    plan = rank.plan(recipe, rank.pooled(hm.counter.counts_LE.copy()), expert_bytes, plan_path,
                     lambda: resolve_hot_budget(recipe, knobs, setup.platform), f"the prefill routing of {t.path}")
    split = make_split(knobs.cold_path, setup.info, hm.banks[0], setup.platform)
    for row, bank in enumerate(hm.banks):
        bank.set_hot(plan.hot_LE[row])
        bank.cold_split = split
    model, source = rank.checkpoint_model(hm, setup.info, Generation(hm, tok, prompts, t.max_new_tokens, t.batch,
                                                                     advance))
    engine = CheckpointEngine(model, source, knobs, expert_bytes, expected_hit_rate=plan.expected_hit_rate)
    return PreparedCheckpoint(engine, plan, setup.info, allocator, expert_bytes, f"prompts {t.path}")


def _check_geometry(recipe: Recipe, hm) -> None:
    m = recipe.model
    if hm.layer_ids != m.moe_layer_ids or hm.num_experts != m.num_experts or hm.top_k != m.top_k:
        raise InputFileError(
            f"{m.path}: the checkpoint has MoE layers {list(hm.layer_ids)}, {hm.num_experts} experts, top-{hm.top_k}; "
            f"recipe {recipe.name!r} says {list(m.moe_layer_ids)}, {m.num_experts}, top-{m.top_k}",
            "make the recipe's geometry match the checkpoint's config.json")
