"""`hotsplit balance`: the routing histogram of a model on sample traffic.

From a Hugging Face checkpoint (`--model DIR`, or a recipe with `model.kind: hf`) run on prompts,
or from a recipe's synthetic model (random routers of its geometry) for planning what-ifs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from hotsplit_runtime import api

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.config.recipe_writer import UNKNOWN_GPU, write_checkpoint_recipe
from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.core.jsonio import write_atomic
from hotsplit_cli.hotset.lookahead import lookahead_guesses
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.options import DeviceOpt, JsonOpt, OutOpt, PrefetchGuessesOpt, RecipeOpt, output_option
from hotsplit_cli.output import Output
from hotsplit_cli.traffic.hist import Histogram, save_hist
from hotsplit_cli.traffic.histstats import hist_report
from hotsplit_cli.traffic.prompts import read_prompts
from hotsplit_cli.traffic.quality import measured_quality, quality_line, quality_summary
from hotsplit_cli.traffic.trace import Trace, save_trace

from .hist_show import render_hist_report

DTYPES = ("auto", "bfloat16", "float16", "float32")


def windows_of(steps_SLE: np.ndarray, steps_per_window: int) -> np.ndarray:
    """Sum consecutive steps into windows [W, L, E]; the last window may be shorter."""
    S = steps_SLE.shape[0]
    starts = np.arange(0, S, steps_per_window)
    return np.add.reduceat(steps_SLE, starts, axis=0).astype(np.float64)


def _check_counts(max_new_tokens, windows_steps, batch_size, steps, dtype: str) -> None:
    """The numeric flags and --dtype, refused in one line before anything is read."""
    for flag, value in (("--max-new-tokens", max_new_tokens), ("--window-steps", windows_steps)):
        if value is not None and value < (0 if flag == "--max-new-tokens" else 1):
            raise UsageError(f"{flag}: must be >= {0 if flag == '--max-new-tokens' else 1}, got {value}")
    for flag, value in (("--batch-size", batch_size), ("--steps", steps)):
        if value is not None and value < 1:
            raise UsageError(f"{flag}: must be >= 1, got {value}")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")


def balance_cmd(
    recipe_arg: Annotated[str | None, typer.Argument(metavar="RECIPE", help="Recipe YAML or shipped name.")] = None,
    recipe: RecipeOpt = None,
    model: Annotated[Path | None, typer.Option("--model", show_default="the recipe's model.path",
                                               help="Local Hugging Face checkpoint folder.")] = None,
    prompts: Annotated[Path | None, typer.Option("--prompts", show_default="the recipe's traffic.path",
                                                 help=".jsonl (prompt / messages) or text, "
                                                 "one prompt per line.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", show_default="the recipe's, else 32",
                                                       help="Greedy decode tokens per "
                                                       "prompt (0: prefill only).")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", show_default="the recipe's traffic.batch, else 8",
                                                   help="Prompts per batch; synthetic model: "
                                                   "tokens per step (each rank's, for an EP recipe).")] = None,
    steps: Annotated[int | None, typer.Option("--steps", show_default="the recipe's run.steps",
                                           help="Synthetic model: engine steps to route.")] = None,
    window_steps: Annotated[int | None, typer.Option("--window-steps", show_default="none: totals only",
                                                     help="Keep counts per window of N "
                                                     "steps.")] = None,
    # The earlier spelling, still accepted (simulate and the docs say --window-steps).
    windows_steps: Annotated[int | None, typer.Option("--windows-steps", hidden=True)] = None,
    trace: Annotated[Path | None, output_option("--trace", help="Also save the routing trace (.npz).",
                                                show_default="none: not written", suffix=".npz")] = None,
    device: DeviceOpt = "auto",
    dtype: Annotated[str, typer.Option("--dtype", metavar="|".join(DTYPES),
                                       help="auto: the checkpoint's.")] = "auto",
    quality: Annotated[bool, typer.Option("--quality/--no-quality",
                                          help="With --model: also measure each expert's error at fp8 and mxfp4 "
                                          "and the model's agreement (a second pass over the prompts).")] = True,
    prefetch_guesses: PrefetchGuessesOpt = None,
    output: OutOpt = None,
    json: JsonOpt = False,
) -> None:
    """Capture the routing histogram of a model on sample traffic (exact counts)."""
    out = Output(json)
    if recipe_arg is not None and recipe is not None:
        raise UsageError("give the recipe once (RECIPE or --recipe)")
    recipe_name = recipe_arg or recipe
    windows_steps = _one_spelling(window_steps, windows_steps)
    _check_counts(max_new_tokens, windows_steps, batch_size, steps, dtype)
    rec, model = _recipe_and_model(recipe_name, model)
    if model is not None:
        hist, trace_obj, notes = _from_checkpoint(out, model, rec, prompts, max_new_tokens, batch_size,
                                                  windows_steps, trace is not None, device, dtype, quality,
                                                  prefetch_guesses)
    else:
        _refuse_checkpoint_flags(rec, prompts, prefetch_guesses)
        hist, trace_obj, notes = _from_synthetic(out, rec, steps, batch_size, windows_steps, trace is not None)
    if output is not None:
        save_hist(output, _with_recipe(hist, output, rec, recipe_name, model, prompts))
    if trace_obj is not None:
        save_trace(trace, trace_obj)
    _report(out, hist, output, trace, notes, rec)


def _recipe_and_model(recipe_name: str | None, model: Path | None):
    """(the recipe named, or None; the checkpoint: --model, else the recipe's when it runs one)."""
    rec = None
    if recipe_name is not None:
        rec = load_recipe(recipe_name)
    if model is None and rec is not None and rec.model.kind == "hf":
        model = rec.model.path
    if model is None and rec is None:
        raise UsageError("balance needs --model DIR or a recipe", "e.g. `hotsplit balance --model ./ckpt --prompts "
                         "p.jsonl -o hist.json` or `hotsplit balance tiny -o hist.json`")
    return rec, model


def _with_recipe(hist: Histogram, output: Path, rec, recipe_name, model, prompts) -> Histogram:
    """The histogram naming the recipe it came from: the one given, else a recipe written from
    the checkpoint beside the histogram (`<name>.recipe.yaml`), so that `plan HIST` needs none."""
    import dataclasses

    if rec is not None:
        given = Path(recipe_name)
        return dataclasses.replace(hist, recipe=str(given.resolve()) if given.is_file() else recipe_name)
    if model is None:
        return hist

    beside = output.with_name(f"{output.stem}.recipe.yaml")
    written = write_checkpoint_recipe(model, beside, UNKNOWN_GPU, prompts=Path(prompts) if prompts else None)
    write_atomic(beside, lambda fh: fh.write(written.text), mode="w")
    return dataclasses.replace(hist, recipe=beside.name)


def _refuse_checkpoint_flags(rec, prompts, prefetch_guesses) -> None:
    """Flags of a checkpoint's capture given for a recipe's synthetic model, refused in one line."""
    if prompts is not None:
        raise UsageError(f"recipe {rec.name!r} has a synthetic model: --prompts needs --model DIR")
    if prefetch_guesses is not None:
        raise UsageError("--prefetch-guesses: router lookahead is measured on a checkpoint",
                         "give --model DIR (a synthetic model's random routers say nothing about it)")


def _from_checkpoint(out, model_dir, rec, prompts, max_new_tokens, batch_size, windows_steps, keep_trace,
                     device, dtype, quality: bool, prefetch_guesses=None):
    import importlib.util

    guesses = lookahead_guesses(rec.knobs if rec is not None else None, prefetch_guesses)

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"balance --model needs torch and transformers ({missing[0]} is missing)",
                         ".venv/bin/pip install -e '.[hf]'")
    if prompts is None and rec is not None and rec.traffic.kind == "prompts":
        prompts = rec.traffic.path
    if prompts is None:
        raise UsageError("balance --model needs --prompts FILE (.jsonl or text)")
    prompt_list = read_prompts(prompts)
    if max_new_tokens is None:
        max_new_tokens = rec.traffic.max_new_tokens if rec is not None else 32
    if batch_size is None:
        batch_size = rec.traffic.batch if rec is not None else 8

    c = api.count_checkpoint_routing(model_dir, device, dtype, prompt_list, max_new_tokens, batch_size, keep_trace,
                                     out.progress, quality, guesses)
    if c.tokens == 0:
        raise InputFileError(f"{prompts}: the prompts produced no tokens")
    name = rec.model.name if rec is not None else Path(model_dir).resolve().name
    hist = Histogram(
        model=name, source=f"balance: {c.family} checkpoint {model_dir} on {prompts} "
        f"({len(prompt_list)} prompts, max_new_tokens {max_new_tokens}, greedy)",
        top_k=c.top_k, tokens=c.tokens, layers=c.layer_ids, counts_LE=c.counts_LE,
        windows_WLE=windows_of(c.steps_SLE, windows_steps) if windows_steps else None,
        steps_per_window=windows_steps,
        quality=None if c.quality is None else measured_quality(
            c.quality, f"checkpoint {model_dir}, prompts {prompts}, {c.tokens} tokens"),
        blocks={"lookahead": c.lookahead.to_doc()} if c.lookahead is not None else {})
    notes = [f"{len(prompt_list)} prompts, {len(c.steps_SLE)} steps, {c.tokens} tokens counted on {c.device_name}"]
    notes += [c.lookahead.summary()] if c.lookahead is not None else []
    return hist, c.trace, notes


