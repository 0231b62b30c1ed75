"""Shared command-line options as `Annotated` aliases (one definition, used by every command)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hotsplit_cli.config.knobs import AUTO_HOT_GIB, KNOB_MEANINGS, knob_spec
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


NOT_WRITTEN = "none: not written"  # what --help says an output file option does when it is not given


def output_option(*names: str, help: str, suffix: str | None = None,
                  show_default: str | None = None) -> typer.models.OptionInfo:
    """A `typer.Option` for a file the command writes in the format `suffix` names, checked by
    `writable_output`; `show_default`: what happens without it (None for a required option)."""
    def check(param: typer.CallbackParam, value: Path | None) -> Path | None:
        return writable_output(param, value, suffix)

    return typer.Option(*names, help=help, callback=check, show_default=show_default or True)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else.")]
OutOpt = Annotated[Path | None, output_option("--output", "-o", help="Write the result here (atomically).",
                                              suffix=".json", show_default=NOT_WRITTEN)]
RequiredOutOpt = Annotated[Path, output_option("--output", "-o", help="Write the result here (atomically).",
                                               suffix=".json")]
RECIPE_HELP = "Recipe YAML file or shipped recipe name."
RecipeOpt = Annotated[str | None, typer.Option("--recipe", "-r", metavar="RECIPE", show_default="none",
                                               help=RECIPE_HELP)]
RequiredRecipeOpt = Annotated[str, typer.Option("--recipe", "-r", metavar="RECIPE", help=RECIPE_HELP)]
RecipeArg = Annotated[str, typer.Argument(metavar="RECIPE",
                                          help="Recipe YAML file or shipped recipe name (e.g. tiny).")]
def knob_option(name: str) -> typer.models.OptionInfo:
    """The flag of knob `name` (config/knobs.py): what it means, what it overrides, the type it is
    read as and its built-in default. Its value is parsed by `resolve_knobs`, like the variable's
    and the recipe's, so all three are refused with the same message."""
    spec = knob_spec(name)
    metavar = "|".join(spec.choices) if spec.choices else f"<{spec.kind.__name__}>"
    default = AUTO_HOT_GIB if spec.default is None else f"{spec.default:g}" if spec.kind is float else str(spec.default)
    return typer.Option(f"--{name.replace('_', '-')}", metavar=metavar, show_default=default,
                        help=f"{KNOB_MEANINGS[name]}; overrides {spec.env} and the recipe.")


HotGibOpt = Annotated[str | None, knob_option("hot_gib")]
PlatformOpt = Annotated[
    Path | None, typer.Option("--platform", show_default="none: nothing measured",
                              help="platform.json from `hotsplit probe` (measured budget and speeds).")
]
ColdPathOpt = Annotated[str | None, knob_option("cold_path")]
PrecisionOpt = Annotated[str | None, knob_option("precision")]
PlotOpt = Annotated[Path | None, output_option("--plot", help="Also draw a PNG here.", suffix=".png",
                                               show_default="none: no plot")]
DeviceOpt = Annotated[str, typer.Option("--device", metavar="auto|cpu|cuda|cuda:N", help="Where to run.")]
PrefetchOpt = Annotated[str | None, knob_option("prefetch")]
PrefetchSlotsOpt = Annotated[str | None, knob_option("prefetch_slots")]
PrefetchPoolOpt = Annotated[str | None, knob_option("prefetch_pool")]
PrefetchGuessesOpt = Annotated[str | None, knob_option("prefetch_guesses")]
