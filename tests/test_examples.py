"""The walk-throughs in examples/ say what their own tables show."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_moving_hotspot_counts_the_redundant_slots_its_table_shows():
    """Issue: it said `all four redundant slots on expert 0` next to a table of 4 copies (3 redundant)."""
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "moving_hotspot_placement.py")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("history-optimised"))
    copies0, copies3 = map(int, re.search(r"(\d+) and (\d+)$", row).groups())
    text = " ".join(r.stdout.split())
    assert f"it spent {copies0 - 1} of its 4 redundant slots on expert 0 ({copies0} copies)" in text
    assert ("a single copy" if copies3 == 1 else f"{copies3} copies") in text
    assert "all four redundant slots" not in text
