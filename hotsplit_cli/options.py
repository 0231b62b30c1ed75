"""Shared command-line options as `Annotated` aliases (one definition, used by every command)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.core.jsonio import output_problem


def writable_output(param: typer.CallbackParam, value: Path | None, suffix: str | None = None) -> Path | None:
    """Callback of every option that names an output file: refuse a folder, a missing or read-only
    folder, and a name whose extension is not `suffix` (the one rule for every output: the
    extension names the format written), while the command line is parsed, before any work
    (exit 2, nothing written)."""
    if value is not None:
        flag = max(param.opts, key=len)
        problem = output_problem(value)
        if problem:
            raise UsageError(f"{flag} {value}: {problem[0]}", problem[1])
        if suffix is not None and value.suffix.lower() != suffix:
            raise UsageError(f"{flag} {value}: must end in {suffix} (it writes {FORMATS[suffix]})",
                             f"name it {value.with_suffix(suffix).name}")
    return value


FORMATS = {".png": "a PNG image", ".npz": "a numpy .npz routing trace", ".json": "JSON", ".jsonl": "JSON lines"}


def output_option(*names: str, help: str, suffix: str | None = None) -> typer.models.OptionInfo:
    """A `typer.Option` for a file the command writes in the format `suffix` names, checked by
    `writable_output`."""
    def check(param: typer.CallbackParam, value: Path | None) -> Path | None:
        return writable_output(param, value, suffix)

    return typer.Option(*names, help=help, callback=check)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else.")]
OutOpt = Annotated[Path | None, output_option("--output", "-o", help="Write the result here (atomically).",
                                              suffix=".json")]
RecipeOpt = Annotated[str | None, typer.Option("--recipe", "-r", help="Recipe YAML file or shipped recipe name.")]
RecipeArg = Annotated[str, typer.Argument(metavar="RECIPE",
                                          help="Recipe YAML file or shipped recipe name (e.g. tiny).")]
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
PlotOpt = Annotated[Path | None, output_option("--plot", help="Also draw a PNG here.", suffix=".png")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
PrefetchOpt = Annotated[str | None, typer.Option(
    "--prefetch", help="Override HOTSPLIT_PREFETCH: off, lookahead, trace or auto (docs/prefetch.md).")]
PrefetchSlotsOpt = Annotated[str | None, typer.Option(
    "--prefetch-slots", help="Override HOTSPLIT_PREFETCH_SLOTS: staging slots, carved from the hot budget.")]
PrefetchPoolOpt = Annotated[str | None, typer.Option(
    "--prefetch-pool", help="Override HOTSPLIT_PREFETCH_POOL: layer (slots for each layer) or shared.")]
PrefetchGuessesOpt = Annotated[str | None, typer.Option(
    "--prefetch-guesses", help="Override HOTSPLIT_PREFETCH_GUESSES: guesses per token (past top_k widens).")]
