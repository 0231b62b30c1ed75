"""scripts/install_engine_checks.sh is best effort: it never fails its caller (CI runs it before
the tests), whatever it cannot install."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install_engine_checks.sh"


def test_without_a_venv_it_says_so_and_succeeds(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    r = subprocess.run(["bash", str(tmp_path / "scripts" / SCRIPT.name)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no .venv" in r.stderr and r.stdout == ""


def test_a_package_that_cannot_be_had_is_skipped_with_a_line(tmp_path):
    """A venv whose python finds nothing and whose pip always fails: one line per package, exit 0."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text("#!/bin/sh\nexit 1\n")  # every import check and every pip call fails
    (bin_ / "python").chmod(0o755)
    r = subprocess.run(["bash", str(tmp_path / "scripts" / SCRIPT.name)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for pkg in ("sglang-kt==0.7.2", "kt-kernel==0.7.2", "gguf==0.19.0", "vllm_ascend-0.23.0.post1"):
        assert pkg in r.stderr, r.stderr
