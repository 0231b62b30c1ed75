"""Drives engine steps through the hot/cold model: routing sources, windows, dynamic swaps.

Routing sources: the model's own router on generated hidden states (`RouterSource`), a trace,
or the synthetic sampler (`ArraySource`: either gives expert ids per step). Every `dyn_steps`
steps a window closes: counters are read (the one host synchronisation), a record is made,
and in dynamic mode `hotsplit_cli.planner.propose_swaps` (the rule shared with the simulator)
proposes swaps, which start on the swap stream and are published between later steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from hotsplit_cli.errors import PlanError, RuntimeFailure
from hotsplit_cli.knobs import Knobs
from hotsplit_cli.planner import Swap, propose_swaps
from hotsplit_cli.trace import Trace
from hotsplit_cli.traffic import SyntheticTraffic

from .log import HitRateRecord
from .model import HotColdMoE

MAX_PLANNER_FAILURES = 3


class RouterSource:
    """Routing by the model's own router on the generated hidden states."""

    name = "router"

    def __init__(self, batch: int):
        self.tokens_per_step = batch

    def steps(self) -> Iterator[None]:
        while True:
            yield None


class ArraySource:
    """Expert ids per step from an iterator of (ids [L, T, K], weights [L, T, K] or None)."""

    def __init__(self, name: str, tokens_per_step: int, it: Iterator[tuple[np.ndarray, np.ndarray | None]],
                 length: int | None = None):
        self.name, self.tokens_per_step, self._it, self.length = name, tokens_per_step, it, length

    def steps(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        return self._it


def synthetic_source(traffic: SyntheticTraffic) -> ArraySource:
    def gen():
        while True:
            yield traffic.next_step(), None
    return ArraySource("synthetic", traffic.batch, gen())


def trace_source(trace: Trace) -> ArraySource:
    def gen():
        for s in range(trace.num_steps):
            w = None if trace.topk_weights_SLTK is None else trace.topk_weights_SLTK[s]
            yield trace.topk_ids_SLTK[s], w
    return ArraySource("trace", int(trace.topk_ids_SLTK.shape[2]), gen(), trace.num_steps)


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

    def to_doc(self) -> dict:
        doc = asdict(self)
        doc.pop("records")
        return doc


Propose = Callable[[np.ndarray, np.ndarray, int, float], list[Swap]]


class Engine:
    """Runs steps and windows. `propose` is the swap rule (replaceable in tests)."""

    def __init__(self, model: HotColdMoE, source, knobs: Knobs, expert_bytes: int, seed: int = 0,
                 expected_hit_rate: float | None = None, propose: Propose = propose_swaps,
                 use_graph: bool | None = None):
        self.model, self.source, self.knobs = model, source, knobs
        self.expert_bytes = expert_bytes  # real bytes of one expert on this rank
        self.expected_hit_rate = expected_hit_rate
        self.propose = propose
        dev = model.info.device
        T, H = source.tokens_per_step, model.geom.hidden
        self.gen = torch.Generator(device=dev).manual_seed(seed)
        self.x_TH = torch.empty(T, H, dtype=model.banks[0].dtype, device=dev)
        self.use_graph = (model.info.graphs and model.compute.capturable) if use_graph is None else use_graph
        self.graph = None
        self.failures = 0
        self._hits = self._assigned = self._cold_reads = 0
        self._layer_hits = np.zeros(model.num_layers)
        self._layer_assigned = np.zeros(model.num_layers)
        self._swaps = self._bytes = 0
        self._copy_ms = 0.0
        self._pending_ms = 0.0
        self.records: list[HitRateRecord] = []
        self.step_count = 0
        self._window_start = 0

    # -- one step -------------------------------------------------------------------------
    def _upload(self, routed) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if routed is None:
            return None, None
        ids, w = routed
        dev = self.model.info.device
        ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=dev)
        if w is None:
            w_t = torch.full(ids_t.shape, 1.0 / ids_t.shape[-1], dtype=torch.float32, device=dev)
        else:
            w_t = torch.as_tensor(np.asarray(w, dtype=np.float32), device=dev)
        return ids_t, w_t

    def _capture(self, routed) -> None:
        """Record one step as a CUDA graph over static buffers (warm-up on a side stream first)."""
        ids_t, w_t = self._upload(routed)
        self._static = (ids_t, w_t)
        side = torch.cuda.Stream(self.model.info.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.model.step(self.x_TH, ids_t, w_t)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out_TH = self.model.step(self.x_TH, ids_t, w_t)
        self.model.read_counters(reset_window=True)  # warm-up and capture steps do not count

    def step(self, routed) -> None:
        _, ms = self.model.publish_ready()  # swaps whose copies landed: publish between steps
        self._pending_ms += ms
        self.x_TH.normal_(generator=self.gen)
        if self.use_graph:
            if self.graph is None:
                self._capture(routed)
            ids_t, w_t = self._static
            if routed is not None:
                ids, w = routed
                ids_t.copy_(torch.from_numpy(np.asarray(ids, dtype=np.int64)))
                w_t.copy_(torch.from_numpy(np.asarray(w, dtype=np.float32)) if w is not None
                          else torch.full(ids_t.shape, 1.0 / ids_t.shape[-1]))
            self.graph.replay()
        else:
            ids_t, w_t = self._upload(routed)
            self.out_TH = self.model.step(self.x_TH, ids_t, w_t)
        self.step_count += 1

    # -- windows --------------------------------------------------------------------------
    def close_window(self, update: bool) -> HitRateRecord:
        c = self.model.read_counters(reset_window=True)
        n_steps = max(1, self.step_count - self._window_start)
        self._window_start = self.step_count
        hits, assigned = int(c["hits_L"].sum()), int(c["assigned_L"].sum())
        self._hits += hits
        self._assigned += assigned
        self._cold_reads += int(c["cold_reads_L"].sum())
        self._layer_hits += c["hits_L"]
        self._layer_assigned += c["assigned_L"]
        swaps, error, copy_ms = [], None, 0.0
        if update:
            swaps, error = self._propose(c["counts_LE"])
            by_layer: dict[int, list[tuple[int, int]]] = {}
            for s in swaps:
                by_layer.setdefault(s.layer, []).append((s.out_expert, s.in_expert))
            copy_ms = self.model.begin_swaps(by_layer)
        copy_ms += self._pending_ms
        self._pending_ms = 0.0
        self._swaps += len(swaps)
        self._bytes += len(swaps) * self.expert_bytes
        self._copy_ms += copy_ms
        layer_rate = np.divide(c["hits_L"], c["assigned_L"], out=np.zeros(len(c["hits_L"])),
                               where=c["assigned_L"] > 0)
        rec = HitRateRecord(
            step=self.step_count,
            hit_rate_window=hits / assigned if assigned else 0.0,
            hit_rate_total=self._hits / self._assigned if self._assigned else 0.0,
            swaps=len(swaps), swaps_total=self._swaps, bytes_copied=len(swaps) * self.expert_bytes,
            copy_ms=copy_ms, cold_bytes_per_step=int(c["cold_reads_L"].sum()) * self.expert_bytes / n_steps,
            layer_hit_rate=[float(x) for x in layer_rate], planner_error=error)
        self.records.append(rec)
        return rec

    def _propose(self, counts_LE: np.ndarray) -> tuple[list[Swap], str | None]:
        """Ask the planner; check its answer; three failures in a row abort the run."""
        hot_LE = self.model.hot_LE()
        try:
            swaps = list(self.propose(counts_LE, hot_LE, self.knobs.dyn_max_swaps, self.knobs.dyn_margin))
            _check_swaps(swaps, hot_LE, self.knobs.dyn_max_swaps)
        except PlanError as exc:
            self.failures += 1
            if self.failures >= MAX_PLANNER_FAILURES:
                raise RuntimeFailure(
                    f"the planner failed {self.failures} updates in a row at step {self.step_count}: {exc.message}",
                    "run with HOTSPLIT_DYNAMIC=0 to keep the plan fixed, or check the live counts",
                ) from None
            return [], exc.message
        self.failures = 0
        return swaps, None

    # -- the run --------------------------------------------------------------------------
    def run(self, steps: int, on_record: Callable[[HitRateRecord], None] | None = None) -> RunSummary:
        """Run up to `steps` steps (fewer if a trace ends); Ctrl-C stops with the summary so far."""
        dyn = self.knobs.dyn_steps
        interrupted = False
        t0 = time.perf_counter()
        try:
            for routed in self.source.steps():
                if self.step_count >= steps:
                    break
                self.step(routed)
                if self.step_count % dyn == 0:
                    rec = self.close_window(update=self.knobs.dynamic)
                    if on_record:
                        on_record(rec)
        except KeyboardInterrupt:
            interrupted = True
        if self.model.info.is_cuda:
            torch.cuda.synchronize(self.model.info.device)
        elapsed = time.perf_counter() - t0
        _, ms = self.model.publish_ready(wait=True)
        self._pending_ms += ms
        if self.step_count > self._window_start:  # the last, partial window
            rec = self.close_window(update=False)
            if on_record:
                on_record(rec)
        elif self._pending_ms:
            self._copy_ms += self._pending_ms
        tokens = self.step_count * self.source.tokens_per_step
        layer = np.divide(self._layer_hits, self._layer_assigned, out=np.zeros_like(self._layer_hits),
                          where=self._layer_assigned > 0)
        return RunSummary(
            steps=self.step_count, tokens=tokens, elapsed_s=elapsed,
            tokens_per_s=tokens / elapsed if elapsed > 0 else 0.0,
            hit_rate=self._hits / self._assigned if self._assigned else 0.0,
            hit_rate_last_window=self.records[-1].hit_rate_window if self.records else None,
            expected_hit_rate=self.expected_hit_rate, swaps=self._swaps, bytes_copied=self._bytes,
            copy_ms=self._copy_ms,
            cold_bytes_per_step=self._cold_reads * self.expert_bytes / self.step_count if self.step_count else 0.0,
            layer_hit_rate=[float(x) for x in layer], interrupted=interrupted, records=list(self.records))


def _check_swaps(swaps: list[Swap], hot_LE: np.ndarray, max_swaps: int) -> None:
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
