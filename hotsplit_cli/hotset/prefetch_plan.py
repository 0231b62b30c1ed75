"""Whether prefetch pays: predicted decode step time with and without staging slots, and the
number of slots to plan (0 included), with the reason (numpy only; never imports torch).

Time model per decode step (docs/prefetch.md, "Planned only where it pays"). A step reads c =
cold experts per step / L distinct cold experts in each of its L MoE layers; one read costs
`read_ms` (expert bytes at the zero-copy read rate), one staged copy `copy_ms` (at the
host->device copy rate), and each layer computes for `compute_ms`. Without prefetch a layer
takes `compute_ms + c x read_ms` (cold reads on the critical path). With s slots for a layer
(a shared pool of s: s / 2 per layer, as layers take turns), the predictor stages
`staged = min(s, recall x c x (1 + wasted_per_useful))` experts while the layer before computes,
`useful = staged / (1 + wasted_per_useful)` of them read. The copies share the link with that
layer's own cold reads and hide only under its compute, so a predicted layer takes
`(c - useful) x read_ms + max(compute_ms, staged x copy_ms)`; the first layer is never staged.
The slots are carved from the hot budget, so c is the cold count of the hot set planned at
the budget less the slots (`cold_by_slots`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.traffic.hist import Histogram
from hotsplit_cli.traffic.predict import MeasuredRecall

from .budget import ReadRate
from .lookahead import Lookahead

SLOT_CHOICES = (0, 1, 2, 4, 8)  # slot counts the planner weighs
MIN_GAIN = 0.01  # the least share of step time slots must save over every batch to be planned


@dataclass(frozen=True)
class LinkModel:
    """The rates a step is timed at (per MoE layer)."""

    num_layers: int
    read_ms: float  # one expert read cold over the link (zero-copy)
    copy_ms: float  # one expert copied into a staging slot
    compute_ms: float | None  # one layer's compute; None: not measured, nothing is known to hide a copy


def step_ms(cold_experts: float, slots: int, pool: str, link: LinkModel, recall: MeasuredRecall | None) -> float:
    """Predicted ms of one decode step with `cold_experts` distinct cold experts (all layers)."""
    L, compute = link.num_layers, link.compute_ms or 0.0
    c = cold_experts / L
    per_layer = slots / 2 if pool == "shared" else slots
    if recall is None or per_layer == 0 or L < 2 or recall.recall == 0:  # nothing staged is ever read
        return L * (compute + c * link.read_ms)
    spread = 1.0 + recall.wasted_per_useful
    staged = min(per_layer, recall.recall * c * spread)
    useful = staged / spread
    predicted = (c - useful) * link.read_ms + max(compute, staged * link.copy_ms)
    return compute + c * link.read_ms + (L - 1) * predicted


@dataclass(frozen=True)
class PrefetchPlan:
    slots: int  # chosen (0: no staging)
    pool: str
    reason: str
    rows: list[dict]  # per batch: batch, compute_ms (a layer's), without_ms, with_ms (at the chosen slots), best_slots

    def to_doc(self) -> dict:
        return {"slots": self.slots, "pool": self.pool, "reason": self.reason, "steps": self.rows}


def plan_prefetch(cold_by_slots: dict[int, list[float]], batches: list[int], link: LinkModel, pool: str,
                  recall: MeasuredRecall | None, unknown: str = "",
                  compute_by_batch: list[float] | None = None) -> PrefetchPlan:
    """Choose among `cold_by_slots` (slots -> cold experts per step at each of `batches`; it holds
    0) the slots with the least total step time over the batches, if they save at least
    MIN_GAIN of it; `unknown` says why `recall` is None. `compute_by_batch`: a layer's compute
    at each batch (else `link.compute_ms` at every batch)."""
    if 0 not in cold_by_slots or any(len(v) != len(batches) for v in cold_by_slots.values()):
        raise PlanError("prefetch planning needs cold counts at 0 slots for every batch")
    links = [link] * len(batches) if compute_by_batch is None else [replace(link, compute_ms=c)
                                                                    for c in compute_by_batch]
    times = {s: [step_ms(c, s, pool, links[i], recall) for i, c in enumerate(cold)]
             for s, cold in cold_by_slots.items()}
    base = times[0]
    best = min(times, key=lambda s: (sum(times[s]), s))
    gain = 1.0 - sum(times[best]) / sum(base) if sum(base) > 0 else 0.0
    chosen = best if gain >= MIN_GAIN else 0
    rows = [{"batch": b, "compute_ms": links[i].compute_ms, "without_ms": base[i], "with_ms": times[chosen][i],
             "best_slots": min(times, key=lambda s, i=i: (times[s][i], s))} for i, b in enumerate(batches)]
    return PrefetchPlan(chosen, pool, _reason(chosen, gain, link, recall, unknown, rows), rows)


def _reason(chosen: int, gain: float, link: LinkModel, recall: MeasuredRecall | None, unknown: str,
            rows: list[dict]) -> str:
    if recall is None:
        return f"0 staging slots: the predictor's recall is unknown ({unknown})"
    if chosen:
        best = max(rows, key=lambda r: (1 - r["with_ms"] / r["without_ms"]) if r["without_ms"] else 0.0)
        return (f"{chosen} staging slots: {100 * gain:.1f}% less step time over batches {rows[0]['batch']}.."
                f"{rows[-1]['batch']} (most at batch {best['batch']}: {best['without_ms']:.3f} -> "
                f"{best['with_ms']:.3f} ms), at recall {recall.recall:.2f} and {recall.wasted_per_useful:.2f} "
                "wasted copies per useful one")
    first, last = rows[0], rows[-1]
    if first["compute_ms"] is None:
        return ("0 staging slots: compute per layer is not measured, so no copy is known to hide under it "
                "(`hotsplit probe -o platform.json` on the GPU machine measures it; older probes did not); "
                "a staged copy then costs the link what the cold read it saves did, and every slot is a hot "
                "expert fewer")
    span = "" if len(rows) == 1 else (f" at batch {first['batch']} ({last['compute_ms']:.3f} ms at batch "
                                      f"{last['batch']})")
    return (f"0 staging slots: no slot count saves {100 * MIN_GAIN:.0f}% of step time: a layer computes for "
            f"{first['compute_ms']:.3f} ms{span}, hiding {first['compute_ms'] / link.copy_ms:.1f} copies of "
            f"{link.copy_ms:.3f} ms, while each slot costs a hot expert and wrong guesses cost link time "
            f"(recall {recall.recall:.2f}, {recall.wasted_per_useful:.2f} wasted per useful)")


def prefetch_for_plan(hist: Histogram, lookahead: Lookahead | None, knobs: Knobs, rate: ReadRate, budget_bytes: int,
                      cold_for, compute_ms: list[float] | None = None) -> PrefetchPlan:
    """`plan --platform`'s verdict for knob `prefetch_pool`: each slot count of SLOT_CHOICES that
    fits the budget, timed at `rate` (`cold_for(budget_bytes, expert_bytes)` gives the cold
    experts per step at each batch of `cold_for.batches` for the hot set planned there; expert
    bytes are `cold_for.expert_bytes`). The recall is the one of `predictor_for(lookahead, knobs)`:
    `lookahead` is the histogram's measured router lookahead (hotset/lookahead.py). `compute_ms`:
    a layer's compute at each batch (hotset/layer_compute.py), None when not measured."""
    L, size, pool = hist.num_layers, cold_for.expert_bytes, knobs.prefetch_pool
    carved = {s: (s * (L - 1) if pool == "layer" else s) * size for s in SLOT_CHOICES}
    cold = {s: cold_for(budget_bytes - c) for s, c in carved.items() if c <= budget_bytes}
    link = LinkModel(L, size / rate.gbps / 1e6, size / (rate.h2d_gbps or rate.gbps) / 1e6, None)
    recall, unknown = predictor_for(lookahead, knobs)
    return plan_prefetch(cold, list(cold_for.batches), link, pool, recall, unknown, compute_ms)


