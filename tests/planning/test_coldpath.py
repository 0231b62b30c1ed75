"""The cold-path cost model and split rule (hotsplit_cli/hotset/coldpath.py)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.coldpath import ColdRates, predict_cold_paths, split_cold

MB = 1e6


def test_equal_rates_halve_the_bytes():
    rates = ColdRates(10.0, ((1, 10.0), (16, 10.0)))
    s = split_cold([MB] * 6, [1] * 6, rates)
    assert s.to_cpu_N.sum() == 3
    assert s.gpu_s == pytest.approx(3 * MB / 10e9) and s.cpu_s == pytest.approx(3 * MB / 10e9)


def test_no_cpu_rate_sends_nothing_to_the_cpu():
    for points in ((), ((1, 0.0), (16, 0.0))):
        s = split_cold([MB] * 4, [1] * 4, ColdRates(25.0, points))
        assert not s.to_cpu_N.any() and s.cpu_s == 0.0 and s.gpu_s == pytest.approx(4 * MB / 25e9)


def test_an_expert_with_many_tokens_goes_to_the_gpu():
    # The CPU streams 1-token experts as fast as the link, but is compute-bound at 64 tokens.
    rates = ColdRates(20.0, ((1, 20.0), (4, 12.0), (64, 2.0)))
    tokens = [1, 64, 1, 1]
    s = split_cold([MB] * 4, tokens, rates)
    assert not s.to_cpu_N[1] and s.to_cpu_N.sum() == 2  # two light experts each way, the heavy one on the GPU


def test_the_sync_cost_keeps_small_layers_on_the_gpu():
    rates = ColdRates(20.0, ((1, 20.0),), sync_ms=1.0)  # 1 ms per layer dwarfs 0.05 ms of reading
    assert not split_cold([MB], [1], rates).to_cpu_N.any()
    big = split_cold([100 * MB] * 4, [1] * 4, rates)  # 20 ms of reading: worth the 1 ms
    assert big.to_cpu_N.sum() == 2 and big.cpu_s == pytest.approx(2 * 100 * MB / 20e9 + 1e-3)


def test_the_cpus_layer_call_is_paid_once_per_layer_it_takes_part_in():
    """The CPU's grouped compute costs `layer_ms` per call beyond its experts: the cpu path pays it
    with the sync, the split weighs it like the sync, the gpu path never pays it."""
    plain = ColdRates(20.0, ((1, 20.0),), sync_ms=0.5)
    layered = ColdRates(20.0, ((1, 20.0),), sync_ms=0.5, layer_ms=0.25)
    cpu = split_cold([MB] * 2, [1, 1], layered, "cpu")
    assert cpu.cpu_s == pytest.approx(split_cold([MB] * 2, [1, 1], plain, "cpu").cpu_s + 0.25e-3)
    assert split_cold([MB] * 2, [1, 1], layered, "gpu").seconds == split_cold([MB] * 2, [1, 1], plain, "gpu").seconds
    # 8 x 5 MB: 2 ms of reading. With 0.5 ms of sync the CPU takes half; with 3 ms more per call it takes none.
    assert split_cold([5 * MB] * 8, [1] * 8, plain).to_cpu_N.sum() == 3
    assert not split_cold([5 * MB] * 8, [1] * 8, ColdRates(20.0, ((1, 20.0),), 0.5, layer_ms=3.0)).to_cpu_N.any()


def test_without_a_gpu_rate_split_gives_everything_to_the_cpu():
    s = split_cold([MB] * 3, [1] * 3, ColdRates(None, ((1, 5.0),)))
    assert s.to_cpu_N.all() and s.gpu_s == 0.0


def test_fixed_modes_and_bad_mode():
    rates = ColdRates(20.0, ((1, 20.0),), sync_ms=0.5)
    assert not split_cold([MB] * 2, [1, 1], rates, "gpu").to_cpu_N.any()
    cpu = split_cold([MB] * 2, [1, 1], rates, "cpu")
    assert cpu.to_cpu_N.all() and cpu.cpu_s == pytest.approx(2 * MB / 20e9 + 0.5e-3)
    empty = split_cold([], [], rates, "cpu")
    assert empty.seconds == 0.0 and empty.to_cpu_N.shape == (0,)
    with pytest.raises(UsageError, match="cold_path"):
        split_cold([MB], [1], rates, "tpu")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 32)), min_size=1, max_size=7),
       st.floats(1.0, 60.0), st.floats(0.5, 60.0), st.floats(0.0, 2.0))
def test_split_is_never_worse_than_one_path_and_near_the_best_partition(items, zc, cpu, sync_ms):
    bytes_N = np.array([b * MB for b, _ in items])
    tokens_N = np.array([t for _, t in items])
    rates = ColdRates(zc, ((1, cpu), (32, cpu / 4)), sync_ms)
    s = split_cold(bytes_N, tokens_N, rates)
    gpu, cpu_only = split_cold(bytes_N, tokens_N, rates, "gpu"), split_cold(bytes_N, tokens_N, rates, "cpu")
    assert s.seconds <= min(gpu.seconds, cpu_only.seconds) + 1e-12
    g, c = rates.gpu_seconds(bytes_N), rates.cpu_seconds(bytes_N, tokens_N)
    best = min(max(g[~m].sum(), c[m].sum() + (sync_ms / 1e3 if m.any() else 0.0))
               for m in (np.array(bits, dtype=bool) for bits in itertools.product([0, 1], repeat=len(items))))
    assert s.seconds <= best + max(g.max(), c.max()) + 1e-12  # within one expert of the exact optimum


def test_prediction_per_batch_picks_the_fastest_path():
    pi = np.full((2, 16), 2 / 16)  # top-2 of 16, uniform
    hot = np.zeros((2, 16), dtype=bool)
    hot[:, :8] = True
    rates = ColdRates(20.0, ((1, 20.0), (4, 5.0), (64, 5.0)))
    (one, many) = predict_cold_paths(pi, hot, int(MB), rates, [1, 64])
    # batch 1: each cold expert is read with p = 1/8, by one token: equal rates, so the split halves
    assert one.gpu_ms == pytest.approx(2 * 8 * MB / 8 / 20e9 * 1e3)
    assert one.split_ms == pytest.approx(one.gpu_ms / 2) and one.cpu_share == pytest.approx(0.5)
    assert one.fastest == "split"
    # batch 64: every cold expert is read (by ~8 tokens), where the CPU is 4x slower than the link:
    # one expert of 8 to the CPU (4 units) while the GPU reads 7
    assert many.cpu_ms == pytest.approx(4 * many.gpu_ms, rel=1e-3)
    assert many.split_ms == pytest.approx(many.gpu_ms * 7 / 8, rel=1e-3) and many.fastest == "split"
    assert many.cpu_share == pytest.approx(1 / 8, rel=1e-3)
    assert predict_cold_paths(pi, hot, int(MB), ColdRates(20.0, ()), [8])[0].fastest == "gpu"


def test_rates_come_from_the_probes_platform_file(tmp_path, gpu_sources):
    """platform.json as the probe writes it (fake GPUs and CPU rates) gives the cost model its rates."""
    from hotsplit_probes.platform import measure_platform, take_inventory

    from hotsplit_cli.config.platform_file import load_platform
    from hotsplit_cli.core.jsonio import write_json_atomic
    from hotsplit_cli.hotset.coldpath import rates_from_platform

    doc = measure_platform(take_inventory("quick", None, gpu_sources), gpu_sources).to_doc()
    doc["gpus"][1]["bandwidth"]["roundtrip_ms"] = 0.04
    doc["host"]["cpu_expert"][1]["handoff_ms"] = 0.01
    write_json_atomic(tmp_path / "platform.json", doc)
    plat = load_platform(tmp_path / "platform.json")
    rates, where = rates_from_platform(plat, gpu_index=1)  # GPU 1 sits on node 1
    assert rates.zero_copy_gbps == 40.0 and rates.sync_ms == pytest.approx(0.05)
    assert rates.cpu_points == ((1.0, 10.0), (4.0, 5.0), (16.0, 2.5))
    assert "zero-copy 40.0 GB/s" in where and "CPU 10.0 GB/s at 1 token" in where
    import dataclasses

    slower = dataclasses.replace(plat.gpus[0], zero_copy_read_gbps=30.0)  # GPU 0 reads slower: it bounds a step
    slowest, _ = rates_from_platform(dataclasses.replace(plat, gpus=(slower, *plat.gpus[1:])))
    assert slowest.zero_copy_gbps == 30.0
    # A file from an older probe, without the CPU expert rate: the CPU path is simply unavailable.
    del doc["host"]["cpu_expert"]
    write_json_atomic(tmp_path / "old.json", doc)
    rates, where = rates_from_platform(load_platform(tmp_path / "old.json"))
    assert rates.cpu_points == () and "no CPU expert rate" in where
    assert not split_cold([MB] * 4, [1] * 4, rates).to_cpu_N.any()


def test_a_malformed_cpu_expert_rate_is_refused_naming_the_field(tmp_path, gpu_sources):
    from hotsplit_probes.platform import measure_platform, take_inventory

    from hotsplit_cli.config.platform_file import load_platform
    from hotsplit_cli.core.errors import InputFileError
    from hotsplit_cli.core.jsonio import write_json_atomic

    doc = measure_platform(take_inventory("quick", None, gpu_sources), gpu_sources).to_doc()
    doc["host"]["cpu_expert"][0]["by_tokens"][1][1]["median_gbps"] = -3
    write_json_atomic(tmp_path / "platform.json", doc)
    with pytest.raises(InputFileError, match=r"host.cpu_expert\[0\].by_tokens\[1\].median_gbps"):
        load_platform(tmp_path / "platform.json")


# ----------------------------------------------------------------------------- plan and simulate


@pytest.fixture
def platform_file(tmp_path, gpu_sources):
    """platform.json of the fake two-GPU machine: zero-copy 40 GB/s, CPU 10 GB/s at one token."""
    from hotsplit_probes.platform import measure_platform, take_inventory

    from hotsplit_cli.core.jsonio import write_json_atomic

    doc = measure_platform(take_inventory("quick", None, gpu_sources), gpu_sources).to_doc()
    path = tmp_path / "platform.json"
    write_json_atomic(path, doc)
    return path


def test_plan_predicts_each_cold_path_per_batch(cli, tiny_hist, platform_file):
    from hotsplit_cli.hotset.planfile import BATCH_SIZES

    r = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.004", "--platform", platform_file, "--json")
    assert r.code == 0, r.err
    paths = json.loads(r.out)["cold_paths"]
    assert [b["batch"] for b in paths["by_batch"]] == list(BATCH_SIZES)
    assert "CPU 10.0 GB/s at 1 token" in paths["rates"]
    for b in paths["by_batch"]:
        assert b["split_ms"] <= min(b["gpu_ms"], b["cpu_ms"]) + 1e-12
        assert b["fastest"] == min(("gpu", "cpu", "split"), key=lambda m: (b[f"{m}_ms"], m != "gpu"))
    # At one token the CPU streams at a quarter of the link (10 vs 40 GB/s): it takes a fifth of the bytes.
    assert paths["by_batch"][0]["split_cpu_share"] == pytest.approx(0.2, abs=0.05)
    human = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.004", "--platform", platform_file)
    assert human.code == 0 and "predicted cold time per decode step by cold path" in human.out
    assert "fastest here: split (batch 1" in human.out


def test_simulate_replays_each_cold_path_on_the_trace(cli, tmp_path, platform_file):
    from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
    from hotsplit_cli.traffic.trace import save_trace

    trace = save_trace(tmp_path / "t.npz", synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4),
                                                           steps=40, batch=16, top_k=4, drift_every=0, seed=0))
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--hot-gib", "0.004", "--platform", platform_file,
            "--json", "--policies", "static")
    assert r.code == 0, r.err
    c = json.loads(r.out)["cold_paths"]
    assert c["policy"] == "static" and c["batch"] == 16
    assert c["split_ms"] <= min(c["gpu_ms"], c["cpu_ms"]) and c["fastest"] in ("gpu", "split")
    assert c["gpu_ms"] > 0 and 0 < c["split_cpu_share"] < 1


def test_under_ep_rank_0_reads_cold_only_its_own_experts(tiny_hist):
    """ep 4 of tiny's 32 experts: rank 0 holds 8 per layer, so at most its cold ones cross its link."""
    import dataclasses

    from hotsplit_cli.config.recipe import load_recipe
    from hotsplit_cli.hotset.planfile import cold_costs, plan_for_recipe, rank0_experts
    from hotsplit_cli.traffic.hist import load_hist

    r = load_recipe("tiny")
    r = dataclasses.replace(r, parallel=dataclasses.replace(r.parallel, ep=4))
    hist = load_hist(tiny_hist)
    held = rank0_experts(hist, r)
    assert held.sum(axis=1).tolist() == [8] * 4 and held[:, :8].all()
    plan = plan_for_recipe(hist, r, 8 * 3 * 256 * 128 * 2)  # room for 8 experts on each rank
    hot = plan.hot_RLE[0]
    most = int((held & ~hot).sum())  # rank 0's cold experts: every one read at a huge batch
    (big,) = cold_costs(hist, hot | ~held, 1, None, batches=(10**6,))
    assert big.cold_experts == pytest.approx(most, abs=1e-6) and most < 4 * 32 - int(hot.sum())


def test_cpu_seconds_take_one_rate_per_distinct_token_count():
    """A layer's token counts repeat: each expert still gets the rate of its own count."""
    rates = ColdRates(None, ((1, 10.0), (2, 8.0), (4, 9.0), (16, 4.0)))
    tokens = np.array([3, 1, 3, 16, 2, 40, 1])
    b = np.arange(1, 8) * 1e9
    want = [b[i] / (rates.cpu_gbps(float(t)) * 1e9) for i, t in enumerate(tokens)]
    assert rates.cpu_seconds(b, tokens).tolist() == want
    assert rates.cpu_seconds(np.zeros(0), np.zeros(0)).shape == (0,)
    assert np.isinf(ColdRates(None, ()).cpu_seconds(b[:2], tokens[:2])).all()  # unmeasured: never the CPU
