"""Replay a routing trace under hot-set policies (numpy only; never imports torch).

Shape letters: S = steps, L = MoE layers, E = experts, W = windows.

Every policy gets the same byte budget per rank, `budget // expert_bytes` hot slots, and the
same accounting. Per step and layer, a routed assignment to a hot expert is a hit; every
distinct cold expert the step activates costs its bytes once over PCIe (read in place by the
GPU, zero-copy), and every host->GPU copy (a dynamic swap, a cache fill, an oracle switch) costs
its bytes once more. So PCIe bytes per step = (distinct cold experts + experts copied) x bytes.

How each policy splits the slots across layers:
- static: the planner's greedy by share per byte over all (layer, expert) pairs, so layers get
  as many slots as their traffic earns; fitted on a histogram, a plan, or the trace's first window.
- dynamic: starts from the static hot set, keeps its per-layer slot counts, and every
  `dyn_steps` steps applies the runtime's rule with its knobs (`dyn_rule` credit:
  `planner.SwapRule`, counts decayed by `dyn_decay` per window, then `propose_swaps`; breakeven:
  `admission.BreakEvenRule`, swaps that pay for their copy in cold reads); swaps apply from the
  next step and each copies one expert.
- lru / lfu: per-layer caches with an equal share of the slots (the remainder to the first
  layers), starting empty. A missed expert is read cold by the step that missed it and also
  copied in (a fill, which costs its bytes a second time) and evicts the least recently / least
  frequently used one. Recency and frequency are
  kept per step: the experts a step activates are the most recent; frequency counts every
  assignment seen so far.
- oracle: per window, the planner's best hot set for that window's own counts (hindsight), with
  the copies to switch between windows. An upper bound on the hit rate of any policy whose hot
  set changes only at window boundaries (static, dynamic); caches may change mid-window.
- hindsight: the planner's best static hot set for the whole replayed trace (the counts of every
  step, known in advance) at the same budget: the yardstick of a rule that learns the traffic
  as it comes. Nothing static does better on this trace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.analysis.prefetch import StagingReport, stage_for_simulate
from hotsplit_cli.analysis.swap_windows import dynamic_windows
from hotsplit_cli.config.knobs import DYN_DECAY, DYN_SIGMAS, Knobs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import GIB, Recipe
from hotsplit_cli.core.errors import PlanError, UsageError
from hotsplit_cli.core.units import gib
from hotsplit_cli.hotset.budget import HotBudget, ReadRate, choose_read_rate, resolve_hot_budget
from hotsplit_cli.hotset.coldpath import replay_cold_paths
from hotsplit_cli.hotset.planfile import (
    PlanFile,
    check_plan_precision,
    check_plan_ranks,
    load_plan,
    recipe_cold_rates,
    stored_sizes,
)
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.hotset.sizes import PRECISIONS, expert_bytes_per_rank, uniform_precision
from hotsplit_cli.hotset.windows import precision_rows
from hotsplit_cli.traffic.hist import load_hist
from hotsplit_cli.traffic.recipe_match import check_hist_matches_recipe
from hotsplit_cli.traffic.trace import Trace, load_trace

POLICIES = ("static", "dynamic", "lru", "lfu", "oracle", "hindsight")
STORED_POLICIES = ("static", "dynamic")  # the policies an auto plan's mixed expert sizes replay under
LAYER_SPLIT = {
    "static": "planner greedy over all layers (share per byte)",
    "dynamic": "static's per-layer slots; swaps keep them",
    "lru": "equal slots per layer",
    "lfu": "equal slots per layer",
    "oracle": "planner greedy over all layers, per window",
    "hindsight": "planner greedy over all layers, on the whole replayed trace",
}


Advance = Callable[[int], None]  # told how many more steps a policy has replayed (progress)


def _ignore(n: int) -> None:
    pass


@dataclass(frozen=True)
class PolicyRun:
    """What one policy did, step by step (all arrays [S])."""

    name: str
    hits_S: np.ndarray  # routed assignments served by hot experts
    cold_experts_S: np.ndarray  # distinct cold experts read in place (zero-copy)
    copied_experts_S: np.ndarray  # experts copied host->GPU (swaps, fills, switches)
    hot_slots: int  # the most experts it holds hot at once (<= the budget's slots)
    cold_bytes_S: np.ndarray | None = None  # auto plans: bytes read in place, each expert at its own
    copied_bytes_S: np.ndarray | None = None  # auto plans: bytes copied, each expert at its own


@dataclass(frozen=True)
class PolicySummary:
    name: str
    hit_rate: float
    window_hit_rate_W: np.ndarray
    pcie_bytes_per_step: float
    zero_copy_bytes_per_step: float
    copy_bytes_per_step: float
    copies: int  # experts copied in the whole trace
    hot_slots: int
    layer_split: str
    step_ms: float | None  # predicted PCIe time per step, when the platform's rates are known

    def to_doc(self) -> dict:
        return {
            "hit_rate": self.hit_rate,
            "pcie_bytes_per_step": self.pcie_bytes_per_step,
            "zero_copy_bytes_per_step": self.zero_copy_bytes_per_step,
            "copy_bytes_per_step": self.copy_bytes_per_step,
            "copies": self.copies,
            "hot_slots": self.hot_slots,
            "window_hit_rate": [float(x) for x in self.window_hit_rate_W],
            "layer_split": self.layer_split,
            "step_ms": self.step_ms,
        }


def _static_stats(counts_SLE: np.ndarray, hot_LE: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hits = np.einsum("sle,le->s", counts_SLE, hot_LE.astype(np.float64))
    cold = ((counts_SLE > 0) & ~hot_LE).sum(axis=(1, 2))
    return hits, cold


def _cold_bytes(counts_SLE: np.ndarray, hot_LE: np.ndarray, sizes_LE: np.ndarray) -> np.ndarray:
    """float [S]: the stored bytes of the distinct cold experts each step touches."""
    return np.einsum("sle,le->s", ((counts_SLE > 0) & ~hot_LE).astype(np.float64), sizes_LE.astype(np.float64))


def run_static(counts_SLE: np.ndarray, hot_LE: np.ndarray, advance: Advance = _ignore,
               sizes_LE: np.ndarray | None = None) -> PolicyRun:
    """A fixed hot set. `sizes_LE`: each expert's stored bytes [L, E] when they differ (auto plans)."""
    hits, cold = _static_stats(counts_SLE, hot_LE)
    advance(len(hits))
    zeros = np.zeros(len(hits), dtype=np.int64)
    if sizes_LE is None:
        return PolicyRun("static", hits, cold, zeros, int(hot_LE.sum()))
    return PolicyRun("static", hits, cold, zeros, int(hot_LE.sum()), _cold_bytes(counts_SLE, hot_LE, sizes_LE),
                     zeros.astype(np.float64))


