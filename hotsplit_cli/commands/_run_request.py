"""What `hotsplit run` was asked to do, in one value: handed from the command to the ranks of
an expert-parallel run (commands/_run_ep.py) instead of a row of positional arguments."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe


@dataclass(frozen=True)
class RunRequest:
    recipe: Recipe
    knobs: Knobs
    plan: Path | None = None  # --plan
    trace: Path | None = None  # --trace
    steps: int | None = None  # --steps
    scale: float | None = None  # --scale
    log_jsonl: Path | None = None  # --log-jsonl
    plot: Path | None = None  # --plot
    platform: Path | None = None  # --platform
    argv: tuple[str, ...] = ()  # this command line, for the ranks a launcher starts with it
