"""Staging slots replayed on a routing trace: the exact counters a runtime with prefetch must
reproduce (numpy only; never imports torch). docs/prefetch.md defines every step.

Shape letters: S = steps, T = tokens per step, N = S x T tokens, L = MoE layers, E = experts.

While MoE layer l - 1 computes, a predictor (traffic/predict.py) guesses layer l's experts for
each token of the step; the union of the tokens' first `guesses` cold guesses are the
candidates. A candidate b is staged when the step's chance of reading it, p(b) = 1 - prod over
the step's tokens of (1 - q_t(b)), pays for its copy by the one admission rule of swaps
(`admission.copy_pays`, with the copy priced at `copy_price` cold reads); the strongest first
(ties by expert id) while a staging slot is free. Layer l then reads a staged expert from GPU
memory. A staged expert is never hot, and slots hold a step's experts for that step only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.knobs import PREFETCH_POOLS as STAGING_POOLS
from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.core.errors import PlanError, UsageError
from hotsplit_cli.core.units import gib
from hotsplit_cli.hotset.admission import copy_pays
from hotsplit_cli.traffic.predict import (
    NextLayerPredictor,
    count_predictions,
    fit_predictor,
    rolling_recall,
    token_members_NLE,
)
from hotsplit_cli.traffic.trace import Trace, load_trace

from .swap_windows import dynamic_windows


@dataclass(frozen=True)
class StagingConfig:
    slots: int  # staging slots per predicted layer ("layer") or for all layers together ("shared")
    pool: str
    guesses: int  # guesses per token (past top_k widens)
    copy_price: float = 0.0  # a staged copy's cost in cold reads: the share compute does not hide

    def __post_init__(self) -> None:
        if self.slots < 0 or self.guesses < 1 or self.pool not in STAGING_POOLS or not 0.0 <= self.copy_price <= 1.0:
            raise PlanError(f"bad staging: slots={self.slots}, pool={self.pool!r}, guesses={self.guesses}, "
                            f"copy_price={self.copy_price}", f"pool is one of {', '.join(STAGING_POOLS)}")

    def carved_slots(self, num_layers: int) -> int:
        """Expert slots the pool takes from the hot budget (layer index 0 is never staged)."""
        return self.slots * (num_layers - 1) if self.pool == "layer" else self.slots


@dataclass
class StagingRun:
    """Per-step counters (each [S]); `hits` and `staged_hits` count routed assignments, the rest experts."""

    prefetched_S: np.ndarray
    useful_S: np.ndarray
    staged_hits_S: np.ndarray
    hits_S: np.ndarray  # assignments served from GPU memory: hot or staged
    cold_S: np.ndarray  # distinct experts still read cold
    copied_S: np.ndarray  # dynamic swaps' copies

    @classmethod
    def empty(cls, steps: int) -> StagingRun:
        return cls(*(np.zeros(steps, dtype=np.float64 if f in ("staged_hits_S", "hits_S") else np.int64)
                     for f in cls.__dataclass_fields__))

    def to_doc(self, expert_bytes: int, assignments: float) -> dict:
        """Totals and per-step rates; bytes are expert bytes moved over PCIe."""
        return staging_doc(StagingTotals(int(self.prefetched_S.sum()), int(self.useful_S.sum()),
                                         float(self.staged_hits_S.sum()), int(self.cold_S.sum()),
                                         int(self.copied_S.sum()), len(self.cold_S)),
                           float(self.hits_S.sum()), assignments, expert_bytes)


@dataclass(frozen=True)
class StagingTotals:
    """What staging did over some steps (a replay's, a run's window or whole run)."""

    prefetched: int  # experts staged
    useful: int  # staged experts read
    staged_hits: float  # routed assignments served by staged experts
    cold_reads: int  # distinct experts neither hot nor staged read, summed over steps
    copies: int  # dynamic swaps' copies
    steps: int


def staging_doc(t: StagingTotals, hits: float, assignments: float, expert_bytes: int) -> dict:
    """The staging counters under the names `simulate` and `run` both report; `hits` are the
    assignments served from GPU memory (hot or staged)."""
    moved = t.cold_reads + t.prefetched + t.copies
    S = max(t.steps, 1)
    return {"prefetched": t.prefetched, "useful": t.useful, "wasted": t.prefetched - t.useful,
            "staged_hits": t.staged_hits, "copies": t.copies,
            "hit_rate": hits / assignments if assignments else 0.0,
            "staged_hit_rate": t.staged_hits / assignments if assignments else 0.0, "cold_reads": t.cold_reads,
            "useful_bytes_per_step": t.useful * expert_bytes / S,
            "wasted_bytes_per_step": (t.prefetched - t.useful) * expert_bytes / S,
            "pcie_bytes_per_step": moved * expert_bytes / S}


def replay_staging(counts_SLE: np.ndarray, member_NLE: np.ndarray, windows, predictor: NextLayerPredictor,
                   cfg: StagingConfig) -> StagingRun:
    """Replay the trace's steps (counts float [S, L, E], the tokens' memberships bool [N, L, E],
    N = S x T in step order) with staging. `windows` yields (start, end, hot [L, E], swaps after)
    as `swap_windows.dynamic_windows` does; one window of every step is a static hot set."""
    S, L, E = counts_SLE.shape
    T = member_NLE.shape[0] // S
    if member_NLE.shape != (S * T, L, E):
        raise PlanError(f"token memberships {member_NLE.shape} do not match counts {counts_SLE.shape}")
    hot_SLE = np.zeros((S, L, E), dtype=bool)
    run = StagingRun.empty(S)
    for start, end, hot, swapped in windows:
        hot_SLE[start:end] = hot
        if end < S:
            run.copied_S[end] = swapped
    staged_SE = np.zeros((S, E), dtype=bool)  # the previous layer's staged experts (shared pool)
    for layer in range(L):
        if layer == 0 or cfg.slots == 0:
            staged_SE = np.zeros((S, E), dtype=bool)
        else:
            staged_SE = _stage_layer(member_NLE, hot_SLE[:, layer], staged_SE, layer, predictor, cfg)
        _count_layer(run, counts_SLE[:, layer], hot_SLE[:, layer], staged_SE)
    return run


def _stage_layer(member_NLE: np.ndarray, hot_SE: np.ndarray, before_SE: np.ndarray, layer: int,
                 predictor: NextLayerPredictor, cfg: StagingConfig) -> np.ndarray:
    """bool [S, E]: what each step stages for `layer` while the layer before it computes."""
    S, E = hot_SE.shape
    T = member_NLE.shape[0] // S
    q_NE = predictor.probs_NE(member_NLE, layer)
    rank_NE = predictor.rank_NE(member_NLE, layer, q_NE)
    live_N = member_NLE[:, layer].any(axis=1)
    staged = np.zeros((S, E), dtype=bool)
    for s in range(S):
        rows = slice(s * T, (s + 1) * T)
        staged[s, choose_staged(rank_NE[rows], q_NE[rows], live_N[rows], hot_SE[s], before_SE[s], cfg)] = True
    return staged


def choose_staged(rank_TE: np.ndarray, q_TE: np.ndarray, live_T: np.ndarray, hot_E: np.ndarray,
                  before_E: np.ndarray, cfg: StagingConfig) -> list[int]:
    """The experts one step stages for a layer, strongest first: the step's tokens' rankings
    (int [T, E]) and probabilities (float [T, E]) of that layer, which tokens route there
    (`live_T`: padding excluded), its hot set and the experts staged for the layer before
    (bool [E], what a shared pool still holds)."""
    rank, q = rank_TE[live_T], q_TE[live_T]
    keep = ~hot_E[rank]  # the same experts drop from every row
    candidates = np.unique(rank[keep].reshape(len(rank), -1)[:, :cfg.guesses])
    p = 1.0 - np.prod(1.0 - q[:, candidates], axis=0)
    free = cfg.slots - int(before_E.sum()) if cfg.pool == "shared" else cfg.slots
    order = np.lexsort((candidates, -p))
    return [int(candidates[i]) for i in order if copy_pays(float(p[i]), cfg.copy_price)][:max(free, 0)]


def stage_step(member_TLE: np.ndarray, hot_LE: np.ndarray, predictor: NextLayerPredictor,
               cfg: StagingConfig) -> np.ndarray:
    """bool [L, E]: what one step (its tokens' memberships bool [T, L, E]) stages for each layer,
    in layer order, as `replay_staging` does for every step (the runtime's staging decisions)."""
    T, L, E = member_TLE.shape
    staged_LE = np.zeros((L, E), dtype=bool)
    if cfg.slots == 0:
        return staged_LE
    for layer in range(1, L):
        live_T = member_TLE[:, layer].any(axis=1)
        staged_LE[layer, stage_layer(member_TLE, layer, live_T, hot_LE[layer], staged_LE[layer - 1], predictor,
                                     cfg)] = True
    return staged_LE


def stage_layer(member_TLE: np.ndarray, layer: int, live_T: np.ndarray, hot_E: np.ndarray, before_E: np.ndarray,
                predictor: NextLayerPredictor, cfg: StagingConfig) -> list[int]:
    """The experts one step stages for `layer` (>= 1) from its tokens' memberships known so far
    (bool [T, L, E]; the predictor reads the layers before `layer` only), which tokens count
    (`live_T`), the layer's hot set and what the layer before staged (bool [E] each)."""
    q_TE = predictor.probs_NE(member_TLE, layer)
    rank_TE = predictor.rank_NE(member_TLE, layer, q_TE)
    return choose_staged(rank_TE, q_TE, live_T, hot_E, before_E, cfg)


def staged_counts(counts_XE: np.ndarray, staged_XE: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prefetched, useful, staged hits) per row of routed-assignment counts [X, E] and the
    experts staged for them (bool [X, E]): experts staged, staged ones read, assignments they served."""
    return (staged_XE.sum(axis=1), (staged_XE & (counts_XE > 0)).sum(axis=1),
            (counts_XE * staged_XE).sum(axis=1))


def _count_layer(run: StagingRun, counts_SE: np.ndarray, hot_SE: np.ndarray, staged_SE: np.ndarray) -> None:
    prefetched, useful, staged_hits = staged_counts(counts_SE, staged_SE)
    run.prefetched_S += prefetched
    run.useful_S += useful
    run.staged_hits_S += staged_hits
    run.hits_S += (counts_SE * (hot_SE | staged_SE)).sum(axis=1)
    run.cold_S += ((counts_SE > 0) & ~hot_SE & ~staged_SE).sum(axis=1)


@dataclass(frozen=True)
class StagingReport:
    """`simulate`'s staging rows: static and dynamic with the pool carved from the same budget."""

    config: StagingConfig
    fit_source: str  # what the predictor was fitted on, as printed
    hot_slots: int  # hot experts left once the pool is carved
    recall: dict  # the predictor's counters on the replayed trace against the carved static hot set
    held_out: dict  # its per-token recall on the replayed trace's windows, refitted on the earlier ones
    rows: dict[str, dict]  # "static" / "dynamic" -> StagingRun.to_doc

    def to_doc(self) -> dict:
        c = self.config
        return {"predictor": "cooccur", "fit": self.fit_source, "slots": c.slots, "pool": c.pool,
                "guesses": c.guesses, "copy_price": c.copy_price, "hot_slots": self.hot_slots,
                "recall": self.recall, "held_out_recall": self.held_out, "policies": self.rows}


def stage_for_simulate(tr: Trace, fit_path: Path | None, hot_for, sim, knobs: Knobs) -> StagingReport | None:
    """`simulate`'s staging rows for knob `prefetch` (None when off): the co-activation table
    fitted on `fit_path` (else the trace's first window), the pool carved from the budget
    (`hot_for(budget_bytes)` gives the static hot set [L, E] there), replayed static and with
    the dynamic swaps of `sim` (a `SimConfig`)."""
    if knobs.prefetch == "off":
        return None
    if knobs.prefetch == "lookahead":
        raise UsageError("prefetch lookahead: the next layer's router cannot be replayed from a trace",
                         "simulate the trace predictor (--prefetch trace); `balance --model` measures lookahead")
    E, L = int(hot_for(sim.budget_bytes).shape[1]), len(tr.layers)
    cfg = staging_config(knobs, E, L)
    carved = carved_bytes(cfg, L, sim.expert_bytes, sim.budget_bytes)
    member_NLE = token_members_NLE(tr, E)
    predictor, fit_source = fit_staging_predictor(tr, fit_path, member_NLE, sim.window_steps)
    hot = hot_for(sim.budget_bytes - carved)
    counts_SLE = tr.counts_SLE(E)
    windows = dynamic_windows(counts_SLE, hot, sim.dyn_steps, sim.dyn_max_swaps, sim.dyn_margin, sim.dyn_decay,
                              sim.dyn_rule, sim.dyn_sigmas)
    rows = {"static": replay_staging(counts_SLE, member_NLE, [(0, tr.num_steps, hot, 0)], predictor, cfg),
            "dynamic": replay_staging(counts_SLE, member_NLE, windows, predictor, cfg)}
    recall = count_predictions(predictor, member_NLE, cfg.guesses, hot).to_doc()
    assignments = float(counts_SLE.sum())
    held_out = rolling_recall("cooccur", member_NLE, sim.window_steps * tr.topk_ids_SLTK.shape[2], cfg.guesses)
    return StagingReport(cfg, fit_source, int(hot.sum()), recall, held_out,
                         {n: r.to_doc(sim.expert_bytes, assignments) for n, r in rows.items()})


def staging_config(knobs: Knobs, num_experts: int, num_layers: int) -> StagingConfig:
    """The staging slots the prefetch knobs ask for (guesses capped at the experts there are)."""
    return StagingConfig(knobs.prefetch_slots, knobs.prefetch_pool, min(knobs.prefetch_guesses, num_experts))


def carved_bytes(cfg: StagingConfig, num_layers: int, expert_bytes: int, budget_bytes: int) -> int:
    """Bytes the staging pool takes from the hot budget; PlanError when it exceeds the budget."""
    carved = cfg.carved_slots(num_layers) * expert_bytes
    if carved > budget_bytes:
        raise PlanError(f"{cfg.carved_slots(num_layers)} staging slots ({gib(carved)}) exceed the hot budget "
                        f"of {gib(budget_bytes)}", "lower --prefetch-slots or use --prefetch-pool shared")
    return carved


def fit_staging_predictor(tr: Trace, fit_path: Path | None, member_NLE: np.ndarray,
                          window_steps: int) -> tuple[NextLayerPredictor, str]:
    """The co-activation table staging replays (and the runtime stages with), fitted on
    `fit_path`'s trace, else on `tr`'s first window; and what it was fitted on, as printed."""
    E = member_NLE.shape[2]
    if fit_path is not None:
        return fit_on_trace(fit_path, tr.layers, E, "the replayed trace's")
    T = tr.topk_ids_SLTK.shape[2]
    fit_NLE, source = member_NLE[:window_steps * T], f"the trace's first window (steps 0..{window_steps - 1})"
    return fit_predictor("cooccur", fit_NLE), source


def fit_on_trace(fit_path: Path, layers: tuple[int, ...], num_experts: int,
                 whose: str = "the model's") -> tuple[NextLayerPredictor, str]:
    """The co-activation table fitted on `fit_path`'s trace, whose MoE layers must be `layers`
    (`whose`: what they are, as the refusal says), and what it was fitted on."""
    fit = load_trace(fit_path, num_experts)
    if tuple(fit.layers) != tuple(layers):
        raise PlanError(f"{fit_path}: layers {list(fit.layers)} differ from {whose} {list(layers)}",
                        "fit the predictor on a trace of the same model")
    return fit_predictor("cooccur", token_members_NLE(fit, num_experts)), str(fit_path)
