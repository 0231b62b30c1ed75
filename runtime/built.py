"""A rank built for the one loop, whichever model source built it (from_recipe.py, hf/run.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from hotsplit_cli.hotset.rank_hot_set import PlanChoice

from .device import DeviceInfo
from .engine import Engine
from .request import Agreement, RunHeader


@dataclass(frozen=True)
class Built:
    engine: Engine
    steps: float  # a synthetic run's steps; math.inf: the checkpoint's generation ends the loop
    info: DeviceInfo
    plan: PlanChoice
    allocator: object  # the cold bank's (a PinnedAllocator, or an EP node's SharedAllocator)
    expert_bytes: int | None  # real, of one expert; None: an auto plan stores experts at several sizes
    traffic: str  # what the rank steps through
    allocated: dict  # the banks as allocated: hidden, inter, experts, top_k, dtype, expert_format
    scale: float = 1.0
    notes: list[str] = field(default_factory=list)
    trace_steps: int | None = None  # steps in the replayed trace (None: no trace)
    trace: object | None = None  # the replayed Trace, whole (every rank's tokens), for a job's predictions
    family: str | None = None  # a checkpoint's model family
    generates: bool = False  # a checkpoint generates text; a synthetic model none
    native_check: Callable[[], Agreement] | None = None  # a checkpoint's agreement with its release, after the run

    @property
    def hidden(self) -> int:  # allocated (scaled)
        return self.allocated["hidden"]

    def header(self, parallel: dict | None = None) -> RunHeader:
        """This rank's set-up as the run document and its header lines say it."""
        a, engine = self.allocator, self.engine
        split = getattr(engine.model.compute, "split", None)
        allocated = {**self.allocated, "cold_bank_bytes": a.requested_bytes,
                     "cold_bank_reserved_bytes": a.reserved_bytes, "cold_bank_method": a.method,
                     "cold_bank_fallback": a.fallback}
        doc = {"device": self.info.to_doc(), "kernel": engine.model.compute.name, "cuda_graph": bool(engine.use_graph),
               "cold_path": {"mode": split.mode if split else "gpu", "rates": split.rates_source if split else None},
               "traffic": self.traffic, "trace_steps": self.trace_steps, "scale": self.scale, "allocated": allocated,
               "numa": a.numa.to_doc(), "plan": self.plan.to_doc(self.expert_bytes)}
        cold_bank = {"requested_bytes": a.requested_bytes, "method": a.method, "fallback": a.fallback,
                     "numa": a.numa.describe()}
        source = engine.source
        return RunHeader(doc, None if math.isinf(self.steps) else self.steps, self.info.name,
                         allocated["expert_format"], cold_bank, source.name, source.tokens_per_step, self.family,
                         parallel or RunHeader.parallel_of(1))

    def texts(self, interrupted: bool) -> list[str] | None:
        """The greedy texts of this rank's prompts (none when interrupted; None: no text)."""
        if not self.generates:
            return None
        return [] if interrupted else self.engine.source.texts()
