"""Decode step time with prefetch off and `prefetch trace`, at batch 1 and batch 32, side by side in
one process, and how much of the staging copies' time the step hides.

A synthetic recipe replays a trace: the shared ESFT DeepSeek-V2-Lite law trace, its staging
predictor fitted on the intent trace, when the recipe is deepseek-v2-lite and
`../shared/data/routing/` is there (benchmarks/bench_prefetch.py), else a synthetic trace made by
the library from the recipe's traffic (skew), its predictor fitted on another draw of the same
traffic. Each batch builds two engines at one hot budget (`--hot` of the experts; the staging
slots are carved from it, as `run` carves them), dynamic swaps off, so that the swap stream
carries only the staging copies. Rounds of `--steps` steps alternate between the two engines;
a round's ms per step is one sample (CUDA events on a GPU, the wall clock on a CPU), and each
figure is the median of `--rounds` samples with their min-max, and trace/off the median of the
rounds' pair ratios with their 10th-90th percentiles. Eager steps first, then CUDA graph
replays where the device has graphs.

The overlap, on a GPU: for `--overlap-steps` more steps of the prefetch engine, each bank times
its staging (runtime/bank.py `StagingTiming`): the copies on the swap stream, and how long the
compute stream waited for them at the layer that reads them. `copy` is their time per step,
`exposed` the wait, `hidden` = 1 - exposed / copy, `compute` the step's span on the compute
stream less the wait. A CPU has no streams: its staging copies run in line, and no overlap is
reported.

    python benchmarks/bench_prefetch_gpu.py [--json]          # GPU: deepseek-v2-lite at 1/4, 8 MoE layers
    python benchmarks/bench_prefetch_gpu.py --dry [--json]    # the same code on the CPU, tiny

scripts/gpu_checks.sh runs it (step `prefetch_timing`); its summary prints `table_lines`. A row
that fails is its `error`, the others still run; the exit code is 1 when a row failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prefetch import DATA  # noqa: E402
from hotsplit_probes.timing import cuda_event_clock, wall_clock  # noqa: E402
from hotsplit_runtime.from_recipe import prepare_run  # noqa: E402
from hotsplit_runtime.selftest import error_line  # noqa: E402
from reporting import load_average, spread  # noqa: E402

from hotsplit_cli.config.knobs import resolve_knobs  # noqa: E402
from hotsplit_cli.config.recipe import Recipe, load_recipe  # noqa: E402
from hotsplit_cli.core.errors import HotsplitError  # noqa: E402
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank  # noqa: E402
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares  # noqa: E402
from hotsplit_cli.traffic.trace import Trace, load_trace, save_trace  # noqa: E402

BATCHES = (1, 32)
WARMUP_STEPS = 3  # before any sample: the graph's capture, the kernels' first calls
NO_OVERLAP = ("not measured on a CPU: it has no swap stream, so its staging copies run in line before "
              "the step and nothing can hide them (CUDA events on the swap and compute streams measure it on a GPU)")


def refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def narrowed(recipe: Recipe, layers: int, device: str, scale: float) -> Recipe:
    """The recipe with its first `layers` MoE layers, run on `device` at `scale`."""
    m = recipe.model
    return dataclasses.replace(recipe, model=dataclasses.replace(m, moe_layer_ids=m.moe_layer_ids[:layers]),
                               run=dataclasses.replace(recipe.run, device=device, scale=scale))


def rebatched(trace: Trace, batch: int, layers: int) -> Trace:
    """The trace's tokens, in their recorded order, `batch` to a step; its first `layers` layers."""
    ids_SLTK = trace.topk_ids_SLTK[:, :layers]
    S, L, T, K = ids_SLTK.shape
    tokens_NLK = np.moveaxis(ids_SLTK, 2, 1).reshape(S * T, L, K)
    n = (S * T) // batch * batch
    return Trace(np.moveaxis(tokens_NLK[:n].reshape(n // batch, batch, L, K), 2, 1), trace.layers[:layers])


def traffic(recipe: Recipe, kind: str, batch: int, steps: int, folder: Path) -> tuple[Path, Path, str]:
    """(replayed trace, trace the predictor is fitted on, what they are) at `batch` tokens a step."""
    m = recipe.model
    if kind == "esft":
        judge, fit = (rebatched(load_trace(DATA / f"esft-v2lite-{task}.trace.npz", m.num_experts), batch,
                                m.num_moe_layers) for task in ("law", "intent"))
        what = "ESFT DeepSeek-V2-Lite law trace, predictor fitted on intent"
    else:
        shares = zipf_shares(m.num_moe_layers, m.num_experts, recipe.traffic.skew, recipe.traffic.seed)
        judge, fit = (synthetic_trace(shares, m.moe_layer_ids, steps, batch, m.top_k, seed=seed) for seed in (1, 2))
        what = f"synthetic Zipf({recipe.traffic.skew}) trace, predictor fitted on another draw"
    if judge.num_steps < steps:
        raise ValueError(f"the {kind} trace has {judge.num_steps} steps of batch {batch}, {steps} are needed")
    return save_trace(folder / f"b{batch}.npz", judge), save_trace(folder / f"b{batch}-fit.npz", fit), what


class Timed:
    """One engine of a row: its steps drawn from its own trace."""

    def __init__(self, recipe: Recipe, env: dict, trace: Path, fit: Path):
        built = prepare_run(recipe, resolve_knobs(recipe.knobs, env), trace_path=trace, prefetch_fit=fit)
        self.engine = built.engine
        self._routing = iter(self.engine.source.steps())

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.engine.step(next(self._routing))


def sync(info) -> None:
    if info.is_cuda:
        torch.cuda.synchronize(info.device)


def step_ms(t: Timed, steps: int) -> float:
    """ms per step of a round of `steps` (CUDA events on a GPU: the device's work, after the host queued it)."""
    info = t.engine.model.info
    sync(info)
    clock = cuda_event_clock(torch) if info.is_cuda else wall_clock
    return clock(lambda: t.steps(steps)) * 1e3 / steps


def timed_steps(t: Timed, steps: int) -> tuple[list, list[list]]:
    """`steps` steps of `t` with their staging timed: per step, the (start, end) events around it on
    the compute stream and its layers' `StagingTiming`s. Every event has completed on return."""
    banks = t.engine.model.banks
    for b in banks:
        b.staging_times = []
    spans, per_step = [], []
    try:
        for _ in range(steps):
            marks = [len(b.staging_times) for b in banks]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t.steps(1)
            end.record()
            spans.append((start, end))
            per_step.append([x for b, n in zip(banks, marks, strict=True) for x in b.staging_times[n:]])
        # The last event on the compute stream: every wait for a copy, so every copy, came before it.
        spans[-1][1].synchronize()
    finally:  # later steps, of this engine's next row too, are not timed
        for b in banks:
            b.staging_times = None
    return spans, per_step


def overlap_figures(spans: list, per_step: list[list]) -> dict:
    """Per step: the staging copies' ms, the compute stream's wait for them (exposed) and the rest
    of its span (compute); and the share of all the copy time that was hidden."""
    copy = [sum(x.copy_ms() for x in xs) for xs in per_step]
    exposed = [sum(x.exposed_ms() for x in xs) for xs in per_step]
    compute = [s.elapsed_time(e) - w for (s, e), w in zip(spans, exposed, strict=True)]
    hidden = 1.0 - sum(exposed) / sum(copy) if sum(copy) > 0 else None
    return {"steps": len(spans), "copy_ms": copy, "exposed_ms": exposed, "compute_ms": compute,
            "layers_staged_per_step": statistics.mean(len(xs) for xs in per_step),
            "hidden_fraction": None if hidden is None else min(1.0, max(0.0, hidden))}


def measure_row(pair: dict[str, Timed], graph: bool, args) -> dict:
    for t in pair.values():
        t.engine.use_graph = graph
        t.steps(WARMUP_STEPS)
    samples: dict[str, list[float]] = {mode: [] for mode in pair}
    for _ in range(args.rounds):  # interleaved, so that machine noise hits both alike
        for mode, t in pair.items():
            samples[mode].append(step_ms(t, args.steps))
    ratios = np.array(samples["trace"]) / np.array(samples["off"])
    row = {"off_ms": samples["off"], "trace_ms": samples["trace"],
           "ratio": float(np.median(ratios)),  # of the interleaved pairs, as is its spread
           "ratio_p10": float(np.percentile(ratios, 10)), "ratio_p90": float(np.percentile(ratios, 90))}
    if pair["trace"].engine.model.info.is_cuda:
        row["overlap"] = overlap_figures(*timed_steps(pair["trace"], args.overlap_steps))
    return row


def batch_rows(recipe: Recipe, batch: int, env: dict, args, doc: dict, folder: Path) -> list[dict]:
    """The rows of one batch: eager steps, then graph replays where the device has graphs."""
    steps = 2 * (WARMUP_STEPS + args.rounds * args.steps + args.overlap_steps)  # enough for both kinds
    trace, fit, doc["traffic"] = traffic(recipe, args.traffic, batch, steps, folder)
    pair = {mode: Timed(recipe, {**env, "HOTSPLIT_PREFETCH": mode}, trace, fit) for mode in ("off", "trace")}
    info = pair["trace"].engine.model.info
    doc["device"] = info.name
    doc["overlap_reason"] = None if info.is_cuda else NO_OVERLAP
    rows = []
    for graph in [False] + ([True] if pair["trace"].engine.use_graph else []):
        try:
            rows.append({"batch": batch, "graph": graph, **measure_row(pair, graph, args)})
        except Exception as exc:  # a CUDA error included: this row's error, the others still run
            rows.append({"batch": batch, "graph": graph, "error": error_line(exc)})
        print(progress_line(rows[-1]), file=sys.stderr)  # what a run stopped by a time limit still shows
    return rows


def progress_line(r: dict) -> str:
    """A row as it is measured, on stderr: its times, and the share of the copy time hidden."""
    o = r.get("overlap")
    hidden = "" if not o or o["hidden_fraction"] is None else f"; {100 * o['hidden_fraction']:.0f}% of copies hidden"
    return f"measured: {row_line(r).strip()}{hidden}"


def measure(args) -> dict:
    recipe = narrowed(load_recipe(args.recipe), args.layers, args.device, args.scale)
    m = recipe.model
    hot_gib = args.hot * m.num_moe_layers * m.num_experts * expert_bytes_per_rank(recipe) / (1 << 30)
    env = {"HOTSPLIT_HOT_GIB": f"{hot_gib:.9f}", "HOTSPLIT_DYNAMIC": "0"}
    knobs = resolve_knobs(recipe.knobs, {**env, "HOTSPLIT_PREFETCH": "trace"})
    doc = {"recipe": recipe.name, "scale": args.scale, "layers": m.num_moe_layers, "experts": m.num_experts,
           "top_k": m.top_k, "hot_fraction": args.hot, "rounds": args.rounds, "steps_per_round": args.steps,
           "prefetch": {"slots": knobs.prefetch_slots, "pool": knobs.prefetch_pool,
                        "guesses": knobs.prefetch_guesses},
           "device": args.device, "traffic": None, "overlap_reason": None, "load_average": [load_average()],
           "rows": []}
    with tempfile.TemporaryDirectory() as folder:
        for batch in BATCHES:
            try:
                doc["rows"] += batch_rows(recipe, batch, env, args, doc, Path(folder))
            except Exception as exc:  # this batch's engines could not be built: its error, the next still runs
                doc["rows"].append({"batch": batch, "graph": None, "error": error_line(exc)})
    doc["load_average"].append(load_average())
    return doc


def row_line(r: dict) -> str:
    """One row of the table: a batch and step kind, its times side by side or its error."""
    kind = {True: "graph", False: "eager", None: "-"}[r["graph"]]
    figures = (f"error: {r['error']}" if "error" in r else
               f"{spread(r['off_ms'], '.3f'):>26} {spread(r['trace_ms'], '.3f'):>26}  {r['ratio']:.3f} "
               f"({r['ratio_p10']:.2f}-{r['ratio_p90']:.2f})")
    return f"  {r['batch']:>5} {kind:6} {figures}"


def table_lines(doc: dict) -> list[str]:
    """The report: one line per batch and step kind, then the overlap per row (or why there is none)."""
    p = doc["prefetch"]
    lines = [f"prefetch timing: {doc['recipe']} at scale {doc['scale']}, {doc['layers']} MoE layers x "
             f"{doc['experts']} experts, top-{doc['top_k']}, {100 * doc['hot_fraction']:.0f}% hot, on "
             f"{doc['device']}; {doc['traffic'] or 'no traffic built'}; prefetch trace: {p['slots']} slots "
             f"({p['pool']} pool), {p['guesses']} guesses; ms per step, median (min-max) of {doc['rounds']} "
             f"rounds of {doc['steps_per_round']}; load average {doc['load_average'][0]:.1f} -> "
             f"{doc['load_average'][-1]:.1f}",
             f"  {'batch':>5} {'steps':6} {'prefetch off':>26} {'prefetch trace':>26}  trace/off (p10-p90)"]
    lines += [row_line(r) for r in doc["rows"]]
    lines.append("  overlap of the staging copies with compute (ms per step, median (min-max)):")
    measured = [r for r in doc["rows"] if r.get("overlap")]
    if not measured:
        lines.append(f"    {doc['overlap_reason'] or 'not measured: no row ran'}")
    for r in measured:
        o, kind = r["overlap"], "graph" if r["graph"] else "eager"
        hidden = "no copies" if o["hidden_fraction"] is None else f"{100 * o['hidden_fraction']:.0f}% hidden"
        lines.append(f"    batch {r['batch']:>2} {kind}: copy {spread(o['copy_ms'], '.3f')}, compute waited "
                     f"{spread(o['exposed_ms'], '.3f')}, compute {spread(o['compute_ms'], '.3f')}; {hidden} "
                     f"({o['layers_staged_per_step']:.1f} layers staged a step, {o['steps']} steps)")
    return lines


PRESETS = {  # what each option is when not given: on a GPU, and with --dry (the CPU, tiny)
    "gpu": {"recipe": "deepseek-v2-lite", "scale": 0.25, "layers": 8, "device": "auto", "rounds": 7, "steps": 8,
            "overlap_steps": 8},
    "dry": {"recipe": "tiny", "scale": 0.25, "layers": 4, "device": "cpu", "rounds": 3, "steps": 2,
            "overlap_steps": 1},
}


def check_args(args) -> str | None:
    """What is wrong with the arguments (None: nothing); fills the preset's defaults in."""
    for key, value in PRESETS["dry" if args.dry else "gpu"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        recipe = load_recipe(args.recipe)
    except HotsplitError as exc:
        return exc.message
    n = recipe.model.num_moe_layers
    if not 2 <= args.layers <= n:
        return (f"--layers takes 2..{n} for {recipe.name} (staging needs a layer before the one it fills), "
                f"got {args.layers}")
    if not 0.0 < args.hot < 1.0 or not 0.0 < args.scale <= 1.0:
        return f"--hot takes a fraction in (0, 1) and --scale one in (0, 1], got {args.hot} and {args.scale}"
    if min(args.rounds, args.steps, args.overlap_steps) < 1:
        return "--rounds, --steps and --overlap-steps take 1 or more"
    esft = recipe.name == "deepseek-v2-lite" and (DATA / "esft-v2lite-law.trace.npz").exists()
    if args.traffic == "esft" and not esft:
        return f"--traffic esft needs the deepseek-v2-lite recipe and the ESFT traces in {DATA}"
    if args.traffic == "auto":
        args.traffic = "esft" if esft else "synthetic"
    if not args.dry and args.device != "cpu" and not torch.cuda.is_available():
        return "this benchmark times a GPU and torch sees none; --dry runs the same code on the CPU, tiny"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="the CPU, tiny: checks the code, no overlap figures")
    ap.add_argument("--recipe", default=None, help="a synthetic recipe (default deepseek-v2-lite; --dry: tiny)")
    ap.add_argument("--scale", type=float, default=None, help="expert dimensions scaled (default 0.25)")
    ap.add_argument("--layers", type=int, default=None, help="its first MoE layers (default 8; --dry: 4)")
    ap.add_argument("--hot", type=float, default=0.25, help="share of the experts the hot budget holds")
    ap.add_argument("--traffic", choices=("auto", "esft", "synthetic"), default="auto",
                    help="auto: the ESFT traces with deepseek-v2-lite where they are, else synthetic")
    ap.add_argument("--device", default=None, help="auto, cuda, cuda:N (--dry: cpu)")
    ap.add_argument("--rounds", type=int, default=None, help="samples of each figure (default 7; --dry: 3)")
    ap.add_argument("--steps", type=int, default=None, help="steps per sample (default 8; --dry: 2)")
    ap.add_argument("--overlap-steps", type=int, default=None, help="steps timed for the overlap (default 8)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    problem = check_args(args)
    if problem:
        return refuse(problem)
    doc = measure(args)
    print(json.dumps(doc, indent=2) if args.json else "\n".join(table_lines(doc)))
    return 1 if any("error" in r for r in doc["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
