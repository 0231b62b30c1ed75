"""A static EP run on a trace achieves what hotsplit predicts for it: `place`'s balancedness and
`plan --placement`'s per-rank hit rates exactly without replicas, and the replica rule's
prediction (`predict_trace`, the same function the ranks dispatch by) with replicas.
`run --plan` runs the placement the plan records, and refuses one that changed."""

from __future__ import annotations

import json
import sys

import pytest

from tests.runtime.ep.harness import env_for_ranks, run_job, tiny_ep_recipe

HOTSPLIT = [sys.executable, "-m", "hotsplit_cli"]


def _ok(args, env=None):
    done = run_job([*HOTSPLIT, *args], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    d = tmp_path_factory.mktemp("ep-pred")
    recipe = tiny_ep_recipe(d / "r.yaml", 2)
    _ok(["balance", str(recipe), "--steps", "6", "--window-steps", "1", "--trace", str(d / "t.npz"),
         "-o", str(d / "h.json")])
    return d, recipe


def _place_plan_run(d, recipe, redundant):
    pl, plan = d / f"pl{redundant}.json", d / f"plan{redundant}.json"
    place = json.loads(_ok(["place", str(d / "h.json"), "--recipe", str(recipe), "--ranks", "2", "--redundant",
                            str(redundant), "-o", str(pl), "--json"]).stdout)
    _ok(["plan", str(d / "h.json"), "--recipe", str(recipe), "--placement", str(pl), "-o", str(plan)])
    env = env_for_ranks()
    env["HOTSPLIT_DYNAMIC"] = "0"
    run = json.loads(_ok(["run", str(recipe), "--plan", str(plan), "--trace", str(d / "t.npz"), "--json"],
                         env=env).stdout)
    return place, json.loads(plan.read_text()), run["summary"]


def test_without_replicas_the_run_is_the_plan_and_the_placement_exactly(traced):
    d, recipe = traced
    place, plan, s = _place_plan_run(d, recipe, 0)
    assert s["placement"]["method"] == "hotsplit" and s["placement"]["physical_experts"] == 8
    assert s["balancedness"] == pytest.approx(place["placement"]["fitted"]["balancedness"], abs=1e-12)
    assert s["balancedness"] == pytest.approx(s["predicted_balancedness"], abs=1e-12)
    for got, want in zip(s["ranks"], plan["ranks"], strict=True):
        assert got["hit_rate"] == pytest.approx(want["hit_rate"], abs=1e-12)
        assert got["expected_hit_rate"] == pytest.approx(want["hit_rate"], abs=1e-12)


def test_with_replicas_the_run_is_the_shared_prediction_exactly(traced):
    d, recipe = traced
    _, _, s = _place_plan_run(d, recipe, 2)
    assert s["placement"]["physical_experts"] == 10
    assert s["balancedness"] == pytest.approx(s["predicted_balancedness"], abs=1e-12)
    for r in s["ranks"]:
        assert r["hit_rate"] == pytest.approx(r["predicted_hit_rate"], abs=1e-12)


def test_a_plan_whose_placement_changed_is_refused(traced):
    d, recipe = traced
    pl, plan = d / "plx.json", d / "planx.json"
    _ok(["place", str(d / "h.json"), "--recipe", str(recipe), "--ranks", "2", "-o", str(pl)])
    _ok(["plan", str(d / "h.json"), "--recipe", str(recipe), "--placement", str(pl), "-o", str(plan)])
    _ok(["place", str(d / "h.json"), "--recipe", str(recipe), "--ranks", "2", "--redundant", "2", "-o", str(pl)])
    log = d / "x.jsonl"
    done = run_job([*HOTSPLIT, "run", str(recipe), "--plan", str(plan), "--trace", str(d / "t.npz"),
                    "--log-jsonl", str(log)])
    lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-2000:]
    assert "changed since the plan was made" in lines[0] and "rank 0 of" not in lines[0]  # the input, before ranks
    assert not log.exists()
