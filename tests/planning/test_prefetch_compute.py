"""Prefetch priced with the probe's GPU compute rate: platform.json's `compute`, a layer's compute
per decode step, and `plan --platform` planning staging slots where copies hide under compute
and none where a batch-1 step is link-bound, saying why either way."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import InputFileError
from hotsplit_cli.core.jsonio import write_json_atomic
from hotsplit_cli.hotset.layer_compute import layer_compute_ms
from hotsplit_cli.hotset.lookahead import LayerLookahead, Lookahead
from hotsplit_cli.hotset.prefetch_plan import NO_LOOKAHEAD, TRACE_ON_A_TRACE, predictor_for
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.hist import load_hist, save_hist
from tests.conftest import make_hist


def platform_doc(read_gbps: float, compute: dict | None, mem_gib: int = 80) -> dict:
    gpu = {"index": 0, "mem_free_bytes": mem_gib << 30, "mem_total_bytes": mem_gib << 30,
           "summary": {"zero_copy_read_gbps": read_gbps, "h2d_gbps": read_gbps}}
    if compute is not None:
        gpu["compute"] = compute
    return {"schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z",
            "host": {"numa_nodes": [{}], "copy_gbps": 10.0, "mem_available_bytes": None}, "gpus": [gpu],
            "reasons": []}


def compute_at(gbps_by_tokens: dict[int, float]) -> dict:
    """A `compute` block as the probe writes it (probes/gpu_compute.py)."""
    return {"method": "fixed rates", "dtype": "bfloat16", "weight_bytes": 128 << 20,
            "by_tokens": [[t, {"median_gbps": g, "spread_gbps": 0.0}] for t, g in gbps_by_tokens.items()]}


def lookahead_block(layers, tokens=100, guesses=12, useful_share=0.8, top_k=6) -> dict:
    """A measured lookahead with `useful_share` of each layer's routed experts guessed."""
    routed = tokens * top_k
    rows = tuple(LayerLookahead(b, a, tokens, tokens * guesses, int(useful_share * routed), routed)
                 for a, b in zip(layers, layers[1:], strict=False))
    return Lookahead("tests", guesses, rows).to_doc()


def test_the_compute_rate_is_read_and_interpolated_between_token_counts(tmp_path):
    path = write_json_atomic(tmp_path / "p.json", platform_doc(25.0, compute_at({1: 1000.0, 4: 1000.0, 64: 250.0})))
    gpu = load_platform(path).gpus[0]
    assert gpu.compute_points == ((1, 1000.0), (4, 1000.0), (64, 250.0))
    assert gpu.compute_gbps(1) == pytest.approx(1000.0) and gpu.compute_gbps(0.5) == pytest.approx(1000.0)
    assert gpu.compute_gbps(16) == pytest.approx(500.0)  # halfway in log-log between 4 and 64
    assert gpu.compute_gbps(1024) == pytest.approx(250.0)  # the last point beyond it
    older = load_platform(write_json_atomic(tmp_path / "o.json", platform_doc(25.0, None))).gpus[0]
    assert older.compute_points == () and older.compute_gbps(1) is None


@pytest.mark.parametrize("compute, message", [
    ({"by_tokens": []}, "gpus[0].compute.by_tokens: must be a non-empty list of [tokens, measurement]"),
    (compute_at({1: -3.0}), "gpus[0].compute.by_tokens[0].median_gbps: must be finite and >= 0, got -3.0"),
    (compute_at({4: 10.0, 1: 20.0}), "gpus[0].compute.by_tokens[1]: tokens must rise from 1 and GB/s be > 0"),
    (compute_at({1: 0.0}), "gpus[0].compute.by_tokens[0]: tokens must rise from 1 and GB/s be > 0"),
    ([1, 2], "gpus[0].compute: must be an object, got list"),
])
def test_a_bad_compute_rate_is_refused_in_one_line_and_plan_writes_nothing(cli, tiny_hist, tmp_path, compute,
                                                                            message):
    path = write_json_atomic(tmp_path / "p.json", platform_doc(25.0, compute))
    with pytest.raises(InputFileError, match=None) as err:
        load_platform(path)
    assert message in str(err.value)
    out = tmp_path / "plan.json"
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", path, "-o", out)
    assert r.code != 0 and len(r.err.strip().splitlines()) == 1 and message in r.err
    assert not out.exists()


def test_a_layers_compute_by_hand(tmp_path):
    """tiny: dense weights over 5 layers at every token's rate; the hot experts a step touches
    at the rate of their tokens per expert."""
    rec = load_recipe("tiny")
    hist = make_hist(np.array([[30.0, 10.0, 0.0, 0.0]] * 4), layers=(1, 2, 3, 4), top_k=1)
    hot = np.array([[True, False, True, False]] * 4)
    path = write_json_atomic(tmp_path / "p.json", platform_doc(25.0, compute_at({1: 100.0, 2: 50.0})))
    gpu = load_platform(path).gpus[0]
    got = layer_compute_ms(gpu, rec, hist, hot, 1000, [1, 2])
    dense = rec.model.dense_weight_bytes / 5
    # batch 1: expert 0 is touched 0.75 of steps (expert 2 never); 1 token per touched expert
    assert got[0] == pytest.approx(dense / 100e6 + 0.75 * 1000 / 100e6)
    # batch 2: expert 0 touched 1 - 0.25^2, expert 1 1 - 0.75^2 of steps; 2 / (their sum) tokens each
    touched = 1 - 0.25 ** 2 + 1 - 0.75 ** 2
    rate = math.exp(np.interp(math.log(2 / touched), [0, math.log(2)], [math.log(100), math.log(50)]))
    assert got[1] == pytest.approx(dense / 50e6 + (1 - 0.25 ** 2) * 1000 / rate / 1e6)