def run_dynamic(counts_SLE: np.ndarray, hot_LE: np.ndarray, dyn_steps: int, max_swaps: int,
                margin: float, advance: Advance = _ignore, decay: float = DYN_DECAY, rule: str = "credit",
                sigmas: float = DYN_SIGMAS) -> PolicyRun:
    """The runtime's rule: every `dyn_steps` steps, one rule of kind `rule` (`dyn_rule`: credit or
    breakeven, hotset/admission.py) is told the last window's counts and proposes the swaps."""
    S = counts_SLE.shape[0]
    hits = np.zeros(S)
    cold = np.zeros(S, dtype=np.int64)
    copied = np.zeros(S, dtype=np.int64)
    windows = dynamic_windows(counts_SLE, hot_LE, dyn_steps, max_swaps, margin, decay, rule, sigmas)
    for start, end, hot, swapped in windows:
        hits[start:end], cold[start:end] = _static_stats(counts_SLE[start:end], hot)
        advance(end - start)
        if end < S:
            copied[end] = swapped  # copies land before the next step runs
    return PolicyRun("dynamic", hits, cold, copied, int(hot_LE.sum()))


def run_dynamic_stored(counts_SLE: np.ndarray, hot_LE: np.ndarray, precision_LE: np.ndarray,
                       sizes_LE: np.ndarray, cfg: SimConfig, advance: Advance = _ignore) -> PolicyRun:
    """`run_dynamic` for experts stored at different precisions (an auto plan, `precision_LE` [L, E]
    any labels, `sizes_LE` their stored bytes): a swap keeps each expert's precision, so an expert
    comes in only for a hot one of its layer at its own precision, and the hot bytes never change.
    Each (layer, precision) is replayed as a layer of its own, holding only that precision's
    experts (the others count 0 there, and a cold expert without traffic is never swapped in)."""
    S, L, E = counts_SLE.shape
    member_LPE = precision_rows(precision_LE)
    P = member_LPE.shape[1]
    split = dynamic_windows((counts_SLE[:, :, None, :] * member_LPE).reshape(S, L * P, E),
                            (hot_LE[:, None, :] & member_LPE).reshape(L * P, E), cfg.dyn_steps, cfg.dyn_max_swaps,
                            cfg.dyn_margin, cfg.dyn_decay, cfg.dyn_rule, cfg.dyn_sigmas)
    hits, cold = np.zeros(S), np.zeros(S, dtype=np.int64)
    copied, cold_bytes, copied_bytes = np.zeros(S, dtype=np.int64), np.zeros(S), np.zeros(S)
    before = None
    for start, end, hot_split, _ in split:
        hot = hot_split.reshape(L, P, E).any(axis=1)
        hits[start:end], cold[start:end] = _static_stats(counts_SLE[start:end], hot)
        cold_bytes[start:end] = _cold_bytes(counts_SLE[start:end], hot, sizes_LE)
        if before is not None:  # the swaps made after the last window land before this one's first step
            copied[start], copied_bytes[start] = int((hot & ~before).sum()), float(sizes_LE[hot & ~before].sum())
        before = hot
        advance(end - start)
    return PolicyRun("dynamic", hits, cold, copied, int(hot_LE.sum()), cold_bytes, copied_bytes)


