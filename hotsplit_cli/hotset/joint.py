"""The joint plan: each expert's stored precision and the hot set, chosen together (numpy only).

Shape letters: N = candidate experts (flattened (layer, expert)), P = precisions, O = options
(P hot, then P cold), K = hull increments, G = groups (ranks, each with its own budget).

Every expert takes one option: hot at precision p (costs b_p hot bytes, reads nothing) or cold
at p (reads b_p with probability q, the chance a step touches it). Minimise the expected PCIe
bytes per step, sum of q x b_p over cold experts, subject to
  - hot bytes <= budget (per group), and
  - expected error = sum of share x err_p <= max_error (over every group together).
This is a multiple-choice knapsack with two constraints. Relaxing the error constraint with a
multiplier lambda >= 0 leaves, for each lambda, a multiple-choice knapsack with one constraint
whose LP relaxation is solved exactly by taking the increments of each expert's lower convex
hull (hot bytes vs cost) by slope. By weak duality, LP(lambda) - lambda x max_error is a lower
bound on the bytes of every plan, for every lambda; the best one found is the plan's bound.
The plan itself is the greedy integer fill of those increments at the smallest lambda whose
plan keeps the error budget (bisection). docs/precision.md has a worked example.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.errors import BudgetOverflowError, PlanError

BRUTE_FORCE_MAX_EXPERTS = 6  # (2 x 3)^6 = 46656 assignments
BISECTION_STEPS = 40


@dataclass(frozen=True)
class JointPlan:
    """Each expert's precision (index into the precisions given) and hot flag, and how good."""

    precision_N: np.ndarray  # int [N]
    hot_N: np.ndarray  # bool [N]
    cold_bytes: float  # expected PCIe bytes per step: sum of q x b over cold experts
    error: float  # expected error: sum of share x err
    hot_bytes_G: np.ndarray  # int64 [G]
    bound_cold_bytes: float  # no plan within both budgets reads fewer bytes per step
    method: str  # "lagrangian greedy" | "brute-force"
    certified: bool  # proven optimal

    @property
    def gap(self) -> float:
        """How far above the bound the plan may be, as a fraction of its bytes (0: optimal)."""
        return 0.0 if self.cold_bytes <= 0 else max(0.0, 1.0 - self.bound_cold_bytes / self.cold_bytes)


@dataclass(frozen=True)
class JointProblem:
    """The plan's input, checked: per-option cost, hot bytes and error of every expert."""

    cost_NO: np.ndarray  # bytes read per step by each option (0 when hot)
    weight_O: np.ndarray  # int64 hot bytes of each option (0 when cold)
    err_NO: np.ndarray  # share x error of each option; inf where not measured
    group_N: np.ndarray  # int [N]
    budget: int
    max_error: float

    @property
    def num_groups(self) -> int:
        return int(self.group_N.max()) + 1 if len(self.group_N) else 1


def make_problem(q_N, share_N, bytes_P, error_NP, budget_bytes: int, max_error: float,
                 group_N=None) -> JointProblem:
    """q_N: chance a step touches each expert; share_N: its routing share; bytes_P: stored bytes per
    precision; error_NP: relative error per (expert, precision), nan where not measured (allowed
    only for an expert without traffic). group_N: the rank holding each expert (None: one)."""
    q_N, share_N = np.asarray(q_N, dtype=np.float64), np.asarray(share_N, dtype=np.float64)
    bytes_P, error_NP = np.asarray(bytes_P, dtype=np.int64), np.asarray(error_NP, dtype=np.float64)
    N, P = error_NP.shape
    if q_N.shape != (N,) or share_N.shape != (N,) or bytes_P.shape != (P,):
        raise PlanError(f"joint plan inputs disagree: q {q_N.shape}, share {share_N.shape}, bytes {bytes_P.shape}, "
                        f"errors {error_NP.shape}")
    if budget_bytes < 0 or not max_error >= 0 or (bytes_P <= 0).any():
        raise PlanError(f"joint plan needs budget >= 0, max error >= 0 and bytes > 0, got {budget_bytes}, "
                        f"{max_error}, {bytes_P.tolist()}")
    routed = np.broadcast_to(share_N[:, None] > 0, error_NP.shape)
    err = np.zeros((N, P))
    err[routed] = np.broadcast_to(share_N[:, None], (N, P))[routed] * np.nan_to_num(error_NP, nan=np.inf)[routed]
    cost_NO = np.concatenate([np.zeros((N, P)), q_N[:, None] * bytes_P[None, :]], axis=1)
    weight_O = np.concatenate([bytes_P, np.zeros(P, dtype=np.int64)])
    group = np.zeros(N, dtype=np.int64) if group_N is None else np.asarray(group_N, dtype=np.int64)
    return JointProblem(cost_NO, weight_O, np.concatenate([err, err], axis=1), group, int(budget_bytes),
                        float(max_error))


def min_error(problem: JointProblem) -> float:
    """The least expected error any plan can have (every expert at its most accurate precision)."""
    return float(problem.err_NO.min(axis=1).sum())


