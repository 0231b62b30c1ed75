"""What one layer's call of the CPU's grouped compute costs beyond its experts, with the caches warm
(calls back to back, as the probe times `layer_ms`) and with the last-level cache flushed before
each call (as in a run, where other work runs between two layers' calls).

Each call computes `--experts` distinct experts of a pool several times the last-level cache (so
every expert's weights stream from DRAM in both states) with `--tokens` tokens each, by the
runtime's own grouped compute (probes/cpu_expert.py `grouped_experts`), one intra-op thread as the
CPU runtime uses. Per state: the ms a call takes, and what is left after its experts at the
probe's per-expert time for the same pool (one call over the whole pool, measured in the same
round): the call's own cost. Rounds alternate which state goes first; median (min-max) over
rounds. The flush (streaming `--flush-mib` MiB) is not timed. `--clock cpu` times by the thread's
CPU time, which takes other processes' share of the cores out.

    .venv/bin/python benchmarks/bench_layer_call.py [--recipe tiny] [--scale 1] [--experts 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from hotsplit_probes.cpu_expert import ExpertShape, grouped_experts, pool_size  # noqa: E402
from hotsplit_runtime.moe import MoEGeometry  # noqa: E402
from reporting import load_average, load_span, spread  # noqa: E402

from hotsplit_cli.config.recipe import load_recipe  # noqa: E402

POOL_BYTES = 128 << 20  # 4x a 32 MiB last-level cache (lscpu on this project's VM)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--scale", type=float, default=None, help="default: the recipe's run.scale")
    ap.add_argument("--experts", type=int, default=8, help="distinct experts per call (default 8)")
    ap.add_argument("--tokens", type=int, default=1, help="tokens per expert (default 1)")
    ap.add_argument("--calls", type=int, default=100, help="calls per state and round (default 100)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--flush-mib", type=int, default=64, help="bytes streamed before each cold call (default 64)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args(argv)
    if min(args.experts, args.tokens, args.calls, args.rounds, args.flush_mib) < 1:
        ap.error("--experts, --tokens, --calls, --rounds and --flush-mib must be >= 1")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)  # runtime/device.py tune_cpu_threads: the CPU path's one thread
    rec = load_recipe(args.recipe)
    g = MoEGeometry.from_recipe(rec, rec.run.scale if args.scale is None else args.scale)
    shape = ExpertShape(g.hidden, g.inter, "float32")  # the CPU runtime computes float32
    expert_bytes = shape.expert_bytes
    n = max(args.experts, pool_size(shape, POOL_BYTES))
    w13 = torch.full((n, 2 * g.inter, g.hidden), 0.01)
    w2 = torch.full((n, g.hidden, g.inter), 0.01)
    flush = torch.ones(args.flush_mib << 18)  # float32 words

    def weights_of(e: int):
        return w13[e], w2[e]

    x = torch.full((args.tokens, g.hidden), 0.5)
    ids = torch.arange(args.experts).repeat(args.tokens, 1)
    w = torch.full(ids.shape, 1.0 / args.experts)
    everything = torch.arange(n).repeat(args.tokens, 1)
    w_all = torch.full(everything.shape, 1.0 / n)

    def per_expert_ms() -> float:  # the probe's way: one call over the whole pool
        t0 = clock()
        grouped_experts(x, everything, w_all, weights_of, n)
        return (clock() - t0) * 1e3 / n

    def calls(cold: bool) -> float:
        total, base = 0.0, 0
        for _ in range(args.calls):
            base = (base + args.experts) % (n - args.experts + 1)  # fresh experts every call
            if cold:
                flush.sum()
            t0 = clock()
            grouped_experts(x, ids + base, w, weights_of, n)
            total += clock() - t0
        return total * 1e3 / args.calls

    calls(False)
    calls(True)
    per_expert_ms()  # warm-up
    load = load_average()
    got: dict[str, list[float]] = {"warm": [], "cold": []}
    own: dict[str, list[float]] = {"warm": [], "cold": []}
    for r in range(args.rounds):
        e_ms = per_expert_ms()
        for state in ("warm", "cold") if r % 2 == 0 else ("cold", "warm"):
            ms = calls(state == "cold")
            got[state].append(ms)
            own[state].append(ms - args.experts * e_ms)
    print(f"{rec.name} experts {g.hidden}x{g.inter} float32 ({expert_bytes / 1e6:.2f} MB), {args.experts} a call x "
          f"{args.tokens} token(s), pool {n} experts, {args.calls} calls x {args.rounds} rounds, {args.clock} clock, "
          f"flush {args.flush_mib} MiB before each cold call; median (min-max); {load_span(load)}")
    print("| caches | ms per call | the call's own cost, ms (beyond its experts) |")
    print("| --- | ---: | ---: |")
    for state in ("warm", "cold"):
        print(f"| {state} | {spread(got[state], '.3f')} | {spread(own[state], '.3f')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