def equal_split(num_slots: int, num_layers: int, num_experts: int) -> np.ndarray:
    """Slots per layer for per-layer caches: equal shares, the remainder to the first layers."""
    cap = np.full(num_layers, num_slots // num_layers, dtype=np.int64)
    cap[: num_slots % num_layers] += 1
    return np.minimum(cap, num_experts)


def run_cache(counts_SLE: np.ndarray, cap_L: np.ndarray, kind: str, advance: Advance = _ignore) -> PolicyRun:
    """Per-layer LRU or LFU caches that fill on a miss, vectorised across layers."""
    if kind not in ("lru", "lfu"):
        raise PlanError(f"unknown cache policy {kind!r}")
    S, L, E = counts_SLE.shape
    in_cache = np.zeros((L, E), dtype=bool)
    last_used = np.full((L, E), -1.0)
    freq = np.zeros((L, E))
    hits = np.zeros(S)
    cold = np.zeros(S, dtype=np.int64)
    copied = np.zeros(S, dtype=np.int64)
    ids = np.arange(E)
    for s in range(S):
        c = counts_SLE[s]
        active = c > 0
        hits[s] = (c * in_cache).sum()
        freq += c
        last_used[active] = s
        # Priority of residency after this step; ties by lower expert id (lexsort: last key first).
        if kind == "lru":
            keys = (-ids[None, :].repeat(L, 0), c, last_used)
        else:
            # Residents stay until a miss evicts the least frequently used one.
            keys = (-ids[None, :].repeat(L, 0), last_used, freq, in_cache, active)
        order = np.lexsort(keys, axis=1)[:, ::-1]  # best first
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.broadcast_to(ids, (L, E)), axis=1)
        seen = last_used >= 0
        new_cache = (rank < cap_L[:, None]) & seen
        filled = new_cache & ~in_cache  # only active experts can enter: they are the most recent
        missed = active & ~in_cache
        copied[s] = filled.sum()
        # Every miss is read in place by the step that missed it; a fill is a copy on top of that
        # read (the copy lands for later steps), so a filled miss costs its bytes twice.
        cold[s] = missed.sum()
        in_cache = new_cache
        advance(1)
    return PolicyRun(kind, hits, cold, copied, int(cap_L.sum()))


def window_bounds(num_steps: int, window_steps: int) -> list[tuple[int, int]]:
    return [(a, min(a + window_steps, num_steps)) for a in range(0, num_steps, window_steps)]


def run_oracle(counts_SLE: np.ndarray, expert_bytes, budget_bytes: int, window_steps: int,
               advance: Advance = _ignore) -> PolicyRun:
    """Best hot set of each window in hindsight; switching copies the newly hot experts."""
    S, L, E = counts_SLE.shape
    hits = np.zeros(S)
    cold = np.zeros(S, dtype=np.int64)
    copied = np.zeros(S, dtype=np.int64)
    prev = None
    slots = 0
    for a, b in window_bounds(S, window_steps):
        chunk = counts_SLE[a:b]
        total = chunk.sum(axis=0)
        hot = (plan_hot_set(total, expert_bytes, budget_bytes).hot_RLE[0] if total.any()
               else np.zeros((L, E), dtype=bool))
        hits[a:b], cold[a:b] = _static_stats(chunk, hot)
        if prev is not None:
            copied[a] = (hot & ~prev).sum()
        prev = hot
        advance(b - a)
        slots = max(slots, int(hot.sum()))
    return PolicyRun("oracle", hits, cold, copied, slots)