def _from_synthetic(out, rec, steps, batch_size, windows_steps, keep_trace):
    steps = steps or rec.run.steps
    batch, step_words = _job_step_tokens(rec, batch_size)
    counts_SLE, ids = api.count_synthetic_routing(rec, steps, batch, keep_trace, out.progress)
    m = rec.model
    hist = Histogram(
        model=m.name, source=f"balance: synthetic model of recipe {rec.name} (random {m.router} routers, "
        f"{steps} steps x {step_words}, seed {rec.run.seed})",
        top_k=m.top_k, tokens=steps * batch, layers=m.moe_layer_ids, counts_LE=counts_SLE.sum(0).astype(np.float64),
        windows_WLE=windows_of(counts_SLE, windows_steps) if windows_steps else None,
        steps_per_window=windows_steps)
    trace_obj = Trace(ids, m.moe_layer_ids) if keep_trace else None
    return hist, trace_obj, [f"synthetic routing: {steps} steps x {step_words}"]


def _job_step_tokens(rec, batch_size: int | None) -> tuple[int, str]:
    """Tokens of one engine step of the recipe's job, and how to say it. `traffic.batch` (or
    --batch-size) is each rank's: an expert-parallel job steps every rank's batch at once, so its
    trace replayed under `run` gives each rank that batch again (token_shard)."""
    per_rank, ranks = batch_size or rec.traffic.batch, rec.parallel.ep
    if ranks == 1:
        return per_rank, f"{per_rank} tokens"
    return per_rank * ranks, f"{per_rank * ranks} tokens ({ranks} ranks x {per_rank} each)"


