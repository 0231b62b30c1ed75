"""`run` checks the files it reads before it builds anything (was: 13.7 s of building for a
missing trace), and a plan of another recipe gets the message `plan` gives for a histogram."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def no_runtime(monkeypatch):
    """Building anything imports runtime.from_recipe: make that fail loudly."""
    monkeypatch.setitem(sys.modules, "hotsplit_runtime.from_recipe", None)


def test_missing_or_wrong_inputs_are_refused_before_any_building(cli, tmp_path, no_runtime):
    hist = tmp_path / "h.json"
    assert cli("balance", "tiny", "--steps", "2", "-o", hist).code == 0
    cases = [
        (("run", "deepseek-v3", "--trace", tmp_path / "nosuch.npz"),
         f"error: {tmp_path / 'nosuch.npz'}: no such file; check the path, or capture one with `hotsplit balance "
         "--trace`"),
        (("run", "tiny", "--plan", tmp_path / "nosuch.json"), f"error: {tmp_path / 'nosuch.json'}: no such file"),
        (("run", "tiny", "--plan", hist), f"error: {hist}: is a hotsplit.hist file"),
        (("run", "tiny", "--trace", hist), f"error: {hist}: is a hotsplit.hist file"),
    ]
    for args, message in cases:
        r = cli(*args)
        assert r.code == 1 and r.err.startswith(message), (args, r.err)
        assert "Traceback" not in r.err and "ImportError" not in r.err


def test_a_plan_of_another_recipe_names_both(cli, tmp_path, no_runtime):
    hist, plan = tmp_path / "ds3.json", tmp_path / "ds3-plan.json"
    assert cli("balance", "deepseek-v3", "--steps", "1", "-o", hist).code == 0
    assert cli("plan", hist, "--recipe", "deepseek-v3", "--hot-gib", "20", "-o", plan).code == 0
    r = cli("run", "tiny", "--plan", plan)
    assert r.code == 1
    assert r.err.startswith(f"error: {plan}: a plan for recipe 'deepseek-v3' (expert ids up to 255, MoE layers 3..60) "
                            "but recipe 'tiny' has 32 experts per layer in MoE layers 1..4; use the recipe the plan "
                            "was made for, or plan for 'tiny' with `hotsplit plan`"), r.err


def test_a_single_rank_run_reads_its_plan_file_once(cli, tmp_path, monkeypatch):
    """The input check reads and checks the plan; the run uses what it read."""
    from hotsplit_runtime import hot_set

    from hotsplit_cli.hotset import planfile

    hist, plan = tmp_path / "h.json", tmp_path / "p.json"
    assert cli("balance", "tiny", "--steps", "2", "-o", hist).code == 0
    assert cli("plan", hist, "--recipe", "tiny", "-o", plan).code == 0
    reads = []
    real = planfile.load_plan

    def counted(path):
        reads.append(path)
        return real(path)

    monkeypatch.setattr(planfile, "load_plan", counted)
    monkeypatch.setattr(hot_set, "load_plan", counted)  # where a run would read it again
    r = cli("run", "tiny", "--plan", plan, "--steps", "2", "--json")
    assert r.code == 0, r.err
    assert len(reads) == 1
