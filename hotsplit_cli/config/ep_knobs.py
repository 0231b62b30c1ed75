"""EP-only knobs given to a run that is not expert-parallel: said, not ignored."""

from __future__ import annotations

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import UsageError

EP_ONLY = ("eplb_steps", "ep_exchange")


def check_ep_knobs_need_ep(recipe: Recipe, knobs: Knobs) -> None:
    """UsageError when `--eplb-steps` / `--ep-exchange` (or their environment variables) are set
    for a recipe with ep 1: a single-rank run has no exchange and nothing to rebalance."""
    if recipe.parallel.ep > 1:
        return
    given = [knobs.origin(k) for k in EP_ONLY if knobs.sources.get(k) in ("flag", "env")]
    if given:
        raise UsageError(f"{' and '.join(given)} only apply to expert parallelism; recipe {recipe.name!r} has ep 1",
                         "drop them, or use a recipe with ep > 1 (for example tiny-ep4)")
