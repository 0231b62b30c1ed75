"""Every command in the README runs as written in a fresh clone (after the Quickstart).

The ```bash blocks of README.md are run in order through bash, in a copy of this checkout, with
`.venv/bin/hotsplit` standing for this checkout's `python -m hotsplit_cli`. The Quickstart's two
lines (`./setup.sh ...`: install, first run, test suite) are left out: CI runs them itself. A
README command this test does not know how to run fails it, so that nothing is skipped unseen.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ("./setup.sh",)  # run by CI, not here
CLI = ".venv/bin/hotsplit "
TORCHRUN = ".venv/bin/torchrun "  # torch's launcher, for the expert-parallel runs
PYTHON = ".venv/bin/python examples/"  # the examples' scripts (a checkpoint of your own)
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache",
                                    "build", "dist", ".whl", "gpu_checks_out")


def readme_commands(text: str) -> list[str]:
    """The command lines of the ```bash blocks, in order (blank and comment lines dropped,
    backslash continuations joined)."""
    commands: list[str] = []
    block: list[str] | None = None
    for line in text.splitlines():
        if block is None:
            if line.strip() == "```bash":
                block = []
        elif line.strip() == "```":
            commands += _joined(block)
            block = None
        else:
            block.append(line)
    return commands


def _joined(lines: list[str]) -> list[str]:
    out, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].strip() + " "
            continue
        full = (pending + line.strip()).strip()
        pending = ""
        if full and not full.startswith("#"):
            out.append(full)
    return out


def to_run(commands: list[str]) -> list[str]:
    return [c for c in commands if not c.startswith(QUICKSTART)]


def make_clone(dest: Path) -> Path:
    """A copy of the checkout whose `.venv/bin/hotsplit` runs its own hotsplit_cli."""
    shutil.copytree(ROOT, dest, ignore=NOT_COPIED)
    shim = dest / ".venv" / "bin" / "hotsplit"
    shim.parent.mkdir(parents=True)
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{dest}" exec "{sys.executable}" -m hotsplit_cli "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    torchrun = dest / ".venv" / "bin" / "torchrun"
    torchrun.write_text(f'#!/bin/sh\nPYTHONPATH="{dest}" exec "{sys.executable}" -m torch.distributed.run "$@"\n')
    torchrun.chmod(torchrun.stat().st_mode | stat.S_IXUSR)
    python = dest / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{dest}" exec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return dest


