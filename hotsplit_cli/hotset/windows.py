"""A run's windows (numpy only): hit-rate accounting, the dynamic update and the run summary of
the runtime's one loop (runtime/engine.py), whichever model it steps, so every run applies the
same swap rule with the same checks and reports in the same terms.

Every `dyn_steps` steps a window closes: its counts go to the swap rule (`dyn_rule` credit =
planner.SwapRule or breakeven = admission.BreakEvenRule, the classes `simulate` replays), the
answer is checked (hot out, cold in, at most dyn_max_swaps per layer), and one `HitRateRecord` is
made (the shell renders it: hotsplit_cli/commands/_run_report.py). Three planner failures in a
row abort the run. Copy time is reported in the record of the window where the copies landed.
Shape letters: L = MoE layers, E = experts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.core.errors import PlanError, RuntimeFailure
from hotsplit_cli.hotset.admission import make_swap_rule
from hotsplit_cli.hotset.planner import Swap


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


MAX_PLANNER_FAILURES = 3

Propose = Callable[[np.ndarray, np.ndarray, int, float], list[Swap]]


@dataclass
class RunSummary:
    steps: int
    tokens: int
    elapsed_s: float
    tokens_per_s: float
    hit_rate: float
    hit_rate_last_window: float | None
    expected_hit_rate: float | None
    swaps: int
    bytes_copied: int  # real bytes
    copy_ms: float
    cold_bytes_per_step: float  # real bytes of distinct cold experts read per step
    layer_hit_rate: list[float]
    interrupted: bool
    records: list[HitRateRecord] = field(default_factory=list)
    cold_paths: dict | None = None  # cold_path cpu/split: bytes and ms per path, measured and predicted
    prefetch: dict | None = None  # staging slots' counters (runtime/prefetch.py); None: prefetch off

    @property
    def hot_hit_rate(self) -> float:
        """Assignments served by hot experts alone, what a plan predicts: `hit_rate` less staged hits."""
        return self.hit_rate - (self.prefetch["staged_hit_rate"] if self.prefetch else 0.0)

    @property
    def expected_gap(self) -> float | None:
        """Achieved (hot) minus expected hit rate (a fraction); None when the plan expected nothing."""
        return None if self.expected_hit_rate is None else self.hot_hit_rate - self.expected_hit_rate

    def to_doc(self) -> dict:
        doc = asdict(self)
        doc.pop("records")
        if self.prefetch is None:
            doc.pop("prefetch")
        return {**doc, "expected_gap": self.expected_gap}


def ratio(num: float, den: float) -> float:
    """num / den; 0.0 when there is nothing to divide by (no assignments, no time)."""
    return float(num / den) if den else 0.0


def layer_rates(hits_L: np.ndarray, assigned_L: np.ndarray) -> list[float]:
    """Hits / assignments of each layer (0.0 for a layer that had none)."""
    return [ratio(h, a) for h, a in zip(hits_L, assigned_L, strict=True)]


def moves_by_layer(swaps: list[Swap]) -> dict[int, list[tuple[int, int]]]:
    """Swaps as {layer: [(out_expert, in_expert), ...]}, what a bank's begin_swaps takes."""
    out: dict[int, list[tuple[int, int]]] = {}
    for s in swaps:
        out.setdefault(s.layer, []).append((s.out_expert, s.in_expert))
    return out


def validate_swaps(swaps: list[Swap], hot_LE: np.ndarray, max_swaps: int) -> None:
    """The planner's answer must be applicable: hot out, cold in, at most max_swaps per layer."""
    per_layer: dict[int, int] = {}
    taken: set[tuple[int, int]] = set()
    for s in swaps:
        per_layer[s.layer] = per_layer.get(s.layer, 0) + 1
        if not 0 <= s.layer < hot_LE.shape[0]:
            raise PlanError(f"swap names layer {s.layer}, the model has {hot_LE.shape[0]}")
        if per_layer[s.layer] > max_swaps:
            raise PlanError(f"{per_layer[s.layer]} swaps proposed in layer {s.layer}, dyn_max_swaps is {max_swaps}")
        if not hot_LE[s.layer, s.out_expert] or hot_LE[s.layer, s.in_expert]:
            raise PlanError(f"swap {s.out_expert}->{s.in_expert} in layer {s.layer} is not hot->cold")
        if (s.layer, s.out_expert) in taken or (s.layer, s.in_expert) in taken:
            raise PlanError(f"layer {s.layer}: expert swapped twice in one update")
        taken.update({(s.layer, s.out_expert), (s.layer, s.in_expert)})


