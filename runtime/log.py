"""Hit-rate records: one per window (a dynamic update, or every dyn_steps in static mode). The
shell renders them as one human line and one JSON line each (hotsplit_cli/commands/_run_report.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class HitRateRecord:
    step: int  # engine steps done when the window closed
    hit_rate_window: float  # routed assignments served hot / all, this window
    hit_rate_total: float  # the same since the start
    swaps: int  # swaps started at this update (all layers)
    swaps_total: int
    bytes_copied: int  # real expert bytes copied host->device by this update's swaps
    copy_ms: float  # copy time of swaps that landed since the previous record
    cold_bytes_per_step: float  # real bytes of distinct cold experts read per step, this window
    layer_hit_rate: list[float]  # per MoE layer, this window
    planner_error: str | None = None
    cold_cpu_bytes_per_step: float | None = None  # of cold_bytes_per_step, what the CPU computed (cold_path cpu/split)
    prefetch: dict | None = None  # this window's staging counters (runtime/prefetch.py); None: prefetch off

    def to_doc(self) -> dict:
        doc = asdict(self)
        if self.prefetch is None:
            doc.pop("prefetch")
        return doc