def run_commands(commands: list[str], clone: Path) -> str:
    """Run each command as written in `clone`; fail at the first that exits non-zero. Returns
    the last command's stdout."""
    # A user's own settings must not change what the README shows.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HOTSPLIT_") and k not in ("PYTHONPATH", "FORCE_COLOR", "TTY_COMPATIBLE")}
    stdout = ""
    for cmd in commands:
        r = subprocess.run(["bash", "-eo", "pipefail", "-c", cmd], cwd=clone, env=env, capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            pytest.fail(f"README command failed (exit {r.returncode}): {cmd}\n{r.stderr[-2000:]}")
        stdout = r.stdout
    return stdout


@pytest.fixture(scope="module")
def commands() -> list[str]:
    return to_run(readme_commands((ROOT / "README.md").read_text()))


def test_every_readme_command_is_one_this_test_runs(commands):
    unknown = [c for c in commands if not c.startswith((CLI, TORCHRUN, PYTHON))]
    assert not unknown, f"teach tests/test_readme.py to run these README commands: {unknown}"
    # The DeepSeek-V3 walk-through from nothing: capture, look, plan, run; then place and plan EP.
    verbs = [c.split()[1:3] for c in commands]
    for want in (["balance", "deepseek-v3"], ["hist", "show"], ["plan", "ds3-hist.json"], ["run", "deepseek-v3"],
                 ["place", "ds3-hist.json"]):
        assert want in verbs, want
    assert any("--placement" in c for c in commands)


def test_every_readme_command_runs_as_written(commands, tmp_path):
    run_commands(commands, make_clone(tmp_path / "clone"))


def test_a_broken_readme_command_fails_the_check(tmp_path):
    text = "```bash\n.venv/bin/hotsplit hist show my-hist.json --recipe deepseek-v3\n```\n"
    with pytest.raises(pytest.fail.Exception, match="my-hist.json"):
        run_commands(to_run(readme_commands(text)), make_clone(tmp_path / "clone"))


def test_readme_blocks_are_parsed_as_a_shell_reads_them():
    text = ("text\n```bash\n./setup.sh && .venv/bin/hotsplit run recipes/tiny.yaml\n# a comment\n\n"
            ".venv/bin/hotsplit plan h.json \\\n  --recipe tiny\n```\n```\nhotsplit probe  -> not bash\n```\n")
    assert readme_commands(text) == ["./setup.sh && .venv/bin/hotsplit run recipes/tiny.yaml",
                                     ".venv/bin/hotsplit plan h.json --recipe tiny"]
    assert to_run(readme_commands(text)) == [".venv/bin/hotsplit plan h.json --recipe tiny"]


def readme_blocks(text: str) -> list[list[str]]:
    """The command lines of each ```bash block, block by block."""
    return [readme_commands(f"```bash\n{block}\n```\n") for block in text.split("```bash\n")[1:]]


def test_a_run_after_a_plan_in_the_same_block_runs_that_plan():
    """Issue: the cold-path block planned 21 hot experts (62.19%), then ran without --plan (54 hot
    experts, 81.6% expected). A run that follows `plan ... -o FILE` in a block runs FILE."""
    checked = 0
    for block in readme_blocks((ROOT / "README.md").read_text()):
        plans: list[str] = []
        for cmd in block:
            words = cmd.split()
            if words[1:2] == ["plan"] and "-o" in words:
                plans.append(words[words.index("-o") + 1])
            elif words[1:2] == ["run"] and plans:
                assert "--plan" in words and words[words.index("--plan") + 1] == plans[-1], cmd
                checked += 1
    assert checked >= 2  # the DeepSeek-V3 walk-through and the cold-path block


def test_what_the_readme_writes_is_ignored_by_git():
    """Following the README leaves nothing untracked: every file its commands write is ignored."""
    written = []
    for cmd in readme_commands((ROOT / "README.md").read_text()):
        words = cmd.split()
        written += [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-o", "--plot", "--trace", "--log-jsonl")
                    and not (w == "--trace" and words[1] == "run")]  # run --trace reads a trace
    assert "platform.json" in written and "tiny-hit-rate.png" in written and "ds3-hist.json" in written
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT, capture_output=True, text=True)
    ignored = set(r.stdout.split())
    assert [w for w in written if w not in ignored] == []


def test_the_readme_ep_block_replays_its_capture_at_the_recipes_batch(tmp_path):
    """Issue: `balance tiny-ep4` recorded one rank's 16 tokens per step, and the replay gave each
    of the 4 ranks 4. The block's plain run (as written) steps each rank the recipe's 16 tokens
    of the captured trace, and achieves the hit rate its plan expects."""
    import re

    block = next(b for b in readme_blocks((ROOT / "README.md").read_text()) if any("tiny-ep4" in c for c in b))
    plain = next(i for i, c in enumerate(block) if c.startswith(CLI + "run tiny-ep4"))
    trace = block[0].split("--trace ")[1].split()[0]
    assert block[0].startswith(CLI + "balance tiny-ep4") and f"--trace {trace}" in block[plain]
    out = run_commands(block[:plain + 1], make_clone(tmp_path / "clone"))
    assert "each rank steps 16 tokens;" in out  # tiny-ep4's traffic.batch
    achieved = float(re.search(r"hit rate \(overall\)\s+([\d.]+)%", out).group(1))
    expected = float(re.search(r"hit rate expected by the plan\s+([\d.]+)%", out).group(1))
    assert abs(achieved - expected) <= 3.0, out
