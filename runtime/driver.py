"""One rank of a run, whichever model source: build it, step it through the one loop, give back
what it ran (one rank's result is the run's; an EP rank's goes to distributed/job.py)."""

from __future__ import annotations

import gc
import importlib.util
from contextlib import ExitStack

from hotsplit_cli.core.errors import UsageError

from . import from_recipe
from .device import tune_cpu_threads
from .hf import run as hf_run
from .ranks import Rank, single_rank
from .request import PrecisionReport, RunRequest, RunResult, Watch


def build(request: RunRequest, rank: Rank, watch: Watch, stack: ExitStack, parallel=single_rank):
    """The rank built from the recipe's model source, `parallel` applied to its model (a checkpoint's
    progress runs on in `stack`), the CPU's threads set for the device chosen."""
    rec = request.recipe
    if rec.model.kind == "hf":
        if importlib.util.find_spec("transformers") is None:  # found, not imported: the loader imports it
            raise UsageError("a checkpoint recipe needs transformers", ".venv/bin/pip install -e '.[hf]'")
        prompts = hf_run.checkpoint_prompts(rec)
        advance = stack.enter_context(watch.progress(f"{rec.name}: prompts", len(prompts)))
        prepared = hf_run.prepare_checkpoint(rec, request.knobs, prompts, request.plan, advance, request.platform,
                                             rank, parallel, prefetch_fit=request.prefetch_fit)
    else:
        layers = rec.model.num_moe_layers
        with watch.progress(f"building {layers} MoE layers", layers) as advance:
            prepared = from_recipe.prepare_run(rec, request.knobs, plan_path=request.plan, trace_path=request.trace,
                                               replay=request.replay,
                                               steps=request.steps, scale=request.scale, advance=advance,
                                               platform_path=request.platform, rank=rank, parallel=parallel,
                                               prefetch_fit=request.prefetch_fit)
    tune_cpu_threads(prepared.info)
    return prepared


def run_single(request: RunRequest, watch: Watch) -> RunResult:
    """A run on one rank: built, described (`watch.ready`), stepped, its windows to `watch.record`."""
    rec = request.recipe
    with ExitStack() as stack:
        rank = Rank.single(rec, request.knobs, request.platform, request.plan_file)
        prepared = build(request, rank, watch, stack)
        for note in prepared.notes:
            watch.note(f"note: {note}")
        header = prepared.header()
        watch.ready(header)
        advance = (None if header.steps is None else
                   stack.enter_context(watch.progress(f"{rec.name}: steps", header.steps)))
        summary = prepared.engine.run(prepared.steps, watch.record, advance)
        texts, check = prepared.texts(summary.interrupted), prepared.native_check
        del prepared  # the run's banks are freed before a checkpoint is loaded again to compare with
        gc.collect()
    return RunResult(rec.name, request.knobs, header, summary, None, texts,
                     PrecisionReport.of_run(request.knobs.precision, request.plan_file, check,
                                            summary.interrupted))
