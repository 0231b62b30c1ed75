"""A plan moved to another folder together with its placement still finds it (the recorded path
is resolved beside the plan file too), and a missing one is still a one-line error."""

import shutil
from pathlib import Path

import pytest

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset.planfile import load_plan

HIST = Path(__file__).resolve().parents[2] / "examples" / "hist-tiny.json"


def _plan_in(cli, folder: Path, monkeypatch) -> None:
    folder.mkdir()
    monkeypatch.chdir(folder)  # relative paths, as a user types them
    assert cli("place", HIST, "--recipe", "tiny-ep4", "--ranks", "4", "-o", "pl.json").code == 0
    done = cli("plan", HIST, "--recipe", "tiny-ep4", "--placement", "pl.json", "-o", "plan.json")
    assert done.code == 0, done.err


def test_a_moved_plan_finds_its_placement_beside_it(cli, tmp_path, monkeypatch):
    from hotsplit_runtime.distributed.rank import placement_of_plan

    _plan_in(cli, tmp_path / "made", monkeypatch)
    shutil.move(tmp_path / "made", tmp_path / "moved")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    m = load_recipe("tiny-ep4").model
    placement = placement_of_plan(load_plan(tmp_path / "moved" / "plan.json"), m.moe_layer_ids, m.num_experts, 4)
    assert placement.num_ranks == 4


def test_a_moved_plan_without_its_placement_is_refused(cli, tmp_path, monkeypatch):
    from hotsplit_runtime.distributed.rank import placement_of_plan

    _plan_in(cli, tmp_path / "made", monkeypatch)
    shutil.move(tmp_path / "made" / "plan.json", tmp_path / "plan.json")
    monkeypatch.chdir(tmp_path)
    m = load_recipe("tiny-ep4").model
    with pytest.raises(PlanError, match="cannot be read"):
        placement_of_plan(load_plan(tmp_path / "plan.json"), m.moe_layer_ids, m.num_experts, 4)
