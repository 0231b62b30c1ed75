"""Options that do not fit the recipe are refused in one line instead of passing silently:
`place --ranks` against an expert-parallel recipe's ep, and the EP-only flags of `run` on a
single-rank recipe."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.traffic.hist import save_hist
from tests.conftest import make_hist


def test_place_refuses_a_rank_count_that_is_not_the_recipes_ep(cli, tmp_path):
    hist, out = tmp_path / "h.json", tmp_path / "place.json"
    save_hist(hist, make_hist(np.ones((4, 32)), layers=(1, 2, 3, 4), top_k=4, model="tiny"))
    r = cli("place", hist, "--recipe", "tiny-ep4", "--ranks", "8", "-o", out)
    assert r.code == 2 and r.out == "" and not out.exists()
    assert r.err.splitlines() == ["error: --ranks 8: recipe 'tiny-ep4' has ep=4; place with --ranks 4, or use a "
                                  "recipe with ep: 8"]
    assert cli("place", hist, "--recipe", "tiny-ep4", "--ranks", "4", "-o", out).code == 0


@pytest.mark.parametrize("flags, named", [(["--eplb-steps", "5"], "--eplb-steps"),
                                          (["--ep-exchange", "allgather"], "--ep-exchange"),
                                          (["--eplb-steps", "5", "--ep-exchange", "allgather"],
                                           "--eplb-steps and --ep-exchange")])
def test_run_refuses_expert_parallel_flags_on_a_single_rank_recipe(cli, tmp_path, flags, named):
    log = tmp_path / "log.jsonl"
    r = cli("run", "tiny", "--steps", "4", "--scale", "0.25", "--log-jsonl", log, *flags)
    assert r.code == 2 and r.out == "" and not log.exists()
    assert r.err.splitlines() == [f"error: {named}: expert-parallel options, but recipe 'tiny' runs on one rank "
                                  "(parallel.ep: 1); drop them, or use a recipe with ep > 1 (e.g. tiny-ep4)"]
