"""A plan finds the placement it was made on when both are moved to another folder, and a stale
file at the recorded path does not stand in for it (the recorded sha256 decides)."""

from __future__ import annotations

import os
import shutil

import numpy as np

from hotsplit_cli.hotset.planfile import load_plan, placement_of_plan
from hotsplit_cli.traffic.hist import file_sha256, save_hist
from tests.conftest import make_hist


def made_in(cli, folder):
    folder.mkdir()
    counts = np.random.default_rng(3).zipf(1.4, size=(4, 32)).clip(max=400).astype(float)
    save_hist(folder / "hist.json", make_hist(counts, layers=(1, 2, 3, 4), top_k=4, model="tiny"))
    cwd = os.getcwd()
    os.chdir(folder)  # paths recorded relative to the folder the plan is made in, as a user types them
    try:
        r = cli("place", "hist.json", "--recipe", "tiny-ep4", "--ranks", "4", "--redundant", "4", "-o", "place.json")
        assert r.code == 0, r.err
        r = cli("plan", "hist.json", "--recipe", "tiny-ep4", "--placement", "place.json", "--hot-gib", "0.002",
                "-o", "plan.json")
        assert r.code == 0, r.err
    finally:
        os.chdir(cwd)


def test_a_plan_moved_with_its_placement_still_finds_it(cli, tmp_path, monkeypatch):
    made_in(cli, tmp_path / "made")
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "made", moved)
    shutil.rmtree(tmp_path / "made")
    monkeypatch.chdir(tmp_path)  # neither the folder it was made in nor the one it is in
    plan = load_plan(moved / "plan.json")
    assert plan.placement["path"] == str(moved / "place.json")

    placement = placement_of_plan(plan, (1, 2, 3, 4), 32, 4)  # loads, sha checked
    assert placement.num_ranks == 4


def test_a_different_file_at_the_recorded_path_loses_to_the_matching_one_beside_the_plan(cli, tmp_path, monkeypatch):
    made_in(cli, tmp_path / "made")
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "made", moved)
    (tmp_path / "made" / "place.json").write_text("{}")  # the old folder now holds another file of that name
    monkeypatch.chdir(tmp_path / "made")
    plan = load_plan(moved / "plan.json")
    assert plan.placement["path"] == str(moved / "place.json")
    assert file_sha256(plan.placement["path"]) == plan.placement["sha256"]