def precision_rows(precision_LE: np.ndarray) -> np.ndarray:
    """bool [L, P, E]: which experts of each layer are stored at each of the P precisions present
    (sorted by name): the (layer, precision) rows the swap rule sees under an auto plan."""
    return np.stack([precision_LE == p for p in np.unique(precision_LE)], axis=1)


@dataclass(frozen=True)
class StoredLayers:
    """The experts of a run whose auto plan stores them at different precisions: each expert's
    precision and stored bytes [L, E]. The swap rule sees each (layer, precision) as a layer of its
    own, rows in the order `simulate` replays them (analysis/simulate.py run_dynamic_stored), so an
    expert only replaces a hot one of its own precision and the hot bytes never change."""

    precision_LE: np.ndarray  # str [L, E]
    sizes_LE: np.ndarray  # int64 [L, E]: real stored bytes

    def decide(self, propose: Propose, counts_LE: np.ndarray, hot_LE: np.ndarray, knobs: Knobs) -> list[Swap]:
        """The rule's swaps on the (layer, precision) rows, as swaps of the model's layers."""
        member_LPE = precision_rows(self.precision_LE)
        L, P, E = member_LPE.shape
        hot_RE = (hot_LE[:, None, :] & member_LPE).reshape(L * P, E)
        rows = list(propose((counts_LE[:, None, :] * member_LPE).reshape(L * P, E), hot_RE, knobs.dyn_max_swaps,
                            knobs.dyn_margin))
        validate_swaps(rows, hot_RE, knobs.dyn_max_swaps)  # at most dyn_max_swaps per (layer, precision)
        return [dataclasses.replace(s, layer=s.layer // P) for s in rows]

    def bytes_of(self, swapped_in, cold_LE: np.ndarray | None) -> tuple[int, float]:
        """(bytes the swaps copy, bytes of the cold reads) at each expert's stored bytes."""
        copied = int(sum(int(self.sizes_LE[li, e]) for li, e in swapped_in))
        return copied, 0.0 if cold_LE is None else float((cold_LE * self.sizes_LE).sum())


class WindowBook:
    """Totals over the run and one record per closed window. `propose` is the swap rule
    (replaceable in tests); None = a fresh rule of the knobs' `dyn_rule`, `dyn_decay`, `dyn_steps`
    and `dyn_sigmas`."""

    def __init__(self, num_layers: int, knobs: Knobs, expert_bytes: int, propose: Propose | None = None,
                 stored: StoredLayers | None = None):
        self.knobs, self.expert_bytes, self.stored = knobs, expert_bytes, stored
        self.propose: Propose = propose if propose is not None else make_swap_rule(
            knobs.dyn_rule, knobs.dyn_decay, knobs.dyn_steps, knobs.dyn_sigmas)
        self.cold_bytes = 0.0  # real (stored) bytes of the distinct cold experts read, summed over steps
        self.failures = 0
        self.hits = self.assigned = 0.0
        self.cold_reads = 0
        self.layer_hits_L = np.zeros(num_layers)
        self.layer_assigned_L = np.zeros(num_layers)
        self.swaps = self.bytes_copied = 0
        self.copy_ms = 0.0
        self._pending_ms = 0.0  # copy time of swaps that landed since the last record
        self._cpu_reads = 0  # distinct cold experts the CPU computed, up to the last record
        self.window_start = 0
        self.records: list[HitRateRecord] = []

    def landed(self, copy_ms: float) -> None:
        """Copies that finished between steps: their time goes into the next record."""
        self._pending_ms += copy_ms

    def decide(self, counts_LE: np.ndarray, hot_LE: np.ndarray, step: int) -> tuple[list[Swap], str | None]:
        """The dynamic update: ask the swap rule, check its answer. A failure is logged in the
        record; three in a row abort the run (RuntimeFailure)."""
        try:
            if self.stored is not None:  # per (layer, precision): a swap keeps each expert's precision
                swaps = self.stored.decide(self.propose, counts_LE, hot_LE, self.knobs)
            else:
                swaps = list(self.propose(counts_LE, hot_LE, self.knobs.dyn_max_swaps, self.knobs.dyn_margin))
                validate_swaps(swaps, hot_LE, self.knobs.dyn_max_swaps)
        except PlanError as exc:
            self.failures += 1
            if self.failures >= MAX_PLANNER_FAILURES:
                raise RuntimeFailure(
                    f"the planner failed {self.failures} updates in a row at step {step}: {exc.message}",
                    "run with HOTSPLIT_DYNAMIC=0 to keep the plan fixed, or check the live counts",
                ) from None
            return [], exc.message
        self.failures = 0
        return swaps, None

    def close(self, step: int, hits_L: np.ndarray, assigned_L: np.ndarray, cold_reads: int, swaps: int = 0,
              copy_ms: float = 0.0, error: str | None = None, cpu_reads_total: int | None = None,
              prefetch: dict | None = None, cold_LE: np.ndarray | None = None,
              swapped_in: list[tuple[int, int]] = ()) -> HitRateRecord:
        """Close the window ending at `step`: hits and assignments per layer, distinct cold experts
        read (summed over steps), swaps started now and their copy time when already done;
        `cpu_reads_total`: distinct cold experts the CPU computed since the start (CPU cold path);
        `prefetch`: the window's staging counters. With experts of different stored sizes
        (`stored`): `cold_LE`, the steps each expert was read cold, and `swapped_in`, the (layer,
        expert) each swap copies, are counted at each expert's stored bytes."""
        n_steps = max(1, step - self.window_start)
        cpu_bytes = None
        if cpu_reads_total is not None:
            cpu_bytes = (cpu_reads_total - self._cpu_reads) * self.expert_bytes / n_steps
            self._cpu_reads = cpu_reads_total
        hits_L, assigned_L = np.asarray(hits_L, dtype=np.float64), np.asarray(assigned_L, dtype=np.float64)
        self.window_start = step
        hits, assigned = float(hits_L.sum()), float(assigned_L.sum())
        self.hits += hits
        self.assigned += assigned
        self.cold_reads += int(cold_reads)
        self.layer_hits_L += hits_L
        self.layer_assigned_L += assigned_L
        copy_ms += self._pending_ms
        self._pending_ms = 0.0
        copied, cold_bytes = swaps * self.expert_bytes, int(cold_reads) * self.expert_bytes
        if self.stored is not None:
            copied, cold_bytes = self.stored.bytes_of(swapped_in, cold_LE)
        self.swaps += swaps
        self.bytes_copied += copied
        self.cold_bytes += cold_bytes
        self.copy_ms += copy_ms
        rec = HitRateRecord(
            step=step, hit_rate_window=ratio(hits, assigned), hit_rate_total=ratio(self.hits, self.assigned),
            swaps=swaps, swaps_total=self.swaps, bytes_copied=copied, copy_ms=copy_ms,
            cold_bytes_per_step=cold_bytes / n_steps,
            layer_hit_rate=layer_rates(hits_L, assigned_L), planner_error=error, cold_cpu_bytes_per_step=cpu_bytes,
            prefetch=prefetch)
        self.records.append(rec)
        return rec

    def summary(self, steps: int, tokens: int, elapsed_s: float, expected_hit_rate: float | None,
                interrupted: bool = False) -> RunSummary:
        """The run so far. Copy time that landed after the last record is counted here."""
        self.copy_ms += self._pending_ms
        self._pending_ms = 0.0
        return RunSummary(
            steps=steps, tokens=tokens, elapsed_s=elapsed_s, tokens_per_s=ratio(tokens, elapsed_s),
            hit_rate=ratio(self.hits, self.assigned),
            hit_rate_last_window=self.records[-1].hit_rate_window if self.records else None,
            expected_hit_rate=expected_hit_rate, swaps=self.swaps, bytes_copied=self.bytes_copied,
            copy_ms=self.copy_ms, cold_bytes_per_step=ratio(self.cold_bytes, steps),
            layer_hit_rate=layer_rates(self.layer_hits_L, self.layer_assigned_L), interrupted=interrupted,
            records=list(self.records))
