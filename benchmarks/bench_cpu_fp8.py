"""Why fp8 experts stay off the CPU cold path: one expert computed on the CPU from bf16 weights vs
from block-scaled fp8 weights dequantised first (runtime/fp8.py `dequantize_swiglu`, then the same
SwiGLU), as GB/s of the weights stored in the cold bank, side by side in one process.

    python benchmarks/bench_cpu_fp8.py [--hidden 2048 --inter 1408 --experts 12]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from probes.cpu_expert import swiglu_expert  # noqa: E402
from runtime.fp8 import FP8, RELEASE_FP8, dequantize_swiglu  # noqa: E402


def best_gbps(fn, n: int, stored_bytes: int, reps: int = 3) -> float:
    """Best of `reps` passes over `n` experts, in GB/s of stored weights."""
    for e in range(n):
        fn(e)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for e in range(n):
            fn(e)
        best = min(best, time.perf_counter() - t0)
    return n * stored_bytes / best / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=2048)  # DeepSeek-V2-Lite's expert (config.json)
    ap.add_argument("--inter", type=int, default=1408)
    ap.add_argument("--experts", type=int, default=12)
    args = ap.parse_args(argv)
    H, inter, n, fmt = args.hidden, args.inter, args.experts, RELEASE_FP8
    b13 = torch.full((n, 2 * inter, H), 0.01, dtype=torch.bfloat16)
    b2 = torch.full((n, H, inter), 0.01, dtype=torch.bfloat16)
    q13, q2 = b13.to(FP8), b2.to(FP8)
    s13 = torch.full((n, 2, *fmt.scale_shape(inter, H)), 1e-3)
    s2 = torch.full((n, *fmt.scale_shape(H, inter)), 1e-3)
    print(f"one expert {H}x{inter}, {n} experts, {torch.get_num_threads()} threads; GB/s of stored weights")
    for tokens in (1, 16):
        x = torch.full((tokens, H), 0.5, dtype=torch.bfloat16)
        bf16 = best_gbps(lambda e, x=x: swiglu_expert(torch, x, b13[e], b2[e]), n, 3 * H * inter * 2)
        fp8 = best_gbps(lambda e, x=x: swiglu_expert(
            torch, x, *dequantize_swiglu(q13[e], s13[e], q2[e], s2[e], fmt, torch.bfloat16)), n, 3 * H * inter)
        print(f"tokens {tokens:>2}: bf16 {bf16:6.2f}  fp8 dequantised {fp8:6.2f}  ratio {bf16 / fp8:5.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
