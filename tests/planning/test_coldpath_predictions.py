"""Cold-path predictions say what happens: one rate rule for plan, simulate and run; ties within
the probe's spread; times that never fall as the batch grows; no GPU means one CPU for both paths."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.core.jsonio import write_json_atomic
from hotsplit_cli.hotset.coldpath import ColdRates, ModeTimes, fastest_spans, predict_cold_paths, split_cold

MB = 1e6


def cpu_platform(path, points=((1, 1.0), (4, 1.3), (16, 1.2)), shape=(256, 128, "float32"), spread=0.1,
                 handoff_ms=0.02, layer_ms=None):
    """platform.json of a machine without GPU, as `hotsplit probe` writes it, with fixed CPU rates
    (`layer_ms` None: an older probe's file, without the layer call's cost)."""
    cells = [[t, {"median_gbps": g, "spread_gbps": spread * g}] for t, g in points]
    doc = {"schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z", "gpus": [], "reasons": [],
           "host": {"numa_nodes": [{"node": 0}], "copy_gbps": 7.0, "mem_available_bytes": 1 << 34,
                    "cpu_expert": [{"node": None, "threads": 1, "handoff_ms": handoff_ms, "by_tokens": cells,
                                    "shape": dict(zip(("hidden", "inter", "dtype"), shape, strict=True))}]}}
    if layer_ms is not None:
        doc["host"]["cpu_expert"][0]["layer_ms"] = layer_ms
    write_json_atomic(path, doc)
    return path


def test_times_within_the_spread_are_a_tie_named_by_the_simpler_path():
    t = ModeTimes(8, gpu_ms=10.0, cpu_ms=9.6, split_ms=9.5, cpu_share=0.4, spread=0.1)
    assert t.fastest == "gpu" and t.tied == ("gpu", "cpu", "split")
    assert ModeTimes(8, 10.0, 9.6, 9.5, 0.4, spread=0.0).fastest == "split"
    assert ModeTimes(8, 10.0, 12.0, 8.0, 0.4, spread=0.1).tied == ("split",)
    rows = [ModeTimes(b, 10.0, 10.0, 9.99, 1.0, 0.05).to_doc() for b in (1, 2, 4)]
    assert fastest_spans(rows) == "gpu (batch 1-4; cpu and split within the spread: a tie)"


def test_equal_cpu_and_split_columns_never_flip_the_fastest(cli, tiny_hist, tmp_path):
    """Issue: equal cpu and split columns printed `cpu (batch 1-2), split (batch 4-8), cpu ...`."""
    platform = cpu_platform(tmp_path / "platform.json")
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", platform, "--hot-gib", "0.004", "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)["cold_paths"]["by_batch"]
    assert {b["fastest"] for b in rows} == {"gpu"}
    human = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", platform, "--hot-gib", "0.004").out
    assert "fastest here: gpu (batch 1-256; cpu and split within the spread: a tie)" in human
    assert "no GPU: the device path is this CPU" in human


def test_the_cpu_column_grows_with_the_batch_even_when_a_probe_point_rises():
    """A probe rate higher at 4 tokens than at 1 (1.3 vs 1.0 GB/s) made the cpu column fall with the
    batch (11.89 ms at 32, 10.83 at 128): an expert never costs less for more tokens."""
    rates = ColdRates(None, ((1, 1.0), (4, 1.3), (16, 1.2)), 0.02, shared_cpu=True)
    assert [rates.cpu_gbps(t) for t in (1, 2, 4, 16, 64)] == [1.0, 1.0, 1.0, 1.0, 1.0]
    pi = np.random.default_rng(0).dirichlet(np.ones(32), size=4) * 4
    times = predict_cold_paths(pi, np.zeros((4, 32), dtype=bool), int(MB), rates, [1, 2, 4, 8, 16, 32, 64, 128, 256])
    for col in ("gpu_ms", "cpu_ms", "split_ms"):
        got = [getattr(t, col) for t in times]
        assert got == sorted(got), col


def test_without_a_gpu_the_two_paths_share_the_cpu_and_the_split_gives_it_nothing():
    rates = ColdRates(None, ((1, 2.0), (16, 1.0)), 0.02, shared_cpu=True)
    s = split_cold([MB] * 6, [1, 1, 2, 3, 8, 16], rates)
    assert not s.to_cpu_N.any() and s.seconds == pytest.approx(s.gpu_s)
    cpu = split_cold([MB] * 6, [1, 1, 2, 3, 8, 16], rates, "cpu")
    assert cpu.seconds == pytest.approx(s.seconds + 0.02e-3)  # the same work, plus the hand-off


def test_plan_charges_the_probes_layer_call_to_the_cpu_path_once_per_layer(cli, tiny_hist, tmp_path):
    """platform.json's `layer_ms` (what one call of the CPU's grouped compute costs beyond its
    experts) reaches the rates by the one rule: the cpu column pays it once per MoE layer a step
    reads cold (tiny: 4 MoE layers after 1 dense), the gpu column never; a file without it (an older probe) is 0."""
    def by_batch(platform):
        doc = json.loads(cli("plan", tiny_hist, "--recipe", "tiny", "--platform", platform, "--hot-gib", "0.004",
                             "--json").out)
        return doc["cold_paths"], doc["cold_paths"]["by_batch"][0]

    (old, old1), (new, new1) = by_batch(cpu_platform(tmp_path / "a.json")), by_batch(
        cpu_platform(tmp_path / "b.json", layer_ms=0.5))
    assert "layer call" not in old["rates"] and "layer call 0.500 ms" in new["rates"]
    assert new1["cpu_ms"] == pytest.approx(old1["cpu_ms"] + 4 * 0.5) and new1["gpu_ms"] == old1["gpu_ms"]
    assert load_platform(tmp_path / "b.json").cpu_expert[0].layer_ms == 0.5


def test_plan_warns_in_one_line_when_the_probe_timed_other_experts(cli, tiny_hist, tmp_path):
    """A tiny-recipe probe used for deepseek-v3 (or any other shape) says so and how to re-probe."""
    platform = cpu_platform(tmp_path / "platform.json", shape=(7168, 256, "float32"))
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", platform, "--hot-gib", "0.004")
    assert r.code == 0, r.err
    lines = [line for line in r.err.splitlines() if "CPU expert rate was measured on" in line]
    assert lines == [f"warning: {platform}: the CPU expert rate was measured on 7168x256 float32 experts, not these "
                     f"256x128 bfloat16 ones: the cpu and split times are for other experts; re-probe with "
                     f"`hotsplit probe --recipe tiny -o {platform}`"]
    fits = cpu_platform(tmp_path / "fits.json")
    assert "measured on" not in cli("plan", tiny_hist, "--recipe", "tiny", "--platform", fits, "--hot-gib",
                                    "0.004").err


def test_without_gpu_the_times_are_for_the_experts_as_this_cpu_computes_them(cli, tiny_hist, tmp_path):
    """The probe of a CPU-only machine times float32 experts (what `run` computes there): plan's
    cold-path times are for those bytes (384 KiB), not the recipe's bf16 192 KiB."""
    platform = cpu_platform(tmp_path / "platform.json", points=((1, 1.0),), handoff_ms=0.0, spread=0.0)
    doc = json.loads(cli("plan", tiny_hist, "--recipe", "tiny", "--platform", platform, "--hot-gib", "0.004",
                         "--json").out)
    assert doc["cold_paths"]["compute_expert_bytes"] == 3 * 256 * 128 * 4
    one = doc["cold_paths"]["by_batch"][0]
    cold_experts = doc["decode_cost"][0]["cold_experts"]
    assert one["gpu_ms"] == pytest.approx(cold_experts * 3 * 256 * 128 * 4 / 1e9 * 1e3)


def test_simulate_uses_the_same_rule_and_names_ties(cli, tmp_path):
    from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
    from hotsplit_cli.traffic.trace import save_trace

    platform = cpu_platform(tmp_path / "platform.json")
    trace = save_trace(tmp_path / "t.npz", synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4),
                                                           steps=20, batch=16, top_k=4, drift_every=0, seed=0))
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--hot-gib", "0.004", "--platform", platform,
            "--json", "--policies", "static")
    assert r.code == 0, r.err
    c = json.loads(r.out)["cold_paths"]
    assert c["split_cpu_share"] == 0 and c["split_ms"] == c["gpu_ms"] and c["fastest"] == "gpu"
    assert c["tied"] == ["gpu", "cpu", "split"] and "no GPU: the device path is this CPU" in c["rates"]
