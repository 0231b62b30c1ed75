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
  `dyn_steps` steps applies `planner.propose_swaps` (the runtime's rule and knobs) to the counts
  of the last `dyn_steps` steps; swaps apply from the next step and each copies one expert.
- lru / lfu: per-layer caches with an equal share of the slots (the remainder to the first
  layers), starting empty. A missed expert is copied in (a fill; its assignments still count as
  misses) and evicts the least recently / least frequently used one. Recency and frequency are
  kept per step: the experts a step activates are the most recent; frequency counts every
  assignment seen so far.
- oracle: per window, the planner's best hot set for that window's own counts (hindsight), with
  the copies to switch between windows. An upper bound on the hit rate of any policy whose hot
  set changes only at window boundaries (static, dynamic); caches may change mid-window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import PlanError, UsageError
from .knobs import Knobs
from .planfile import PlanFile
from .planner import plan_hot_set, propose_swaps
from .recipe import GIB, Recipe
from .sizes import derive_hot_budget

POLICIES = ("static", "dynamic", "lru", "lfu", "oracle")
LAYER_SPLIT = {
    "static": "planner greedy over all layers (share per byte)",
    "dynamic": "static's per-layer slots; swaps keep them",
    "lru": "equal slots per layer",
    "lfu": "equal slots per layer",
    "oracle": "planner greedy over all layers, per window",
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


def run_static(counts_SLE: np.ndarray, hot_LE: np.ndarray, advance: Advance = _ignore) -> PolicyRun:
    hits, cold = _static_stats(counts_SLE, hot_LE)
    advance(len(hits))
    return PolicyRun("static", hits, cold, np.zeros(len(hits), dtype=np.int64), int(hot_LE.sum()))


def run_dynamic(counts_SLE: np.ndarray, hot_LE: np.ndarray, dyn_steps: int, max_swaps: int,
                margin: float, advance: Advance = _ignore) -> PolicyRun:
    """The runtime's rule: every `dyn_steps` steps, `propose_swaps` on the last window's counts."""
    S = counts_SLE.shape[0]
    hot = np.array(hot_LE, dtype=bool)
    hits = np.zeros(S)
    cold = np.zeros(S, dtype=np.int64)
    copied = np.zeros(S, dtype=np.int64)
    for start in range(0, S, dyn_steps):
        chunk = counts_SLE[start:start + dyn_steps]
        hits[start:start + len(chunk)], cold[start:start + len(chunk)] = _static_stats(chunk, hot)
        advance(len(chunk))
        end = start + len(chunk)
        if end >= S:
            break
        swaps = propose_swaps(chunk.sum(axis=0), hot, max_swaps, margin)
        for s in swaps:
            hot[s.layer, s.out_expert] = False
            hot[s.layer, s.in_expert] = True
        copied[end] = len(swaps)  # copies land before the next step runs
    return PolicyRun("dynamic", hits, cold, copied, int(hot_LE.sum()))


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
        cold[s] = (missed & ~filled).sum()  # misses that did not enter were read in place
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


def summarise(run: PolicyRun, assignments_S: np.ndarray, expert_bytes: int, window_steps: int,
              read_gbps: float | None = None, h2d_gbps: float | None = None) -> PolicySummary:
    """Rates from a run. Step time = zero-copy bytes / read rate + copy bytes / H2D copy rate
    (copies share the PCIe link with the reads, so the two are added, not overlapped)."""
    S = len(assignments_S)
    total = float(assignments_S.sum())
    windows = [
        float(run.hits_S[a:b].sum() / assignments_S[a:b].sum()) if assignments_S[a:b].sum() > 0 else 0.0
        for a, b in window_bounds(S, window_steps)
    ]
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
class SimBudget:
    """The per-rank byte budget every policy gets, and where it came from."""

    budget_bytes: int
    source: str  # flag | env | recipe | auto | plan
    origin: str  # as the user wrote it: --hot-gib, HOTSPLIT_HOT_GIB, ..., auto, plan PATH

    @property
    def hot_gib(self) -> float:
        return self.budget_bytes / GIB


def choose_budget(recipe: Recipe, knobs: Knobs, plan: PlanFile | None = None) -> SimBudget:
    """The budget of a simulation: with a plan, the plan's own, so that every policy is compared
    at the budget its hot set was made for (a --hot-gib that says otherwise is refused); else
    --hot-gib > env > recipe > auto. A plan that records no budget takes --hot-gib."""
    flag = knobs.sources["hot_gib"] == "flag"
    if plan is None or (plan.budget_bytes is None and flag):
        if knobs.hot_gib is not None:
            return SimBudget(int(knobs.hot_gib * GIB), knobs.sources["hot_gib"], knobs.origin("hot_gib"))
        return SimBudget(int(derive_hot_budget(recipe, knobs.vram_reserve_gib).hot_gib * GIB), "auto", "auto")
    budget = plan.budget_bytes
    if budget is None:
        raise UsageError(f"{plan.path}: records no `budget_bytes`",
                         "pass --hot-gib, or re-create the plan with `hotsplit plan`")
    if flag and int(knobs.hot_gib * GIB) != budget:
        raise UsageError(f"--hot-gib {knobs.hot_gib:g} disagrees with the budget of {plan.path} "
                         f"({budget / GIB:g} GiB)", "drop --hot-gib: with --plan every policy gets the plan's budget")
    return SimBudget(budget, "plan", f"plan {plan.path}")


@dataclass(frozen=True)
class SimConfig:
    """Budget and knobs shared by every policy."""

    expert_bytes: int  # bytes one rank holds of one expert
    budget_bytes: int  # per rank
    window_steps: int
    dyn_steps: int
    dyn_max_swaps: int
    dyn_margin: float

    @property
    def hot_slots(self) -> int:
        return self.budget_bytes // self.expert_bytes


def simulate(counts_SLE: np.ndarray, static_hot_LE: np.ndarray, cfg: SimConfig,
             policies=POLICIES, advance: Advance = _ignore) -> dict[str, PolicyRun]:
    """Run each named policy on the per-step counts (float [S, L, E]); `advance` is told of
    every replayed step of every policy (S x len(policies) in all)."""
    counts_SLE = np.asarray(counts_SLE, dtype=np.float64)
    S, L, E = counts_SLE.shape
    if static_hot_LE.shape != (L, E):
        raise PlanError(f"static hot set has shape {static_hot_LE.shape}, the trace has {(L, E)}")
    out: dict[str, PolicyRun] = {}
    for name in policies:
        if name == "static":
            out[name] = run_static(counts_SLE, static_hot_LE, advance)
        elif name == "dynamic":
            out[name] = run_dynamic(counts_SLE, static_hot_LE, cfg.dyn_steps, cfg.dyn_max_swaps, cfg.dyn_margin,
                                    advance)
        elif name in ("lru", "lfu"):
            out[name] = run_cache(counts_SLE, equal_split(cfg.hot_slots, L, E), name, advance)
        elif name == "oracle":
            out[name] = run_oracle(counts_SLE, cfg.expert_bytes, cfg.budget_bytes, cfg.window_steps, advance)
        else:
            raise PlanError(f"unknown policy {name!r}", f"policies are: {', '.join(POLICIES)}")
    return out


def rebatch(topk_ids_SLTK: np.ndarray, batch: int) -> np.ndarray:
    """Regroup a trace's tokens into steps of `batch` tokens ([S', L, batch, K]; the remainder
    that does not fill a step is dropped)."""
    S, L, T, K = topk_ids_SLTK.shape
    tokens = np.moveaxis(topk_ids_SLTK, 1, 2).reshape(S * T, L, K)  # token order kept
    steps = (S * T) // batch
    if steps == 0:
        raise PlanError(f"--batch {batch} exceeds the trace's {S * T} tokens")
    return np.moveaxis(tokens[: steps * batch].reshape(steps, batch, L, K), 2, 1)
