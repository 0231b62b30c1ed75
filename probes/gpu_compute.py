"""How fast a GPU computes through a layer's weights at decode batch sizes: the time a layer's
compute offers to hide a staged copy behind (the prefetch planner's compute per layer).

A decode step multiplies each layer's activations [T, H] through weights resident in GPU memory.
At a few tokens that is bound by reading the weights from device memory, at many by arithmetic.
The probe times x [T, H] @ W [H, N] in bfloat16 (the dtype of served checkpoints) with W larger
than any GPU's L2 cache, so that every product streams W from device memory as a layer's weights
are, for T in TOKENS: CUDA events on the current stream, `iterations` products per sample, the
median of `samples` samples after one warm-up sample. GB/s (1e9 B/s) = W's bytes / time per
product: the rate a layer's weights are computed at with T tokens. torch is imported lazily.

Only a GPU is measured: staging slots are GPU memory, and a machine without one has nothing to
stage into (platform.json then has no GPU entries, and the plan no prefetch verdict).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .bandwidth import Measurement, summarize
from .timing import cuda_event_clock

TOKENS = (1, 4, 16, 64, 256)  # decode batch sizes, 1 to the planner's largest
HIDDEN, OUT = 4096, 16384  # W: 128 MiB in bfloat16, above the largest L2 (H100/H200: 50-60 MB)
DTYPE = "bfloat16"
METHOD = (f"torch on the GPU: x [T, {HIDDEN}] @ W [{HIDDEN}, {OUT}] in {DTYPE}, W larger than the L2 cache; "
          "CUDA events, median of samples of back-to-back products after a warm-up; GB/s = W bytes / time per product")


@dataclass(frozen=True)
class GpuCompute:
    """GB/s of resident weights one GPU computes through, per token count."""

    method: str
    dtype: str
    weight_bytes: int
    by_tokens: tuple[tuple[int, Measurement], ...]  # (tokens, GB/s of weights computed)


def _import_torch() -> Any:
    import torch

    return torch


def measure_gpu_compute(cuda_index: int, tick: Callable[[int], None] | None = None, samples: int = 7,
                        iterations: int = 20, load: Callable[[], Any] = _import_torch,
                        shape: tuple[int, int] = (HIDDEN, OUT)) -> GpuCompute:
    """The compute rate of `cuda:cuda_index` at each of TOKENS (one `tick(1)` per token count)."""
    torch = load()
    tick = tick or (lambda n: None)
    device = torch.device("cuda", cuda_index)
    hidden, out = shape
    cells = []
    with torch.cuda.device(device):
        w = torch.randn(hidden, out, dtype=torch.bfloat16, device=device)
        nbytes = w.numel() * w.element_size()
        clock = cuda_event_clock(torch)
        for tokens in TOKENS:
            x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)

            def run(x=x, w=w) -> None:
                for _ in range(iterations):
                    torch.matmul(x, w)

            clock(run)  # warm-up: kernel selection, clocks up
            seconds = [clock(run) / iterations for _ in range(samples)]
            cells.append((tokens, summarize(nbytes, iterations, [nbytes / max(s, 1e-12) / 1e9 for s in seconds])))
            tick(1)
        del w
    return GpuCompute(METHOD, DTYPE, nbytes, tuple(cells))