def run_hindsight(counts_SLE: np.ndarray, expert_bytes, budget_bytes: int, advance: Advance = _ignore) -> PolicyRun:
    """The best static hot set for the whole trace, fitted on the trace itself."""
    hot = plan_hot_set(counts_SLE.sum(axis=0), expert_bytes, budget_bytes).hot_RLE[0]
    hits, cold = _static_stats(counts_SLE, hot)
    advance(len(hits))
    return PolicyRun("hindsight", hits, cold, np.zeros(len(hits), dtype=np.int64), int(hot.sum()))


def swap_cap_bound(counts_SLE: np.ndarray, hot_LE: np.ndarray, window_steps: int, max_swaps: int,
                   across_layers: bool = False) -> float:
    """The most assignments any swap rule can serve hot on this trace: a proven upper bound, not
    a policy. A rule of the dynamic kind starts from `hot_LE`, changes the hot set only at window
    boundaries and brings in at most `max_swaps` experts per layer per window, one out for each
    in; so in window w each layer's hot set differs from its start by at most w x max_swaps
    experts. The bound lets every window take the best such set for that window's own counts
    (knowing them, and free of the sets before it). With `across_layers`, a layer may also give
    its slots to another (same total; still at most w x max_swaps new experts per layer)."""
    S, L, E = counts_SLE.shape
    n_L = hot_LE.sum(axis=1)
    total = 0.0
    for w, (a, b) in enumerate(window_bounds(S, window_steps)):
        c_LE = counts_SLE[a:b].sum(axis=0)
        k = w * max_swaps
        ins = -np.sort(-np.where(hot_LE, c_LE, -np.inf), axis=1)  # hot experts first, heaviest first
        outs = -np.sort(-np.where(hot_LE, -np.inf, c_LE), axis=1)  # the rest, heaviest first
        if across_layers:
            new = np.where(np.arange(E) < k, outs, -np.inf)  # each layer's k best newcomers
            pool = np.concatenate([ins, new], axis=1).ravel()
            pool = pool[np.isfinite(pool)]
            total += float(np.sort(pool)[::-1][: int(n_L.sum())].sum())
            continue
        ci = np.concatenate([np.zeros((L, 1)), np.cumsum(np.where(np.isfinite(ins), ins, 0), axis=1)], axis=1)
        co = np.concatenate([np.zeros((L, 1)), np.cumsum(np.where(np.isfinite(outs), outs, 0), axis=1)], axis=1)
        for layer in range(L):
            n = int(n_L[layer])
            j = np.arange(min(k, n, E - n) + 1)  # newcomers taken in this layer
            total += float((co[layer, j] + ci[layer, n - j]).max())
    return total


def summarise(run: PolicyRun, assignments_S: np.ndarray, expert_bytes: int | None, window_steps: int,
              read_gbps: float | None = None, h2d_gbps: float | None = None) -> PolicySummary:
    """Rates from a run. Step time = zero-copy bytes / read rate + copy bytes / H2D copy rate
    (copies share the PCIe link with the reads, so the two are added, not overlapped). A run that
    counted its own bytes (experts of different sizes: `expert_bytes` None) is summed as counted."""
    S = len(assignments_S)
    total = float(assignments_S.sum())
    windows = [
        float(run.hits_S[a:b].sum() / assignments_S[a:b].sum()) if assignments_S[a:b].sum() > 0 else 0.0
        for a, b in window_bounds(S, window_steps)
    ]
    if run.cold_bytes_S is not None:
        zc, cp = float(run.cold_bytes_S.sum()) / S, float(run.copied_bytes_S.sum()) / S
    else:
        zc = float(run.cold_experts_S.sum()) * expert_bytes / S
        cp = float(run.copied_experts_S.sum()) * expert_bytes / S
    step_ms = None
    if read_gbps:
        step_ms = zc / (read_gbps * 1e9) * 1e3
        if cp:
            step_ms = None if not h2d_gbps else step_ms + cp / (h2d_gbps * 1e9) * 1e3
    return PolicySummary(
        name=run.name,
        hit_rate=float(run.hits_S.sum() / total) if total > 0 else 0.0,
        window_hit_rate_W=np.asarray(windows),
        pcie_bytes_per_step=zc + cp,
        zero_copy_bytes_per_step=zc,
        copy_bytes_per_step=cp,
        copies=int(run.copied_experts_S.sum()),
        hot_slots=run.hot_slots,
        layer_split=LAYER_SPLIT[run.name],
        step_ms=step_ms,
    )


