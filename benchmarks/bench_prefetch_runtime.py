"""Staging in the runtime, side by side: prefetch off, trace (the co-activation table) and lookahead
(the next layer's router) on the same tiny synthetic run, in one process, rounds alternating the
order, after an untimed warm-up of each. Two routings: a replayed drifting synthetic trace (the
router does not route there, so lookahead guesses at random: a floor), and the model's own router
on generated hidden states (no attention between a synthetic model's layers, so lookahead is
exact: a ceiling; trace needs a trace and is left out). Per mode: ms per step (median and spread
over rounds), experts staged and read per step, the lookahead's recall, and the step time
against prefetch off.

On a CPU every copy is synchronous and nothing hides under compute: the ratio is staging's cost,
not its gain. Outputs are equal in every mode (tests/runtime/test_prefetch_lookahead.py).

    .venv/bin/python benchmarks/bench_prefetch_runtime.py [--steps 24] [--rounds 3] [--slots 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from hotsplit_runtime.from_recipe import prepare_run  # noqa: E402

from hotsplit_cli.config.knobs import resolve_knobs  # noqa: E402
from hotsplit_cli.config.recipe import load_recipe  # noqa: E402
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares  # noqa: E402
from hotsplit_cli.traffic.trace import save_trace  # noqa: E402

ROUTINGS = {"trace replay": ("off", "trace", "lookahead"), "own router": ("off", "lookahead")}


def tiny(traffic: str):
    r = load_recipe("tiny")
    return dataclasses.replace(r, run=dataclasses.replace(r.run, scale=0.25),
                               traffic=dataclasses.replace(r.traffic, kind=traffic))


def one_run(routing: str, mode: str, trace: Path, steps: int, slots: int) -> dict:
    """One timed run: ms per step (the engine's own clock) and the staging counters per step."""
    r = tiny("trace" if routing == "trace replay" else "prompts")
    knobs = resolve_knobs(r.knobs, {"HOTSPLIT_PREFETCH": mode, "HOTSPLIT_PREFETCH_SLOTS": str(slots),
                                    "HOTSPLIT_DYNAMIC": "0", "HOTSPLIT_HOT_GIB": "0.0035"})
    p = prepare_run(r, knobs, trace_path=trace if routing == "trace replay" else None, steps=steps)
    t0 = time.perf_counter()
    s = p.engine.run(steps)
    ms = (time.perf_counter() - t0) * 1e3 / s.steps
    pre = s.prefetch or {}
    look = pre.get("lookahead")
    return {"ms": ms, "staged": pre.get("prefetched", 0) / s.steps, "read": pre.get("useful", 0) / s.steps,
            "recall": None if look is None else look["recall"], "hit_rate": s.hit_rate}


def table(routing: str, trace: Path, steps: int, rounds: int, slots: int) -> None:
    modes = ROUTINGS[routing]
    runs = {m: [] for m in modes}
    for m in modes:  # warm-up, not timed: first-call allocations and lazy initialisation
        one_run(routing, m, trace, 2, slots)
    for k in range(rounds):  # alternate the order: a slow moment of a shared machine falls on each mode
        for m in (modes if k % 2 == 0 else modes[::-1]):
            runs[m].append(one_run(routing, m, trace, steps, slots))
    base = statistics.median(x["ms"] for x in runs["off"])
    print(f"\n{routing}: {steps} steps of 16 tokens, {slots} shared staging slots, {rounds} rounds")
    print(f"{'mode':<10} {'ms/step':>8} {'(min-max)':>15} {'staged/step':>12} {'read/step':>10} {'recall':>7} "
          f"{'hit rate':>9} {'vs off':>7}")
    for m in modes:
        ms = [x["ms"] for x in runs[m]]
        last = runs[m][-1]
        recall = "-" if last["recall"] is None else f"{last['recall']:.3f}"
        print(f"{m:<10} {statistics.median(ms):8.2f} {f'({min(ms):.2f}-{max(ms):.2f})':>15} "
              f"{last['staged']:12.2f} {last['read']:10.2f} {recall:>7} {last['hit_rate']:9.2%} "
              f"{statistics.median(ms) / base:6.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    m = tiny("trace").model
    with tempfile.TemporaryDirectory() as tmp:
        trace = save_trace(Path(tmp) / "t.npz", synthetic_trace(
            zipf_shares(m.num_moe_layers, m.num_experts, 1.2, 5), m.moe_layer_ids, args.steps, 16, m.top_k,
            drift_every=12, seed=4))
        for routing in ROUTINGS:
            table(routing, trace, args.steps, args.rounds, args.slots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
