"""CUDA-only Python branches run on the CPU against recording fakes of torch.cuda streams and events:
the swap protocol of the bank (map writes, stream waits, events, copy ms), the link sampling load
of the bandwidth probe, and the NUMA policy of bench_probe's reference buffer.

The fakes model a stream as a log of what was issued to it; copies on the CPU land at once, and
"the copy has landed" is what the fake event's query() answers."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hotsplit_probes.nvml import LinkState
from hotsplit_runtime import pinned
from hotsplit_runtime.bank import ExpertBank
from hotsplit_runtime.pinned import PinnedAllocator, numa_policy_for

from tests.conftest import cpu_without_triton, load_benchmark

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
    alloc = PinnedAllocator(pin=False, numa=numa_policy_for("off", None))
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
    from hotsplit_probes.bandwidth import GIB, LINK_LOAD_SECONDS, LINK_SAMPLE_GAP_S, LINK_SAMPLES, link_load_copies

    size = 256 << 20
    # Sampling ends after (samples + 1) gaps; the queued copying must outlast it at the measured rate.
    assert LINK_LOAD_SECONDS > (LINK_SAMPLES + 1) * LINK_SAMPLE_GAP_S
    for gbps in (12.0, 26.0, 55.0, 110.0):  # PCIe Gen3 x16 .. Gen6 x16
        seconds = link_load_copies(size, gbps) * size / (gbps * 1e9)
        assert seconds >= LINK_LOAD_SECONDS
    assert link_load_copies(size, None) * size >= 4 * GIB
    assert link_load_copies(8 * GIB, 1.0) == 1


def test_link_sampling_queues_the_load_before_sampling():
    from hotsplit_probes import bandwidth

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
    from hotsplit_probes import bandwidth

    dst = SimpleNamespace(numel=lambda: 1 << 30, copy_=lambda src, non_blocking: None)
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None))
    link = bandwidth._sample_link_under_load(fake_torch, dst, None, lambda: LinkState(None, None, "nvmlInit: lost"))
    assert link == (None, None, "nvmlInit: lost")


def test_failed_host_register_clears_the_cuda_error(monkeypatch):
    from hotsplit_probes import hostmem

    calls = []
    monkeypatch.setattr(hostmem, "libcudart", lambda: SimpleNamespace(cudaGetLastError=lambda: calls.append(1)))
    hostmem.clear_cuda_error()
    assert calls == [1]
    monkeypatch.setattr(hostmem, "libcudart", lambda: None)
    hostmem.clear_cuda_error()  # no libcudart loaded: nothing to clear, no error


def test_bench_probe_reference_buffer_is_pinned_on_the_probe_node(monkeypatch):
    from hotsplit_probes import hostmem

    bench = load_benchmark("bench_probe")
    calls = []
    monkeypatch.setattr(pinned, "list_numa_nodes", lambda root: (0, 1))
    monkeypatch.setattr(hostmem, "set_mempolicy", lambda mode, node: calls.append(("policy", mode, node)))
    real_empty = torch.empty

    def empty(size, dtype, pin_memory):
        calls.append(("alloc", pin_memory))
        return real_empty(size, dtype=dtype)

    monkeypatch.setattr(torch, "empty", empty)  # a plain torch pinned tensor, as a CPU can make one
    buf, placed = bench.plain_pinned(3000, 1)
    assert buf.numel() == 3000
    assert calls == [("policy", hostmem.MPOL_PREFERRED, 1), ("alloc", True), ("policy", hostmem.MPOL_DEFAULT, None)]
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
    from hotsplit_runtime.engine import StagedUpload

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


# ----------------------------------------------------------------------------- host memory lifetime


def _mapped_intervals() -> list[tuple[int, int]]:
    """[start, end) of every mapping of this process, merged where they touch."""
    spans = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            lo, hi = line.split()[0].split("-")
            spans.append((int(lo, 16), int(hi, 16)))
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _is_mapped(address: int, size: int) -> bool:
    return any(lo <= address and address + size <= hi for lo, hi in _mapped_intervals())


class RangeCudart:
    """torch.cuda.cudart() with CUDA's rules for registered host ranges, recorded rather than crashed on:
    a range registered twice (cudaErrorHostMemoryAlreadyRegistered), unregistered when it was never
    registered, or unmapped while still registered; and a pageable copy spanning a registered range
    (cudaErrorInvalidValue: what crashed selftest on a GPU)."""

    def __init__(self):
        self.ranges: dict[int, int] = {}  # address -> bytes, registered now
        self.violations: list[str] = []
        self.registrations = 0

    def cudaHostRegister(self, address, size, flags):  # noqa: N802 - CUDA's name
        self.check_mapped()
        for a, n in self.ranges.items():
            if address < a + n and a < address + size:
                self.violations.append(f"{address:#x}+{size} registered twice (overlaps {a:#x}+{n})")
                return 712
        self.ranges[address] = size
        self.registrations += 1
        return 0

    def cudaHostUnregister(self, address):  # noqa: N802
        if address not in self.ranges:
            self.violations.append(f"{address:#x} unregistered but not registered")
            return 713
        size = self.ranges.pop(address)
        if not _is_mapped(address, size):
            self.violations.append(f"{address:#x}+{size} was unmapped before it was unregistered")
        return 0

    def check_mapped(self) -> None:
        """Every registered range must still be mapped."""
        for a, n in list(self.ranges.items()):
            if not _is_mapped(a, n):
                self.violations.append(f"{a:#x}+{n} unmapped while still registered")
                del self.ranges[a]

    def pageable_copy(self, t: torch.Tensor) -> None:
        """What `t.to("cuda")` of a pageable tensor asks of CUDA."""
        lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        for a, n in self.ranges.items():
            if lo < a + n and a < hi:
                self.violations.append(f"pageable copy of {lo:#x}+{hi - lo} spans the registered {a:#x}+{n}")


@pytest.fixture
def cudart(monkeypatch) -> RangeCudart:
    fake = RangeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


def _pinned_cpu():
    """The CPU device with the pinned (registered) cold bank a GPU gets."""
    import dataclasses

    return dataclasses.replace(CPU, pinned=True)


def _cheap_model(info, seed: int):
    """A two-layer hot/cold model with 2 x 48 MiB cold banks (above malloc's mmap threshold, so
    freed ranges are reused by the next large allocation, as on a GPU host)."""
    from hotsplit_runtime.kernels import choose_compute
    from hotsplit_runtime.model import HotColdMoE
    from hotsplit_runtime.moe import LayerWeights, MoEGeometry, Router

    g = MoEGeometry(hidden=1024, inter=512, num_experts=8, top_k=2, shared_inter=0, router="softmax")
    layers = [LayerWeights(torch.full((8, 1024, 1024), float(seed)), torch.full((8, 1024, 512), 1.0),
                           Router(torch.zeros(8, 1024), None, g), None, None) for _ in range(2)]
    hot = np.zeros((2, 8), dtype=bool)
    hot[:, :2] = True
    alloc = PinnedAllocator(pin=info.pinned, numa=numa_policy_for("off", None))
    return HotColdMoE(layers, g, hot, info, alloc, choose_compute(info))


def test_fake_cudart_catches_each_rule(cudart):
    """The fake must fail the tests below on exactly the mistakes CUDA punishes."""
    import mmap

    m = mmap.mmap(-1, 1 << 16, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = torch.frombuffer(m, dtype=torch.uint8).data_ptr()
    assert cudart.cudaHostRegister(address, 1 << 16, 3) == 0
    assert cudart.cudaHostRegister(address + 4096, 4096, 3) != 0
    cudart.pageable_copy(torch.frombuffer(m, dtype=torch.uint8)[100:200])
    assert len(cudart.violations) == 2
    cudart.ranges.clear()
    cudart.violations.clear()
    assert cudart.cudaHostUnregister(address) != 0 and len(cudart.violations) == 1


def test_models_built_and_dropped_leave_no_stale_registration(cudart):
    """Build and drop 20 models, each registering its cold banks, then copy large pageable buffers:
    every registration was undone before its memory was unmapped, and no freed range stays registered."""
    import gc

    info = _pinned_cpu()
    for i in range(20):
        model = _cheap_model(info, i)
        assert len(cudart.ranges) == 2 and all(b.cold_EB.data_ptr() in cudart.ranges for b in model.banks)
        x = torch.ones(3, 1024)
        model.step(x)
        del model, x
        cudart.check_mapped()
        assert cudart.violations == [] and cudart.ranges == {}, f"model {i}"
        # The next large pageable allocation tends to reuse the freed range: CUDA would refuse its copy
        # if that range were still registered.
        cudart.pageable_copy(torch.full((8, 1024, 1024), 1.0))
    gc.collect()
    cudart.check_mapped()
    assert cudart.registrations == 40 and cudart.ranges == {} and cudart.violations == []


def test_selftest_pairs_built_in_a_loop_leave_no_stale_registration(cudart):
    """What selftest's reference check does (8 models, dropped one after another)."""
    from hotsplit_runtime.selftest import check_reference

    assert check_reference(_pinned_cpu(), torch.float32).ok
    import gc

    gc.collect()
    cudart.check_mapped()
    assert cudart.registrations >= 8 and cudart.ranges == {} and cudart.violations == []


