"""CUDA-only Python branches run on the CPU against recording fakes of torch.cuda streams and events:
the swap protocol of the bank (map writes, stream waits, events, copy ms), the link sampling load
of the bandwidth probe, and the NUMA placement of bench_probe's reference buffer.

The fakes model a stream as a log of what was issued to it; copies on the CPU land at once, and
"the copy has landed" is what the fake event's query() answers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from probes.nvml import LinkState
from runtime import pinned
from runtime.bank import ExpertBank
from runtime.pinned import PinnedAllocator, plan_placement
from tests.conftest import cpu_without_triton

CPU = cpu_without_triton()
E, H, INTER = 8, 4, 2


class FakeEvent:
    """torch.cuda.Event: records on the fake current stream; query() is what the test says."""

    def __init__(self, cuda: FakeCuda, enable_timing: bool = False):
        self.cuda, self.enable_timing = cuda, enable_timing
        self.stream = None
        self.landed = False
        self.synchronized = False
        self.t_ms = None

    def record(self, stream=None):
        self.stream = stream or self.cuda.current
        self.t_ms = self.cuda.clock_ms
        self.cuda.clock_ms += 1.5
        self.cuda.log.append(("record", self.stream.name))

    def query(self) -> bool:
        return self.landed

    def synchronize(self):
        self.landed = self.synchronized = True
        self.cuda.log.append(("event.synchronize",))

    def elapsed_time(self, end: FakeEvent) -> float:
        # torch raises unless both events were recorded with timing and have completed.
        assert self.enable_timing and end.enable_timing, "elapsed_time needs enable_timing=True"
        assert self.t_ms is not None and end.t_ms is not None, "elapsed_time of an unrecorded event"
        assert end.landed, "elapsed_time before the end event completed"
        return end.t_ms - self.t_ms


class FakeStream:
    def __init__(self, cuda: FakeCuda, name: str):
        self.cuda, self.name = cuda, name

    def wait_stream(self, other: FakeStream):
        self.cuda.log.append(("wait_stream", self.name, other.name, self.cuda.snapshot()))

    def wait_event(self, event: FakeEvent):
        self.cuda.log.append(("wait_event", self.name, event, self.cuda.snapshot()))


class FakeCuda:
    """The parts of torch.cuda that the bank's CUDA branch calls."""

    def __init__(self):
        self.log: list[tuple] = []
        self.clock_ms = 0.0
        self.compute = FakeStream(self, "compute")
        self.current = self.compute
        self.bank: ExpertBank | None = None

    def snapshot(self) -> np.ndarray | None:
        """The device map at the moment a stream operation is issued."""
        return None if self.bank is None else self.bank.expert2slot_E.numpy().copy()

    def current_stream(self, device=None) -> FakeStream:
        return self.current

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 - torch's name
        return FakeEvent(self, enable_timing)

    def stream(self, s: FakeStream):
        cuda = self

        class _Ctx:
            def __enter__(self):
                self.prev, cuda.current = cuda.current, s

            def __exit__(self, *exc):
                cuda.current = self.prev

        return _Ctx()

    def entries(self, kind: str) -> list[tuple]:
        return [e for e in self.log if e[0] == kind]