@dataclass(frozen=True)
class SimConfig:
    """Budget and knobs shared by every policy."""

    expert_bytes: int | None  # bytes one rank holds of one expert; None when they differ (auto plans)
    budget_bytes: int  # per rank
    window_steps: int
    dyn_steps: int
    dyn_max_swaps: int
    dyn_margin: float
    dyn_decay: float = DYN_DECAY
    dyn_rule: str = "credit"
    dyn_sigmas: float = DYN_SIGMAS
    stored: StoredPrecisions | None = None  # auto plans: each expert's precision and bytes

    @property
    def hot_slots(self) -> int:
        """Experts the budget holds hot: the budget over one expert's bytes, or an auto plan's hot set."""
        return self.stored.hot_experts if self.stored is not None else self.budget_bytes // self.expert_bytes


@dataclass(frozen=True)
class StoredPrecisions:
    """An auto plan's stored precisions, as `simulate` replays them: each expert's precision and
    stored bytes [L, E], rows in the trace's layer order."""

    precision_LE: np.ndarray  # str [L, E]: native, fp8 or mxfp4
    sizes_LE: np.ndarray  # int64 [L, E]: stored bytes per rank
    hot_experts: int  # the plan's hot experts (their bytes differ, so the budget gives no one count)


def simulate(counts_SLE: np.ndarray, static_hot_LE: np.ndarray, cfg: SimConfig,
             policies=POLICIES, advance: Advance = _ignore) -> dict[str, PolicyRun]:
    """Run each named policy on the per-step counts (float [S, L, E]); `advance` is told of
    every replayed step of every policy (S x len(policies) in all)."""
    counts_SLE = np.asarray(counts_SLE, dtype=np.float64)
    S, L, E = counts_SLE.shape
    if static_hot_LE.shape != (L, E):
        raise PlanError(f"static hot set has shape {static_hot_LE.shape}, the trace has {(L, E)}")
    if cfg.stored is not None:
        check_stored_policies(policies)
    out: dict[str, PolicyRun] = {}
    for name in policies:
        if name == "static":
            out[name] = run_static(counts_SLE, static_hot_LE, advance,
                                   None if cfg.stored is None else cfg.stored.sizes_LE)
        elif name == "dynamic" and cfg.stored is not None:
            out[name] = run_dynamic_stored(counts_SLE, static_hot_LE, cfg.stored.precision_LE, cfg.stored.sizes_LE,
                                           cfg, advance)
        elif name == "dynamic":
            out[name] = run_dynamic(counts_SLE, static_hot_LE, cfg.dyn_steps, cfg.dyn_max_swaps, cfg.dyn_margin,
                                    advance, cfg.dyn_decay, cfg.dyn_rule, cfg.dyn_sigmas)
        elif name in ("lru", "lfu"):
            out[name] = run_cache(counts_SLE, equal_split(cfg.hot_slots, L, E), name, advance)
        elif name == "oracle":
            out[name] = run_oracle(counts_SLE, cfg.expert_bytes, cfg.budget_bytes, cfg.window_steps, advance)
        elif name == "hindsight":
            out[name] = run_hindsight(counts_SLE, cfg.expert_bytes, cfg.budget_bytes, advance)
        else:
            raise PlanError(f"unknown policy {name!r}", f"policies are: {', '.join(POLICIES)}")
    return out


def policies_for(text: str | None, precision: str) -> tuple[str, ...]:
    """The policies `--policies` names, or by default every one (at precision auto, the ones that
    replay experts of different stored sizes)."""
    if text is None:
        return STORED_POLICIES if precision == "auto" else POLICIES
    return parse_policies(text)


def check_stored_policies(policies) -> None:
    """UsageError unless every policy can replay experts of different stored sizes (an auto plan)."""
    bad = [name for name in policies if name not in STORED_POLICIES]
    if bad:
        raise UsageError(f"--policies {bad[0]}: experts stored at an auto plan's precisions replay under "
                         f"{' and '.join(STORED_POLICIES)} only (the others choose hot sets of one expert size)",
                         f"pass --policies {','.join(STORED_POLICIES)}")


