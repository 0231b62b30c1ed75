"""Progress while the ranks of an EP run start (was: nine silent seconds): the launcher says it
starts them, rank 0 says when every rank has joined and when every rank's banks are built, once
each, in that order, on stderr; stdout keeps only the run's own lines."""

from __future__ import annotations

import sys

from tests.runtime.ep.harness import run_job, tiny_ep_recipe


def test_the_launcher_and_rank_zero_show_the_set_up_on_stderr(tmp_path):
    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 2)
    done = run_job([sys.executable, "-m", "hotsplit_cli", "run", str(recipe), "--steps", "2"], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [x for x in done.stderr.splitlines() if x.startswith("expert parallel:")]
    assert [x.split(" after ")[0] for x in lines] == [
        "expert parallel: starting 2 local ranks",
        "expert parallel: 2 ranks joined (gloo)",
        "expert parallel: every rank's banks built",
    ], done.stderr[-3000:]
    joined, built = (float(x.split(" after ")[1].split(" s")[0]) for x in lines[1:])
    assert 0 < joined <= built < 120
    assert "joined" not in done.stdout and "banks built" not in done.stdout
