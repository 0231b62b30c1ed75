"""`hotsplit run` on a real checkpoint: load it onto the hot/cold banks, plan, generate, log.

The hot set comes from `--plan` or is planned (runtime/hot_set.py, as for a synthetic model) on
the prompts' prefill routing (one calibration pass), with the recipe's real bytes and budget.
Shape letters: L = MoE layers, E = experts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

from hotsplit_cli.analysis.prefetch import fit_on_trace
from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.hotset.budget import resolve_hot_budget
from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.prompts import read_prompts

from ..built import Built
from ..cold_split import make_split
from ..hot_set import choose_hot_set
from ..lookahead_stage import lookahead_stager
from ..prefetch import StagingPool, StepStager, carve_budget, check_plan_leaves_pool, staging_pool
from ..ranks import Rank, single_rank
from ..request import Agreement
from ..stored_run import describe_auto, run_auto_layers, stored_recipe
from .agreement import native_agreement
from .capture import Generation, capture
from .loader import load_model, load_tokenizer
from .lookahead import LookaheadCounter
from .steps import CheckpointEngine, CheckpointMoE
from .trace_stage import TraceStepStager


def checkpoint_prompts(recipe: Recipe) -> list:
    """The prompts a checkpoint run of `recipe` generates from, read once (the caller sizes its
    progress bar from them and passes them to prepare_checkpoint)."""
    t = recipe.traffic
    if t.kind != "prompts" or t.path is None:
        raise UsageError(f"recipe {recipe.name!r}: a checkpoint run needs traffic.kind: prompts with a path",
                         "name a .jsonl or text file of prompts")
    return read_prompts(t.path)


def prepare_checkpoint(recipe: Recipe, knobs: Knobs, prompts: list, plan_path: str | Path | None = None,
                       advance: Callable[[int], None] | None = None, platform_path: str | Path | None = None,
                       rank: Rank | None = None, parallel: Callable = single_rank,
                       prefetch_fit: str | Path | None = None) -> Built:
    """Load the checkpoint onto the hot/cold banks and plan for the rank's share of `prompts`
    (`rank`: the single-rank default, or an expert-parallel rank; `parallel`: applied to the
    loaded model). An EP node's experts are read from the files once (by the rank that fills
    the node's bank), every other tensor by every rank. `prefetch_fit`: the trace `prefetch
    trace` is fitted on (required for it)."""
    m, t = recipe.model, recipe.traffic
    rank = Rank.single(recipe, knobs, platform_path) if rank is None else rank
    plan_file = rank.plan_file or (load_plan(plan_path) if plan_path else None)  # read once
    auto = run_auto_layers(recipe, knobs, plan_file)
    if auto is None:
        recipe = stored_recipe(recipe, knobs.precision)  # counted at the stored precision, refused where it cannot be
    expert_bytes = expert_bytes_per_rank(recipe)
    # The banks keep a checkpoint's fp8 experts on every device; refused before gigabytes are loaded.
    rank.check_fp8(recipe, knobs, kept=lambda info: True)
    info = rank.info
    hm = rank.on_bank(lambda allocator: load_model(m.path, info, allocator=allocator, precision=knobs.precision,
                                                   precision_LE=None if auto is None else auto.precision_LE))
    _check_geometry(recipe, hm)
    tok = load_tokenizer(m.path)
    prompts = rank.share(prompts)
    if plan_path is None:  # calibrate on the prefill of the prompts (counts only, no generation)
        capture(hm, tok, prompts, 0, t.batch)
    counts_LE = hm.counter.counts_LE.copy() if rank.group is None else rank.group.summed(hm.counter.counts_LE)
    pool = staging_pool(recipe, knobs, expert_bytes)  # carved from the budget the hot set is planned at
    plan = choose_hot_set(rank, recipe, counts_LE, expert_bytes, plan_path,
                          carve_budget(lambda: resolve_hot_budget(recipe, knobs, rank.platform), pool),
                          f"the prefill routing of {t.path}")
    if auto is not None:  # each hot expert at its stored bytes
        plan = dataclasses.replace(plan, hot_bytes=int(auto.sizes_LE[plan.hot_LE].sum()))
    check_plan_leaves_pool(pool, plan.hot_bytes, plan_file)
    split = make_split(knobs.cold_path, info, hm.banks[0], rank.platform)
    generation = Generation(hm, tok, prompts, t.max_new_tokens, t.batch, advance)
    model, source = parallel(CheckpointMoE(hm, info, plan.hot_LE, split), generation, rank)
    held = (lambda row: model.held_LE[row]) if hasattr(model, "held_LE") else (lambda row: None)  # EP: its experts
    engine = CheckpointEngine(model, source, knobs, expert_bytes, expected_hit_rate=plan.expected_hit_rate,
                              stager=_stager(hm, pool, knobs.prefetch, prefetch_fit, held), stored=auto)
    bank = getattr(hm.banks[0], "subs", [hm.banks[0]])[0]  # a mixed layer's banks share the shape
    dtype = str(bank.compute_dtype).replace("torch.", "")
    allocated = {"hidden": bank.hidden, "inter": bank.inter, "experts": hm.num_experts, "top_k": hm.top_k,
                 "dtype": dtype, "expert_format": bank.layout.describe(dtype) if auto is None else describe_auto(auto)}
    return Built(engine, math.inf, info, plan, rank.allocator, expert_bytes if auto is None else None,
                 f"prompts {t.path}", allocated,
                 notes=pool.notes() if pool else [], family=hm.family, generates=True,
                 native_check=_native_check(hm, m.path, info, prompts, generation.ids))


def _stager(hm, pool: StagingPool | None, prefetch: str, fit_path, held: Callable) -> StepStager | None:
    """A checkpoint's staging: rows in every predicted layer's bank, and for `prefetch lookahead`
    the hooks `balance --model` measures lookahead with (hf/lookahead.py), staging as they guess
    (`held(row)`: the experts this rank serves, bool [E]; None: all); for `prefetch trace` the
    co-activation table fitted on `fit_path` (hf/trace_stage.py; one rank)."""
    if pool is None:
        return None
    for bank in hm.banks[1:]:
        bank.reserve_staging(pool.config.slots)
    look = lookahead_stager(pool, prefetch, hm.num_experts, hm.top_k)
    if look is None:
        predictor, source = fit_on_trace(Path(fit_path), tuple(hm.layer_ids), hm.num_experts, "the checkpoint's")
        return TraceStepStager(hm, pool, predictor, source)
    LookaheadCounter(hm, pool.config.guesses, lambda row, rank_TE, q_TE, mask_T: look.ahead(
        row, hm.banks[row], rank_TE, q_TE, mask_T, held(row)), look.book)  # hooked for the model's life
    return look


def _native_check(hm, path, info, prompts: list, generated: list[list[int]]) -> Callable[[], Agreement]:
    """What compares the run's tokens (`generated`, filled as it runs) with the checkpoint as
    released, once the run is over; it holds no reference to the run's model."""
    released, dtype = hm.released, hm.banks[0].compute_dtype
    if hm.banks[0].precision == released:
        return lambda: Agreement(None, 0, f"stored as released ({released}): the run is the checkpoint itself")
    return lambda: native_agreement(path, info, dtype, prompts, generated)


def _check_geometry(recipe: Recipe, hm) -> None:
    m = recipe.model
    if hm.layer_ids != m.moe_layer_ids or hm.num_experts != m.num_experts or hm.top_k != m.top_k:
        raise InputFileError(
            f"{m.path}: the checkpoint has MoE layers {list(hm.layer_ids)}, {hm.num_experts} experts, top-{hm.top_k}; "
            f"recipe {recipe.name!r} says {list(m.moe_layer_ids)}, {m.num_experts}, top-{m.top_k}",
            "make the recipe's geometry match the checkpoint's config.json")