def plan_joint(problem: JointProblem) -> JointPlan:
    """The plan with the fewest expected PCIe bytes per step within both budgets: brute force for a
    few experts, else the Lagrangian greedy; the LP bound either way. PlanError when no plan keeps
    the error budget."""
    floor = min_error(problem)
    if floor > problem.max_error * (1 + 1e-12):
        raise PlanError(f"error budget {problem.max_error:.4g} is below the least expected error any plan can have "
                        f"({floor:.4g})", "raise --max-error")
    bound, best = _search(problem)
    method, certified = "lagrangian greedy", False
    if len(problem.group_N) <= BRUTE_FORCE_MAX_EXPERTS:
        best, method, certified = brute_force_options(problem), "brute-force", True
    return _finish(problem, best, bound, method, certified)


def _search(problem: JointProblem) -> tuple[float, np.ndarray]:
    """Bisection on lambda: the cheapest greedy plan within the error budget, and the best bound."""
    bound, best = -math.inf, None

    def visit(lam: float) -> bool:
        nonlocal bound, best
        lp, option_N = _relaxation(problem, lam)
        bound = max(bound, lp - lam * problem.max_error)
        feasible = _error_of(problem, option_N) <= problem.max_error * (1 + 1e-12)
        if feasible and (best is None or _cost_of(problem, option_N) < _cost_of(problem, best)):
            best = option_N
        return feasible

    for option_N in _uniform_plans(problem):  # a uniform precision is a joint plan too: never do worse
        if _error_of(problem, option_N) <= problem.max_error * (1 + 1e-12) and (
                best is None or _cost_of(problem, option_N) < _cost_of(problem, best)):
            best = option_N
    if visit(0.0):
        return bound, best
    lo, hi = 0.0, max(1.0, float(problem.cost_NO.max())) / max(problem.max_error, 1e-12)
    for _ in range(200):  # the error term grows with lambda until only the most accurate options are left
        if visit(hi):
            break
        lo, hi = hi, hi * 4
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if visit(mid) else (mid, hi)
    if best is None:  # the most accurate options, all cold: within the error budget (checked before)
        best = _most_accurate_cold(problem)
    return bound, best


