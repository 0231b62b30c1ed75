"""`run --plan` checks the plan against the run before any work: its number of ranks, and a budget
the user asked for (--hot-gib, HOTSPLIT_HOT_GIB), which a plan's fixed hot set must not ignore."""

from __future__ import annotations

import pytest

from hotsplit_cli.core.jsonio import write_json_atomic

GIB = 1 << 30
HOT = {"1": [0, 1], "2": [3], "3": [], "4": [31]}


def plan_file(tmp_path, ranks: int, budget_bytes: int | None = None):
    doc = {"schema": "hotsplit.plan/1", "hit_rate": 0.5, "recipe": "tiny",
           "ranks": [{"rank": r, "hot": HOT} for r in range(ranks)]}
    if budget_bytes is not None:
        doc["budget_bytes"] = budget_bytes
    path = tmp_path / f"plan-{ranks}.json"
    write_json_atomic(path, doc)
    return path


def test_a_single_rank_run_refuses_a_plan_made_for_four_ranks(cli, tmp_path):
    log = tmp_path / "log.jsonl"
    r = cli("run", "tiny", "--steps", "4", "--scale", "0.25", "--plan", plan_file(tmp_path, 4), "--log-jsonl", log)
    assert r.code == 1 and r.out == "" and not log.exists()
    assert r.err.splitlines() == [f"error: {tmp_path / 'plan-4.json'}: a plan for 4 ranks; recipe 'tiny' runs on 1; "
                                  "plan with this recipe"]


def test_an_expert_parallel_run_refuses_a_single_rank_plan_before_its_ranks_start(cli, tmp_path):
    r = cli("run", "tiny-ep4", "--plan", plan_file(tmp_path, 1))
    assert r.code == 1 and r.out == ""
    assert r.err.splitlines() == [f"error: {tmp_path / 'plan-1.json'}: a plan for 1 ranks; recipe 'tiny-ep4' runs "
                                  "on 4; plan with a recipe of ep 4"]


def test_a_tensor_parallel_plan_has_one_hot_set_per_rank_and_runs(cli, tmp_path):
    """`plan` for a tp 8 recipe writes 8 ranks, each the same hot set: that plan fits its recipe."""
    from hotsplit_cli.config.recipe import load_recipe
    from hotsplit_cli.hotset.planfile import check_plan_ranks, load_plan

    rec = load_recipe("deepseek-v3")
    path = tmp_path / "tp8.json"
    hot = {str(layer): [0] for layer in rec.model.moe_layer_ids}
    write_json_atomic(path, {"schema": "hotsplit.plan/1", "ranks": [{"rank": r, "hot": hot} for r in range(8)]})
    check_plan_ranks(load_plan(path), rec)
    write_json_atomic(path, {"schema": "hotsplit.plan/1", "ranks": [{"rank": 0, "hot": hot}]})
    r = cli("run", "deepseek-v3", "--plan", path, "--steps", "1", "--scale", "0.01")
    assert r.code == 1 and "a plan for 1 ranks; recipe 'deepseek-v3' runs on 8 (tp 8 x ep 1)" in r.err


def test_simulate_refuses_a_plan_made_for_four_ranks(cli, tmp_path):
    from hotsplit_cli.config.recipe import load_recipe
    from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
    from hotsplit_cli.traffic.trace import save_trace

    m = load_recipe("tiny").model
    trace = tmp_path / "trace.npz"
    save_trace(trace, synthetic_trace(zipf_shares(m.num_moe_layers, m.num_experts, 1.2, 3), m.moe_layer_ids, 8, 4,
                                      m.top_k, seed=5))
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--plan", plan_file(tmp_path, 4))
    assert r.code == 1 and r.out == "" and "a plan for 4 ranks; recipe 'tiny' runs on 1" in r.err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_budget_that_disagrees_with_the_plans_is_refused_not_ignored(cli, tmp_path, monkeypatch, how):
    plan = plan_file(tmp_path, 1, budget_bytes=int(0.01 * GIB))
    args = ["run", "tiny", "--steps", "4", "--scale", "0.25", "--plan", plan]
    if how == "flag":
        args += ["--hot-gib", "0.0001"]
    else:
        monkeypatch.setenv("HOTSPLIT_HOT_GIB", "0.0001")
    where = "--hot-gib" if how == "flag" else "HOTSPLIT_HOT_GIB"
    r = cli(*args)
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines() == [f"error: {where} 0.0001 disagrees with the budget of {plan} (0.01 GiB); drop "
                                  f"{where}: a --plan brings its own budget"]


def test_a_budget_with_a_plan_that_records_none_is_refused(cli, tmp_path):
    plan = plan_file(tmp_path, 1)
    r = cli("run", "tiny", "--steps", "4", "--scale", "0.25", "--plan", plan, "--hot-gib", "0.0001")
    assert r.code == 2 and r.out == ""
    assert r.err.startswith(f"error: --hot-gib 0.0001 with --plan {plan}: the plan's hot set is used as it is")


def test_the_plans_own_budget_is_accepted(cli, tmp_path):
    plan = plan_file(tmp_path, 1, budget_bytes=int(0.01 * GIB))
    r = cli("run", "tiny", "--steps", "4", "--scale", "0.25", "--plan", plan, "--hot-gib", "0.01", "--json")
    assert r.code == 0, r.err
