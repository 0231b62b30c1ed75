"""`hotsplit recipe --model DIR|config.json -o R.yaml`: a recipe written from a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hotsplit_cli.config.recipe_writer import hardware_of, write_checkpoint_recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.core.jsonio import write_atomic
from hotsplit_cli.options import JsonOpt, PlatformOpt, writable_output
from hotsplit_cli.output import Output


def _yaml_output(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """-o names a writable .yaml (or .yml) file, checked before any work."""
    value = writable_output(param, value)
    if value is not None and value.suffix.lower() not in (".yaml", ".yml"):
        raise UsageError(f"-o {value}: must end in .yaml (it writes a recipe)", f"name it {value.stem}.yaml")
    return value


def recipe_cmd(
    model: Annotated[Path, typer.Option("--model", help="Checkpoint folder, or its config.json (the weights may be "
                                        "absent: sizes then come from the index or the geometry).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The recipe to write (.yaml).",
                                         callback=_yaml_output)],
    gpu_mem_gib: Annotated[float | None, typer.Option(
        "--gpu-mem-gib", show_default="--platform's GPU 0",
        help="GPU memory per rank in GiB (it or --platform is needed).")] = None,
    platform: PlatformOpt = None,
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel size.", min=1)] = 1,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size.", min=1)] = 1,
    prompts: Annotated[Path | None, typer.Option("--prompts", show_default="none: no traffic section",
                                                 help="Sample prompts (.jsonl or text): the recipe's traffic.")] = None,
    json: JsonOpt = False,
) -> None:
    """Write a recipe from a Hugging Face checkpoint's config.json and safetensors headers."""
    out = Output(json)
    if prompts is not None and not prompts.is_file():
        raise UsageError(f"--prompts {prompts}: no such file")
    written = write_checkpoint_recipe(model, output, hardware_of(gpu_mem_gib, platform), ep, tp, prompts)
    write_atomic(output, lambda fh: fh.write(written.text), mode="w")
    g, p = written.geometry, written.params
    doc = {"output": str(output), "family": g.family, "moe_layers": list(g.moe_layer_ids),
           "num_experts": g.num_experts, "top_k": g.top_k, "expert_dtype": g.expert_dtype,
           "total_params": p.total_params, "params_source": p.source, "params_exact": p.exact}

    def render() -> None:
        out.print(f"{g.family}: {len(g.moe_layer_ids)} MoE layers of {g.num_hidden_layers}, {g.num_experts} experts, "
                  f"top-{g.top_k}, {g.expert_dtype} experts; {p.total_params:,.0f} parameters ({p.source})")

    out.emit(doc, render)
    out.note(f"wrote {output}")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("recipe")(recipe_cmd)
