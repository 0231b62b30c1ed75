"""An EP run's header says how the experts are laid out: the plan's placement, or the contiguous
split when the plan was made without --placement."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.runtime.ep.harness import REPO, run_job

HOTSPLIT = [sys.executable, "-m", "hotsplit_cli"]
HIST = REPO / "examples" / "hist-tiny.json"


def test_a_plan_without_placement_says_contiguous_in_the_header(tmp_path: Path, cli):
    plan = tmp_path / "plan.json"
    assert cli("plan", HIST, "--recipe", "tiny-ep4", "-o", plan).code == 0
    done = run_job([*HOTSPLIT, "run", "tiny-ep4", "--plan", str(plan), "--steps", "2"])
    assert done.returncode == 0, done.stderr[-3000:]
    header = next(x for x in done.stdout.splitlines() if x.startswith("expert parallel:"))
    assert "layout contiguous: the plan was made without --placement" in header, header
    plan_line = next(x for x in done.stdout.splitlines() if x.startswith("plan"))
    assert plan_line.startswith("plan, rank 0 of 4 (each rank its own hot set): "), plan_line  # not the job's total
    flat = " ".join(done.stdout.split())  # table cells wrap when piped
    assert "balancedness (per exchange)" in flat and "bottleneck rank (run totals)" in flat
    assert "measured vs" in flat and "by the ledger at" in flat and "of a step (" in flat, flat[-1500:]
