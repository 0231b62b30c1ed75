"""The verdict's pieces (numpy): bands and names of each prediction, the window a placement is
judged over, a rebalance's prediction error, and which spread times each cold path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hotsplit_cli.config.platform_file import CpuExpertInfo, GpuInfo, PlatformInfo
from hotsplit_cli.core.holdout import Band
from hotsplit_cli.hotset.coldpath import rates_from_platform
from hotsplit_cli.hotset.verdict import balancedness_verdicts, cold_path_verdicts, prediction_error
from hotsplit_cli.placement.dispatch import balancedness, window_balancedness
from hotsplit_cli.placement.file import PlacementPrediction


def test_window_balancedness_sums_steps_into_windows_as_place_does():
    loads = np.random.default_rng(0).integers(0, 9, size=(7, 2, 3))
    by_hand_mean = by_hand_max = 0.0
    for w in (loads[0:3], loads[3:6], loads[6:7]):  # 3-step windows, the last one shorter
        summed = w.sum(axis=0)  # [L, R]
        by_hand_mean += summed.mean(axis=1).sum()
        by_hand_max += summed.max(axis=1).sum()
    assert window_balancedness(loads, 3) == pytest.approx(by_hand_mean / by_hand_max)
    assert window_balancedness(loads, 1) == pytest.approx(balancedness(loads.reshape(-1, 3)))


def test_a_placement_is_judged_over_its_histograms_windows():
    def pred(spw, windows):
        return PlacementPrediction(0.9, spw, windows, None, "tokens")
    assert pred(8, 5).window_steps(40) == 8
    assert pred(None, 1).window_steps(40) == 40  # no windows: the whole run is one
    assert pred(None, 5).window_steps(40) is None  # an older file: its window size is unknown


def test_balancedness_verdicts_band_like_the_hit_rates():
    inside, oos = balancedness_verdicts(0.98, Band(0.96, 0.95, 0.97), 0.975, 4)
    assert (inside.name, oos.name) == ("balancedness.in_sample", "balancedness.out_of_sample")
    assert "per 4-step window" in inside.figure and inside.unit == "ratio"
    assert (inside.low, inside.high) == (pytest.approx(0.97), pytest.approx(0.99)) and inside.word == "WITHIN"
    assert (oos.low, oos.high, oos.word) == (0.95, 0.98, "WITHIN")
    assert [v.word for v in balancedness_verdicts(0.98, Band(0.96, 0.95, 0.97), 0.90, 4)] == ["OUTSIDE"] * 2
    (exact,) = balancedness_verdicts(0.98, None, 0.98, 4)
    assert exact.band.startswith("exact") and exact.word == "WITHIN"


def _paths(spread, rates="p.json: ..."):
    path = {"experts": 10, "ms": 5.0, "predicted_ms": 4.0, "spread": spread}
    return {"mode": "split", "rates": rates, "gpu": dict(path), "cpu": {**path, "experts": 0}}


def test_cold_path_time_is_judged_per_read_within_a_factor_of_the_spread():
    (v,) = cold_path_verdicts(_paths(0.3), " rank 1")  # the CPU read nothing: not judged
    assert (v.name, v.unit, v.achieved, v.predicted) == ("cold_path.gpu.rank.1", "ms", 0.5, 0.4)
    assert (v.low, v.high) == (pytest.approx(0.4 / 1.3), pytest.approx(0.52)) and v.word == "WITHIN"
    assert cold_path_verdicts(_paths(0.1))[0].word == "OUTSIDE"
    old = cold_path_verdicts(_paths(None))[0]
    assert (old.within, old.word, old.band) == (None, "NO BAND", "no band: the platform file records no spread")
    now = cold_path_verdicts(_paths(None, "measured now for the experts this run allocates: ..."))[0]
    assert now.band == "no band: the rate measured at the start records no spread"
    assert cold_path_verdicts(None) == [] and old.to_doc()["within"] is None


def test_prediction_error_is_over_judged_pairs_only():
    assert prediction_error([(0.99, 0.86), (0.97, None), (0.95, 0.97)]) == {
        "count": 2, "mean_abs": pytest.approx(0.075), "max_abs": pytest.approx(0.13)}
    assert prediction_error([(0.9, None)]) == {"count": 0, "mean_abs": None, "max_abs": None}


def _platform(zero_copy_spread, cpu_spread):
    gpu = GpuInfo(index=0, cuda_index=0, name="g", mem_free_bytes=1, mem_total_bytes=2, zero_copy_read_gbps=40.0,
                  h2d_gbps=50.0, numa_node=0, link_rate_gbps=None, zero_copy_read_spread=zero_copy_spread)
    cpu = CpuExpertInfo(0, ((1.0, 10.0),), 0.01, "8x4 bf16", cpu_spread)
    return PlatformInfo(Path("p.json"), "", (gpu,), None, None, 1, (), (cpu,))


def test_each_path_is_timed_with_its_own_rates_spread():
    rates, _ = rates_from_platform(_platform(0.05, 0.2))
    assert (rates.gpu_spread, rates.cpu_spread, rates.spread) == (0.05, 0.2, 0.2)
    rates, _ = rates_from_platform(_platform(0.05, 0.2), device_is_cpu=True)  # the device path is this CPU
    assert (rates.gpu_spread, rates.cpu_spread) == (0.2, 0.2)
    rates, _ = rates_from_platform(_platform(None, None))  # an older probe's file: nothing recorded
    assert (rates.gpu_spread, rates.cpu_spread, rates.spread) == (None, None, 0.0)