def test_a_failed_build_leaves_no_registration(cudart):
    """An exception after the cold bank was registered (weights of the wrong shape) releases it."""
    from hotsplit_runtime.bank import ExpertBank

    w13 = torch.zeros(4, 8, 16)
    with pytest.raises(RuntimeError):
        ExpertBank(w13, torch.zeros(4, 16, 5), np.zeros(4, dtype=bool), _pinned_cpu(),
                   PinnedAllocator(pin=True, numa=numa_policy_for("off", None)))
    assert cudart.registrations == 1
    import gc

    gc.collect()  # the traceback's frames held the bank
    assert cudart.ranges == {} and cudart.violations == []


def test_pages_dropped_during_a_graph_capture_are_released_after_it(cudart, monkeypatch):
    from hotsplit_probes import hostmem

    pages = hostmem.HostPages(1 << 16, cudart=cudart)
    address = pages.address
    monkeypatch.setattr(hostmem, "_capturing", lambda: True)
    del pages  # no synchronisation or unregistration inside a capture
    assert address in cudart.ranges and _is_mapped(address, 1 << 16)
    monkeypatch.setattr(hostmem, "_capturing", lambda: False)
    assert hostmem.release_deferred() == 1
    assert cudart.ranges == {} and cudart.violations == [] and not _is_mapped(address, 1 << 16)


