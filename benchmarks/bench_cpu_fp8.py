"""Why fp8 experts stay off the CPU cold path: one expert computed on the CPU from bf16 weights vs
from block-scaled fp8 weights dequantised first (runtime/fp8.py `dequantize_swiglu`, then the same
SwiGLU), as GB/s of the weights stored in the cold bank, side by side in one process.

    python benchmarks/bench_cpu_fp8.py [--hidden 2048 --inter 1408 --experts 12 --rounds 7]

Threads: the runtime's CPU setting (`runtime.device.tune_cpu_threads`: one intra-op thread), so
the numbers are those of the path the refusal protects, and a busy machine's spinning thread
teams do not decide the ratio. Each round times one pass over every expert in bf16 and one in
fp8, alternating which goes first; the table gives the median round and the spread (min - max)
of each column, the ratio's included (the ratio of each round's two passes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from hotsplit_probes.cpu_expert import swiglu_expert  # noqa: E402
from hotsplit_runtime.device import choose_device, tune_cpu_threads  # noqa: E402
from hotsplit_runtime.fp8 import FP8, RELEASE_FP8, dequantize_swiglu  # noqa: E402
from reporting import load_average, load_span, spread  # noqa: E402


def pass_gbps(fn, n: int, stored_bytes: int) -> float:
    """One pass over `n` experts, in GB/s of stored weights."""
    t0 = time.perf_counter()
    for e in range(n):
        fn(e)
    return n * stored_bytes / (time.perf_counter() - t0) / 1e9


def interleaved(a, b, rounds: int) -> tuple[list[float], list[float]]:
    """`rounds` passes of each of `a` and `b` (after one warm-up pass each), alternating which
    goes first, so that a burst of load hits both sides alike."""
    a(), b()
    out_a, out_b = [], []
    for r in range(rounds):
        first, second = (a, b) if r % 2 == 0 else (b, a)
        x, y = first(), second()
        out_a.append(x if r % 2 == 0 else y)
        out_b.append(y if r % 2 == 0 else x)
    return out_a, out_b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=2048)  # DeepSeek-V2-Lite's expert (config.json)
    ap.add_argument("--inter", type=int, default=1408)
    ap.add_argument("--experts", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.experts < 1:
        ap.error("--rounds and --experts must be >= 1")
    H, inter, n, fmt = args.hidden, args.inter, args.experts, RELEASE_FP8
    tune_cpu_threads(choose_device("cpu"))
    b13 = torch.full((n, 2 * inter, H), 0.01, dtype=torch.bfloat16)
    b2 = torch.full((n, H, inter), 0.01, dtype=torch.bfloat16)
    q13, q2 = b13.to(FP8), b2.to(FP8)
    s13 = torch.full((n, 2, *fmt.scale_shape(inter, H)), 1e-3)
    s2 = torch.full((n, *fmt.scale_shape(H, inter)), 1e-3)
    load, lines = load_average(), []
    for tokens in (1, 16):
        x = torch.full((tokens, H), 0.5, dtype=torch.bfloat16)
        bf16, fp8 = interleaved(
            lambda x=x: pass_gbps(lambda e: swiglu_expert(torch, x, b13[e], b2[e]), n, 3 * H * inter * 2),
            lambda x=x: pass_gbps(lambda e: swiglu_expert(
                torch, x, *dequantize_swiglu(q13[e], s13[e], q2[e], s2[e], fmt, torch.bfloat16)), n, 3 * H * inter),
            args.rounds)
        ratios = [a / b for a, b in zip(bf16, fp8, strict=True)]
        lines.append(f"| {tokens} | {spread(bf16, '.2f')} | {spread(fp8, '.2f')} | {spread(ratios, '.1f')}x |")
    print(f"one expert {H}x{inter}, {n} experts, {torch.get_num_threads()} thread(s) (the runtime's CPU setting), "
          f"{args.rounds} interleaved rounds; GB/s of stored weights, median (min-max); {load_span(load)}")
    print("| tokens | bf16 | fp8 dequantised | ratio |")
    print("| --- | --- | --- | --- |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
