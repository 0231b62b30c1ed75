"""A plan must suit the run it is given to: as many ranks as the recipe's ep, and no hot budget
beside it (the plan fixes the hot set)."""

from pathlib import Path

import pytest

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace

HIST = Path(__file__).resolve().parents[2] / "examples" / "hist-tiny.json"


@pytest.fixture
def ep4_plan(cli, tmp_path):
    path = tmp_path / "ep4-plan.json"
    done = cli("plan", HIST, "--recipe", "tiny-ep4", "-o", path)
    assert done.code == 0, done.err
    return path


def _one_line_refusal(done, *words, code=1):
    assert done.code == code, (done.out, done.err)
    lines = [x for x in done.err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.err
    for w in words:
        assert w in lines[0], lines[0]


def test_a_4_rank_plan_is_refused_by_a_single_rank_run(cli, ep4_plan, tmp_path):
    log = tmp_path / "log.jsonl"
    done = cli("run", "tiny", "--plan", ep4_plan, "--steps", "2", "--log-jsonl", log)
    _one_line_refusal(done, "a plan for 4 ranks", "runs on 1", "ep: 4")
    assert not log.exists() and done.out == ""


def test_a_4_rank_plan_is_refused_by_simulate_on_a_single_rank_recipe(cli, ep4_plan, tmp_path):
    m = load_recipe("tiny").model
    trace = tmp_path / "t.npz"
    save_trace(trace, synthetic_trace(zipf_shares(m.num_moe_layers, m.num_experts, 1.2, 3), m.moe_layer_ids, 4, 8,
                                      m.top_k, seed=5))
    done = cli("simulate", "--trace", trace, "--recipe", "tiny", "--plan", ep4_plan)
    _one_line_refusal(done, "a plan for 4 ranks")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_hot_budget_beside_a_plan_is_refused(cli, tmp_path, monkeypatch, how):
    plan, log = tmp_path / "plan.json", tmp_path / "log.jsonl"
    assert cli("plan", HIST, "--recipe", "tiny", "--hot-gib", "0.004", "-o", plan).code == 0
    extra = ["--hot-gib", "0.0001"] if how == "flag" else []
    if how == "env":
        monkeypatch.setenv("HOTSPLIT_HOT_GIB", "0.0001")
    done = cli("run", "tiny", "--plan", plan, "--steps", "2", "--log-jsonl", log, *extra)
    _one_line_refusal(done, "--hot-gib" if how == "flag" else "HOTSPLIT_HOT_GIB", "the plan fixes the hot set", code=2)
    assert not log.exists()


def test_a_plan_alone_still_runs(cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli("plan", HIST, "--recipe", "tiny", "--hot-gib", "0.004", "-o", plan).code == 0
    done = cli("run", "tiny", "--plan", plan, "--steps", "2")
    assert done.code == 0, done.err
