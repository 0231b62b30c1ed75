"""Shared command-line options as `Annotated` aliases (one definition, used by every command)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else.")]
OutOpt = Annotated[Path | None, typer.Option("--output", "-o", help="Write the result here (atomically).")]
RecipeOpt = Annotated[str | None, typer.Option("--recipe", "-r", help="Recipe YAML file or shipped recipe name.")]
RecipeArg = Annotated[str, typer.Argument(help="Recipe YAML file or shipped recipe name (e.g. tiny).")]
HotGibOpt = Annotated[
    str | None,
    typer.Option("--hot-gib", help="Per-rank hot budget in GiB (overrides HOTSPLIT_HOT_GIB and the recipe)."),
]
PlatformOpt = Annotated[
    Path | None, typer.Option("--platform", help="platform.json from `hotsplit probe` (measured budget and speeds).")
]
ColdPathOpt = Annotated[
    str | None,
    typer.Option("--cold-path", help="Who computes cold experts: gpu (zero-copy), cpu, or split by the measured "
                                     "cost model (overrides HOTSPLIT_COLD_PATH and the recipe)."),
]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Also draw a PNG here (needs matplotlib).")]
