"""Knobs: resolved once, before any work, with precedence flag > environment > recipe > default.

A bad value refuses to start (`UsageError`, exit 2) with the knob's path in the message.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hotsplit_cli.core.errors import UsageError

NUMA_POLICIES = ("preferred", "bind", "off")
COLD_PATHS = ("gpu", "cpu", "split")  # who computes cold experts: see coldpath.py
EP_EXCHANGES = ("a2a", "allgather")  # how EP ranks exchange tokens: see runtime/distributed/dispatch.py
DYN_DECAY = 0.8  # the swap rule's memory per window (hotset/planner.py SwapRule; docs/simulate.md)
DYN_RULES = ("credit", "breakeven")  # which window rule swaps (hotset/admission.py; docs/simulate.md)
DYN_SIGMAS = 2.0  # the break-even rule's noise test, in Poisson standard deviations (docs/simulate.md)
PRECISIONS = ("native", "fp8", "mxfp4", "auto")  # stored precision of experts; auto: per expert, by `plan`
PREFETCH_MODES = ("off", "lookahead", "trace", "auto")  # what predicts the next layer's experts (docs/prefetch.md)
PREFETCH_POOLS = ("layer", "shared")  # staging slots per layer, or one pool for all layers (docs/prefetch.md)


@dataclass(frozen=True)
class KnobSpec:
    name: str
    env: str
    kind: type  # float | int | bool | str
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    nullable: bool = False  # empty = auto


KNOBS = (
    KnobSpec("hot_gib", "HOTSPLIT_HOT_GIB", float, None, minimum=0.0, nullable=True),
    KnobSpec("dynamic", "HOTSPLIT_DYNAMIC", bool, True),
    KnobSpec("dyn_steps", "HOTSPLIT_DYN_STEPS", int, 2000, minimum=1),
    KnobSpec("dyn_max_swaps", "HOTSPLIT_DYN_MAX_SWAPS", int, 2, minimum=0),
    KnobSpec("dyn_margin", "HOTSPLIT_DYN_MARGIN", float, 1.25, minimum=1.0),
    KnobSpec("dyn_decay", "HOTSPLIT_DYN_DECAY", float, DYN_DECAY, minimum=0.0, maximum=1.0),
    KnobSpec("dyn_rule", "HOTSPLIT_DYN_RULE", str, "credit", choices=DYN_RULES),
    KnobSpec("dyn_sigmas", "HOTSPLIT_DYN_SIGMAS", float, DYN_SIGMAS, minimum=0.0),  # breakeven rule only
    KnobSpec("vram_reserve_gib", "HOTSPLIT_VRAM_RESERVE_GIB", float, 2.0, minimum=0.0),
    KnobSpec("numa_policy", "HOTSPLIT_NUMA_POLICY", str, "preferred", choices=NUMA_POLICIES),
    KnobSpec("cold_path", "HOTSPLIT_COLD_PATH", str, "gpu", choices=COLD_PATHS),
    KnobSpec("precision", "HOTSPLIT_PRECISION", str, "native", choices=PRECISIONS),
    KnobSpec("eplb_steps", "HOTSPLIT_EPLB_STEPS", int, 0, minimum=0),  # 0 = off; EP runs only
    KnobSpec("ep_exchange", "HOTSPLIT_EP_EXCHANGE", str, "a2a", choices=EP_EXCHANGES),  # EP runs only
    # prefetch defaults measured with benchmarks/bench_prefetch.py (docs/prefetch.md)
    KnobSpec("prefetch", "HOTSPLIT_PREFETCH", str, "off", choices=PREFETCH_MODES),
    KnobSpec("prefetch_slots", "HOTSPLIT_PREFETCH_SLOTS", int, 4, minimum=0),
    KnobSpec("prefetch_pool", "HOTSPLIT_PREFETCH_POOL", str, "shared", choices=PREFETCH_POOLS),
    KnobSpec("prefetch_guesses", "HOTSPLIT_PREFETCH_GUESSES", int, 12, minimum=1),
)
KNOB_NAMES = tuple(k.name for k in KNOBS)

# What each knob means, as a flag's --help says it (the meanings of SPEC.md's table, docs/simulate.md).
KNOB_MEANINGS = {
    "hot_gib": "Per-rank hot budget in GiB",
    "dyn_steps": "Engine steps between dynamic swap evaluations",
    "dyn_max_swaps": "Most swaps per MoE layer at each evaluation",
    "dyn_margin": "Swap only when the incoming expert's score exceeds margin x the outgoing one's",
    "dyn_decay": "Share of the swap rule's score kept from one window to the next (0: the last window only)",
    "dyn_rule": "Which rule proposes swaps: credit (scores against the margin) or breakeven (swaps whose "
                "copy pays back in cold reads)",
    "dyn_sigmas": "breakeven rule: Poisson standard deviations by which an incoming expert's score must lead",
    "cold_path": "Who computes cold experts: gpu (zero-copy), cpu, or split by the measured cost model",
    "eplb_steps": "EP: engine steps between live expert-parallel rebalances (0 = off)",
    "ep_exchange": "EP: how ranks exchange tokens: a2a (all_to_all_single) or allgather (all-gather, then "
                   "reduce-scatter)",
    "prefetch": "What predicts the next layer's experts for the staging slots: off, lookahead (the next "
                "layer's router), trace (a predictor fitted on a trace) or auto (docs/prefetch.md)",
    "prefetch_slots": "Staging slots for prefetched experts, carved from the hot budget",
    "prefetch_pool": "Staging slots for each layer (layer) or one pool for all layers (shared)",
    "prefetch_guesses": "Guesses per token of the next layer's experts (past top_k widens)",
    "precision": "How routed experts are stored: native, fp8 (e4m3, 128x128 block scales) or mxfp4 (e2m1, a "
                 "scale per 32 inputs)",
}
AUTO_HOT_GIB = "auto: GPU memory - dense weights - KV cache - reserve"  # what an empty hot_gib means


def knob_spec(name: str) -> KnobSpec:
    """The spec of knob `name` (KeyError for a name that is no knob)."""
    return {k.name: k for k in KNOBS}[name]


@dataclass(frozen=True)
class Knobs:
    hot_gib: float | None  # None = auto budget from the hardware
    dynamic: bool
    dyn_steps: int
    dyn_max_swaps: int
    dyn_margin: float
    dyn_decay: float  # weight the swap rule keeps of its score per window (0 = the last window only)
    vram_reserve_gib: float
    numa_policy: str
    cold_path: str  # gpu | cpu | split
    sources: Mapping[str, str]  # knob -> "flag" | "env" | "recipe" | "default"
    eplb_steps: int = 0  # steps between live expert-parallel rebalances (0 = off)
    ep_exchange: str = "a2a"  # a2a (uneven all_to_all_single) | allgather (all-gather, then reduce-scatter)
    dyn_rule: str = "credit"  # credit (planner.SwapRule) | breakeven (hotset/admission.py: swaps that pay in bytes)
    dyn_sigmas: float = DYN_SIGMAS  # breakeven: Poisson standard deviations an incoming score must lead by
    precision: str = "native"  # native | fp8 | mxfp4 | auto (per expert, chosen by `plan`)
    prefetch: str = "off"  # off | lookahead (the next layer's router) | trace (a fitted predictor) | auto (the plan's)
    prefetch_slots: int = 4  # staging slots, per layer or shared (prefetch_pool), carved from the hot budget
    prefetch_pool: str = "shared"  # layer | shared
    prefetch_guesses: int = 12  # guesses per token of the next layer's experts (past top_k widens)

    def to_doc(self) -> dict:
        return {k: getattr(self, k) for k in KNOB_NAMES}

    def origin(self, name: str) -> str:
        """Where a knob's value came from, as the user wrote it: `--hot-gib`, `HOTSPLIT_HOT_GIB`,
        `recipe hotsplit.hot_gib` or `default`."""
        env = next(k.env for k in KNOBS if k.name == name)
        return {"flag": f"--{name.replace('_', '-')}", "env": env,
                "recipe": f"recipe hotsplit.{name}"}.get(self.sources[name], "default")


def _convert(spec: KnobSpec, raw: Any, where: str) -> Any:
    """Parse a raw value (a string from env/flags, or a YAML scalar) and range-check it."""
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        if spec.nullable:
            return None
        raise UsageError(f"{where}: must be set, got an empty value")
    value: Any = raw
    try:
        if spec.kind is bool:
            if isinstance(raw, bool):
                value = raw
            elif isinstance(raw, int) and raw in (0, 1):
                value = bool(raw)
            elif isinstance(raw, str) and raw.strip().lower() in ("0", "1", "true", "false", "on", "off"):
                value = raw.strip().lower() in ("1", "true", "on")
            else:
                raise ValueError
        elif spec.kind is int:
            if isinstance(raw, bool) or isinstance(raw, float):
                raise ValueError
            value = int(raw.strip()) if isinstance(raw, str) else int(raw)
        elif spec.kind is float:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError
        else:
            value = str(raw).strip()
    except (ValueError, TypeError):
        kind = {bool: "0 or 1", int: "an integer", float: "a finite number", str: "a string"}[spec.kind]
        raise UsageError(f"{where}: must be {kind}, got {raw!r}") from None
    if spec.minimum is not None and value < spec.minimum:
        raise UsageError(f"{where}: must be >= {spec.minimum:g}, got {value!r}")
    if spec.maximum is not None and value > spec.maximum:
        raise UsageError(f"{where}: must be <= {spec.maximum:g}, got {value!r}")
    if spec.choices is not None and value not in spec.choices:
        raise UsageError(f"{where}: must be one of {', '.join(spec.choices)}, got {value!r}")
    return value


def resolve_knobs(
    recipe_knobs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Knobs:
    """Resolve every knob. `flags` holds only the flags the user gave (None = not given)."""
    env = os.environ if env is None else env
    recipe_knobs = recipe_knobs or {}
    flags = flags or {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for spec in KNOBS:
        if flags.get(spec.name) is not None:
            where, raw, src = f"--{spec.name.replace('_', '-')}", flags[spec.name], "flag"
        elif spec.env in env:
            where, raw, src = spec.env, env[spec.env], "env"
        elif spec.name in recipe_knobs:
            where, raw, src = f"hotsplit.{spec.name}", recipe_knobs[spec.name], "recipe"
        else:
            values[spec.name], sources[spec.name] = spec.default, "default"
            continue
        values[spec.name], sources[spec.name] = _convert(spec, raw, where), src
    return Knobs(**values, sources=sources)


EP_KNOBS = ("eplb_steps", "ep_exchange")  # knobs of an expert-parallel run only


def check_ep_knobs(knobs: Knobs, ep: int, recipe_name: str) -> None:
    """UsageError when a flag of an expert-parallel run is given to a single-rank recipe, which
    would otherwise ignore it without a word."""
    given = [f"--{k.replace('_', '-')}" for k in EP_KNOBS if knobs.sources.get(k) == "flag"]
    if ep == 1 and given:
        raise UsageError(f"{' and '.join(given)}: expert-parallel options, but recipe {recipe_name!r} runs on one "
                         "rank (parallel.ep: 1)", "drop them, or use a recipe with ep > 1 (e.g. tiny-ep4)")


def check_prefetch_runs(knobs: Knobs, model_kind: str, ep: int, replays_trace: bool) -> None:
    """UsageError when a run is asked to stage experts it cannot: the runtime stages with router
    lookahead (`prefetch lookahead`: a synthetic model or a checkpoint, at ep > 1 each rank the
    experts it serves) or with the trace predictor (`prefetch trace`: one rank, a synthetic
    model replaying a trace, the routing it decides from before each step, or a checkpoint with
    the table fitted on a trace of it); a run that ignored the knob would report figures the user
    did not ask for."""
    where = f"{knobs.origin('prefetch')}={knobs.prefetch}"
    if knobs.prefetch not in ("lookahead", "trace"):
        return
    if ep > 1 and knobs.prefetch == "trace":
        raise UsageError(f"{where}: the runtime stages with the trace predictor on one rank, not ep {ep}",
                         "run with parallel.ep: 1, stage with prefetch lookahead, or prefetch off")
    if knobs.prefetch == "trace" and model_kind != "hf" and not replays_trace:
        raise UsageError(f"{where}: the trace predictor stages a synthetic model from a replayed trace, not traffic "
                         "that is not a trace", "run with --trace, or use prefetch lookahead")
