"""What `simulate --trace T` recommends running on that trace (numpy only; never imports torch).

Only what `hotsplit run` can do is a candidate: the static hot set (HOTSPLIT_DYNAMIC=0), or a
dynamic rule (`dyn_rule` credit or breakeven) at `dyn_steps` in GRID_STEPS (and the knobs' own)
and `dyn_max_swaps` in GRID_SWAPS (and the knobs' own); `dyn_margin`, `dyn_decay` and
`dyn_sigmas` stay as resolved. Each is replayed from the same static hot set with the same
accounting as `simulate`. The judge is the cost the run pays: the lowest PCIe bytes per step
wins; candidates within BYTES_TIE of it count as tied, and among them the highest hit rate,
then the longest window (fewer host synchronisations), then the order above. Under an auto
plan each expert counts at its own stored bytes and a swap stays within a precision, as
`simulate` replays it. The command carries the precision a flag or the environment chose, so the
run stores experts as the plan and the replay did.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, replace

import numpy as np

from hotsplit_cli.config.knobs import DYN_RULES, Knobs

from .simulate import (
    Advance,
    SimConfig,
    SimResult,
    StoredPrecisions,
    _ignore,
    _no_progress,
    run_dynamic,
    run_dynamic_stored,
    run_static,
)

GRID_STEPS = (4, 8, 16, 32)
GRID_SWAPS = (2, 16)
BYTES_TIE = 1e-3  # relative: closer bytes per step than this are a tie, judged on hit rate


@dataclass(frozen=True)
class Candidate:
    dynamic: bool
    dyn_rule: str | None  # None when static
    dyn_steps: int | None
    dyn_max_swaps: int | None
    hit_rate: float
    pcie_bytes_per_step: float
    copies: int


def _grid(num_steps: int, knobs: Knobs) -> tuple[list[int], list[int]]:
    """The dyn_steps and dyn_max_swaps tried (a window as long as the trace never swaps)."""
    return (sorted({s for s in (*GRID_STEPS, knobs.dyn_steps) if s < num_steps}),
            sorted({*GRID_SWAPS, knobs.dyn_max_swaps}))


def count_candidates(num_steps: int, knobs: Knobs) -> int:
    steps, caps = _grid(num_steps, knobs)
    return 1 + 2 * len(steps) * len(caps)


def candidates(counts_SLE: np.ndarray, hot_LE: np.ndarray, expert_bytes: int | None, knobs: Knobs,
               advance: Advance = _ignore, stored: StoredPrecisions | None = None) -> list[Candidate]:
    """Every candidate replayed, static first; `advance(1)` after each. `stored`: an auto plan's
    precisions and bytes per expert (then `expert_bytes` is None)."""
    S = counts_SLE.shape[0]
    total = float(counts_SLE.sum())

    def judged(run, **kw) -> Candidate:
        if stored is None:
            moved = float(run.cold_experts_S.sum() + run.copied_experts_S.sum()) * expert_bytes / S
        else:
            moved = float(run.cold_bytes_S.sum() + run.copied_bytes_S.sum()) / S
        return Candidate(hit_rate=float(run.hits_S.sum()) / total if total else 0.0, pcie_bytes_per_step=moved,
                         copies=int(run.copied_experts_S.sum()), **kw)

    def dynamic(rule: str, dyn: int, cap: int):
        if stored is None:
            return run_dynamic(counts_SLE, hot_LE, dyn, cap, knobs.dyn_margin, decay=knobs.dyn_decay, rule=rule,
                               sigmas=knobs.dyn_sigmas)
        cfg = SimConfig(None, 0, dyn, dyn, cap, knobs.dyn_margin, knobs.dyn_decay, rule, knobs.dyn_sigmas, stored)
        return run_dynamic_stored(counts_SLE, hot_LE, stored.precision_LE, stored.sizes_LE, cfg)

    sizes = None if stored is None else stored.sizes_LE
    out = [judged(run_static(counts_SLE, hot_LE, sizes_LE=sizes), dynamic=False, dyn_rule=None, dyn_steps=None,
                  dyn_max_swaps=None)]
    advance(1)
    steps, caps = _grid(S, knobs)
    for rule in DYN_RULES:
        for dyn in steps:
            for cap in caps:
                out.append(judged(dynamic(rule, dyn, cap), dynamic=True, dyn_rule=rule, dyn_steps=dyn,
                                  dyn_max_swaps=cap))
                advance(1)
    return out


def best(cands: list[Candidate]) -> Candidate:
    """The judge of the module docstring."""
    low = min(c.pcie_bytes_per_step for c in cands)
    tied = [c for c in cands if c.pcie_bytes_per_step <= low * (1 + BYTES_TIE)]
    return max(tied, key=lambda c: (c.hit_rate, c.dyn_steps or 0, -cands.index(c)))


def run_env(c: Candidate, knobs: Knobs) -> dict[str, str]:
    """The environment that makes `hotsplit run` do what the candidate did."""
    if not c.dynamic:
        return {"HOTSPLIT_DYNAMIC": "0"}
    return {"HOTSPLIT_DYNAMIC": "1", "HOTSPLIT_DYN_RULE": c.dyn_rule, "HOTSPLIT_DYN_STEPS": str(c.dyn_steps),
            "HOTSPLIT_DYN_MAX_SWAPS": str(c.dyn_max_swaps), "HOTSPLIT_DYN_MARGIN": f"{knobs.dyn_margin:g}",
            "HOTSPLIT_DYN_DECAY": f"{knobs.dyn_decay:g}", "HOTSPLIT_DYN_SIGMAS": f"{knobs.dyn_sigmas:g}"}


@dataclass(frozen=True)
class Recommendation:
    best: Candidate
    env: dict[str, str]
    command: str  # the shell line that runs it
    note: str | None  # where the run cannot start from the same hot set
    candidates: tuple[Candidate, ...]

    def to_doc(self) -> dict:
        return {"best": asdict(self.best), "env": self.env, "command": self.command, "note": self.note,
                "judge": f"lowest PCIe bytes per step, ties within {BYTES_TIE:g} by hit rate",
                "candidates": [asdict(c) for c in self.candidates]}


def recommend(counts_SLE, hot_LE, expert_bytes: int | None, knobs: Knobs, recipe: str, trace: str,
              static_from: tuple[str, str | None], hot_gib_flag: str | None = None,
              advance: Advance = _ignore, stored: StoredPrecisions | None = None) -> Recommendation:
    """`static_from`: ("plan", path), ("fit", histogram path) or ("window", None): where the static
    hot set came from, so the command starts the run from the same one where it can."""
    cands = candidates(counts_SLE, hot_LE, expert_bytes, knobs, advance, stored)
    pick = best(cands)
    env = run_env(pick, knobs)
    # A precision the recipe does not set travels as a flag: the run refuses a plan made at another.
    precision = f" --precision {knobs.precision}" if knobs.sources.get("precision") in ("flag", "env") else ""
    budget = f" --hot-gib {shlex.quote(hot_gib_flag)}" if hot_gib_flag is not None else ""
    kind, path = static_from
    run = f"{' '.join(f'{k}={v}' for k, v in env.items())} hotsplit run {shlex.quote(recipe)} " \
          f"--trace {shlex.quote(trace)}{precision}"
    note = None
    if kind == "plan":
        run += f" --plan {shlex.quote(path)}"
    elif kind == "fit":  # the plan carries the budget to the run
        run = f"hotsplit plan {shlex.quote(path)} --recipe {shlex.quote(recipe)}{budget}{precision} -o plan.json " \
              f"&& {run} --plan plan.json"
    else:
        run += budget
        note = ("the run plans on the whole trace (simulate's hindsight set), not on its first window as simulate "
                "did here: pass --fit or --plan to simulate the run's start exactly")
    return Recommendation(pick, env, run, note, tuple(cands))


def recommend_for(result: SimResult, recipe_arg: str, progress=_no_progress) -> Recommendation:
    """The recommendation for a finished `simulate` (`recipe_arg`: the recipe as the user named it;
    `progress(description, total)` as `run_simulation` takes it)."""
    req, k = result.request, result.knobs
    if req.plan_path is not None:
        static_from = ("plan", str(req.plan_path))
    elif req.fit_path is not None:
        static_from = ("fit", str(req.fit_path))
    else:
        static_from = ("window", None)
    flag = repr(k.hot_gib) if k.sources.get("hot_gib") == "flag" and req.plan_path is None else None
    n = count_candidates(result.trace.num_steps, k)
    with progress(f"recommending: replaying {n} runnable candidates", n) as advance:
        rec = recommend(result.trace.counts_SLE(result.num_experts), result.static_hot_LE, result.config.expert_bytes,
                        k, recipe_arg, str(req.trace_path), static_from, flag, advance, result.config.stored)
    if req.batch is not None:
        rec = replace(rec, note=f"judged on steps regrouped by --batch {req.batch}; the run replays the trace's own "
                                "steps" + (f"; {rec.note}" if rec.note else ""))
    return rec
