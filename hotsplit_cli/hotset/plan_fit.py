"""Checks that a plan suits the run it is given to, before anything is built: its number of
ranks is the recipe's `ep`, and no hot budget is asked for beside it (the plan fixes the hot set)."""

from __future__ import annotations

from pathlib import Path

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import PlanError, UsageError

from .planfile import PlanFile, load_plan


def check_plan_ranks(plan: PlanFile | Path, recipe: Recipe) -> None:
    """PlanError when a plan made for N ranks meets a recipe of another `ep` (a 4-rank plan on a
    single-rank run would serve rank 0's hot set to every expert and miss the rest)."""
    pf = plan if isinstance(plan, PlanFile) else load_plan(plan)
    ranks, ep = len(pf.hot_by_rank), recipe.parallel.ep
    if ranks != ep:
        raise PlanError(f"{pf.path}: a plan for {ranks} ranks; recipe {recipe.name!r} runs on {ep}",
                        f"use a recipe with ep: {ranks}, or plan for this one with --recipe {recipe.name}")


def check_no_budget_beside_plan(knobs: Knobs, plan_path: Path | None) -> None:
    """UsageError when `--hot-gib` or HOTSPLIT_HOT_GIB is set together with a plan: the plan's hot
    set is used as it is, so the budget would be ignored without a word."""
    if plan_path is None or knobs.hot_gib is None or knobs.sources.get("hot_gib") not in ("flag", "env"):
        return
    raise UsageError(f"{knobs.origin('hot_gib')} {knobs.hot_gib:g} with --plan {plan_path}: the plan fixes the hot "
                     f"set, so the budget would be ignored",
                     f"drop {knobs.origin('hot_gib')}, or make a plan with it (`hotsplit plan --hot-gib "
                     f"{knobs.hot_gib:g}`)")



def check_plan_suits_run(recipe: Recipe, knobs: Knobs, plan: PlanFile | None) -> None:
    """Both checks for `run --plan` (nothing when no plan is given)."""
    if plan is not None:
        check_plan_ranks(plan, recipe)
        check_no_budget_beside_plan(knobs, plan.path)


def placement_path_of(plan: PlanFile) -> Path:
    """Where the placement an EP plan was made on is now. The plan records the path as it was given
    (relative to the folder `plan` ran in), so a plan moved with its placement is found by
    looking beside the plan file too; the first candidate whose sha256 is the recorded one wins
    (the recorded path itself when none matches, so the caller's error names it)."""
    from hotsplit_cli.traffic.hist import file_sha256

    stored = Path(plan.placement["path"])
    beside = plan.path.resolve().parent
    candidates = [stored] if stored.is_absolute() else [stored, beside / stored]
    candidates.append(beside / stored.name)
    want = plan.placement.get("sha256")
    for path in candidates:
        try:
            if want is None or file_sha256(path) == want:
                if path.is_file():
                    return path
        except OSError:
            continue
    return stored


def layout_words(plan_path: Path | None) -> str:
    """How an EP run lays its experts out, for its header: the plan's placement file, or the
    contiguous split (rank r holds experts r*E/R .. (r+1)*E/R-1 of every layer) and why."""
    if plan_path is None:
        return "layout contiguous (no plan)"
    pf = load_plan(plan_path)
    if pf.placement is None:
        return "layout contiguous: the plan was made without --placement"
    return f"placement {placement_path_of(pf)}"