def _report(out: Output, hist: Histogram, output, trace, notes, rec=None) -> None:

    report = hist_report(hist, expert_bytes_per_rank(rec) if rec is not None else None)
    doc = {"output": str(output) if output else None, "trace": str(trace) if trace else None,
           "layers": list(hist.layers), "num_experts": hist.num_experts, "top_k": hist.top_k,
           "tokens": hist.tokens, "notes": notes,
           "report": report.to_doc(), "lookahead": hist.blocks.get("lookahead"),
           "quality": None if hist.quality is None else {"measured_on": hist.quality.measured_on,
                                                         "precisions": quality_summary(hist.quality)}}

    def render() -> None:
        for n in notes:
            out.print(n)
        render_hist_report(out, report)
        if hist.quality is not None:
            out.print(f"quality of stored precisions, measured on {hist.quality.measured_on}:")
            for row in quality_summary(hist.quality):
                out.print("  " + quality_line(row))

    out.emit(doc, render)
    for p in (output, trace):
        if p is not None:
            out.note(f"wrote {p}")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("balance")(balance_cmd)


def _one_spelling(window_steps: int | None, earlier: int | None) -> int | None:
    """--window-steps, or its earlier spelling --windows-steps; not both."""
    if window_steps is not None and earlier is not None:
        raise UsageError("give --window-steps once (--windows-steps is its earlier spelling)")
    return window_steps if window_steps is not None else earlier
