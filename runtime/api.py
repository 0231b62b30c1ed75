"""The one door from the command line into the runtime: `hotsplit_cli/commands` import this module
and no other of `hotsplit_runtime` (an import-linter contract in pyproject.toml). `run` gives
back the same `RunResult` on one rank or N (started here as local ranks, or joined under
torchrun); the rest is what `balance`, `selftest` and tensor files need. Importing it imports no
torch: each function imports what it runs, so `hotsplit --help`, the planning commands and a
refusal before a job's launch stay instant."""

from __future__ import annotations

import time

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.planfile import load_plan, placement_of_plan
from hotsplit_cli.traffic.trace import load_run_replay

from .distributed.leftovers import removed_words
from .distributed.refusal import in_group, say_error
from .request import RunHeader, RunRequest, RunResult, Watch

__all__ = ["RunHeader", "RunRequest", "RunResult", "Watch", "count_checkpoint_routing", "count_synthetic_routing",
           "load_tensors", "run", "save_tensors", "say_error", "selftest"]


def run(request: RunRequest, watch: Watch | None = None) -> RunResult | None:
    """Run `request`; `watch` sees its progress, set-up, notes and windows. None on the ranks of
    a job other than rank 0 (under torchrun each rank is this call)."""
    watch = Watch() if watch is None else watch
    rec = request.recipe
    if rec.parallel.ep == 1:
        from .driver import run_single  # torch from here on

        return run_single(request, watch)
    if rec.parallel.tp != 1:
        raise UsageError(f"parallel.tp is {rec.parallel.tp} with ep {rec.parallel.ep}: the runtime runs tp 1 "
                         "under ep", "use tp: 1 for an expert-parallel run")
    if in_group():
        from .distributed.job import run_in_group  # torch from here on

        return run_in_group(request, watch)
    started = time.time()  # the job's start, for the progress lines of its set-up
    _check_before_launch(request)  # before torch is imported
    from .distributed.launch import launch_local  # torch from here on

    words = removed_words()
    if words:
        watch.note(words)
    watch.note(f"expert parallel: starting {rec.parallel.ep} local ranks")
    return launch_local(rec.parallel.ep, request, watch, started)


def _check_before_launch(request: RunRequest) -> None:
    """What every rank would refuse (trace, plan placement), refused once before any rank starts, naming the input."""
    rec = request.recipe
    if request.replay is None:
        load_run_replay(rec, request.trace, request.steps)
    if request.plan is not None:  # its number of ranks is checked with the single-rank checks
        m = rec.model
        plan_file = request.plan_file or load_plan(request.plan)
        placement_of_plan(plan_file, m.moe_layer_ids, m.num_experts, rec.parallel.ep)


def count_checkpoint_routing(model_dir, device: str, dtype: str, prompts: list, max_new_tokens: int,
                             batch_size: int, keep_trace: bool, progress=Watch().progress, quality: bool = False,
                             guesses: int | None = None):
    """The routing counts of greedy generation over `prompts` on a checkpoint (hf/capture.py);
    `dtype`: "auto" or a name in runtime/moe.py DTYPES; `progress`: a Watch's; `quality`: also
    measure fp8 and mxfp4 experts' errors (hf/quality.py: a second pass over the prompts);
    `guesses`: measure router lookahead at that many guesses per token (hf/lookahead.py)."""
    from .device import choose_device  # torch from here on
    from .hf.capture import count_routing
    from .moe import DTYPES

    info = choose_device(device, "--device")
    with progress("balance", len(prompts) * (2 if quality else 1)) as advance:
        return count_routing(model_dir, info, None if dtype == "auto" else DTYPES[dtype], prompts, max_new_tokens,
                             batch_size, keep_trace, advance, quality, guesses)


def count_synthetic_routing(recipe, steps: int, batch: int, keep_trace: bool, progress=Watch().progress):
    """(counts [S, L, E], ids [S, L, T, K] or None) of the recipe's synthetic model's routers."""
    from .hf.synthetic import synthetic_routing  # torch from here on

    with progress("balance (synthetic)", steps) as advance:
        return synthetic_routing(recipe, steps, batch, recipe.run.seed, advance, keep_trace)


def selftest(device: str) -> tuple[str, dict]:
    """(the device's name, the selftest's report) on the device chosen as `device` names it."""
    from .device import choose_device, tune_cpu_threads  # torch from here on
    from .selftest import run_selftest

    info = choose_device(device, "--device")
    tune_cpu_threads(info)
    return info.name, run_selftest(info)


def save_tensors(path, tensors: dict) -> None:
    """Write a tensors-only .pt file, atomically (torch_files.py)."""
    from .torch_files import save_tensors as save  # torch from here on

    save(path, tensors)


def load_tensors(path):
    """Read a tensors-only .pt file (torch_files.py: nothing but tensors is unpickled)."""
    from .torch_files import load_tensors_only  # torch from here on

    return load_tensors_only(path)