@pytest.fixture
def fake(monkeypatch) -> FakeCuda:
    cuda = FakeCuda()
    for name in ("current_stream", "Event", "stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    return cuda


def make_bank(cuda: FakeCuda, hot=(0, 1, 2)) -> ExpertBank:
    """A bank on the CPU that takes the CUDA branch: it has a swap stream."""
    gen = torch.Generator().manual_seed(0)
    w13 = torch.randn(E, 2 * INTER, H, generator=gen)
    w2 = torch.randn(E, H, INTER, generator=gen)
    hot_E = np.zeros(E, dtype=bool)
    hot_E[list(hot)] = True
    alloc = PinnedAllocator(pin=False, placement=plan_placement("off", None))
    bank = ExpertBank(w13, w2, hot_E, CPU, alloc, torch.full((E,), -1, dtype=torch.int32),
                      swap_stream=FakeStream(cuda, "swap"))
    cuda.bank = bank
    cuda.log.clear()
    return bank


def test_begin_swaps_clears_outgoing_before_the_swap_stream_waits(fake):
    bank = make_bank(fake)
    slot = int(bank.table.expert2slot_E[1])
    assert bank.begin_swaps([(1, 5)]) == 0.0  # asynchronous: the time comes with publish_ready
    (wait,) = fake.entries("wait_stream")
    _, waiter, waited, map_then = wait
    assert (waiter, waited) == ("swap", "compute")
    assert map_then[1] == -1, "the outgoing expert must be served cold before the swap stream waits"
    assert map_then[5] == -1
    # Both events on the swap stream, after its wait on the compute stream.
    kinds = [e[0] for e in fake.log]
    assert kinds == ["wait_stream", "record", "record"]
    assert [e[1] for e in fake.entries("record")] == ["swap", "swap"]
    assert torch.equal(bank.hot_SB[slot], bank.cold_EB[5])  # the copy was issued into the freed slot
    # The incoming expert is not served from its slot until the copy is published.
    assert bank.expert2slot_E[5] == -1 and bank.served_E[5] == -1
    assert bank.hot_E[5] and not bank.hot_E[1]  # the table holds the target state


def test_publish_ready_sets_incoming_only_after_the_compute_stream_waits(fake):
    bank = make_bank(fake)
    slot = int(bank.table.expert2slot_E[1])
    bank.begin_swaps([(1, 5)])
    flight = bank.in_flight[0]
    assert bank.publish_ready() == (0, 0.0)  # the copy has not landed: nothing published
    assert bank.expert2slot_E[5] == -1 and not fake.entries("wait_event")
    flight.done.landed = True
    n, ms = bank.publish_ready()
    assert n == 1 and ms == pytest.approx(flight.done.t_ms - flight.start.t_ms) and ms > 0
    (wait,) = fake.entries("wait_event")
    _, waiter, event, map_then = wait
    assert waiter == "compute" and event is flight.done
    assert map_then[5] == -1, "the incoming map entry must be written after the compute stream waits"
    assert bank.expert2slot_E[5] == slot and bank.served_E[5] == slot
    assert bank.in_flight == []
    assert np.array_equal(bank.expert2slot_E.numpy(), bank.table.expert2slot_E)


def test_publish_ready_wait_synchronizes_and_sums_copy_ms(fake):
    bank = make_bank(fake)
    bank.begin_swaps([(0, 6)])
    bank.begin_swaps([(2, 7)])
    flights = list(bank.in_flight)
    n, ms = bank.publish_ready(wait=True)  # FakeEvent.elapsed_time asserts the end event completed
    assert n == 2
    assert ms == pytest.approx(sum(f.done.t_ms - f.start.t_ms for f in flights))
    assert all(f.done.synchronized for f in flights)
    assert np.array_equal(bank.expert2slot_E.numpy(), bank.table.expert2slot_E)


def test_swapping_out_an_expert_whose_copy_is_in_flight(fake):
    bank = make_bank(fake)
    slot = int(bank.table.expert2slot_E[1])
    bank.begin_swaps([(1, 5)])  # 5 is copied into the slot ...
    bank.begin_swaps([(5, 6)])  # ... and swapped out again before it was published: 6 takes the slot
    first, second = bank.in_flight
    first.done.landed = True  # the first copy landed, the second still writes the slot
    bank.publish_ready()
    assert bank.expert2slot_E[5] == -1, "expert 5 would read a slot that expert 6's copy is overwriting"
    second.done.landed = True
    bank.publish_ready()
    assert bank.expert2slot_E[6] == slot and bank.expert2slot_E[5] == -1
    assert np.array_equal(bank.expert2slot_E.numpy(), bank.table.expert2slot_E)
    assert np.array_equal(bank.served_E, bank.table.expert2slot_E)


# ----------------------------------------------------------------------------- probes


def test_link_load_lasts_past_the_last_sample():
    from probes.bandwidth import GIB, LINK_LOAD_SECONDS, LINK_SAMPLE_GAP_S, LINK_SAMPLES, link_load_copies

    size = 256 << 20
    # Sampling ends after (samples + 1) gaps; the queued copying must outlast it at the measured rate.
    assert LINK_LOAD_SECONDS > (LINK_SAMPLES + 1) * LINK_SAMPLE_GAP_S
    for gbps in (12.0, 26.0, 55.0, 110.0):  # PCIe Gen3 x16 .. Gen6 x16
        seconds = link_load_copies(size, gbps) * size / (gbps * 1e9)
        assert seconds >= LINK_LOAD_SECONDS
    assert link_load_copies(size, None) * size >= 4 * GIB
    assert link_load_copies(8 * GIB, 1.0) == 1


def test_link_sampling_queues_the_load_before_sampling():
    from probes import bandwidth

    events = []
    dst = SimpleNamespace(numel=lambda: 1 << 30, copy_=lambda src, non_blocking: events.append(("copy",)))
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: events.append(("sync",))))
    samples = iter([LinkState(1, 16), LinkState(5, 16), LinkState(4, 16)])

    def sample():
        events.append(("sample",))
        return next(samples)

    link = bandwidth._sample_link_under_load(fake_torch, dst, None, sample, h2d_gbps=55.0)
    assert link == (5, 16, None)  # the highest generation seen under load
    kinds = [e[0] for e in events]
    n_copies = bandwidth.link_load_copies(1 << 30, 55.0)
    assert kinds == ["copy"] * n_copies + ["sample"] * 3 + ["sync"]


