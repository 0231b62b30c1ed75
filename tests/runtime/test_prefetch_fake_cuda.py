"""The staging slots' CUDA branch on the CPU, against the recording fakes of
tests/runtime/test_cuda_paths_fake.py: the copies go on the swap stream after it waits for the
compute stream, and no read ever sees a staging row before the compute stream has waited on
the copies' event."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hotsplit_runtime.from_recipe import prepare_run

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace
from tests.runtime.test_cuda_paths_fake import FakeStream, fake, make_bank  # noqa: F401 - fake: a fixture

torch.set_num_threads(1)


def test_staging_copies_wait_for_compute_and_publish_after_their_event(fake):  # noqa: F811
    bank = make_bank(fake)  # experts 0, 1, 2 hot in slots 0..2
    bank.reserve_staging(2)
    fake.log.clear()
    bank.stage([5, 6])
    assert [e[0] for e in fake.log] == ["wait_stream", "record"]
    assert fake.log[0][1:3] == ("swap", "compute") and fake.log[1][1] == "swap"
    assert torch.equal(bank.hot_SB[3], bank.cold_EB[5]) and torch.equal(bank.hot_SB[4], bank.cold_EB[6])
    assert bank.expert2slot_E[5] == -1 and bank.served_E[6] == -1, "mapped before its copy's event"
    event = bank._staged_ready
    bank.publish_staged()
    (wait,) = fake.entries("wait_event")
    _, waiter, waited, map_then = wait
    assert waiter == "compute" and waited is event
    assert map_then[5] == map_then[6] == -1, "the map entries must be written after the compute stream waits"
    assert bank.expert2slot_E[5] == 3 and bank.expert2slot_E[6] == 4 and list(bank.served_E[[5, 6]]) == [3, 4]
    bank.publish_staged()  # a second call (a graph run's) publishes nothing again
    assert len(fake.entries("wait_event")) == 1
    bank.unstage()
    assert bank.expert2slot_E[5] == bank.expert2slot_E[6] == -1 and bank.staged == []
    assert np.array_equal(bank.expert2slot_E.numpy(), bank.table.expert2slot_E)


@pytest.mark.parametrize("experts", [[1], [4, 5, 6]])
def test_a_hot_expert_or_more_than_the_rows_is_never_staged(fake, experts):  # noqa: F811
    bank = make_bank(fake)
    bank.reserve_staging(2)
    with pytest.raises(ValueError, match="cannot stage"):
        bank.stage(experts)
    assert bank.staged == [] and not fake.entries("wait_stream")


@pytest.mark.parametrize("prefetch", ["trace", "lookahead"])
def test_no_layer_reads_a_staging_row_before_its_event(fake, tmp_path, prefetch):  # noqa: F811
    """Staged between steps (trace) or while the step runs, from the layer before's output
    (lookahead): either way a layer reads its staged experts only after waiting on their copies."""
    r = load_recipe("tiny")
    r = dataclasses.replace(r, run=dataclasses.replace(r.run, scale=0.25))
    m = r.model
    trace = save_trace(tmp_path / "t.npz", synthetic_trace(zipf_shares(4, 32, 1.2, 1), m.moe_layer_ids, 6, 8, 4,
                                                           seed=1))
    knobs = resolve_knobs(r.knobs, {"HOTSPLIT_PREFETCH": prefetch, "HOTSPLIT_PREFETCH_POOL": "layer",
                                    "HOTSPLIT_DYNAMIC": "0", "HOTSPLIT_HOT_GIB": "0.0035"})
    p = prepare_run(r, knobs, trace_path=trace)
    model = p.engine.model
    events, reads = {}, []
    for li, bank in enumerate(model.banks):
        bank.swap_stream = FakeStream(fake, "swap")  # the CUDA branch of every bank
        stage = bank.stage

        def recording_stage(experts, li=li, bank=bank, stage=stage):
            stage(experts)
            if bank.staged:
                events[li] = bank._staged_ready
        bank.stage = recording_stage
    compute = model.compute

    def recording_compute(x, ids, w, bank, counts):
        waited = [e[2] for e in fake.entries("wait_event")]
        reads.append((bank.staged, events.get(model.banks.index(bank)) in waited,
                      [int(bank.served_E[e]) for e in bank.staged]))
        return compute(x, ids, w, bank, counts)
    model.compute = recording_compute
    p.engine.run(p.steps)
    staged_reads = [r for r in reads if r[0]]
    assert len(staged_reads) >= 6  # every step staged something
    for _, waited, rows in staged_reads:
        assert waited, "a layer read its staging rows before waiting on their copies' event"
        assert min(rows) >= 0  # and read them from the rows


@pytest.mark.parametrize("prefetch", ["off", "trace"])
def test_a_graph_run_equals_an_eager_one_step_after_step(fake, tmp_path, monkeypatch, prefetch):  # noqa: F811
    """The CUDA-graph branch of the step loop on the CPU: capture records the step, each replay
    computes it again from the static routing buffers (filled by the pinned upload). Every step's
    output equals the eager run's, prefetch off and on (the upload once shadowed the staging step,
    so every step after the capture failed on a GPU)."""
    import hotsplit_runtime.engine as engine

    def capture(step, device):
        out = step()

        class Replay:
            def replay(self):
                out.copy_(step())
        return Replay(), out

    monkeypatch.setattr(engine, "capture_graph", capture)
    monkeypatch.setattr(engine, "release_deferred", lambda: None)
    r = load_recipe("tiny")
    r = dataclasses.replace(r, run=dataclasses.replace(r.run, scale=0.25))
    trace = save_trace(tmp_path / "t.npz", synthetic_trace(zipf_shares(4, 32, 1.2, 1), r.model.moe_layer_ids, 6, 8,
                                                           4, seed=1))
    knobs = resolve_knobs(r.knobs, {"HOTSPLIT_PREFETCH": prefetch, "HOTSPLIT_PREFETCH_POOL": "layer",
                                    "HOTSPLIT_DYNAMIC": "0", "HOTSPLIT_HOT_GIB": "0.0035"})
    outs = {}
    for graph in (False, True):
        p = prepare_run(r, knobs, trace_path=trace)
        e, outs[graph] = p.engine, []
        e.use_graph = graph
        for routed in e.source.steps():
            e.step(routed)
            outs[graph].append(e.out_TH.clone())
        assert e.step_count == 6 and (e.graph is not None) == graph
    assert all(torch.equal(a, b) for a, b in zip(outs[True], outs[False], strict=True))


def test_timed_staging_records_the_copies_and_the_wait_for_them(fake):  # noqa: F811
    """With `staging_times`, the copies are bracketed by timing events on the swap stream and the
    compute stream's wait by two on the compute stream; untimed staging records none of them."""
    bank = make_bank(fake)
    bank.reserve_staging(2)
    bank.stage([5])
    bank.publish_staged()
    assert [e[0] for e in fake.log if e[0] == "record"] == ["record"] and bank.staging_times is None
    bank.unstage()
    bank.staging_times = []
    fake.log.clear()
    bank.stage([5, 6])
    bank.publish_staged()
    assert [e[:2] for e in fake.log if e[0] != "wait_stream"] == [
        ("record", "swap"), ("record", "swap"), ("record", "compute"), ("wait_event", "compute"),
        ("record", "compute")]
    (t,) = bank.staging_times
    assert fake.entries("wait_event")[0][2] is t.ready
    assert t.start.stream.name == t.ready.stream.name == "swap"
    assert t.arrive.stream.name == t.resume.stream.name == "compute"
    t.ready.synchronize()
    t.resume.synchronize()
    assert t.copy_ms() == t.ready.t_ms - t.start.t_ms > 0
    assert t.exposed_ms() == t.resume.t_ms - t.arrive.t_ms > 0
    bank.publish_staged()  # published once: no second wait, no second record
    assert len(bank.staging_times) == 1
    bank.unstage()
    bank.stage([])  # nothing staged: nothing timed
    bank.publish_staged()
    assert len(bank.staging_times) == 1
