"""`plan --precision`: each expert's stored precision, one for all (native, fp8, mxfp4) or chosen
with the hot set (`auto`, hotset/joint.py), with its expected error and where the errors came
from (numpy only). Shape letters: L = MoE layers, E = experts, P = precisions, R = ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import PlanError, UsageError
from hotsplit_cli.hotset.joint import JointPlan, make_problem, plan_joint
from hotsplit_cli.hotset.planner import Plan, check_counts, contiguous_owner
from hotsplit_cli.hotset.quality import Quality, expected_error
from hotsplit_cli.hotset.sizes import PRECISIONS, expert_bytes_per_rank, precision_bytes

MEASURE_HINT = "measure them with `hotsplit balance --model DIR --prompts FILE -o HIST`"


@dataclass(frozen=True)
class PrecisionChoice:
    """Every expert's stored precision and what it is expected to cost in quality."""

    knob: str  # native | fp8 | mxfp4 | auto
    bytes_by_precision: dict[str, int]  # stored bytes of one expert per rank, per precision the shape allows
    precision_LE: np.ndarray  # int [L, E]: index into PRECISIONS
    expected_error: float | None  # routing-share-weighted error; None when not measured
    max_error: float | None  # the budget it was planned under (--max-error)
    errors_from: str  # where the errors were measured, or why they are unknown
    model: dict  # per measured precision: next-token agreement and mean KL against native
    batch: int  # tokens per step the PCIe bytes are predicted at (the recipe's traffic batch)
    joint: JointPlan | None = None  # auto: the joint plan's bound and method
    quality: Quality | None = None  # the measured errors it was planned with

    @property
    def sizes_LE(self) -> np.ndarray:
        """int64 [L, E]: each expert's stored bytes per rank."""
        table = np.array([self.bytes_by_precision.get(p, 0) for p in PRECISIONS], dtype=np.int64)
        return table[self.precision_LE]

    def names_LE(self) -> np.ndarray:
        return np.asarray(PRECISIONS)[self.precision_LE]

    def to_doc(self, hot_LE: np.ndarray, layers, pi_LE: np.ndarray) -> dict:
        """plan.json's `precision` block: counts per precision hot and cold, the expected error and
        its source, the predicted PCIe bytes per step, and under auto each layer's expert ids per
        precision (`by_layer`)."""
        names = self.names_LE()
        doc = {
            "knob": self.knob,
            "expert_bytes": dict(self.bytes_by_precision),
            "experts": {p: {"hot": int(((names == p) & hot_LE).sum()), "cold": int(((names == p) & ~hot_LE).sum())}
                        for p in PRECISIONS if p in self.bytes_by_precision},
            "expected_error": self.expected_error,
            "max_error": self.max_error,
            "errors_from": self.errors_from,
            "model": self.model,
            "batch": self.batch,
            "pcie_bytes_per_step": pcie_bytes_per_step(pi_LE, hot_LE, self.sizes_LE, self.batch),
        }
        if self.knob == "auto":  # the runtime stores each expert as listed; uniform plans need no list
            doc["by_layer"] = {str(layer): {p: np.flatnonzero(names[i] == p).tolist() for p in PRECISIONS
                                            if (names[i] == p).any()} for i, layer in enumerate(layers)}
        if self.joint is not None:
            doc["bound"] = {"pcie_bytes_per_step": self.joint.bound_cold_bytes, "gap": self.joint.gap,
                            "method": self.joint.method, "certified": self.joint.certified,
                            "kind": "Lagrangian of the LP relaxation (docs/precision.md)"}
        return doc


def pcie_bytes_per_step(pi_LE: np.ndarray, hot_LE: np.ndarray, sizes_LE: np.ndarray, batch: int) -> float:
    """Expected bytes read over PCIe per step of `batch` tokens: sum over cold experts of
    (1 - (1 - pi)^batch) x stored bytes."""
    q_LE = 1.0 - (1.0 - pi_LE) ** batch
    return float((q_LE * sizes_LE)[~hot_LE].sum())


def errors_LEP(quality: Quality | None, shape: tuple[int, int]) -> np.ndarray:
    """float [L, E, P] relative error of each expert at each precision: native 0, nan when not measured."""
    out = np.full((*shape, len(PRECISIONS)), np.nan)
    out[..., PRECISIONS.index("native")] = 0.0
    for p, err in (quality.error_LE.items() if quality else ()):
        out[..., PRECISIONS.index(p)] = err
    return out


