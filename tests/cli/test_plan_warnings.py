"""What a planner says about a plan that looks better or worse than it is (plan and place)."""

from __future__ import annotations

import json

import numpy as np
import yaml

from hotsplit_cli.config.recipe import RECIPES_DIR
from hotsplit_cli.traffic.hist import save_hist
from tests.conftest import make_hist


def _hist(path, counts):
    save_hist(path, make_hist(np.asarray(counts, dtype=np.float64), layers=(1, 2, 3, 4), top_k=4, model="tiny"))
    return path


def test_a_sample_that_never_saw_most_experts_says_how_many(cli, tmp_path):
    counts = np.zeros((4, 32))
    counts[:, :3] = 10  # 30 assignments per layer: 3 of 32 experts seen
    r = cli("plan", _hist(tmp_path / "h.json", counts), "--recipe", "tiny", "--hot-gib", "0.004")
    assert r.code == 0, r.err
    assert "hit rate 100.00%" in r.out
    assert ("warning: the histogram never saw 116 of 128 experts (30 tokens): the hit rate counts only the routing "
            "it saw; capture more tokens for a plan to trust") in r.err


def test_a_zero_budget_says_nothing_is_hot(cli, tiny_hist):
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["hit_rate"] == 0.0
    assert "hot budget 0: no expert is hot and every routed assignment is read cold (hit rate 0%)" in r.err


def test_replicas_that_cost_hot_bytes_are_named_by_place_and_plan(cli, tiny_hist, tmp_path):
    rec = yaml.safe_load((RECIPES_DIR / "tiny.yaml").read_text())
    rec["name"], rec["parallel"] = "tiny-ep4", {"tp": 1, "ep": 4}
    recipe = tmp_path / "tiny-ep4.yaml"
    recipe.write_text(yaml.safe_dump(rec))
    placement = tmp_path / "placement.json"
    r = cli("place", tiny_hist, "--recipe", recipe, "--ranks", "4", "--redundant", "8", "-o", placement)
    assert r.code == 0, r.err
    assert "each of the 8 redundant replicas per layer takes an expert's bytes on its rank" in r.err
    r = cli("plan", tiny_hist, "--recipe", recipe, "--placement", placement, "--hot-gib", "0.002", "--json")
    assert r.code == 0, r.err
    with_replicas = json.loads(r.out)["hit_rate"]
    plain = json.loads(cli("plan", tiny_hist, "--recipe", recipe, "--hot-gib", "0.002", "--json").out)["hit_rate"]
    assert (f"the placement's 8 redundant replicas per layer take hot bytes on their ranks: hit rate "
            f"{100 * with_replicas:.2f}% vs {100 * plain:.2f}% for the same budget without replicas") in r.err