def _uniform_plans(problem: JointProblem) -> list[np.ndarray]:
    """One plan per precision: every expert at it, the most often touched hot while they fit."""
    P = len(problem.weight_O) // 2
    q_N = problem.cost_NO[:, P] / problem.weight_O[0]  # the chance a step touches each expert
    plans = []
    for p in range(P):
        option_N = np.full(len(q_N), P + p)
        for g in range(problem.num_groups):
            members = np.flatnonzero((problem.group_N == g) & (q_N > 0))
            ranked = members[np.lexsort((members, -q_N[members]))]
            option_N[ranked[: problem.budget // int(problem.weight_O[p])]] = p
        plans.append(option_N)
    return plans


def _most_accurate_cold(problem: JointProblem) -> np.ndarray:
    P = len(problem.weight_O) // 2
    return P + np.argmin(problem.err_NO[:, P:] + 1e-30 * problem.cost_NO[:, P:], axis=1)


def _hull(problem: JointProblem, lam: float):
    """Each expert's cheapest cold option at lambda and the increments of its lower convex hull
    (hot bytes vs cost), ordered by slope (most negative first)."""
    err = problem.err_NO
    c_NO = problem.cost_NO + np.where(np.isinf(err), np.inf, lam * np.where(np.isinf(err), 0.0, err))
    P = len(problem.weight_O) // 2
    base_N = P + np.argmin(c_NO[:, P:], axis=1)
    rows = np.arange(len(base_N))
    cur_o, cur_c, cur_w = base_N.copy(), c_NO[rows, base_N], np.zeros(len(base_N))
    parts = []
    hot_w = problem.weight_O[:P].astype(np.float64)
    for step in range(P):
        dw = hot_w[None, :] - cur_w[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            slope = np.where(dw > 0, (c_NO[:, :P] - cur_c[:, None]) / np.where(dw > 0, dw, 1.0), np.inf)
        slope = np.nan_to_num(slope, nan=np.inf)
        to = np.argmin(slope, axis=1)
        s = slope[rows, to]
        go = s < 0
        if not go.any():
            break
        idx = rows[go]
        parts.append((idx, cur_o[go], to[go], dw[idx, to[go]], c_NO[idx, to[go]] - cur_c[go], s[go],
                      np.full(go.sum(), step)))
        cur_o[go], cur_c[go], cur_w[go] = to[go], c_NO[idx, to[go]], hot_w[to[go]]
    if not parts:
        empty = np.zeros(0)
        return c_NO, base_N, (empty.astype(int), empty.astype(int), empty.astype(int), empty, empty)
    item, frm, to, dw, dc, slope, step = (np.concatenate(x) for x in zip(*parts, strict=True))
    order = np.lexsort((item, step, slope))
    return c_NO, base_N, (item[order], frm[order], to[order], dw[order], dc[order])


def _relaxation(problem: JointProblem, lam: float) -> tuple[float, np.ndarray]:
    """LP(lambda), the optimum of the relaxed one-constraint problem, and the greedy integer plan."""
    c_NO, base_N, (item, frm, to, dw, dc) = _hull(problem, lam)
    lp = float(c_NO[np.arange(len(base_N)), base_N].sum())
    option_N = base_N.copy()
    group_K = problem.group_N[item]
    for g in range(problem.num_groups):
        k = np.flatnonzero(group_K == g)
        cum = np.cumsum(dw[k])
        full = int(np.searchsorted(cum, problem.budget, side="right"))
        lp += float(dc[k[:full]].sum())
        room = problem.budget - (cum[full - 1] if full else 0.0)
        if full < len(k):
            lp += float(dc[k[full]]) * room / dw[k[full]]
        option_N[item[k[:full]]] = to[k[:full]]
        _fill_rest(option_N, (item[k[full:]], frm[k[full:]], to[k[full:]], dw[k[full:]]), room)
        _fill_cold(problem, c_NO, option_N, g)
    return lp, option_N


def _fill_rest(option_N: np.ndarray, increments, room: float) -> None:
    """Past the budget's prefix: take each later increment that still fits (skip, don't stop),
    until none of the rest could fit."""
    item, frm, to, dw = increments
    least_after = np.minimum.accumulate(dw[::-1])[::-1] if len(dw) else dw
    for j in range(len(dw)):
        if least_after[j] > room:
            break
        if option_N[item[j]] == frm[j] and dw[j] <= room:
            option_N[item[j]], room = to[j], room - dw[j]


def _fill_cold(problem: JointProblem, c_NO: np.ndarray, option_N: np.ndarray, group: int) -> None:
    """Room left in a group: make hot the cold experts whose cheapest fitting hot option lowers
    their cost most per byte (a hull increment too large for the room may hide a smaller one)."""
    weight_O = problem.weight_O
    P = len(weight_O) // 2
    rows = np.arange(len(option_N))
    room = problem.budget - int(weight_O[option_N[problem.group_N == group]].sum())
    cold = (problem.group_N == group) & (option_N >= P)
    if room <= 0 or not cold.any():
        return
    fits = weight_O[:P][None, :] <= room
    gain = np.where(fits, c_NO[rows, option_N][:, None] - c_NO[:, :P], -np.inf)
    best_o = np.argmax(gain / weight_O[:P][None, :], axis=1)
    per_byte = gain[rows, best_o] / weight_O[best_o]
    candidates = np.flatnonzero(cold & (per_byte > 0))
    for i in candidates[np.argsort(-per_byte[candidates], kind="stable")]:
        if weight_O[best_o[i]] <= room:
            option_N[i], room = best_o[i], room - int(weight_O[best_o[i]])


def _cost_of(problem: JointProblem, option_N: np.ndarray) -> float:
    return float(problem.cost_NO[np.arange(len(option_N)), option_N].sum())


def _error_of(problem: JointProblem, option_N: np.ndarray) -> float:
    return float(problem.err_NO[np.arange(len(option_N)), option_N].sum())


def brute_force_options(problem: JointProblem) -> np.ndarray:
    """Every assignment of options (N <= BRUTE_FORCE_MAX_EXPERTS): the cheapest within both
    budgets (ties: the first in lexicographic order of option indices)."""
    N, num_options = problem.err_NO.shape
    if N > BRUTE_FORCE_MAX_EXPERTS:
        raise PlanError(f"brute force is limited to {BRUTE_FORCE_MAX_EXPERTS} experts, got {N}")
    combos = np.array(list(itertools.product(range(num_options), repeat=N)), dtype=np.int64).reshape(-1, N)
    rows = np.arange(N)
    cost = problem.cost_NO[rows, combos].sum(axis=1)
    err = problem.err_NO[rows, combos].sum(axis=1)
    ok = err <= problem.max_error * (1 + 1e-12)
    for g in range(problem.num_groups):
        ok &= (problem.weight_O[combos] * (problem.group_N == g)).sum(axis=1) <= problem.budget
    if not ok.any():
        raise PlanError("no assignment keeps both budgets")
    return combos[np.flatnonzero(ok)[np.argmin(cost[ok])]]


def _finish(problem: JointProblem, option_N: np.ndarray, bound: float, method: str, certified: bool) -> JointPlan:
    P = len(problem.weight_O) // 2
    hot_bytes = np.array([int(problem.weight_O[option_N[problem.group_N == g]].sum())
                          for g in range(problem.num_groups)], dtype=np.int64)
    if (hot_bytes > problem.budget).any():
        raise BudgetOverflowError(f"internal: joint plan uses {hot_bytes.max()} bytes, budget is {problem.budget}")
    cost = _cost_of(problem, option_N)
    if bound > cost * (1 + 1e-9) + 1e-9:
        raise PlanError(f"internal: the bound {bound} exceeds the plan's {cost} bytes per step")
    bound = min(bound, cost)  # float noise only
    return JointPlan(option_N % P, option_N < P, cost, _error_of(problem, option_N), hot_bytes, bound, method,
                     certified or cost <= bound * (1 + 1e-9))