def rebatch(topk_ids_SLTK: np.ndarray, batch: int) -> np.ndarray:
    """Regroup a trace's tokens into steps of `batch` tokens ([S', L, batch, K]; the remainder
    that does not fill a step is dropped)."""
    S, L, T, K = topk_ids_SLTK.shape
    tokens = np.moveaxis(topk_ids_SLTK, 1, 2).reshape(S * T, L, K)  # token order kept
    steps = (S * T) // batch
    if steps == 0:
        raise PlanError(f"--batch {batch} exceeds the trace's {S * T} tokens")
    return np.moveaxis(tokens[: steps * batch].reshape(steps, batch, L, K), 2, 1)


def parse_policies(text: str) -> tuple[str, ...]:
    """`--policies static,lru` -> ("static", "lru"): known names, in order, each once."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in POLICIES]
    if bad or not names:
        raise UsageError(f"--policies: unknown policy {bad[0] if bad else '(none)'!r}",
                         f"choose from {','.join(POLICIES)}")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class SimRequest:
    """What to replay: a trace, the policies, where the static hot set comes from (a histogram to
    fit, a plan, else the trace's first window), and optional regrouping and platform."""

    trace_path: Path
    policies: tuple[str, ...] = POLICIES
    fit_path: Path | None = None
    plan_path: Path | None = None
    batch: int | None = None  # regroup the trace's tokens into steps of this many
    window_steps: int | None = None  # default: dyn_steps
    platform_path: Path | None = None
    prefetch_fit_path: Path | None = None  # the trace the prefetch predictor is fitted on

    def __post_init__(self) -> None:
        if self.fit_path is not None and self.plan_path is not None:
            raise UsageError("--fit and --plan both give the static hot set", "pass one of them")
        if self.batch is not None and self.batch < 1:
            raise UsageError(f"--batch: must be >= 1, got {self.batch}")
        if self.window_steps is not None and self.window_steps < 1:
            raise UsageError(f"--window-steps: must be >= 1, got {self.window_steps}")


@dataclass(frozen=True)
class SimResult:
    """A finished simulation: each policy's summary and everything it was run with."""

    request: SimRequest
    recipe: str
    trace: Trace  # after regrouping
    num_experts: int
    routed_assignments: float
    budget: HotBudget
    config: SimConfig
    static_source: str  # where the static hot set came from, as printed
    knobs: Knobs
    rate: ReadRate  # what step times are predicted at (none when rate.gbps is None)
    sums: dict[str, PolicySummary]
    cold_paths: dict | None  # the static hot set's cold time per step by cold path (with a platform)
    static_hot_LE: np.ndarray | None = None  # the static hot set every policy started from
    staging: StagingReport | None = None  # with knob prefetch on: the rows with staging slots

    def to_doc(self) -> dict:
        tr, cfg, k, platform = self.trace, self.config, self.knobs, self.request.platform_path
        doc = {
            "trace": str(self.request.trace_path), "recipe": self.recipe, "steps": tr.num_steps,
            "tokens_per_step": int(tr.topk_ids_SLTK.shape[2]), "top_k": tr.top_k, "layers": list(tr.layers),
            "num_experts": self.num_experts, "routed_assignments": self.routed_assignments,
            "budget": {"hot_gib": self.budget.budget_bytes / GIB, "source": self.budget.source,
                       "origin": self.budget.origin, "budget_bytes": cfg.budget_bytes,
                       "expert_bytes": cfg.expert_bytes, "precision": k.precision, "hot_slots": cfg.hot_slots},
            "static": self.static_source, "window_steps": cfg.window_steps,
            "knobs": {"dyn_steps": k.dyn_steps, "dyn_max_swaps": k.dyn_max_swaps, "dyn_margin": k.dyn_margin,
                      "dyn_decay": k.dyn_decay, "dyn_rule": k.dyn_rule, "dyn_sigmas": k.dyn_sigmas},
            "platform": {"path": str(platform), "zero_copy_read_gbps": self.rate.zero_copy_gbps,
                         "h2d_gbps": self.rate.h2d_gbps} if platform else None,
        }
        if cfg.stored is not None:  # an auto plan's experts per precision (uniform docs keep their shape)
            doc["budget"]["stored"] = stored_counts(cfg.stored, self.static_hot_LE)
        if self.rate.gbps is not None:
            doc["read_rate"] = {"gbps": self.rate.gbps, "source": self.rate.source}
        doc["policies"] = {n: s.to_doc() for n, s in self.sums.items()}
        if self.cold_paths is not None:
            doc["cold_paths"] = self.cold_paths
        if self.staging is not None:
            doc["prefetch"] = self.staging.to_doc()
        return doc


def stored_counts(stored: StoredPrecisions, hot_LE: np.ndarray) -> dict[str, dict[str, int]]:
    """Experts per stored precision of an auto plan, hot (in the static set) and cold."""
    names = stored.precision_LE
    return {p: {"hot": int(((names == p) & hot_LE).sum()), "cold": int(((names == p) & ~hot_LE).sum())}
            for p in PRECISIONS if (names == p).any()}


Warn = Callable[[str], None]


@contextmanager
def _no_progress(description: str, total: float | None) -> Iterator[Advance]:
    yield _ignore


def run_simulation(req: SimRequest, recipe: Recipe, knobs: Knobs, warn: Warn = _ignore,
                   progress=_no_progress) -> SimResult:
    """Load the trace (and plan, histogram, platform), choose the budget and the static hot set,
    replay every policy and summarise. `warn(message)` is told each warning as it arises;
    `progress(description, total)` is a context manager yielding `advance(n)`."""
    if recipe.parallel.ep > 1:
        raise UsageError(f"recipe {recipe.name!r} uses ep={recipe.parallel.ep}; simulate models one rank of a TP "
                         "deployment", "use a recipe with ep: 1 (EP layouts: `hotsplit place`)")
    auto = knobs.precision == "auto"
    if auto:
        check_auto_request(req, knobs)
    tr, counts_SLE, assignments_S = _load_trace(req, recipe)
    E = recipe.model.num_experts
    plan = load_plan(req.plan_path) if req.plan_path is not None else None
    if plan is not None:
        check_plan_ranks(plan, recipe)
        check_plan_precision(plan, knobs)
    # Stored bytes of one expert, or of each [L, E] under an auto plan.
    size = stored_sizes(plan, recipe, tr.layers) if auto else expert_bytes_per_rank(recipe, uniform_precision(knobs))
    platform = load_platform(req.platform_path) if req.platform_path is not None else None
    budget = resolve_hot_budget(recipe, knobs, platform, plan)
    wsteps = min(req.window_steps or knobs.dyn_steps, tr.num_steps)
    rate = choose_read_rate(recipe, platform)
    if platform is not None and rate.gbps is None:
        warn(f"{req.platform_path} has no measured zero-copy read rate: no step time predicted")
    if plan is not None:
        def hot_for(budget_bytes):  # a smaller budget: the staging slots carved (analysis/prefetch.py)
            if budget_bytes < budget.budget_bytes and int(plan.hot_LE(tr.layers, E).sum()) * size > budget_bytes:
                raise PlanError(f"{req.plan_path}: its hot set fills the budget the staging slots are carved from",
                                "plan at the budget less the slots, or simulate prefetch with --fit")
            return _plan_hot_set(req.plan_path, plan, recipe, tr, size, budget_bytes, warn)[0]
        static_source = f"plan {req.plan_path}"
    else:
        fit_counts, static_source = _fit_counts(req, recipe, tr, counts_SLE, wsteps, warn)

        def hot_for(budget_bytes):
            return plan_hot_set(fit_counts, size, budget_bytes).hot_RLE[0]
    static_hot = hot_for(budget.budget_bytes)
    stored = (StoredPrecisions(plan.precision_LE(tr.layers, E), size, int(static_hot.sum())) if auto else None)
    cfg = SimConfig(None if auto else size, budget.budget_bytes, wsteps, knobs.dyn_steps, knobs.dyn_max_swaps,
                    knobs.dyn_margin, knobs.dyn_decay, knobs.dyn_rule, knobs.dyn_sigmas, stored)
    with progress(f"replaying {tr.num_steps} steps x {len(req.policies)} policies",
                  tr.num_steps * len(req.policies)) as advance:
        runs = simulate(counts_SLE, static_hot, cfg, req.policies, advance)
    sums = {n: summarise(r, assignments_S, cfg.expert_bytes, wsteps, rate.gbps, rate.h2d_gbps) for n, r in runs.items()}
    cold_paths = None
    if platform is not None:
        fitted, time_bytes = recipe_cold_rates(recipe, platform, warn, size)
        times = replay_cold_paths(counts_SLE, static_hot, time_bytes, fitted.rates, int(tr.topk_ids_SLTK.shape[2]))
        cold_paths = {"policy": "static", "rates": fitted.where, **times.to_doc()}
    staging = stage_for_simulate(tr, req.prefetch_fit_path, hot_for, cfg, knobs)
    return SimResult(req, recipe.name, tr, recipe.model.num_experts, float(assignments_S.sum()), budget, cfg,
                     static_source, knobs, rate, sums, cold_paths, static_hot, staging)


def check_auto_request(req: SimRequest, knobs: Knobs) -> None:
    """precision auto replays the precisions an auto plan chose for each expert: it needs that
    plan, and the policies and staging rows that count experts of different sizes."""
    if req.plan_path is None:
        raise UsageError(f"{knobs.origin('precision')} auto: simulate replays the precisions an auto plan chose, "
                         "and no --plan was given",
                         "pass --plan made with `hotsplit plan --precision auto --max-error E`, or a uniform "
                         "--precision")
    check_stored_policies(req.policies)
    if knobs.prefetch != "off":
        raise UsageError(f"prefetch {knobs.prefetch}: staging slots are sized for one stored precision, and "
                         "precision auto stores several", "simulate prefetch with a uniform --precision")


def _load_trace(req: SimRequest, recipe: Recipe) -> tuple[Trace, np.ndarray, np.ndarray]:
    """The trace regrouped by --batch, its counts [S, L, E] and routed assignments per step [S]."""
    E = recipe.model.num_experts
    tr = load_trace(req.trace_path, E)
    unknown = [x for x in tr.layers if x not in recipe.model.moe_layer_ids]
    if unknown:
        raise PlanError(f"{req.trace_path}: layer {unknown[0]} is not a MoE layer of recipe {recipe.name!r}",
                        "use the recipe of the model the trace was captured on")
    ids = tr.topk_ids_SLTK if req.batch is None else rebatch(tr.topk_ids_SLTK, req.batch)
    tr = Trace(ids, tr.layers)
    if tr.num_steps == 0:
        raise PlanError(f"{req.trace_path}: the trace has no steps")
    counts_SLE = tr.counts_SLE(E)
    assignments_S = counts_SLE.sum(axis=(1, 2))
    if not assignments_S.any():
        raise PlanError(f"{req.trace_path}: the trace routes no tokens (every id is padding)")
    return tr, counts_SLE, assignments_S


def _plan_hot_set(path: Path, plan: PlanFile, recipe: Recipe, tr: Trace, size, budget_bytes: int,
                  warn: Warn) -> tuple[np.ndarray, str]:
    """The static hot set [L, E] a plan gives, checked against the trace and the budget."""
    missing = [x for x in tr.layers if x not in plan.layers]
    if missing:
        raise PlanError(f"{path}: has no hot set for trace layer {missing[0]}", "plan on a matching histogram")
    if plan.expert_bytes is not None and np.ndim(size) == 0 and plan.expert_bytes != size:
        warn(f"{path} was planned with {plan.expert_bytes} B experts, recipe {recipe.name!r} has {size} B")
    hot = plan.hot_LE(tr.layers, recipe.model.num_experts, model=recipe.name)
    hot_bytes = int((hot * np.asarray(size, dtype=np.int64)).sum())  # size: one expert's, or each's [L, E]
    if hot_bytes > budget_bytes:
        raise PlanError(f"{path}: its hot set ({gib(hot_bytes)}) exceeds the "
                        f"budget of {gib(budget_bytes)}", "pass the plan's --hot-gib")
    return hot, f"plan {path}"


def _fit_counts(req: SimRequest, recipe: Recipe, tr: Trace, counts_SLE: np.ndarray, wsteps: int,
                warn: Warn) -> tuple[np.ndarray, str]:
    """The counts [L, E] the static hot set is fitted on: --fit's histogram, else the trace's first window."""
    E, fit = recipe.model.num_experts, req.fit_path
    if fit is None:
        first_LE = counts_SLE[:wsteps].sum(axis=0)
        if not first_LE.any():
            raise PlanError(f"{req.trace_path}: the first window routes no tokens", "pass --fit HIST or --plan")
        return first_LE, f"fitted on the trace's first window (steps 0..{wsteps - 1})"
    hist = load_hist(fit)
    if hist.num_experts != E or tuple(hist.layers) != tr.layers:
        raise PlanError(f"{fit}: layers {list(hist.layers)} x {hist.num_experts} experts do not match the "
                        f"trace ({list(tr.layers)} x {E})", "fit on a histogram of the same model")
    for warning in check_hist_matches_recipe(hist, recipe, fit):
        warn(warning)
    return hist.counts_LE, f"fitted on {fit}"
