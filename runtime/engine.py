"""Drives engine steps through the hot/cold model: routing sources, windows, dynamic swaps.

Routing sources: the model's own router on generated hidden states (`RouterSource`), a trace, or
the synthetic sampler (`ArraySource`: either gives expert ids per step); a checkpoint's is its
generation (runtime/hf/steps.py). Every `dyn_steps` steps a window closes: counters are read
(the one host synchronisation), a record is made, and in dynamic mode
`hotsplit_cli.hotset.planner.SwapRule` (the rule shared with the simulator) proposes swaps,
which start on the swap stream and are published between later steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
from hotsplit_probes.hostmem import release_deferred

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.hotset.windows import HitRateRecord, Propose, RunSummary, StoredLayers, WindowBook, moves_by_layer
from hotsplit_cli.traffic.synthetic import SyntheticTraffic

from .model import HotColdMoE
from .prefetch import Stager


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

    def __init__(self, name: str, tokens_per_step: int, it: Iterator[tuple[np.ndarray, np.ndarray | None]]):
        self.name, self.tokens_per_step, self._it = name, tokens_per_step, it

    def steps(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        return self._it


def synthetic_source(traffic: SyntheticTraffic) -> ArraySource:
    def gen():
        while True:
            yield traffic.next_step(), None
    return ArraySource("synthetic", traffic.batch, gen())


def capture_graph(step: Callable[[], torch.Tensor], device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`step` recorded as a CUDA graph, and its output buffer. Two warm-up runs on a side stream
    come first, so that lazy allocations and kernel compilation happen outside the graph."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


class StagedUpload:
    """Each step's routing into the CUDA graph's static device buffers without stalling the host.

    A copy from pageable memory waits for everything queued before it (the previous replay), so
    the host could never prepare a step while the GPU runs one. Here the ids and weights go into
    one of two pinned staging buffers and are copied asynchronously; a staging buffer is written
    again only once the copy that read it, two steps back, has finished."""

    def __init__(self, ids_t: torch.Tensor, w_t: torch.Tensor, pinned: bool = True):
        self.ids_t, self.w_t = ids_t, w_t
        self._bufs = [[torch.empty(ids_t.shape, dtype=torch.int64, pin_memory=pinned),
                       torch.empty(w_t.shape, dtype=torch.float32, pin_memory=pinned), None] for _ in range(2)]
        self._next = 0

    def __call__(self, ids: np.ndarray, w: np.ndarray | None) -> None:
        buf = self._bufs[self._next]
        ids_h, w_h, copied = buf
        if copied is not None:
            copied.synchronize()  # the copy that last read this buffer is done
        ids_h.numpy()[...] = ids
        w_h.numpy()[...] = 1.0 / ids_h.shape[-1] if w is None else w
        self.ids_t.copy_(ids_h, non_blocking=True)
        self.w_t.copy_(w_h, non_blocking=True)
        buf[2] = torch.cuda.Event()
        buf[2].record()
        self._next ^= 1


class Engine:
    """Runs steps and windows. `propose` is the swap rule (replaceable in tests)."""

    def __init__(self, model: HotColdMoE, source, knobs: Knobs, expert_bytes: int, seed: int = 0,
                 expected_hit_rate: float | None = None, propose: Propose | None = None,
                 use_graph: bool | None = None, stager: Stager | None = None, stored: StoredLayers | None = None):
        """`stored`: each expert's precision and stored bytes, when an auto plan stores them at several."""
        self.model, self.source, self.knobs = model, source, knobs
        self.stager = stager  # prefetch: what each step stages (runtime/prefetch.py); None: nothing
        self.expert_bytes, self.expected_hit_rate = expert_bytes, expected_hit_rate  # bytes: real, of one expert
        self.book = WindowBook(model.num_layers, knobs, expert_bytes, propose, stored)
        self.step_count = 0
        self._init_forward(seed, use_graph)

    def _init_forward(self, seed: int, use_graph: bool | None) -> None:
        """A synthetic model's steps: fresh hidden states, in a CUDA graph where one can run."""
        dev = self.model.info.device
        T, H = self.source.tokens_per_step, self.model.geom.hidden
        self.gen = torch.Generator(device=dev).manual_seed(seed)
        self.x_TH = torch.empty(T, H, dtype=self.model.banks[0].compute_dtype, device=dev)
        self.use_graph = (self.model.info.graphs and self.model.compute.capturable) if use_graph is None else use_graph
        self.graph = None

    # -- one step -------------------------------------------------------------------------
    def _upload(self, routed) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if routed is None:
            return None, None
        ids, w = routed
        dev = self.model.info.device
        ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=dev)
        w_t = (torch.full(ids_t.shape, 1.0 / ids_t.shape[-1], dtype=torch.float32, device=dev) if w is None
               else torch.as_tensor(np.asarray(w, dtype=np.float32), device=dev))
        return ids_t, w_t

    def _capture(self, routed) -> None:
        """Record one step as a CUDA graph over static buffers."""
        ids_t, w_t = self._upload(routed)
        self.graph, self.out_TH = capture_graph(lambda: self.model.step(self.x_TH, ids_t, w_t), self.model.info.device)
        release_deferred()  # host memory dropped during the capture is unregistered and freed now
        self.model.read_counters(reset_window=True)  # warm-up and capture steps do not count
        self._routing = None if ids_t is None else StagedUpload(ids_t, w_t, pinned=self.model.info.pinned)

    def step(self, routed) -> None:
        self.book.landed(self.model.publish_ready()[1])  # swaps whose copies landed: publish between steps
        st = self.stager  # prefetch (runtime/prefetch.py, lookahead_stage.py); None: nothing staged
        staged_LE = None if st is None else st.before_step(self.model, routed, self.use_graph)
        self._forward(routed)
        if staged_LE is not None:
            self.model.unstage()  # between steps: a staging row holds its expert for one step
            st.after_step(self.model, routed, staged_LE)
        self.step_count += 1

    def _forward(self, routed) -> None:
        self.x_TH.normal_(generator=self.gen)
        if self.use_graph:
            if self.graph is None:
                self._capture(routed)
            if routed is not None:
                self._routing(*routed)
            self.graph.replay()
        else:
            ids_t, w_t = self._upload(routed)
            self.out_TH = self.model.step(self.x_TH, ids_t, w_t)

    def tokens(self) -> int:  # tokens the steps so far computed (a checkpoint counts its real ones)
        return self.step_count * self.source.tokens_per_step

    # -- windows --------------------------------------------------------------------------
    def close_window(self, update: bool) -> HitRateRecord:
        c = self.model.read_counters(reset_window=True)  # the one host synchronisation
        swaps, error, copy_ms = [], None, 0.0
        if update:
            swaps, error = self.book.decide(c["counts_LE"], self.model.hot_LE(), self.step_count)
            copy_ms = self.model.begin_swaps(moves_by_layer(swaps))
        prefetch = None if self.stager is None else self.stager.close_window(
            self.step_count - self.book.window_start, int(c["cold_reads_L"].sum()), len(swaps),
            float(c["hits_L"].sum()), float(c["assigned_L"].sum()))
        split = getattr(self.model.compute, "split", None)
        # The window's own counts, kept for a job's reduction (runtime/distributed/summary.py).
        self.window_counts = (c["hits_L"].astype(np.float64), c["assigned_L"].astype(np.float64),
                              int(c["cold_reads_L"].sum()))
        return self.book.close(self.step_count, *self.window_counts, len(swaps), copy_ms, error,
                               split.counters.cpu_experts if split else None, prefetch, c["cold_LE"],
                               [(s.layer, s.in_expert) for s in swaps])

    # -- the run --------------------------------------------------------------------------
    def run(self, steps: int, on_record: Callable[[HitRateRecord], None] | None = None,
            advance: Callable[[int], None] | None = None, hooks: LoopHooks | None = None) -> RunSummary:
        """The one loop of every run, one rank or a rank of an expert-parallel job: up to `steps`
        steps (fewer if a trace ends). `on_record` gets each window's record, `advance(1)` is
        called after every step; `hooks` are the rank's part (the single-rank default: none).
        Ctrl-C stops a single rank with the summary so far."""
        hooks = LoopHooks() if hooks is None else hooks
        interrupted = False
        t0 = time.perf_counter()
        try:
            interrupted = self._steps(steps, on_record, advance, hooks)
        except KeyboardInterrupt:
            if not hooks.stops_alone:
                raise
            interrupted = True
        if self.model.info.is_cuda:  # time finished work, not queued work
            torch.cuda.synchronize(self.model.info.device)
        elapsed = time.perf_counter() - t0
        hooks.finish()
        self.book.landed(self.model.publish_ready(wait=True)[1])
        if self.step_count > self.book.window_start:  # the last, partial window
            rec = self.close_window(update=False)
            if on_record:
                on_record(rec)
        summary = self.book.summary(self.step_count, self.tokens(), elapsed,
                                    self.expected_hit_rate, interrupted)
        split = getattr(self.model.compute, "split", None)
        if split is not None:
            summary.cold_paths = split.report(self.expert_bytes, self.model.banks[0].expert_bytes)
        if self.stager is not None:
            b = self.book
            summary.prefetch = self.stager.summary(self.step_count, b.cold_reads, b.swaps, b.hits, b.assigned)
        return summary

    def _steps(self, steps: int, on_record, advance, hooks: LoopHooks) -> bool:
        """Step until `steps` or the source ends; True when the hooks stop the run at a window."""
        dyn = self.knobs.dyn_steps
        for routed in self.source.steps():
            if self.step_count >= steps:
                break
            self.step(routed)
            if advance:
                advance(1)
            if self.step_count % dyn == 0:
                # No swap after the last step: its copies would serve nothing (simulate makes none).
                rec = self.close_window(update=self.knobs.dynamic and self.step_count < steps)
                if on_record:
                    on_record(rec)
                if hooks.stops_at_window():
                    return True
            hooks.after_step(self.step_count, steps)  # after the window's swaps: decided on the map they served
        return False


class LoopHooks:
    """What the loop asks of the run around it; this default is a single rank's: nothing
    between steps, nothing at the end, and Ctrl-C stops the run with its summary so far.
    A rank of an expert-parallel job (runtime/distributed/rank.py `RankLoop`) rebalances
    between steps and cannot stop alone in the middle of collectives: Ctrl-C stops every
    rank at the same window."""

    stops_alone = True

    def stops_at_window(self) -> bool:
        """Called as each window closes: whether the run stops there (a job's Ctrl-C)."""
        return False

    def after_step(self, step: int, steps: int) -> None:
        """Called after step `step` of `steps` (and after the window it closed, if any)."""

    def finish(self) -> None:
        """Called once the steps are done and timed, before the last copies are published."""
