"""The optimality certificate: a plan says `certified_optimal: true` only when an exact solver (or
the equal-size argument) proved it; when the exact solvers are skipped, the plan is the greedy one,
says so, and the CLI says the solver was skipped."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotsplit_cli.hotset import planfile, planner
from hotsplit_cli.hotset.planner import BRUTE_FORCE_MAX_ITEMS, DP_MAX_CELLS, plan_hot_set, select


def _too_large_for_the_dp(n: int = 24):
    """n positive items (more than brute force takes) of unequal sizes with gcd 1, under a budget
    whose DP table would have more than DP_MAX_CELLS cells."""
    assert n > BRUTE_FORCE_MAX_ITEMS
    values = np.arange(n, 0, -1, dtype=np.float64) * 10.0
    sizes = 1_000_003 + np.arange(n, dtype=np.int64) * 7  # gcd 1: the DP works in single bytes
    budget = int(sizes[: n // 2].sum())
    assert (budget + 1) * (n + n) > DP_MAX_CELLS
    return values, sizes, budget


def test_a_skipped_exact_solver_gives_the_greedy_plan_uncertified():
    values, sizes, budget = _too_large_for_the_dp()
    sel = select(values, sizes, budget)
    assert (sel.method, sel.certified) == ("greedy", False)
    np.testing.assert_array_equal(sel.chosen_N, planner.greedy_select(values, sizes, budget))
    assert sel.value == sel.greedy_value <= sel.bound_value
    plan = plan_hot_set(values.reshape(2, -1), sizes.reshape(2, -1), budget)
    assert plan.certified is False and plan.methods == ("greedy",)


def test_one_uncertified_rank_makes_the_plan_uncertified():
    values, sizes, budget = _too_large_for_the_dp(48)
    owner = np.zeros((2, len(values) // 2), dtype=np.int64)
    owner[1] = 1  # rank 0 owns layer 0 (unequal sizes, too large), rank 1 layer 1 (equal sizes)
    sizes_LE = sizes.reshape(2, -1).copy()
    sizes_LE[1] = 1_000_003
    plan = plan_hot_set(values.reshape(2, -1), sizes_LE, budget, rank_of_LE=owner, num_ranks=2)
    assert plan.methods == ("greedy", "top-n") and plan.certified is False


@pytest.fixture
def uneven_sizes_without_the_dp(monkeypatch):
    """The plan command with experts of (slightly) unequal sizes and no room for the DP table, so
    that the exact solvers are skipped as on a large model of mixed expert sizes."""
    real = planfile.plan_hot_set

    def uneven(counts_LE, size, budget_bytes, **kw):
        L, E = np.shape(counts_LE)
        sizes_LE = size + (np.arange(L * E).reshape(L, E) % 7)
        return real(counts_LE, sizes_LE, budget_bytes, **kw)

    monkeypatch.setattr(planfile, "plan_hot_set", uneven)
    monkeypatch.setattr(planner, "DP_MAX_CELLS", 0)


def test_the_plan_file_and_the_report_say_the_solver_was_skipped(cli, tiny_hist, uneven_sizes_without_the_dp):
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.005", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["certified_optimal"] is False and doc["ranks"][0]["method"] == "greedy"
    human = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.005")
    assert human.code == 0, human.err
    verdict = next(line for line in human.out.splitlines() if line.startswith("hit rate "))
    assert "greedy (exact solver skipped: too large)" in verdict and "certified" not in verdict


def test_an_equal_size_plan_says_it_is_certified(cli, tiny_hist):
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.005", "--json")
    doc = json.loads(r.out)
    assert doc["certified_optimal"] is True and doc["ranks"][0]["method"] == "top-n"
    human = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.005").out
    assert ", optimal (certified); LP bound" in human
