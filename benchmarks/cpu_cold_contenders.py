"""The contenders of benchmarks/bench_cpu_cold_rate.py, one per process: built on one MoE layer of
a shape's experts (every one cold), then timed on request. A process reads requests from stdin
and answers on stdout, one JSON line each.

The weights are filled, not drawn (values do not change the speed, and drawing gigabytes takes
minutes): every contender holds the same experts.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from fullsize import WEIGHT, filled_layer, grouped_mm_experts, routing
from hotsplit_probes.cpu_expert import QUICK_POOL_BYTES, TOKENS, ExpertShape, measure_cpu_expert
from hotsplit_runtime.cold_split import ColdSplit, SplitExperts
from hotsplit_runtime.device import choose_device
from hotsplit_runtime.kernels import choose_compute
from hotsplit_runtime.model import HotColdMoE
from hotsplit_runtime.moe import MoEGeometry
from hotsplit_runtime.pinned import PinnedAllocator, numa_policy_for
from hotsplit_runtime.precision import stored_format
from hotsplit_runtime.selftest import error_line

from hotsplit_cli.hotset.coldpath import ColdRates, split_cold
from hotsplit_cli.hotset.sizes import scaled_dim

ROUTINGS = 4  # calls cycle through this many routings, so no call reads what the last one did
SAMPLES = 2 * ROUTINGS
DTYPE = torch.bfloat16
Compute = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def geometry(shape, scale: float) -> MoEGeometry:
    # Scaled dims stay multiples of 32, mxfp4's group, so that every precision has the same shapes.
    return MoEGeometry(hidden=scaled_dim(shape.hidden, scale, 32), inter=scaled_dim(shape.inter, scale, 32),
                       num_experts=shape.num_experts, top_k=shape.top_k, shared_inter=0, router="softmax")


def runtime_path(g: MoEGeometry, precision: str) -> tuple[Compute, int]:
    """The runtime's CPU cold path as a run builds it: a bank with every expert cold and the
    split in mode cpu, called as SplitExperts calls it; and the bytes one expert is stored in."""
    info = choose_device("cpu")
    alloc = PinnedAllocator(pin=False, numa=numa_policy_for("off", None))
    layer = filled_layer(g, DTYPE, stored_format(precision))
    cold = np.zeros((1, g.num_experts), dtype=bool)
    model = HotColdMoE([layer], g, cold, info, alloc, choose_compute(info))
    bank = model.banks[0]
    split = ColdSplit("cpu", ColdRates(None, ((1, 1.0),), shared_cpu=True), info)
    compute = SplitExperts(model.compute, split)
    return (lambda x, ids, w: compute(x, ids, w, bank)), bank.expert_bytes


def plain_torch(g: MoEGeometry, kind: str) -> tuple[Compute, int]:
    """Plain torch on the same weights: a per-expert loop of F.linear, or torch._grouped_mm."""
    w13 = torch.full((g.num_experts, 2 * g.inter, g.hidden), WEIGHT, dtype=DTYPE)
    w2 = torch.full((g.num_experts, g.hidden, g.inter), WEIGHT, dtype=DTYPE)
    expert_bytes = (w13[0].numel() + w2[0].numel()) * 2
    if kind == "grouped_mm":
        return (lambda x, ids, w: grouped_mm_experts(x, ids, w, w13, w2)), expert_bytes

    def loop(x, ids, w):
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
        for e in ids.unique().tolist():
            tok, k = (ids == e).nonzero(as_tuple=True)
            gate, up = F.linear(x[tok], w13[e]).chunk(2, dim=-1)
            out.index_add_(0, tok, F.linear(F.silu(gate) * up, w2[e]).float() * w[tok, k, None])
        return out.to(x.dtype)

    return loop, expert_bytes


def time_batch(compute: Compute, g: MoEGeometry, batch: int) -> float:
    """Median ms of SAMPLES calls after a warm-up, cycling through ROUTINGS routings."""
    ids, w = routing(g, ROUTINGS, batch, torch.device("cpu"))
    x = torch.full((batch, g.hidden), 0.5, dtype=DTYPE)
    compute(x, ids[0], w[0])
    ms = []
    for i in range(SAMPLES):
        t0 = time.perf_counter()
        compute(x, ids[i % ROUTINGS], w[i % ROUTINGS])
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def probe_ms(g: MoEGeometry, threads: int, batches: list[int]) -> dict[str, float]:
    """Per batch, the cost model's time for the same routings (mode cpu, this CPU the device)
    from the probe's CPU expert rate and layer cost, measured now with `threads` threads."""
    shape = ExpertShape(g.hidden, g.inter, "bfloat16")
    # At most 4 layers' experts: the pool must outgrow the cache, not hold thousands of tiny
    # experts in a scaled run (each a call of its own).
    pool = min(QUICK_POOL_BYTES, 4 * g.num_experts * shape.expert_bytes)
    rate = measure_cpu_expert(shape, None, None, pool_bytes=pool, tokens=TOKENS, samples=3,
                              threads=threads, layer_experts=g.num_experts)
    rates = ColdRates(None, tuple((float(t), m.median_gbps) for t, m in rate.by_tokens), 0.0, shared_cpu=True,
                      layer_ms=rate.layer_ms or 0.0)
    out = {}
    for b in batches:
        ids, _ = routing(g, ROUTINGS, b, torch.device("cpu"))
        per_call = []
        for i in range(SAMPLES):
            _, tokens = np.unique(ids[i % ROUTINGS].numpy(), return_counts=True)
            per_call.append(split_cold(np.full(len(tokens), float(shape.expert_bytes)), tokens, rates, "cpu").seconds)
        out[str(b)] = statistics.median(per_call) * 1e3
    return out


def read_bytes(g: MoEGeometry, expert_bytes: int, batches: list[int]) -> dict[str, float]:
    """Per batch, the mean stored bytes of the distinct experts a call reads."""
    out = {}
    for b in batches:
        ids, _ = routing(g, ROUTINGS, b, torch.device("cpu"))
        out[str(b)] = float(np.mean([len(np.unique(i)) for i in ids.numpy()])) * expert_bytes
    return out


def serve(contender: str, shape, args) -> int:
    """Build `contender`, say so (or why not), then answer each request line until stdin ends."""
    torch.set_num_threads(args.threads)
    g = geometry(shape, args.scale)
    try:
        if contender == "probe":
            compute, expert_bytes = None, 3 * g.hidden * g.inter * 2
        elif contender.startswith("path:"):
            compute, expert_bytes = runtime_path(g, contender.split(":", 1)[1])
        else:
            compute, expert_bytes = plain_torch(g, contender)
        answer = {"read_bytes": read_bytes(g, expert_bytes, args.batches)}
    except Exception as exc:  # noqa: BLE001 - a contender that cannot be built is that column's error
        answer = {"error": error_line(exc)}
    print(json.dumps(answer), flush=True)
    for line in sys.stdin:
        batches = json.loads(line)["batches"]
        try:
            ms = (probe_ms(g, args.threads, batches) if compute is None
                  else {str(b): time_batch(compute, g, b) for b in batches})
            print(json.dumps({"ms": ms}), flush=True)
        except Exception as exc:  # noqa: BLE001
            print(json.dumps({"error": error_line(exc)}), flush=True)
    return 0
