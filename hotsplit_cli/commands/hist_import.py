"""`hotsplit hist import FILE... --from sglang|vllm -o hist.json`: what a serving engine recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from hotsplit_runtime import api

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.options import JsonOpt, RecipeOpt, RequiredOutOpt
from hotsplit_cli.output import Output
from hotsplit_cli.traffic.hist import save_hist
from hotsplit_cli.traffic.serving_import import read_serving, to_histogram

FromOpt = Annotated[str, typer.Option("--from", metavar="sglang|vllm", help="The engine that wrote the files.")]
ModelOpt = Annotated[str | None, typer.Option("--model", show_default="the recipe's model name", metavar="NAME",
                                                     help="Model name stored in the histogram.")]
TopKOpt = Annotated[int | None, typer.Option("--top-k", show_default="the recipe's top_k",
                                                  help="Experts per token (when no recipe says it).")]


def import_cmd(
    files: Annotated[list[Path], typer.Argument(metavar="FILE", help="Engine dumps (per-rank dumps are summed).")],
    output: RequiredOutOpt,
    engine: FromOpt = "sglang",
    recipe: RecipeOpt = None,
    model: ModelOpt = None,
    top_k: TopKOpt = None,
    json: JsonOpt = False,
) -> None:
    """Import routing counts recorded by SGLang (or saved from vLLM) as a hotsplit histogram."""
    out = Output(json)
    if top_k is not None and top_k < 1:
        raise UsageError(f"--top-k: must be >= 1, got {top_k}")
    spec = None
    if recipe is not None:
        spec = load_recipe(recipe).model
    ec = read_serving(engine, files, _read_pt)
    imp = to_histogram(ec, spec, top_k, model, where=", ".join(map(str, files)))
    save_hist(output, imp.hist)
    h = imp.hist
    doc = {
        "output": str(output),
        "engine": engine,
        "source": h.source,
        "model": h.model,
        "layers": list(h.layers),
        "num_experts": h.num_experts,
        "top_k": h.top_k,
        "tokens": h.tokens,
        "steps": ec.steps,
        "notes": list(imp.notes),
    }

    def render() -> None:
        out.print(f"imported {h.num_layers} MoE layers x {h.num_experts} experts, top_k {h.top_k}, "
                  f"{h.tokens} tokens from {engine} ({h.source})")
        for note in imp.notes:
            out.print(f"  {note}")

    out.emit(doc, render)
    out.note(f"wrote {output}")


def _read_pt(path: Path) -> object:
    """A tensors-only .pt dump. torch is imported only when such a file is read (JSON dumps need none)."""
    return api.load_tensors(path)


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    hist_app.command("import")(import_cmd)
