"""What a run is asked (`RunRequest`) and what it gives back (`RunResult`), the same on one rank
and N, for a synthetic model and a checkpoint. Plain values, no torch: a request travels to the
ranks a launcher starts as a file, and rank 0's result comes back to the launcher the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.core.jsonio import schema_tag
from hotsplit_cli.hotset.planfile import PlanFile
from hotsplit_cli.hotset.windows import HitRateRecord, RunSummary
from hotsplit_cli.traffic.trace import Replay


def check_steps_and_scale(steps: int | None, scale: float | None) -> None:
    """--steps and --scale, refused before anything is built."""
    if steps is not None and steps < 1:
        raise UsageError(f"--steps: must be >= 1, got {steps}")
    if scale is not None and not 0 < scale <= 1:
        raise UsageError(f"--scale: must be in (0, 1], got {scale}")


@dataclass(frozen=True)
class RunRequest:
    recipe: Recipe
    knobs: Knobs
    plan: Path | None = None  # --plan
    trace: Path | None = None  # --trace
    steps: int | None = None  # --steps
    scale: float | None = None  # --scale
    platform: Path | None = None  # --platform
    plan_file: PlanFile | None = None  # the --plan file, when the caller has read (and checked) it already
    prefetch_fit: Path | None = None  # --prefetch-fit: the trace the prefetch predictor is fitted on
    replay: Replay | None = None  # the trace replayed, when the caller has read (and checked) it already

    def __post_init__(self):
        check_steps_and_scale(self.steps, self.scale)


@dataclass(frozen=True)
class RunHeader:
    """Rank 0's set-up, once every rank is built: `doc` is the run document's part that describes
    it (device, kernel, traffic, numa, plan, ...), the rest is what its header lines say."""

    doc: dict
    steps: int | None  # steps the run is asked for (None: a generation ends when its prompts do)
    device_name: str
    expert_format: str  # how the routed experts are stored
    cold_bank: dict  # requested_bytes, method, fallback, numa (words)
    source: str  # the routing source: "synthetic", "trace", "router", a generation's name
    tokens_per_step: int
    family: str | None  # a checkpoint's model_type
    parallel: dict  # ep, backend, nodes (parallel_of)

    @staticmethod
    def parallel_of(world: int, backend: str | None = None, local_world: int = 1) -> dict:
        return {"ep": world, "backend": backend, "nodes": world // local_world}


class Agreement(NamedTuple):
    """A checkpoint run's generated tokens against the checkpoint as released (runtime/hf/agreement.py)."""

    agreement: float | None  # None: not measured (`note` says why)
    tokens: int  # generated tokens compared
    note: str | None = None


@dataclass(frozen=True)
class PrecisionReport:
    """The run's stored precision next to what it costs: the plan's expected error (None: the plan
    has none, or there is no plan file) and, for a checkpoint stored at another precision than it
    is released in, the teacher-forced next-token agreement of the run's own greedy tokens with
    the checkpoint as released (runtime/hf/agreement.py); `note` says why it was not measured."""

    stored: str  # the precision knob: native, fp8 or mxfp4
    expected_error: float | None = None
    agreement: float | None = None  # fraction of generated tokens the native model also chooses
    tokens: int = 0  # generated tokens compared
    note: str | None = None

    @classmethod
    def of_run(cls, stored: str, plan: PlanFile | None, check: Callable[[], Agreement] | None,
               interrupted: bool) -> PrecisionReport:
        """A finished run's report: `plan` the plan file it ran (None: planned here), `check`
        measures a checkpoint's agreement (None: a synthetic model)."""
        expected = None if plan is None else plan.expected_error
        if check is None:
            return cls(stored, expected, note="a synthetic model has no release to compare with")
        return cls(stored, expected, *(Agreement(None, 0, "interrupted: not compared") if interrupted else check()))

    def to_doc(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class RunResult:
    """A finished run (rank 0's view of a job): its set-up, summary, EP figures (None on one rank) and
    a checkpoint's greedy texts in prompt order (None: a synthetic model; none when interrupted)."""

    recipe: str
    knobs: Knobs
    header: RunHeader
    summary: RunSummary
    figures: object | None = None  # hotsplit_cli/hotset/ep_figures.py EPFigures
    texts: list[str] | None = None
    precision: PrecisionReport | None = None  # None: the knob's, nothing measured

    def to_doc(self) -> dict:
        """The one `hotsplit.run/1` shape of every run (the shell adds its verdicts and plot)."""
        summary = self.summary.to_doc()
        if self.figures is not None:
            summary.update(self.figures.to_doc())
        precision = self.precision or PrecisionReport(self.knobs.precision)
        return {"schema": schema_tag("run"), "recipe": self.recipe, "knobs": self.knobs.to_doc(),
                **self.header.doc, "parallel": self.header.parallel, "summary": summary, "texts": self.texts,
                "precision": precision.to_doc()}


class Watch:
    """What a caller sees of a run while it goes: progress of its long phases, rank 0's set-up
    once built, notes, and each window's record. This default shows nothing."""

    @contextmanager
    def progress(self, label: str, total: float):
        """Yields `advance(n)` for `label`'s `total` units."""
        yield lambda n: None

    def ready(self, header: RunHeader) -> None:
        """Rank 0 (or the one rank) is built and about to step."""

    def note(self, line: str) -> None:
        """A note for stderr (what the set-up decided, what a launcher removed)."""

    def record(self, record: HitRateRecord) -> None:
        """A window closed (on N ranks: the job's window, on rank 0)."""