def test_link_sampling_keeps_the_reason_when_nothing_was_read():
    from probes import bandwidth

    dst = SimpleNamespace(numel=lambda: 1 << 30, copy_=lambda src, non_blocking: None)
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None))
    link = bandwidth._sample_link_under_load(fake_torch, dst, None, lambda: LinkState(None, None, "nvmlInit: lost"))
    assert link == (None, None, "nvmlInit: lost")


def test_failed_host_register_clears_the_cuda_error(monkeypatch):
    from probes import bandwidth

    calls = []
    monkeypatch.setattr(bandwidth, "_libcudart", lambda: SimpleNamespace(cudaGetLastError=lambda: calls.append(1)))
    bandwidth.clear_cuda_error()
    assert calls == [1]
    monkeypatch.setattr(bandwidth, "_libcudart", lambda: None)
    bandwidth.clear_cuda_error()  # no libcudart loaded: nothing to clear, no error


def _load_bench_probe():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_probe.py"
    spec = importlib.util.spec_from_file_location("bench_probe_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_probe_reference_buffer_is_pinned_on_the_probe_node(monkeypatch):
    bench = _load_bench_probe()
    calls = []
    monkeypatch.setattr(pinned, "_numa_nodes", lambda: [0, 1])
    monkeypatch.setattr(pinned, "_set_mempolicy", lambda mode, node: calls.append(("policy", mode, node)))
    real_empty = torch.empty

    def empty(size, dtype, pin_memory):
        calls.append(("alloc", pin_memory))
        return real_empty(size, dtype=dtype)

    monkeypatch.setattr(torch, "empty", empty)  # a plain torch pinned tensor, as a CPU can make one
    buf, placed = bench.plain_pinned(3000, 1)
    assert buf.numel() == 3000
    assert calls == [("policy", pinned.MPOL_PREFERRED, 1), ("alloc", True), ("policy", pinned.MPOL_DEFAULT, None)]
    assert placed["applied"] and placed["node"] == 1 and placed["policy"] == "preferred"
    assert sum(placed["share_by_node"].values()) == pytest.approx(1.0)  # its pages were located


def test_an_expert_swapped_out_and_back_in_waits_for_its_own_copy(fake):
    bank = make_bank(fake)
    slot = int(bank.table.expert2slot_E[1])
    bank.begin_swaps([(1, 5)])  # 5 into the slot
    bank.begin_swaps([(5, 6)])  # 6 into the same slot
    bank.begin_swaps([(6, 5)])  # and 5 again: the table maps 5 to the slot, but only the third copy is 5's
    first, second, third = bank.in_flight
    first.done.landed = True
    bank.publish_ready()
    assert bank.expert2slot_E[5] == -1 and bank.served_E[5] == -1
    second.done.landed = True
    bank.publish_ready()
    assert bank.expert2slot_E[5] == -1 and bank.expert2slot_E[6] == -1
    third.done.landed = True
    bank.publish_ready()
    assert bank.expert2slot_E[5] == slot
    assert np.array_equal(bank.expert2slot_E.numpy(), bank.table.expert2slot_E)


# ----------------------------------------------------------------------------- graph inputs


def test_staged_upload_never_rewrites_a_buffer_a_copy_may_still_read(fake):
    from runtime.engine import StagedUpload

    ids_t, w_t = torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, 2)
    stage = StagedUpload(ids_t, w_t, pinned=False)
    events = []
    for step in range(4):
        ids = np.full((3, 2), step)
        stage(ids, None if step % 2 else np.full((3, 2), 0.25 * step, dtype=np.float32))
        events.append(stage._bufs[step % 2][2])
        assert torch.equal(ids_t, torch.from_numpy(ids))  # the step's routing reached the static buffers
        assert torch.equal(w_t, torch.full((3, 2), 0.5 if step % 2 else 0.25 * step))
        # Step s reuses the buffer of step s - 2: that copy must have finished first, and no newer one.
        assert [e.synchronized for e in events] == [i <= step - 2 for i in range(step + 1)]
    assert [e[1] for e in fake.entries("record")] == ["compute"] * 4  # copies ordered on the compute stream
