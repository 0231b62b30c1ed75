"""From a recipe to a ready engine: device, traffic, plan (at the real expert bytes), banks;
`scale` shrinks only the tensors allocated, so a scaled run makes the same decisions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.hotset.budget import resolve_hot_budget
from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.hotset.windows import StoredLayers
from hotsplit_cli.traffic.synthetic import SyntheticTraffic, inclusion_probs, recipe_shares
from hotsplit_cli.traffic.trace import Replay, Trace, load_run_replay

from .bank import expert_blob_layout
from .built import Built
from .cold_split import make_split
from .device import DeviceInfo
from .engine import Engine, RouterSource, synthetic_source
from .fp8 import RELEASE_FP8
from .hot_set import choose_hot_set
from .kernels import choose_compute
from .lookahead_stage import lookahead_stager
from .memory import check_device_memory, check_host_memory
from .model import HotColdMoE
from .moe import LayerWeights, MoEGeometry, make_layer_weights, rms_norm
from .prefetch import Stager, StagingPool, carve_budget, check_plan_leaves_pool, make_stager, staging_pool
from .ranks import Rank, single_rank
from .request import check_steps_and_scale
from .stored_run import describe_auto, run_auto_layers, store_layer, stored_run

CALIBRATION_STEPS = 32


def _check_bytes(host_bytes: int, device_bytes: int, info: DeviceInfo) -> None:
    """The cold banks' bytes in host memory and the hot slots' on the device, as allocated."""
    check_host_memory(host_bytes, "the cold bank needs", "shrink the tensors with --scale (plans keep the real sizes)")
    check_device_memory(device_bytes, info, "the hot bank needs", "lower --hot-gib or use --scale")


def _blob_bytes(layers: list[LayerWeights], geom: MoEGeometry, dtype: torch.dtype) -> np.ndarray:
    """int64 [L, E]: each expert's blob as its bank allocates it (runtime/bank.py expert_blob_layout),
    what the memory checks count."""
    out = np.zeros((len(layers), geom.num_experts), dtype=np.int64)
    for li, lw in enumerate(layers):
        for ids, stored in lw.parts or [(slice(None), lw.stored)]:
            blob = expert_blob_layout(2 * geom.inter, geom.hidden, dtype, stored)
            out[li, ids] = blob.elems * blob.storage.itemsize
    return out


def prepare_run(recipe: Recipe, knobs: Knobs, *, plan_path: str | Path | None = None,
                trace_path: str | Path | None = None, steps: int | None = None, scale: float | None = None,
                dtype: torch.dtype | None = None, advance: Callable[[int], None] | None = None,
                platform_path: str | Path | None = None, rank: Rank | None = None,
                parallel: Callable = single_rank, prefetch_fit: str | Path | None = None,
                replay: Replay | None = None) -> Built:
    """Build everything a run needs; every check that can refuse happens before allocation.
    `advance(1)` as each MoE layer's weights are made; `rank`: the rank built (default: a single
    one), `parallel`: applied to its built model; `prefetch_fit`: the trace `prefetch trace` is
    fitted on (else the replayed trace's first window); `replay`: the trace replayed, read already."""
    scale = recipe.run.scale if scale is None else scale
    check_steps_and_scale(steps, scale)
    rank = Rank.single(recipe, knobs, platform_path) if rank is None else rank
    if plan_path is not None and rank.plan_file is None:  # read once: for the hot set and the pool's check
        rank = dataclasses.replace(rank, plan_file=load_plan(plan_path))
    recipe, geom, stored = stored_run(recipe, knobs.precision, scale)
    rank.check_fp8(recipe, knobs, kept=lambda info: info.triton)
    info, platform = rank.info, rank.platform
    dtype = dtype or (torch.bfloat16 if info.is_cuda else torch.float32)
    auto = run_auto_layers(recipe, knobs, rank.plan_file if plan_path is not None else None)
    experts = _expert_format(recipe, info, dtype, stored, auto)
    layers = _make_layers(recipe, geom, dtype, experts.fp8, advance, auto)
    traffic = _traffic(recipe, rank, layers, geom, replay or load_run_replay(recipe, trace_path, steps))
    expert_bytes = expert_bytes_per_rank(recipe)
    pool = staging_pool(recipe, knobs, expert_bytes)  # carved from the budget the hot set is planned at
    plan = choose_hot_set(rank, recipe, traffic.counts_LE, expert_bytes, plan_path,
                          carve_budget(lambda: resolve_hot_budget(recipe, knobs, platform), pool), traffic.name)
    if auto is not None:  # each hot expert at its stored bytes
        plan = dataclasses.replace(plan, hot_bytes=int(auto.sizes_LE[plan.hot_LE].sum()))
    check_plan_leaves_pool(pool, plan.hot_bytes, rank.plan_file)
    blob_LE = _blob_bytes(layers, geom, dtype)
    _check_bytes(int(blob_LE.sum()), int(blob_LE[plan.hot_LE].sum()) + (pool.device_rows * int(blob_LE.max())
                                                                         if pool else 0), info)
    compute = choose_compute(info)
    look = lookahead_stager(pool, knobs.prefetch, geom.num_experts, geom.top_k)
    model = rank.on_bank(lambda allocator: HotColdMoE(layers, geom, plan.hot_LE, info, allocator, compute,
                                                      lambda bank: make_split(knobs.cold_path, info, bank, platform),
                                                      look))
    stager = None if pool is None else _stager(model, pool, traffic.trace, prefetch_fit, knobs)
    model, source = parallel(model, traffic.source, rank)
    notes = experts.notes + traffic.notes + (pool.notes() if pool else []) + _graph_notes(knobs, info)
    engine = Engine(model, source, knobs, expert_bytes, seed=rank.seed(recipe.run.seed),
                    expected_hit_rate=plan.expected_hit_rate, use_graph=False if look else rank.use_graph,
                    stager=stager, stored=auto)
    allocated = {"hidden": geom.hidden, "inter": geom.inter, "experts": geom.num_experts, "top_k": geom.top_k,
                 "dtype": str(model.banks[0].compute_dtype).replace("torch.", ""), "expert_format": experts.describe}
    return Built(engine, traffic.steps or steps or recipe.run.steps, info, plan, rank.allocator,
                 expert_bytes if auto is None else None,
                 traffic.name, allocated, scale, notes, traffic.trace_steps, traffic.trace)


def _graph_notes(knobs: Knobs, info: DeviceInfo) -> list[str]:
    """Why a run on a device that could replay CUDA graphs does not."""
    if not info.graphs:
        return []
    notes = []
    if knobs.cold_path != "gpu":
        notes.append(f"cold_path {knobs.cold_path}: no CUDA graph (the split reads each layer's routing on the host)")
    if knobs.prefetch == "lookahead":
        notes.append("prefetch lookahead: no CUDA graph (each layer's staging is chosen on the host from the "
                     "next router's guesses)")
    return notes


def _stager(model: HotColdMoE, pool: StagingPool, trace: Trace, fit_path, knobs: Knobs) -> Stager:
    """The staging rows reserved in every predicted layer's bank, and the run's stager (router
    lookahead's, made with the model, or the trace predictor's)."""
    for bank in model.banks[1:]:
        bank.reserve_staging(pool.config.slots)
    if model.lookahead is not None:
        return model.lookahead
    return make_stager(trace, None if fit_path is None else Path(fit_path), pool, model.geom.num_experts,
                       pool.expert_bytes, knobs.dyn_steps)


@dataclass
class _Experts:
    fp8: object  # the stored format the banks hold (fp8 or mxfp4), or None
    describe: str  # how the routed experts are stored
    notes: list[str]


def _expert_format(recipe: Recipe, info: DeviceInfo, dtype: torch.dtype, stored, auto: StoredLayers | None = None
                   ) -> _Experts:
    """How the banks hold the experts: a stored precision asked for (`stored`) on every device, or
    each at its auto plan's (`auto`); a release's fp8 experts stay fp8 where the Triton kernels read
    them, dequantised on the CPU torch path (which would dequantise every expert at every use: 3x slower)."""
    if stored is not None:
        return _Experts(stored, stored.describe(), [])
    if auto is not None:
        return _Experts(None, describe_auto(auto), [])
    m = recipe.model
    fp8 = RELEASE_FP8 if m.expert_dtype == "fp8" else None
    fp8_banks = fp8 is not None and info.triton  # a CPU cold path was refused for them (rank.check_fp8)
    name = str(dtype).replace("torch.", "")
    notes = []
    if m.expert_dtype == "mxfp4":
        notes.append(f"the runtime has no mxfp4 experts: they run in {name} (plans keep mxfp4 bytes)")
    describe = fp8.describe() if fp8_banks else f"{name} (fp8 values, dequantised)" if fp8 else name
    return _Experts(fp8 if fp8_banks else None, describe, notes)


def _make_layers(recipe: Recipe, geom: MoEGeometry, dtype: torch.dtype, banks_fp8, advance,
                 auto: StoredLayers | None = None) -> list:
    """The routed experts' weights, quantised as the banks store them or else as the recipe's
    release is; the quantised form is kept only where the banks hold it. Under `auto`, each
    expert is then stored at its plan's precision (stored_run.py store_layer)."""
    release = banks_fp8 or (RELEASE_FP8 if recipe.model.expert_dtype == "fp8" else None)
    layers = []
    for li in range(recipe.model.num_moe_layers):
        lw = make_layer_weights(geom, recipe.run.seed * 1000 + li, dtype, release)
        if banks_fp8 is None:
            lw.stored = None  # the banks hold the dequantised values
        if auto is not None:
            store_layer(lw, auto.precision_LE[li], dtype)
        layers.append(lw)
        if advance:
            advance(1)
    return layers


@dataclass
class _Traffic:
    source: object  # the rank's routing source
    counts_LE: np.ndarray  # the routing counts the plan is made from
    name: str
    steps: int | None = None  # a trace's steps to replay (None: the run's --steps or the recipe's)
    trace_steps: int | None = None
    notes: list[str] = field(default_factory=list)
    trace: Trace | None = None  # the replayed trace


def _traffic(recipe: Recipe, rank: Rank, layers, geom: MoEGeometry, replay: Replay | None) -> _Traffic:
    """This rank's traffic, and the routing counts the plan is made from."""
    m, t = recipe.model, recipe.traffic
    if replay is not None:  # the counts of the replayed steps
        return _Traffic(rank.shard_trace(replay.trace), replay.counts_LE(m.num_experts), replay.describe(),
                        replay.steps, replay.trace.num_steps, trace=replay.trace)
    if t.kind in ("synthetic", "histogram"):
        shares, name = recipe_shares(recipe)
        if t.drift_every:
            name += f", hotspot moves every {t.drift_every} steps"
        sampler = SyntheticTraffic(shares, m.top_k, t.batch, t.drift_every, rank.seed(t.seed))
        # Each token includes expert e with probability pi[e]: the expected counts per token.
        return _Traffic(synthetic_source(sampler), inclusion_probs(shares, m.top_k), name)
    # prompts: the router itself on generated hidden states
    return _Traffic(RouterSource(t.batch), _calibrate(layers, geom, t.batch, recipe.run.seed),
                    "router on generated hidden states",
                    notes=["the plan is calibrated on each router's response to random hidden states"])


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