def test_a_device_view_keeps_the_pages_alive(cudart, monkeypatch):
    """A zero-copy view outliving every host tensor still reads mapped, registered memory."""
    from hotsplit_probes import hostmem

    seen = []
    monkeypatch.setattr(torch, "as_tensor", lambda obj, device: seen.append(obj) or torch.empty(0))
    pages = hostmem.HostPages(1 << 16, cudart=cudart)
    address = pages.address
    with pytest.raises(RuntimeError, match="copied"):  # the stand-in tensor is not at the address
        pages.device_view(torch, "cuda")
    (interface,) = seen
    del pages
    assert address in cudart.ranges  # the interface object torch keeps holds the owner
    del interface, seen[:]
    assert cudart.ranges == {} and cudart.violations == []


def test_registrations_alive_at_exit_are_undone(tmp_path):
    """The process ends with a registered range still in use: it is unregistered at exit."""
    import subprocess

    log = tmp_path / "calls.txt"
    code = f"""
import torch
from hotsplit_probes import hostmem

class Cudart:
    def cudaHostRegister(self, address, size, flags):
        return 0
    def cudaHostUnregister(self, address):
        open({str(log)!r}, "a").write(f"unregister {{address}}\\n")
        return 0

pages = hostmem.HostPages(1 << 16, cudart=Cudart())
keep = pages.array()
open({str(log)!r}, "w").write(f"register {{pages.address}}\\n")
"""
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": ""})
    lines = log.read_text().split()
    assert lines[0] == "register" and lines[2] == "unregister" and lines[1] == lines[3]


def test_graph_capture_then_frees_the_host_memory_dropped_during_it(fake, monkeypatch):
    """Pages released while a step was being captured are unregistered and freed right after."""
    import contextlib

    from hotsplit_runtime import engine as engine_mod
    from hotsplit_runtime.from_recipe import prepare_run

    from tests.runtime.test_runtime_engine import knobs, tiny

    r = tiny()
    p = prepare_run(r, knobs(r, dynamic=0, dyn_steps=10), steps=4)
    calls = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream(fake, "side"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: SimpleNamespace(replay=lambda: None))
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext(calls.append("capture")))
    monkeypatch.setattr(engine_mod, "release_deferred", lambda: calls.append("release_deferred"))
    p.engine._capture(None)
    assert calls == ["capture", "release_deferred"]
