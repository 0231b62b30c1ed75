"""benchmarks/bench_prefetch_gpu.py on the CPU: `--dry` runs the GPU code path tiny (batch 1 and
32, prefetch off and trace side by side); the overlap's plumbing runs against the recording CUDA
fakes (each layer's staging timed into the step it served); bad arguments are refused in one
line with nothing on stdout."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.traffic.trace import Trace
from tests.conftest import load_benchmark
from tests.runtime.test_cuda_paths_fake import FakeStream, fake  # noqa: F401 - fake: a fixture

bench = load_benchmark("bench_prefetch_gpu")
torch.set_num_threads(1)


def test_dry_run_times_both_batches_with_prefetch_off_and_trace(capsys):
    assert bench.main(["--dry", "--rounds", "2", "--steps", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert (doc["recipe"], doc["device"], doc["layers"], doc["experts"]) == ("tiny", "cpu", 4, 32)
    assert doc["traffic"].startswith("synthetic Zipf(1.1) trace")
    assert doc["prefetch"] == {"slots": 4, "pool": "shared", "guesses": 12}  # the knobs' defaults
    assert [(r["batch"], r["graph"]) for r in doc["rows"]] == [(1, False), (32, False)]  # no graphs on a CPU
    for r in doc["rows"]:
        assert len(r["off_ms"]) == len(r["trace_ms"]) == 2 and min(r["off_ms"] + r["trace_ms"]) > 0
        assert r["ratio"] == pytest.approx(np.median(np.array(r["trace_ms"]) / np.array(r["off_ms"])))
        assert r["ratio_p10"] <= r["ratio"] <= r["ratio_p90"]
        assert "overlap" not in r
    assert doc["overlap_reason"] == bench.NO_OVERLAP
    lines = bench.table_lines(doc)
    assert lines[0].startswith("prefetch timing: tiny at scale 0.25, 4 MoE layers x 32 experts, top-4, 25% hot, on cpu")
    assert lines[2].split()[:2] == ["1", "eager"] and lines[3].split()[:2] == ["32", "eager"]
    assert lines[-1] == f"    {bench.NO_OVERLAP}"
    # each row on stderr as it is measured: what a run stopped by its time limit still shows
    assert err.splitlines() == [f"measured: {lines[2].strip()}", f"measured: {lines[3].strip()}"]


def test_a_batch_that_fails_is_its_rows_error_and_the_next_still_runs(monkeypatch, capsys):
    built = bench.Timed.__init__

    def fail_batch_1(self, recipe, env, trace, fit):
        if trace.name.startswith("b1."):
            raise RuntimeError("CUDA error: out of memory\nmore")
        built(self, recipe, env, trace, fit)

    monkeypatch.setattr(bench.Timed, "__init__", fail_batch_1)
    assert bench.main(["--dry", "--rounds", "1", "--steps", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "      1 -      error: RuntimeError: CUDA error: out of memory"
    assert out[3].split()[:2] == ["32", "eager"]


def test_rebatched_keeps_the_tokens_in_their_recorded_order():
    ids = np.arange(2 * 3 * 4 * 2).reshape(2, 3, 4, 2)  # [S, L, T, K]
    trace = Trace(ids, (1, 2, 3))
    one = bench.rebatched(trace, 1, 2)
    assert one.topk_ids_SLTK.shape == (8, 2, 1, 2) and one.layers == (1, 2)
    assert np.array_equal(one.topk_ids_SLTK[5, :, 0], ids[1, :2, 1])  # token 5 = step 1, token 1
    three = bench.rebatched(trace, 3, 3)
    assert three.topk_ids_SLTK.shape == (2, 3, 3, 2)  # 8 tokens: two steps of 3, the last 2 dropped
    assert np.array_equal(three.topk_ids_SLTK[1, :, 0], ids[0, :, 3])


def test_overlap_figures_share_of_the_copy_time_hidden():
    def timing(copy, exposed):
        return SimpleNamespace(copy_ms=lambda: copy, exposed_ms=lambda: exposed)

    def span(ms):
        return SimpleNamespace(elapsed_time=lambda end: ms), None

    got = bench.overlap_figures([span(5.0), span(4.0)], [[timing(1.0, 0.5), timing(1.0, 0.0)], [timing(2.0, 1.5)]])
    assert got["copy_ms"] == [2.0, 2.0] and got["exposed_ms"] == [0.5, 1.5]
    assert got["compute_ms"] == [4.5, 2.5]  # the span less the wait
    assert got["hidden_fraction"] == pytest.approx(0.5) and got["layers_staged_per_step"] == 1.5
    assert bench.overlap_figures([span(1.0)], [[]])["hidden_fraction"] is None  # nothing copied
    row = {"batch": 32, "graph": True, "off_ms": [1.0], "trace_ms": [2.0], "ratio": 2.0, "ratio_p10": 2.0,
           "ratio_p90": 2.0, "overlap": got}
    assert bench.progress_line(row) == f"measured: {bench.row_line(row).strip()}; 50% of copies hidden"
    assert bench.progress_line(row).split()[1:5] == ["32", "graph", "1.000", "(1.000-1.000)"]


@pytest.mark.parametrize("graph", [False, True])
def test_timed_steps_give_each_step_its_own_layers_staging(fake, tmp_path, monkeypatch, graph):  # noqa: F811
    """Eager steps publish each layer's staging as it runs; a graph step publishes them all before
    its replay (the replay: the step run again, as in tests/runtime/test_prefetch_fake_cuda.py)."""
    import hotsplit_runtime.engine as engine

    def capture(step, device):
        out = step()
        return SimpleNamespace(replay=lambda: out.copy_(step())), out

    monkeypatch.setattr(engine, "capture_graph", capture)
    monkeypatch.setattr(engine, "release_deferred", lambda: None)
    recipe = bench.narrowed(load_recipe("tiny"), 4, "cpu", 0.25)
    trace, fit, _ = bench.traffic(recipe, "synthetic", 8, 10, tmp_path)
    env = {"HOTSPLIT_HOT_GIB": "0.003", "HOTSPLIT_DYNAMIC": "0", "HOTSPLIT_PREFETCH": "trace"}
    t = bench.Timed(recipe, env, trace, fit)
    t.engine.use_graph = graph
    model = t.engine.model
    for b in model.banks:
        b.swap_stream = FakeStream(fake, "swap")  # every bank's CUDA branch
    staged_layers, stage = [], model.stage

    def counting_stage(staged_LE):
        staged_layers.append(int(staged_LE.any(axis=1).sum()))
        stage(staged_LE)

    model.stage = counting_stage
    fake.log.clear()
    spans, per_step = bench.timed_steps(t, 4)
    assert [len(xs) for xs in per_step] == staged_layers and sum(staged_layers) > 0
    assert spans[-1][1].synchronized and all(b.staging_times is None for b in model.banks)
    for event in [e for xs in per_step for x in xs for e in (x.start, x.ready, x.arrive, x.resume)] + [
            e for s in spans for e in s]:
        event.landed = True  # what the synchronise did on a GPU
    figures = bench.overlap_figures(spans, per_step)
    # The fake clock ticks 1.5 ms per record: start and ready are one record apart, arrive and resume too.
    assert figures["copy_ms"] == figures["exposed_ms"] == [1.5 * n for n in staged_layers]
    assert figures["hidden_fraction"] == 0.0 and figures["steps"] == 4
    assert (t.engine.graph is not None) == graph


@pytest.mark.parametrize(("argv", "message"), [
    (["--dry", "--layers", "1"], "--layers takes 2..4 for tiny (staging needs a layer before the one it fills), got 1"),
    (["--dry", "--hot", "1.5"], "--hot takes a fraction in (0, 1) and --scale one in (0, 1], got 1.5 and 0.25"),
    (["--dry", "--rounds", "0"], "--rounds, --steps and --overlap-steps take 1 or more"),
    (["--dry", "--traffic", "esft"], "--traffic esft needs the deepseek-v2-lite recipe and the ESFT traces in "),
    (["--dry", "--recipe", "no-such-recipe"], "no-such-recipe"),
    ([], "this benchmark times a GPU and torch sees none; --dry runs the same code on the CPU, tiny"),
])
def test_bad_arguments_are_refused_in_one_line_and_nothing_is_measured(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "measure", lambda args: pytest.fail("measured after a refusal"))
    assert bench.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_step_that_fails_while_timed_leaves_no_bank_timing(fake):  # noqa: F811
    banks = [SimpleNamespace(staging_times=None) for _ in range(2)]

    def fail(n):
        raise RuntimeError("CUDA error: an illegal memory access")

    t = SimpleNamespace(engine=SimpleNamespace(model=SimpleNamespace(banks=banks)), steps=fail)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        bench.timed_steps(t, 2)
    assert [b.staging_times for b in banks] == [None, None]
