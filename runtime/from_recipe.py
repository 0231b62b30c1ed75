"""From a recipe to a ready engine: device, traffic, plan (with real bytes), banks.

Plans and hit rates always use the recipe's true expert bytes (`expert_bytes_per_rank`);
`scale` shrinks only the tensors allocated, so a scaled run makes the same decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.hotset.budget import resolve_hot_budget
from hotsplit_cli.hotset.planfile import PlanFile, load_plan
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.hist import load_hist
from hotsplit_cli.traffic.synthetic import SyntheticTraffic, inclusion_probs, zipf_shares
from hotsplit_cli.traffic.trace import Trace, load_replay

from . import cold_split
from .device import DeviceInfo, choose_device
from .engine import Engine, RouterSource, synthetic_source, trace_source
from .fp8 import RELEASE_FP8
from .kernels import choose_compute
from .memory import check_device_memory, check_host_memory
from .model import HotColdMoE
from .moe import MoEGeometry, make_layer_weights, rms_norm
from .pinned import PinnedAllocator, numa_policy_for

CALIBRATION_STEPS = 32


@dataclass
class PlanChoice:
    hot_LE: np.ndarray  # bool [L, E]
    expected_hit_rate: float | None
    source: str  # "planned from <traffic>" | "<plan.json path>"
    budget_bytes: int | None
    hot_bytes: int  # real bytes
    made_from: str  # the routing the hot set was chosen on: this run's traffic, or a plan's histogram


@dataclass
class Prepared:
    engine: Engine
    steps: int
    info: DeviceInfo
    geom: MoEGeometry
    plan: PlanChoice
    allocator: PinnedAllocator
    expert_bytes: int  # real
    traffic: str
    scale: float
    notes: list[str] = field(default_factory=list)
    expert_format: str = ""  # how the routed experts are stored, e.g. "fp8 e4m3, 128x128 block scales"
    trace_steps: int | None = None  # steps in the replayed trace (None: no trace)

    def to_doc(self) -> dict:
        g = self.geom
        return {
            "device": self.info.to_doc(), "kernel": self.engine.model.compute.name,
            "cuda_graph": bool(self.engine.use_graph), "cold_path": _cold_path_doc(self.engine),
            "traffic": self.traffic, "trace_steps": self.trace_steps,
            "scale": self.scale,
            "allocated": {"hidden": g.hidden, "inter": g.inter, "experts": g.num_experts, "top_k": g.top_k,
                          "dtype": str(self.engine.model.banks[0].compute_dtype).replace("torch.", ""),
                          "expert_format": self.expert_format,
                          "cold_bank_bytes": self.allocator.requested_bytes,
                          "cold_bank_reserved_bytes": self.allocator.reserved_bytes,
                          "cold_bank_method": self.allocator.method, "cold_bank_fallback": self.allocator.fallback},
            "numa": self.allocator.numa.to_doc(),
            "plan": {"source": self.plan.source, "made_from": self.plan.made_from,
                     "expected_hit_rate": self.plan.expected_hit_rate,
                     "budget_bytes": self.plan.budget_bytes, "hot_bytes": self.plan.hot_bytes,
                     "hot_experts": int(self.plan.hot_LE.sum()), "expert_bytes": self.expert_bytes},
        }


def _cold_path_doc(engine: Engine) -> dict:
    split = getattr(engine.model.compute, "split", None)
    return {"mode": split.mode if split else "gpu", "rates": split.rates_source if split else None}


def read_plan_file(path: str | Path, recipe: Recipe, expert_bytes: int, plan: PlanFile | None = None) -> PlanChoice:
    """Rank 0's hot set [L, E], expected hit rate and origin from a `hotsplit.plan/1` file
    (`plan`: that file, when the caller has read it already)."""
    m = recipe.model
    plan = load_plan(path) if plan is None else plan
    hot_LE = plan.hot_LE(m.moe_layer_ids, m.num_experts, model=recipe.name)
    return PlanChoice(hot_LE, plan.hit_rate, str(path), None, int(hot_LE.sum()) * expert_bytes,
                      plan.made_from or f"{path} (it records no histogram)")


def _check_memory(geom: MoEGeometry, layers: int, dtype: torch.dtype, info: DeviceInfo, hot_slots: int) -> None:
    elem = torch.empty(0, dtype=dtype).element_size()
    check_host_memory(layers * geom.num_experts * geom.blob_elems * elem, "the cold bank needs",
                      "shrink the tensors with --scale (plans keep the real sizes)")
    check_device_memory(hot_slots * geom.blob_elems * elem, info, "the hot bank needs",
                        "lower --hot-gib or use --scale")


def prepare_run(recipe: Recipe, knobs: Knobs, *, plan_path: str | Path | None = None,
                trace_path: str | Path | None = None, steps: int | None = None, scale: float | None = None,
                dtype: torch.dtype | None = None, advance: Callable[[int], None] | None = None,
                platform_path: str | Path | None = None, ep=None, plan_file: PlanFile | None = None) -> Prepared:
    """Build everything a run needs; every check that can refuse happens before allocation.
    `advance(1)` is called as each MoE layer's weights are made (the slow part of a large recipe).
    `ep`: this rank's part of an expert-parallel run (runtime/distributed/rank.py RankHooks): its tokens,
    its plan among the experts placed on it, the node-shared cold bank and the exchange.
    `plan_file`: the file at `plan_path`, when the caller has read (and checked) it already."""
    if recipe.parallel.ep > 1 and ep is None:
        raise UsageError(f"parallel.ep is {recipe.parallel.ep}: an expert-parallel recipe runs on its ranks",
                         "run it with `hotsplit run` (it starts the ranks) or under torchrun")
    scale = recipe.run.scale if scale is None else scale
    if not 0 < scale <= 1:
        raise UsageError(f"--scale: must be in (0, 1], got {scale}")
    if steps is not None and steps < 1:
        raise UsageError(f"--steps: must be >= 1, got {steps}")
    geom = MoEGeometry.from_recipe(recipe, scale)
    platform = load_platform(platform_path) if platform_path is not None else None  # read once, before the work
    m, t = recipe.model, recipe.traffic
    L, E = m.num_moe_layers, m.num_experts
    info = choose_device(recipe.run.device if ep is None else ep.device(recipe.run.device))
    dtype = dtype or (torch.bfloat16 if info.is_cuda else torch.float32)
    notes: list[str] = []
    n_steps, trace_steps = steps or recipe.run.steps, None
    # fp8 experts are quantised as the fp8 releases are (e4m3, 128x128 block scales). Where the
    # Triton kernels run they stay fp8 in the banks (dequantised per tile as they are read); the
    # CPU torch path would dequantise every expert at every use, so there the banks hold the
    # dequantised values: the same function, 3x faster on a CPU.
    fp8 = RELEASE_FP8 if m.expert_dtype == "fp8" else None
    fp8_banks = fp8 is not None and info.triton
    if fp8_banks and knobs.cold_path != "gpu":
        raise UsageError(cold_split.FP8_REFUSAL.format(mode=knobs.cold_path))
    name = str(dtype).replace("torch.", "")
    expert_format = (fp8.describe() if fp8_banks
                     else f"{name} (fp8 values, dequantised)" if fp8 else name)
    if m.expert_dtype == "mxfp4":
        notes.append(f"the runtime has no mxfp4 experts: they run in {name} (plans keep mxfp4 bytes)")
    layers = []
    for li in range(L):
        layers.append(make_layer_weights(geom, recipe.run.seed * 1000 + li, dtype, fp8))
        if advance:
            advance(1)
    if fp8 is not None and not fp8_banks:
        for lw in layers:
            lw.fp8 = None

    # Traffic, and the routing counts the plan is made from.
    trace_file = trace_path or (t.path if t.kind == "trace" else None)
    if trace_file is not None:
        trace, n_steps = load_replay(trace_file, recipe, steps)
        trace_steps = trace.num_steps
        # The plan is made from the steps that are replayed.
        source, counts_LE = trace_source(trace), Trace(trace.topk_ids_SLTK[:n_steps], trace.layers).counts_LE(E)
        if ep is not None:
            source = ep.shard_trace(trace)
        traffic = f"trace {trace_file} ({n_steps} of {trace_steps} trace steps)"
    elif t.kind in ("synthetic", "histogram"):
        if t.kind == "histogram":
            hist = load_hist(t.path)
            if hist.counts_LE.shape != (L, E):
                raise InputFileError(f"{t.path}: histogram is {list(hist.counts_LE.shape)} (layers x experts), "
                                     f"{recipe.name} has [{L}, {E}]")
            shares, traffic = hist.counts_LE, f"histogram {t.path}"
        else:
            shares, traffic = zipf_shares(L, E, t.skew, t.seed), f"synthetic skew {t.skew:g}"
        if t.drift_every:
            traffic += f", hotspot moves every {t.drift_every} steps"
        sampler = SyntheticTraffic(shares, m.top_k, t.batch, t.drift_every, t.seed if ep is None else ep.seed(t.seed))
        source = synthetic_source(sampler)
        # Each token includes expert e with probability pi[e]: the expected counts per token.
        counts_LE = inclusion_probs(shares, m.top_k)
    else:  # prompts: the router itself on generated hidden states
        source, traffic = RouterSource(t.batch), "router on generated hidden states"
        counts_LE = _calibrate(layers, geom, t.batch, recipe.run.seed)
        notes.append("the plan is calibrated on each router's response to random hidden states")

    expert_bytes = expert_bytes_per_rank(recipe)
    if ep is not None:
        plan = ep.plan(counts_LE, expert_bytes, plan_path, lambda: resolve_hot_budget(recipe, knobs, platform), traffic)
    elif plan_path is not None:
        plan = read_plan_file(plan_path, recipe, expert_bytes, plan_file)
    else:
        budget = resolve_hot_budget(recipe, knobs, platform).budget_bytes
        p = plan_hot_set(counts_LE, expert_bytes, budget)
        plan = PlanChoice(p.hot_RLE[0], p.hit_rate, f"planned from {traffic}", budget, int(p.hot_bytes_R[0]),
                          traffic)
    _check_memory(geom, L, torch.float8_e4m3fn if fp8_banks else dtype, info, int(plan.hot_LE.sum()))
    numa = numa_policy_for(knobs.numa_policy, info.numa_node, info.reasons.get("numa_node"))
    if ep is None:
        allocator = PinnedAllocator(pin=info.pinned, numa=numa)
        model = HotColdMoE(layers, geom, plan.hot_LE, info, allocator, choose_compute(info))
    else:
        allocator, model = ep.build_model(layers, geom, plan.hot_LE, info, numa, choose_compute(info))
    split = cold_split.attach(model, knobs.cold_path, info, platform)
    if split is not None and info.graphs:
        notes.append(f"cold_path {knobs.cold_path}: no CUDA graph (the split reads each layer's routing on the host)")
    seed = recipe.run.seed if ep is None else ep.seed(recipe.run.seed)
    # An EP step exchanges over the network, sized on the host: it cannot be captured in a CUDA graph.
    engine = Engine(model, source, knobs, expert_bytes, seed=seed, expected_hit_rate=plan.expected_hit_rate,
                    use_graph=False if ep is not None else None)
    return Prepared(engine, n_steps, info, geom, plan, allocator, expert_bytes, traffic, scale, notes, expert_format,
                    trace_steps)


def _calibrate(layers, geom: MoEGeometry, batch: int, seed: int) -> np.ndarray:
    """Routing counts [L, E] of each router on random hidden states (planning input for `prompts`)."""
    gen = torch.Generator().manual_seed(seed + 7919)
    counts = np.zeros((len(layers), geom.num_experts))
    for li, lw in enumerate(layers):
        for _ in range(CALIBRATION_STEPS):
            x = rms_norm(torch.randn(batch, geom.hidden, generator=gen))
            ids, _ = lw.router(x)
            counts[li] += np.bincount(ids.reshape(-1).numpy(), minlength=geom.num_experts)
    return counts