def test_auto_takes_the_only_predictor_a_plan_can_judge_out_of_sample():
    look = Lookahead("m", 4, (LayerLookahead(2, 1, 10, 40, 15, 20),))
    for mode in ("lookahead", "auto", "off"):
        knobs = resolve_knobs({"prefetch": mode}, {})
        assert predictor_for(look, knobs) == (look.measured(), NO_LOOKAHEAD)
    assert predictor_for(look, resolve_knobs({"prefetch": "trace"}, {})) == (None, TRACE_ON_A_TRACE)
    assert predictor_for(None, resolve_knobs({"prefetch": "auto"}, {}))[1] == (
        f"prefetch auto: {NO_LOOKAHEAD}, and {TRACE_ON_A_TRACE}")


def _with_lookahead(path, **kw):
    hist = load_hist(path)
    save_hist(path, dataclasses.replace(hist, blocks={"lookahead": lookahead_block(hist.layers, top_k=hist.top_k,
                                                                                     **kw)}))
    return path


def test_slots_are_planned_where_compute_is_slower_than_the_copies(cli, tiny_hist, tmp_path):
    """tiny at 25 GB/s on the link (a 192 KiB expert copies in 8 us), a GPU computing through its
    weights at 50 GB/s: a layer computes for 0.07-0.11 ms, which hides about 9 copies, and a
    lookahead recall of 0.8 at top_k guesses makes them pay."""
    platform = write_json_atomic(tmp_path / "p.json", platform_doc(25.0, compute_at({1: 50.0, 256: 50.0})))
    r = cli("plan", _with_lookahead(tiny_hist, guesses=4), "--recipe", "tiny", "--platform", platform, "--json")
    assert r.code == 0, r.err
    pre = json.loads(r.out)["prefetch"]
    assert pre["slots"] > 0 and pre["reason"].startswith(f"{pre['slots']} staging slots: ")
    assert "at recall 0.80 and 0.25 wasted copies per useful one" in pre["reason"]
    steps = pre["steps"]
    assert sum(s["with_ms"] for s in steps) < 0.99 * sum(s["without_ms"] for s in steps)
    assert all(0.05 < s["compute_ms"] < 0.2 for s in steps)
    # the same plan with the compute per layer 100x faster: nothing hides, no slot
    fast = write_json_atomic(tmp_path / "f.json", platform_doc(25.0, compute_at({1: 5000.0, 256: 5000.0})))
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", fast, "--json")
    assert r.code == 0 and json.loads(r.out)["prefetch"]["slots"] == 0


def test_a_link_bound_batch_one_step_on_a_shipped_recipe_plans_no_slots_and_says_why(cli, tmp_path):
    """deepseek-v2-lite (recipes/deepseek-v2-lite.yaml) on its RTX 4090: experts read over PCIe 4.0
    x16 at 25 GB/s (0.69 ms each), weights computed through at its 1 TB/s of GDDR6X, traffic
    spread over the experts (a quarter of it cold): a layer computes for 0.17 ms at batch 1 and
    reads 1.5 cold experts (1.0 ms), so a staged copy hides under a quarter of its time, and a wrong guess
    (1.5 per right one at recall 0.8) costs what a right one saves: no slot at batch 1, and none
    saves 1% over batches 1..256."""
    rec = load_recipe("deepseek-v2-lite")
    rng = np.random.default_rng(0)
    counts = rng.integers(500, 1500, size=(26, 64)).astype(np.float64)
    hist = tmp_path / "h.json"
    save_hist(hist, make_hist(counts, layers=rec.model.moe_layer_ids, top_k=6, model=rec.model.name))
    platform = write_json_atomic(tmp_path / "p.json", platform_doc(25.0, compute_at({1: 1000.0, 64: 1000.0,
                                                                                       256: 400.0}), mem_gib=24))
    r = cli("plan", _with_lookahead(hist), "--recipe", "deepseek-v2-lite", "--platform", platform, "--json")
    assert r.code == 0, r.err
    pre = json.loads(r.out)["prefetch"]
    read_ms = expert_bytes_per_rank(rec) / 25e6
    first = pre["steps"][0]
    assert pre["slots"] == 0 and first["batch"] == 1 and first["best_slots"] == 0
    assert first["compute_ms"] < read_ms / 3 < first["without_ms"] / 26 / 3  # link-bound
    assert pre["reason"].startswith(f"0 staging slots: no slot count saves 1% of step time: a layer computes for "
                                    f"{first['compute_ms']:.3f} ms at batch 1")
    assert all(s["with_ms"] == s["without_ms"] for s in pre["steps"])


def test_an_older_platform_file_still_plans_and_names_the_probe(cli, tiny_hist, tmp_path):
    platform = write_json_atomic(tmp_path / "p.json", platform_doc(25.0, None))
    r = cli("plan", _with_lookahead(tiny_hist), "--recipe", "tiny", "--platform", platform)
    assert r.code == 0, r.err
    assert ("prefetch: 0 staging slots: compute per layer is not measured, so no copy is known to hide under it "
            "(`hotsplit probe -o platform.json` on the GPU machine measures it; older probes did not)") in r.out
