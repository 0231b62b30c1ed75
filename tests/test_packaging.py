"""A wheel install (not editable) finds the shipped recipes from any folder."""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hotsplit_cli.config.recipe import RECIPES_DIR

ROOT = Path(__file__).resolve().parent.parent
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "out", "*.egg-info", "__pycache__",
                                    ".hypothesis", ".ruff_cache", ".pytest_cache", "mutants")


def test_checkout_recipes_folder_is_the_packaged_one():
    """One copy of every recipe: `recipes/` in a checkout leads to the package's folder."""
    assert RECIPES_DIR == ROOT / "hotsplit_cli" / "config" / "recipes" and (RECIPES_DIR / "tiny.yaml").is_file()
    assert (ROOT / "recipes").resolve() == RECIPES_DIR


@pytest.mark.slow  # about 10 s: builds the wheel and installs it into a new virtual environment
@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None or importlib.util.find_spec("pip") is None,
                    reason="building the wheel offline needs pip and setuptools in this environment")
def test_wheel_install_runs_a_shipped_recipe_from_another_folder(tmp_path):
    src, wheels, venv = tmp_path / "src", tmp_path / "wheels", tmp_path / "venv"
    shutil.copytree(ROOT, src, symlinks=True, ignore=NOT_SOURCE)  # the build writes build/ next to the sources
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, src], check=True,
                   timeout=300)
    wheel = next(wheels.glob("hotsplit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(p.name for p in RECIPES_DIR.glob("*.yaml"))
    assert sorted(n.split("/")[-1] for n in names if n.startswith("hotsplit_cli/config/recipes/")) == shipped

    # A fresh environment that sees this one's packages (torch, numpy, ...) but not its hotsplit.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    venv_site = next(venv.glob("lib/python*/site-packages"))
    (venv_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([*pip, "--python", venv / "bin" / "python", "install", "-q", "--no-deps", "--no-index", wheel],
                   check=True, timeout=300)
    # PyPI has packages named `runtime` and `probes`: stand-ins for them sit beside hotsplit.
    for name in ("runtime", "probes"):
        (venv_site / name).mkdir()
        (venv_site / name / "__init__.py").write_text(f"WHO = 'the stand-in {name}'\n")
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"hotsplit_cli", "hotsplit_runtime", "hotsplit_probes"}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([venv / "bin" / "hotsplit", "ledger", "deepseek-v3"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ledger: deepseek-v3 (deepseek-ai/DeepSeek-V3)")
    r = subprocess.run([venv / "bin" / "hotsplit", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "Usage" in r.stdout, r.stderr
    r = subprocess.run([venv / "bin" / "hotsplit", "run", "tiny", "--steps", "4", "--json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)  # the runtime and the probes, imported
    assert r.returncode == 0, r.stderr
    both = "import runtime, probes; print(runtime.WHO, '/', probes.WHO)"
    r = subprocess.run([venv / "bin" / "python", "-c", both], cwd=tmp_path, env=env, capture_output=True, text=True,
                       check=True)
    assert r.stdout.strip() == "the stand-in runtime / the stand-in probes"
    where_cmd = "import hotsplit_cli.config.recipe as r; print(r.RECIPES_DIR)"
    where = subprocess.run([venv / "bin" / "python", "-c", where_cmd],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv)


def test_the_wheel_lists_every_package_folder_under_its_import_name():
    """pyproject names the packages one by one (two folders install under another name): a new
    package folder that is not listed would be missing from the wheel."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folder_of = {name: folder for name, folder in tool["package-dir"].items()}
    assert folder_of == {"hotsplit_runtime": "runtime", "hotsplit_probes": "probes"}
    on_disk = set()
    for name in ("hotsplit_cli", "hotsplit_runtime", "hotsplit_probes"):
        base = ROOT / folder_of.get(name, name)
        on_disk |= {".".join((name, *p.parent.relative_to(base).parts)) for p in base.rglob("__init__.py")}
    assert set(tool["packages"]) == on_disk


def test_no_source_imports_a_generic_top_level_name():
    """`runtime` and `probes` are folders, not import names: an import of either would work in a
    checkout (the folder is on sys.path) and break in an install beside PyPI's packages of those names."""
    import ast

    bad = []
    for path in ROOT.rglob("*.py"):
        if {".venv", "mutants", "build", ".git"} & set(path.relative_to(ROOT).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [])
            generic = [n for n in names if n.split(".")[0] in ("runtime", "probes")]
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in generic]
    assert bad == []


def test_matplotlib_is_a_dependency_and_the_plot_extra_still_works():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("matplotlib") for d in project["dependencies"])
    assert any(d.startswith("matplotlib") for d in project["optional-dependencies"]["plot"])


def test_missing_matplotlib_hint_installs_matplotlib_not_hotsplit_from_the_index(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "hit.png"
    r = cli("run", "tiny", "--steps", "5", "--plot", png)
    assert r.code == 1 and r.out == "" and not png.exists()
    assert r.err.splitlines() == ["error: --plot needs matplotlib, a dependency of hotsplit missing from this "
                                  "environment; install it with `pip install 'matplotlib>=3.7'` (in a checkout "
                                  "./setup.sh does)"]


def test_quickstart_is_two_commands_and_the_first_draws_a_named_plot():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = block.strip().splitlines()
    assert len(commands) == 2
    words = commands[0].split()
    png = words[words.index("--plot") + 1]
    assert png.endswith(".png") and f"`{png}`" in section.replace(block, "")


def test_every_test_runs_under_a_timeout(pytestconfig):
    """pytest-timeout (the dev extra) is active with pyproject's default, so a hung test fails on
    its own instead of stalling the whole run."""
    import tomllib

    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pip install -e '.[dev]' (pytest-timeout)"
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert float(pytestconfig.getini("timeout")) == ini["timeout"] == 900
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("pytest-timeout") for d in dev)