STAGING_MODES = ("lookahead", "trace")  # the `prefetch` knob's values a run stages with


def carved_for_run(prefetch: PrefetchPlan | None, knobs: Knobs, num_layers: int, expert_bytes: int) -> int:
    """Bytes of the planned staging slots a run with these knobs carves from the hot budget (0: the
    plan stages nothing, or the knobs do not stage): the hot set is planned at the budget less them,
    so that `run` with the plan takes its slots (`knobs_from_plan`)."""
    if prefetch is None or not prefetch.slots or knobs.prefetch not in STAGING_MODES:
        return 0
    return (prefetch.slots * (num_layers - 1) if prefetch.pool == "layer" else prefetch.slots) * int(expert_bytes)


def knobs_from_plan(knobs: Knobs, plan) -> tuple[Knobs, str | None]:
    """The knobs a run stages with under `plan` (a PlanFile): the plan's slot count and pool where
    it judged them (`plan --platform`), the knobs stage (`prefetch` lookahead or trace) and the
    user set no `prefetch_slots`; and what to say of it (None: the knobs as they are)."""
    if plan is None or plan.prefetch is None or knobs.prefetch not in STAGING_MODES \
            or knobs.sources.get("prefetch_slots", "default") != "default":
        return knobs, None
    slots, pool, reason = plan.prefetch
    pool = pool if knobs.sources.get("prefetch_pool", "default") == "default" else knobs.prefetch_pool
    note = (f"prefetch_slots {slots} ({pool} pool) from the plan {plan.path}, carved from its hot budget "
            f"({reason.rstrip('.')}); --prefetch-slots says otherwise")
    return replace(knobs, prefetch_slots=slots, prefetch_pool=pool), note


NO_LOOKAHEAD = ("the histogram records no router lookahead: measure it on your model with `hotsplit balance "
                "--model DIR --prompts FILE`")
TRACE_ON_A_TRACE = ("the trace predictor is judged on a trace (`simulate --prefetch trace`); a plan reads a "
                    "histogram, which holds no per-token routing")


def predictor_for(lookahead: Lookahead | None, knobs: Knobs) -> tuple[MeasuredRecall | None, str]:
    """The recall staging is priced at, or None and why. Knob `prefetch`: lookahead (and off, to say
    whether it would pay) takes the histogram's measured router lookahead; trace cannot be judged
    from a histogram; auto takes the better predictor this plan can judge out of sample, and the
    only one is router lookahead: it is fitted on nothing, so its recall on the user's prompts is
    a held-out figure, while the trace predictor's needs a trace."""
    look = lookahead.measured() if lookahead is not None else None
    if knobs.prefetch == "trace":
        return None, TRACE_ON_A_TRACE
    if knobs.prefetch == "auto" and look is None:
        return None, f"prefetch auto: {NO_LOOKAHEAD}, and {TRACE_ON_A_TRACE}"
    return look, NO_LOOKAHEAD
