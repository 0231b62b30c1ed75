"""The layer rule (docs/architecture.md), as import-linter contracts in pyproject.toml: checked on
the tree, shown to fail on a deliberate violation, and every module of hotsplit_cli classified."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter (hotsplit[dev])")

ROOT = Path(__file__).resolve().parent.parent
SHELL = {"cli", "__main__", "commands", "output", "options", "plotting"}  # the CLI: parses, calls, renders


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()", "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_the_tree_keeps_every_layer_contract():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout or "broken" not in r.stdout.split("Contracts:")[-1]


def test_every_module_of_the_cli_package_is_library_or_shell():
    library = set(next(c for c in contracts() if c["name"].startswith("the planning library"))["source_modules"])
    modules = {p.stem for p in (ROOT / "hotsplit_cli").glob("*.py")} | {"commands"}
    named = {m.removeprefix("hotsplit_cli.") for m in library}
    unclassified = modules - named - SHELL - {"__init__"}
    assert not unclassified, f"add {sorted(unclassified)} to the library contracts in pyproject.toml, or to SHELL"
    torch_free = set(next(c for c in contracts() if c["name"].startswith("no torch"))["source_modules"])
    assert torch_free == library


@pytest.mark.parametrize("module, line, contract", [
    ("probes/hostmem.py", "import runtime.bank", "probes import nothing of hotsplit"),
    ("hotsplit_cli/planner.py", "import torch", "no torch in the planning library"),
    ("hotsplit_cli/sizes.py", "from .output import gib", "the planning library imports probes only"),
    ("runtime/engine.py", "from hotsplit_cli.commands import run", "the runtime imports the library and probes"),
    ("hotsplit_cli/output.py", "import runtime.device", "only commands import the runtime"),
])
def test_a_deliberate_violation_breaks_its_contract(tmp_path, module, line, contract):
    for name in ("hotsplit_cli", "runtime", "probes"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "recipes"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\ndef _violation():\n    {line}  # noqa\n")
    r = lint_imports(tmp_path)
    assert r.returncode == 1, r.stdout
    broken = r.stdout.split("Broken contracts")[-1]
    assert contract in broken
