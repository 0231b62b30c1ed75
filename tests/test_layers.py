"""The layer rule (docs/architecture.md), as import-linter contracts in pyproject.toml: checked on
the tree, shown to fail on a deliberate violation, and every module of hotsplit_cli classified."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter (hotsplit[dev])")

ROOT = Path(__file__).resolve().parent.parent
# folder: import package
IMPORT_NAMES = {"hotsplit_cli": "hotsplit_cli", "runtime": "hotsplit_runtime", "probes": "hotsplit_probes"}
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


LIBRARY_CONTRACTS = ("the planning library", "no torch")


def test_every_entry_of_the_cli_package_is_library_or_shell():
    """A library folder is named by both library contracts; anything else in hotsplit_cli is the shell."""
    folders = {p.name for p in (ROOT / "hotsplit_cli").iterdir() if (p / "__init__.py").exists()}
    modules = {p.stem for p in (ROOT / "hotsplit_cli").glob("*.py")} - {"__init__"}
    for prefix in LIBRARY_CONTRACTS:
        library = next(c for c in contracts() if c["name"].startswith(prefix))["source_modules"]
        named = {m.removeprefix("hotsplit_cli.") for m in library}
        assert named == folders - SHELL, f"{prefix}: name every library folder of hotsplit_cli, and only those"
    assert modules <= SHELL, f"{sorted(modules - SHELL)}: a library module belongs in a library folder"


def import_cycles(*packages: str) -> list[list[str]]:
    """Every strongly connected set of modules (imports under TYPE_CHECKING included)."""
    import grimp

    graph = grimp.build_graph(*packages, include_external_packages=False)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in edges[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for module in edges:
        if module not in order:
            visit(module)
    return cycles


def test_no_import_cycle_anywhere(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    assert import_cycles("hotsplit_cli", "hotsplit_runtime", "hotsplit_probes") == []


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    (tmp_path / "cyc").mkdir()
    (tmp_path / "cyc" / "__init__.py").write_text("")
    (tmp_path / "cyc" / "a.py").write_text("from cyc import b\n")
    lazy = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyc import a\n"  # a cycle all the same
    (tmp_path / "cyc" / "b.py").write_text(lazy)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("cyc") == [["cyc.a", "cyc.b"]]


@pytest.mark.parametrize("module, line, contract", [
    ("probes/hostmem.py", "import hotsplit_runtime.bank", "probes import nothing of hotsplit"),
    ("hotsplit_cli/hotset/planner.py", "import torch", "no torch in the planning library"),
    ("hotsplit_cli/hotset/sizes.py", "from hotsplit_cli.output import gib", "the planning library imports probes only"),
    ("hotsplit_cli/traffic/trace.py", "import hotsplit_runtime.engine", "the planning library imports probes only"),
    ("hotsplit_cli/core/units.py", "from hotsplit_cli.config import recipe", "the basics (core) import nothing else"),
    ("runtime/engine.py", "from hotsplit_cli.commands import run", "the runtime imports the library and probes"),
    ("hotsplit_cli/output.py", "import hotsplit_runtime.device", "only commands import the runtime"),
    ("hotsplit_cli/commands/plan.py", "import hotsplit_runtime.engine", "commands enter the runtime through its one"),
    ("hotsplit_cli/commands/run.py", "from hotsplit_runtime.distributed import launch", "commands enter the runtime"),
])
def test_a_deliberate_violation_breaks_its_contract(tmp_path, module, line, contract):
    for folder, name in IMPORT_NAMES.items():  # copied under their import names, found first on PYTHONPATH
        shutil.copytree(ROOT / folder, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "recipes"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    folder, rest = module.split("/", 1)
    target = tmp_path / IMPORT_NAMES[folder] / rest
    target.write_text(target.read_text() + f"\n\ndef _violation():\n    {line}  # noqa\n")
    r = lint_imports(tmp_path)
    assert r.returncode == 1, r.stdout
    broken = r.stdout.split("Broken contracts")[-1]
    assert contract in broken


def test_the_front_door_contract_names_every_other_runtime_module():
    """Commands import `hotsplit_runtime.api` only: the contract forbids every other top-level
    module and folder of the runtime, so a new one is forbidden as soon as it is added."""
    door = next(c for c in contracts() if c["name"].startswith("commands enter the runtime"))
    assert door["source_modules"] == ["hotsplit_cli.commands"]
    runtime = {p.stem for p in (ROOT / "runtime").glob("*.py")} | {
        p.name for p in (ROOT / "runtime").iterdir() if (p / "__init__.py").exists()}
    want = {f"hotsplit_runtime.{m}" for m in runtime - {"__init__", "api"}}
    assert set(door["forbidden_modules"]) == want


def test_no_folder_imports_another_that_imports_it_back(monkeypatch):
    """Folders import each other one way, lazy imports included: no folder circle hides behind an
    import inside a function (traffic/ <-> hotset/, runtime/hf/ <-> runtime/distributed/ were)."""
    import grimp

    monkeypatch.syspath_prepend(str(ROOT))
    graph = grimp.build_graph("hotsplit_cli", "hotsplit_runtime", "hotsplit_probes", include_external_packages=False)

    def folder(module: str) -> str | None:  # a package's top-level modules are no folder
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 else None

    edges = {(folder(m), folder(n)) for m in graph.modules for n in graph.find_modules_directly_imported_by(m)}
    edges = {(a, b) for a, b in edges if a and b and a != b}
    assert sorted((a, b) for a, b in edges if (b, a) in edges and a < b) == []


LAZY_REASON = re.compile(r"#.*\b(torch|matplotlib|triton|transformers|pynvml|cycle)\b", re.IGNORECASE)


def unexplained_lazy_imports(paths) -> list[str]:
    """`path:line` of each import of hotsplit's own code inside a function that says no reason: a
    comment on its first line, or on the line above it or above the run of imports it stands in,
    naming the cost it defers (torch, matplotlib, triton, transformers, pynvml) or the cycle it breaks."""
    own = tuple(IMPORT_NAMES.values())
    found = []
    for path in paths:
        lines = Path(path).read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for body in (getattr(n, f) for n in ast.walk(fn) for f in ("body", "orelse", "finalbody")
                         if isinstance(getattr(n, f, None), list)):
                first = None  # the first line of the run of imports a statement stands in
                for st in body:
                    if not isinstance(st, ast.Import | ast.ImportFrom):
                        first = None
                        continue
                    first = first or st.lineno
                    names = [st.module or ""] if isinstance(st, ast.ImportFrom) else [a.name for a in st.names]
                    if not (getattr(st, "level", 0) or any(n.split(".")[0] in own for n in names)):
                        continue
                    said = [lines[st.lineno - 1], lines[st.lineno - 2], lines[first - 1], lines[first - 2]]
                    if not any(LAZY_REASON.search(x) for x in said):
                        found.append(f"{path}:{st.lineno}")
    return sorted(set(found))


def test_every_import_inside_a_function_says_why():
    """hotsplit's own modules are imported at the top; one imported inside a function says why
    (the torch, matplotlib, ... cost it defers, or the cycle it breaks) in a comment."""
    paths = [p for folder in IMPORT_NAMES for p in sorted((ROOT / folder).rglob("*.py"))]
    assert [str(Path(p).relative_to(ROOT)) for p in unexplained_lazy_imports(paths)] == []


def test_the_lazy_import_check_finds_an_unexplained_import(tmp_path):
    code = ("import numpy as np\n\n\ndef f():\n    import json\n    from hotsplit_cli.core import units\n\n"
            "    from . import sibling  # here, not at the top: sibling imports this module (a cycle)\n\n"
            "    from hotsplit_runtime import device  # torch from here on\n    from . import engine\n\n"
            "    return units\n")
    (tmp_path / "m.py").write_text(code)
    assert unexplained_lazy_imports([tmp_path / "m.py"]) == [f"{tmp_path / 'm.py'}:6"]


STATE_REASON = re.compile(r"#.*\b(process-wide|cache)\b", re.IGNORECASE)
MUTATORS = {"append", "extend", "clear", "pop", "popitem", "update", "add", "remove", "discard", "setdefault",
            "insert"}


def unexplained_module_state(paths) -> list[str]:
    """`path:line` of each module-level value its module changes (a method that mutates it, or an
    item assigned) and each cached function, with no comment on its line or the comment block
    above it saying it is process-wide on purpose or a cache."""
    found = []
    for path in paths:
        lines = Path(path).read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        names = {t.id: st for st in tree.body if isinstance(st, ast.Assign | ast.AnnAssign)
                 for t in (st.targets if isinstance(st, ast.Assign) else [st.target]) if isinstance(t, ast.Name)}
        changed = {n.func.value.id for n in ast.walk(tree) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS
                   and isinstance(n.func.value, ast.Name)}
        changed |= {t.value.id for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AugAssign)
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)}
        held = [names[n] for n in changed if n in names]
        held += [d for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for d in f.decorator_list
                 if "cache" in ast.unparse(d)]
        for st in held:
            said, i = [lines[st.lineno - 1]], st.lineno - 2
            while i >= 0 and lines[i].lstrip().startswith("#"):
                said.append(lines[i])
                i -= 1
            if not any(STATE_REASON.search(x) for x in said):
                found.append(f"{path}:{st.lineno}")
    return sorted(found)


def test_module_level_state_says_it_is_process_wide_or_a_cache():
    paths = [p for folder in IMPORT_NAMES for p in sorted((ROOT / folder).rglob("*.py"))]
    assert [str(Path(p).relative_to(ROOT)) for p in unexplained_module_state(paths)] == []


def test_the_state_check_finds_unexplained_state(tmp_path):
    code = ("import functools\n\nTABLE = {'a': 1}  # read only\nSEEN = []\n# process-wide on purpose: a signal "
            "handler sets it\nASKED = {'stop': False}\n\n\ndef f(x):\n    SEEN.append(x)\n    ASKED['stop'] = True\n"
            "    return TABLE[x]\n\n\n@functools.cache\ndef g(x):\n    return x\n")
    (tmp_path / "m.py").write_text(code)
    assert unexplained_module_state([tmp_path / "m.py"]) == [f"{tmp_path / 'm.py'}:15", f"{tmp_path / 'm.py'}:4"]
