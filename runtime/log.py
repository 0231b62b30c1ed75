"""Hit-rate records: one per window (a dynamic update, or every dyn_steps in static mode),
rendered as one human line and as one JSON line. No printing here: callers render.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import IO

from hotsplit_cli.core.jsonio import dumps

MIB = 1 << 20


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

    def to_doc(self) -> dict:
        return asdict(self)


def format_line(r: HitRateRecord) -> str:
    """`step   600  hit rate: window  71.2%, cumulative  68.9%  swaps  3  copied  0.56 MiB in  0.21 ms`
    (the plot's words: the last window, and everything so far)."""
    line = (f"step {r.step:>7}  hit rate: window {100 * r.hit_rate_window:5.1f}%, cumulative "
            f"{100 * r.hit_rate_total:5.1f}%"
            f"  swaps {r.swaps:>3}  copied {r.bytes_copied / MIB:8.2f} MiB in {r.copy_ms:7.2f} ms"
            f"  cold {r.cold_bytes_per_step / MIB:8.2f} MiB/step")
    if r.cold_cpu_bytes_per_step is not None:
        line += f" ({r.cold_cpu_bytes_per_step / MIB:.2f} on the CPU)"
    if r.planner_error:
        line += f"  planner failed: {r.planner_error}"
    return line


def write_jsonl(fh: IO[bytes], r: HitRateRecord) -> None:
    """Append one record as a JSON line and flush (so a tail sees it as it happens)."""
    fh.write(dumps(r.to_doc(), indent=False) + b"\n")
    fh.flush()
