"""The full-size side-by-side benchmark's parts on the CPU: the grouped_mm peer against a plain
per-expert loop, the bytes a step reads, the targets, and rows that fail one at a time."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest
import torch
from hotsplit_runtime.device import choose_device
from hotsplit_runtime.moe import MoEGeometry, grouped_experts

from tests.conftest import load_benchmark
from tests.runtime.reference import dense_reference

fullsize = load_benchmark("fullsize")
torch.set_num_threads(1)  # as tune_cpu_threads does for the CPU path: tiny matmuls, a busy machine
CPU = choose_device("cpu")
TINY = fullsize.FullSizeModel("tiny", MoEGeometry(hidden=32, inter=16, num_experts=8, top_k=2, shared_inter=0,
                                                  router="softmax"), 2, None)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("seed", range(3))
def test_grouped_mm_peer_equals_a_per_expert_loop(dtype, tol, seed):
    g = torch.Generator().manual_seed(seed)
    T, K, E, H, inter = 11, 3, 6, 32, 16
    x = torch.randn(T, H, generator=g).to(dtype)
    ids = torch.rand(T, E, generator=g).topk(K, dim=-1).indices
    ids[0] = torch.tensor([5, 4, 3])  # experts out of order within a token
    ids[1:, 0] = 5  # one expert chosen by most tokens, some experts by none
    w = torch.rand(T, K, generator=g)
    w13 = (torch.randn(E, 2 * inter, H, generator=g) / H ** 0.5).to(dtype)
    w2 = (torch.randn(E, H, inter, generator=g) / inter ** 0.5).to(dtype)
    got = fullsize.grouped_mm_experts(x, ids, w, w13, w2)
    want = grouped_experts(x, ids, w, lambda e: (w13[e], w2[e]), E)
    assert got.dtype == dtype and got.shape == (T, H)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(got.float(), dense_reference(x, ids, w, w13, w2).float(), atol=tol, rtol=tol)


def test_read_bytes_counts_each_distinct_expert_of_each_layer_once():
    ids = torch.tensor([[[0, 1], [1, 2], [0, 2]], [[3, 3], [3, 3], [3, 3]]])  # layer 0: 0,1,2; layer 1: 3
    hot = np.array([[True, False, False, False], [False, False, False, True]])
    assert fullsize.read_bytes(ids, hot, 100) == (400, 200)  # experts 1 and 2 of layer 0 are cold


def test_routing_picks_distinct_experts_per_token_and_is_deterministic():
    g = TINY.geom
    ids, w = fullsize.routing(g, 2, 5, torch.device("cpu"))
    assert ids.shape == w.shape == (2, 5, g.top_k)
    assert all(len(set(t)) == g.top_k for t in ids.reshape(-1, g.top_k).tolist())
    assert torch.equal(ids, fullsize.routing(g, 2, 5, torch.device("cpu"))[0])
    assert torch.allclose(w.sum(-1), torch.ones(2, 5))


def test_filled_fp8_weights_dequantise_to_the_peers_weight():
    from hotsplit_runtime.fp8 import RELEASE_FP8, dequantize_swiglu

    g = dataclasses.replace(TINY.geom, hidden=256, inter=160)  # a partial 128-block
    lw = fullsize.filled_layer(g, torch.float32, RELEASE_FP8)
    q = lw.stored
    w13, w2 = dequantize_swiglu(q.q13_EIH[0], q.s13_E2RC[0], q.q2_EHI[0], q.s2_ERC[0], q.fmt, torch.float32)
    assert bool((w13 == fullsize.WEIGHT).all()) and bool((w2 == fullsize.WEIGHT).all())
    assert lw.w13_EIH.stride() == (0, 0, 0)  # broadcast: no memory behind the stand-ins


def _rates(**kw):
    return fullsize.Rates(**{"d2d_gbps": 100.0, "zero_copy_gbps": 50.0, "zero_copy_source": "test",
                             "launch_ms": 0.01, "reasons": {}, **kw})


def test_targets_apply_where_the_issue_sets_them():
    rates = _rates()
    row = {"hot_fraction": 1.0, "batch": 32, "step_ms": 1.19, "peer_ms": 1.0, "cold_bytes": 0}
    assert fullsize.judge(row, rates) == {"peer": True}
    assert fullsize.judge({**row, "step_ms": 1.21}, rates) == {"peer": False}
    assert fullsize.judge({**row, "batch": 8}, rates) == {}
    cold = {"hot_fraction": 0.0, "batch": 8, "step_ms": 1.0, "cold_bytes": 1, "cold_gbps": 45.0}
    assert fullsize.judge(cold, rates) == {"cold": True}
    assert fullsize.judge({**cold, "cold_gbps": 44.9}, rates) == {"cold": False}
    one = {"hot_fraction": 0.25, "batch": 1, "step_ms": 1.51, "ideal_ms": 1.0, "cold_bytes": 1, "cold_gbps": 1.0}
    assert fullsize.judge(one, rates) == {"batch1": True}  # 1.5 x 1.0 + 0.01 launch
    assert fullsize.judge({**one, "step_ms": 1.52}, rates) == {"batch1": False}
    assert fullsize.judge(one, _rates(launch_ms=None)) == {}  # not measured: not judged


def test_rows_on_the_cpu_have_every_column_and_hotsplit_equals_the_peer():
    rates = fullsize.measure_rates(CPU, d2d_bytes=1 << 20)
    desc, rows = fullsize.model_rows(TINY, CPU, rates, batches=(1, 4), hot_fractions=(1.0, 0.0), budget_ms=5)
    assert [(r["batch"], r["hot_fraction"]) for r in rows] == [(1, 1.0), (1, 0.0), (4, 1.0), (4, 0.0)]
    eb = desc["expert_bytes"]
    assert eb == 3 * 32 * 16 * 4 and desc["peer_expert_bytes"] == eb
    for r in rows:
        assert "error" not in r, r
        assert r["step_ms"] > 0 and r["peer_ms"] > 0 and r["graph"] == "eager"
        assert r["read_bytes"] % eb == 0 and r["read_bytes"] <= 2 * r["batch"] * 2 * eb
        assert r["cold_bytes"] == (r["read_bytes"] if r["hot_fraction"] == 0.0 else 0)
        assert r["hit_rate"] == r["hot_fraction"]
        assert r["max_rel_diff"] < 1e-5  # the same weights, routing and input on both sides
    assert rates.zero_copy_gbps is None and "zero_copy_gbps" in rates.reasons  # no zero-copy on a CPU


def test_a_row_that_raises_is_that_rows_error_and_the_others_are_measured(monkeypatch):
    real = fullsize.measure_row

    def flaky(model, peer, spec, batch, rates, budget_ms):
        if batch == 4 and model.hot_LE().all():
            raise torch.AcceleratorError("CUDA error: out of memory\nmore")
        return real(model, peer, spec, batch, rates, budget_ms)

    monkeypatch.setattr(fullsize, "measure_row", flaky)
    _, rows = fullsize.model_rows(TINY, CPU, _rates(), batches=(1, 4), hot_fractions=(1.0, 0.0), budget_ms=5)
    errors = [r for r in rows if "error" in r]
    assert len(rows) == 4 and len(errors) == 1
    assert errors[0]["batch"] == 4 and errors[0]["hot_fraction"] == 1.0
    assert errors[0]["error"] == "AcceleratorError: CUDA error: out of memory"


def test_a_failing_peer_leaves_hotsplits_figures(monkeypatch):
    monkeypatch.setattr(fullsize, "peer_step", lambda *a: (_ for _ in ()).throw(RuntimeError("no kernel")))
    _, rows = fullsize.model_rows(TINY, CPU, _rates(), batches=(1,), hot_fractions=(1.0,), budget_ms=5)
    assert rows[0]["step_ms"] > 0 and rows[0]["peer_error"] == "RuntimeError: no kernel"
    assert "peer_ms" not in rows[0]


def test_a_model_that_cannot_be_built_errors_every_row_of_it_only(monkeypatch):
    real = fullsize.filled_layer

    def filled(g, dtype, fp8):
        if g.num_experts == 4:
            raise MemoryError("cannot allocate the cold bank")
        return real(g, dtype, fp8)

    monkeypatch.setattr(fullsize, "filled_layer", filled)
    bad = dataclasses.replace(TINY, name="bad", geom=dataclasses.replace(TINY.geom, num_experts=4))
    doc = fullsize.full_size_doc(CPU, models=(bad, TINY), batches=(1,), hot_fractions=(1.0, 0.0), budget_ms=5)
    assert doc["errors"] == 2 and doc["models"][0]["error"] == "MemoryError: cannot allocate the cold bank"
    assert [("error" in r, r["model"]) for r in doc["rows"]] == [(True, "bad"), (True, "bad"), (False, "tiny"),
                                                                 (False, "tiny")]
    lines = fullsize.table_lines(doc)
    assert any(line.startswith("| bad | 1 | 100% | error: setup: MemoryError") for line in lines)
    assert sum(line.startswith("| tiny |") for line in lines) == 2
    json.dumps(doc)  # plain data


def _bench_runtime(monkeypatch=None):
    """bench_runtime.py, importing the `fullsize` these tests patch when `monkeypatch` is given."""
    if monkeypatch is not None:
        monkeypatch.setitem(sys.modules, "fullsize", fullsize)
    return load_benchmark("bench_runtime")


def test_full_size_on_a_cpu_refuses_in_one_line(capsys):
    bench = _bench_runtime()
    with pytest.raises(SystemExit) as exc:
        bench.main(["--full-size", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: --full-size needs a CUDA GPU")
    assert "--scale" in err  # what to do instead


def test_bench_rows_are_isolated_and_the_json_always_printed(capsys, monkeypatch):
    bench = _bench_runtime()
    real = bench.step_time_ratio

    def flaky(info, dtype, batch, hot, **kw):
        if batch == 8 and hot == 0.5:
            raise RuntimeError("CUDA error: invalid argument\nCUDA kernel errors might be reported later")
        return real(info, dtype, batch, hot, **kw)

    monkeypatch.setattr(bench, "step_time_ratio", flaky)
    code = bench.main(["--json", "--reps", "1", "--device", "cpu", "--layers", "1"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and len(doc["rows"]) == 9
    bad = [r for r in doc["rows"] if "error" in r]
    assert bad == [{"batch": 8, "hot_fraction": 0.5, "error": "RuntimeError: CUDA error: invalid argument"}]
    assert all(r["runtime_ms"] > 0 for r in doc["rows"] if "error" not in r)


def test_bench_full_size_scaled_runs_on_a_cpu_and_prints_the_table(capsys, monkeypatch):
    bench = _bench_runtime(monkeypatch)
    monkeypatch.setattr(fullsize, "FULL_SIZE_MODELS", (TINY,))
    monkeypatch.setattr(fullsize, "BATCHES", (1, 2))
    code = bench.main(["--full-size", "--scale", "0.5", "--device", "cpu", "--budget-ms", "5"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "| tiny | 1 | 100% |" in out and "| tiny | 2 | 0% |" in out and "target peer:" in out


def _platform(tmp_path, zero_copy_gbps):
    path = tmp_path / "platform.json"
    path.write_text(json.dumps({
        "schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z",
        "host": {"numa_nodes": [{}], "copy_gbps": 9.5, "mem_available_bytes": 100},
        "gpus": [{"index": 0, "cuda_index": 0, "name": "g", "summary": {"zero_copy_read_gbps": zero_copy_gbps}}],
        "reasons": []}))
    return path


def test_full_size_compares_cold_reads_with_the_probes_zero_copy_read(capsys, monkeypatch, tmp_path):
    bench = _bench_runtime(monkeypatch)
    monkeypatch.setattr(fullsize, "FULL_SIZE_MODELS", (TINY,))
    monkeypatch.setattr(fullsize, "BATCHES", (1,))
    code = bench.main(["--full-size", "--scale", "0.5", "--device", "cpu", "--budget-ms", "5", "--json",
                       "--platform", str(_platform(tmp_path, 51.1))])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["zero_copy_gbps"] == 51.1 and doc["zero_copy_source"].startswith("hotsplit probe")
    cold = next(r for r in doc["rows"] if r["hot_fraction"] == 0.0)
    assert cold["cold_vs_zero_copy"] == pytest.approx(cold["cold_gbps"] / 51.1)
    assert "cold" in cold["targets"]


def test_full_size_refuses_a_bad_platform_file_in_one_line(capsys, tmp_path):
    bench = _bench_runtime()
    path = tmp_path / "platform.json"
    path.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--full-size", "--scale", "0.5", "--device", "cpu", "--platform", str(path)])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1