def uniform_choice(counts_LE: np.ndarray, recipe: Recipe, precision: str, quality: Quality | None,
                   max_error: float | None) -> PrecisionChoice:
    """Every expert at `precision`. Its expected error when measured (native: 0); a PlanError when
    it exceeds `max_error`, and when a budget is given for errors that were not measured."""
    sizes = precision_bytes(recipe)
    if precision not in sizes:
        expert_bytes_per_rank(recipe, precision)  # says in one line why the shape cannot take it
    index = PRECISIONS.index(precision)
    share = counts_LE / counts_LE.sum()
    err = expected_error(share, errors_LEP(quality, counts_LE.shape)[..., index])
    known = math.isfinite(err)
    if max_error is not None and not known:
        raise PlanError(f"--max-error {max_error:g}: the errors of {precision} experts were not measured",
                        f"drop --max-error, or {MEASURE_HINT}")
    if max_error is not None and err > max_error:
        raise PlanError(f"--max-error {max_error:g} is unreachable at {precision}: its expected error is {err:.4g}",
                        "raise --max-error, or plan with --precision auto to choose precision per expert")
    source = _errors_from(quality, precision) if known else f"unknown: no {precision} errors measured; {MEASURE_HINT}"
    return PrecisionChoice(precision, sizes, np.full(counts_LE.shape, index), err if known else None, max_error,
                           source, quality.model if quality else {}, recipe.traffic.batch, quality=quality)


def _errors_from(quality: Quality | None, precision: str) -> str:
    if precision == "native":
        return "native: stored as the checkpoint is, no error"
    return f"measured: {quality.measured_on}"


def check_auto_inputs(quality: Quality | None, max_error: float | None, hist_path, placement) -> None:
    """auto needs measured errors and an error budget, and plans without a placement."""
    if quality is None:
        raise PlanError(f"--precision auto chooses each expert's precision by its measured error, and {hist_path} "
                        "has no `quality` block", MEASURE_HINT)
    if max_error is None:
        raise UsageError("--precision auto needs --max-error E: the expected error it may spend",
                         "pass --max-error (e.g. 0.02), or a uniform --precision")
    if placement is not None:
        raise UsageError("--precision auto plans the contiguous expert-parallel layout, not a --placement",
                         "drop --placement, or plan the placement with a uniform --precision")


def auto_plan(counts_LE: np.ndarray, top_k: int, recipe: Recipe, budget_bytes: int, quality: Quality,
              max_error: float) -> tuple[Plan, PrecisionChoice]:
    """The hot set and every expert's precision chosen together (joint.plan_joint): fewest expected
    PCIe bytes per step at the recipe's batch, hot bytes within the budget on every rank, expected
    error within `max_error`. Under EP each rank's budget holds the experts it owns."""
    counts_LE = check_counts(counts_LE)
    L, E = counts_LE.shape
    sizes = precision_bytes(recipe)
    allowed = [PRECISIONS.index(p) for p in PRECISIONS if p in sizes]
    share_LE = counts_LE / counts_LE.sum()
    pi_LE = routed_probs(counts_LE, top_k)
    batch = recipe.traffic.batch
    ep = recipe.parallel.ep
    owner_LE = contiguous_owner(L, E, ep)
    problem = make_problem((1.0 - (1.0 - pi_LE) ** batch).ravel(), share_LE.ravel(),
                           [sizes[PRECISIONS[p]] for p in allowed],
                           errors_LEP(quality, (L, E))[..., allowed].reshape(L * E, len(allowed)),
                           budget_bytes, max_error, owner_LE.ravel())
    joint = plan_joint(problem)
    hot_LE = joint.hot_N.reshape(L, E)
    precision_LE = np.asarray(allowed)[joint.precision_N].reshape(L, E)
    hot_RLE = np.stack([hot_LE & (owner_LE == r) for r in range(ep)])
    served = (counts_LE * hot_LE).sum(axis=1)
    hit = float((share_LE * hot_LE).sum())
    plan = Plan(hot_RLE, joint.hot_bytes_G, int(budget_bytes), hit, served / counts_LE.sum(axis=1), hit, hit,
                (joint.method,) * ep, joint.certified)
    choice = PrecisionChoice("auto", sizes, precision_LE, joint.error, max_error,
                             f"measured: {quality.measured_on}", quality.model, batch, joint, quality)
    return plan, choice


def routed_probs(counts_LE: np.ndarray, top_k: int) -> np.ndarray:
    """pi [L, E]: the chance one token routes to expert e of layer l (top_k x its share in the layer)."""
    row = counts_LE.sum(axis=1, keepdims=True)
    return np.minimum(1.0, top_k * np.divide(counts_LE, row, out=np.zeros_like(counts_LE), where=row > 0))


def uniform_layer_precisions(precision_LE, num_layers: int, num_experts: int) -> list[str]:
    """One precision per MoE layer from a per-(layer, expert) precision array [L, E] of names: one
    bank per layer holds one precision, so every expert of a layer must share it."""
    rows = [list(map(str, row)) for row in precision_LE]
    if len(rows) != num_layers or any(len(r) != num_experts for r in rows):
        raise UsageError(f"per-expert precisions have shape {len(rows)} x {len(rows[0]) if rows else 0}, "
                         f"want {num_layers} x {num_experts}")
    for li, row in enumerate(rows):
        bad = sorted(set(row) - set(PRECISIONS))
        if bad:
            raise UsageError(f"layer {li}: precision {bad[0]!r} is not one of {', '.join(PRECISIONS)}")
        if len(set(row)) > 1:
            raise UsageError(f"layer {li} mixes precisions {', '.join(sorted(set(row)))}",
                             "the runtime stores one precision per layer's bank; give each layer one")
    return [row[0] for row in rows]

