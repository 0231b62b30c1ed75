"""A plan or placement made with a recipe YAML of the user's records its path, so that `export`
needs no --recipe for it, as for a shipped recipe (a name alone would not find the file)."""

from __future__ import annotations

import json
import shutil

from hotsplit_cli.config.recipe import RECIPES_DIR
from tests.export.helpers import synthetic_hist


def test_a_plan_and_a_placement_made_with_a_recipe_file_export_without_recipe(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "conf" / "mine.yaml"
    mine.parent.mkdir()
    mine.write_text((RECIPES_DIR / "tiny.yaml").read_text().replace("name: tiny", "name: mine", 1))
    hist = synthetic_hist(tmp_path / "h.json", "tiny")
    assert cli("plan", hist, "--recipe", "conf/mine.yaml", "--hot-gib", "0.004", "-o", "plan.json").code == 0
    assert cli("place", hist, "--recipe", "conf/mine.yaml", "--ranks", "4", "-o", "placement.json").code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert (plan["recipe"], plan["recipe_path"]) == ("mine", str(mine))
    assert json.loads((tmp_path / "placement.json").read_text())["source"]["recipe_path"] == str(mine)
    monkeypatch.chdir(tmp_path / "conf")  # from another folder: the recorded path is absolute
    for src, engine, out in (("plan.json", "ktransformers", "kt.pt"), ("placement.json", "sglang", "s.json")):
        r = cli("export", tmp_path / src, "--to", engine, "-o", out)
        assert r.code == 0, r.err
    shutil.move(mine, tmp_path / "moved.yaml")
    r = cli("export", tmp_path / "plan.json", "--to", "ktransformers", "-o", "kt2.pt")
    assert (r.code, r.err.count("\n")) == (2, 1) and f"made with recipe {mine}, which is no longer there" in r.err
    assert not (tmp_path / "conf" / "kt2.pt").exists()
    assert cli("export", tmp_path / "plan.json", "--to", "ktransformers", "--recipe", tmp_path / "moved.yaml",
               "-o", "kt2.pt").code == 0


def test_a_shipped_recipe_is_recorded_by_its_name_alone(cli, tmp_path):
    hist = synthetic_hist(tmp_path / "h.json", "tiny")
    assert cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.004", "-o", tmp_path / "plan.json").code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["recipe"] == "tiny" and "recipe_path" not in plan
