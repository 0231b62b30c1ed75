"""The rates and split share `run` uses are the ones `plan --platform` predicts with: one rule
(coldpath.fit_rates), fixed rates here so that nothing depends on this machine's speed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hotsplit_runtime.cold_split import ColdSplit
from hotsplit_runtime.device import choose_device

from hotsplit_cli.hotset.coldpath import ColdRates, predict_cold_paths
from tests.planning.test_coldpath_predictions import cpu_platform

# A GPU's figures (zero-copy 20 GB/s; the CPU 10 GB/s at one token, 2.5 at 16; its layer call 0.05 ms):
# a non-trivial split.
GPU_RATES = ColdRates(20.0, ((1, 10.0), (2, 8.0), (4, 6.0), (16, 2.5)), sync_ms=0.01, layer_ms=0.05)


class _Bank:
    """What ColdSplit reads of a bank: the expert->slot map and one expert's bytes."""

    def __init__(self, served_E: np.ndarray, expert_bytes: int):
        self.served_E, self.expert_bytes = served_E, expert_bytes


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_the_runtimes_split_share_equals_the_plans_prediction(batch):
    """Every token of a step routes to the same top-k experts: each cold expert is then read with
    probability 1 by all `batch` tokens, so plan's expectation is exactly what the run sees."""
    E, K, L = 16, 6, 3
    hot_LE = np.zeros((L, E), dtype=bool)
    hot_LE[:, 0] = True
    chosen_L = [np.array([0, 1, 2, 3, 4, 5]), np.array([0, 2, 4, 6, 8, 10]), np.array([1, 3, 5, 7, 9, 11])]
    pi_LE = np.zeros((L, E))
    for layer, ids in enumerate(chosen_L):
        pi_LE[layer, ids] = 1.0  # every token picks them
    (predicted,) = predict_cold_paths(pi_LE, hot_LE, 8 << 20, GPU_RATES, [batch])

    split = ColdSplit("split", GPU_RATES, choose_device("cpu"))
    for layer, ids in enumerate(chosen_L):
        served = np.where(hot_LE[layer], 0, -1)
        ids_TK = torch.from_numpy(np.tile(ids, (batch, 1)))
        x, w = torch.zeros(batch, 4), torch.ones(batch, K)
        split(x, ids_TK, w, _Bank(served, 8 << 20), lambda ids: torch.zeros(batch, 4),
              lambda x, ids, w: torch.zeros(x.shape[0], 4))
    report = split.report(8 << 20)
    split.close()
    assert (0 < predicted.cpu_share < 1) if batch < 16 else predicted.cpu_share == 0  # 16 tokens: the CPU is slow
    assert report["cpu_share"] == predicted.cpu_share  # exactly: the same rule on the same figures
    assert report["cpu"]["predicted_ms"] + report["gpu"]["predicted_ms"] > 0


def test_without_a_gpu_the_device_is_charged_its_layer_call_on_every_layer():
    """On a CPU the device path's grouped compute runs on every layer call (its hot experts, even
    none): its prediction is its hot experts plus one `layer_ms` per call, cold experts or not."""
    def device_predicted(layer_ms: float) -> float:
        rates = ColdRates(None, ((1, 2.0), (16, 1.0)), 0.02, shared_cpu=True, layer_ms=layer_ms)
        split = ColdSplit("gpu", rates, choose_device("cpu"))
        served = np.array([0, -1, -1, -1])  # expert 0 hot
        for ids in ([[0, 1], [0, 2]], [[0, 0], [0, 0]], [[1, 2], [3, 1]]):  # mixed, hot only, cold only
            split(torch.zeros(2, 4), torch.tensor(ids), torch.ones(2, 2), _Bank(served, 1 << 20),
                  lambda ids: torch.zeros(2, 4), lambda x, ids, w: torch.zeros(x.shape[0], 4))
        report = split.report(1 << 20)
        split.close()
        return report["gpu"]["predicted_ms"], report["gpu"]["hot_predicted_ms"]

    (plain, plain_hot), (layered, layered_hot) = device_predicted(0.0), device_predicted(0.5)
    assert layered == pytest.approx(plain + 3 * 0.5) and layered_hot == pytest.approx(plain_hot + 3 * 0.5)


@pytest.mark.parametrize("shared_cpu", [True, False])
def test_on_one_cpu_the_worker_finishes_before_the_device_part_starts(shared_cpu):
    """Without a GPU the two paths share the cores and the interpreter lock: run at once they only
    slowed each other (the model adds them up), so the worker's job ends before the device's
    starts. With a GPU they overlap: the worker here waits for the device's part to begin."""
    import threading

    rates = (ColdRates(None, ((1, 2.0),), 0.0, shared_cpu=True) if shared_cpu
             else ColdRates(None, ((1, 2.0),), 0.0))  # no zero-copy rate: every cold expert to the CPU
    split = ColdSplit("cpu", rates, choose_device("cpu"))
    device_began, seen = threading.Event(), {}

    def cpu_compute(x, ids, w):
        seen["overlapped"] = device_began.wait(timeout=0 if shared_cpu else 10)
        seen["cpu_done"] = True
        return torch.zeros(x.shape[0], 4)

    def device_compute(ids):
        seen["device_saw_cpu_done"] = seen.get("cpu_done", False)
        device_began.set()
        return torch.zeros(2, 4)

    bank = _Bank(np.array([0, -1, -1, -1]), 1 << 20)  # expert 0 hot: the device's part
    split(torch.zeros(2, 4), torch.tensor([[0, 2], [3, 1]]), torch.ones(2, 2), bank, device_compute, cpu_compute)
    split.close()
    assert seen == ({"overlapped": False, "cpu_done": True, "device_saw_cpu_done": True} if shared_cpu
                    else {"device_saw_cpu_done": False, "overlapped": True, "cpu_done": True})


def test_run_uses_a_fitting_platform_and_reports_the_same_share_as_plan(cli, tmp_path):
    """A probe of this CPU-only machine that timed tiny's allocated experts (256x128 float32): `run`
    takes its rates as they are, and its split share is the one plan predicts at tiny's batch."""
    platform = cpu_platform(tmp_path / "platform.json")
    r = cli("run", "tiny", "--cold-path", "split", "--platform", platform, "--steps", "10", "--json")
    assert r.code == 0, r.err
    paths = json.loads(r.out)["summary"]["cold_paths"]
    assert paths["rates"].startswith(f"{platform}: no GPU: the device path is this CPU")
    assert paths["rates_not_used"] is None
    hist = tmp_path / "hist.json"
    assert cli("balance", "tiny", "--steps", "4", "-o", hist).code == 0
    doc = json.loads(cli("plan", hist, "--recipe", "tiny", "--platform", platform, "--json").out)
    at16 = next(b for b in doc["cold_paths"]["by_batch"] if b["batch"] == 16)
    assert doc["cold_paths"]["rates"] == paths["rates"]
    assert paths["cpu_share"] == at16["split_cpu_share"] == 0.0  # one CPU: the split gives its worker nothing
    assert paths["gpu"]["predicted_ms"] > 0 and paths["gpu"]["hot_predicted_ms"] > 0


def test_a_probe_of_other_experts_is_remeasured_and_reported_as_full_size(cli, tmp_path):
    """A scaled run (or another recipe's probe) predicts for the tensors it allocates: it measures
    them now and names platform.json's figures as full-size ones it did not use."""
    platform = cpu_platform(tmp_path / "platform.json")  # tiny at full size: 256x128
    r = cli("run", "tiny", "--cold-path", "cpu", "--platform", platform, "--steps", "4", "--scale", "0.5")
    assert r.code == 0, r.err
    assert "cold path: cpu (measured now for the experts this run allocates: no GPU: the device path is this CPU, " \
           "CPU" in r.out
    assert "(128x64 float32, 1 thread)" in r.out
    assert "rates not used" in r.out and "full-size figures, not used" in r.out
    flat = " ".join(r.out.split())  # table cells wrap on a narrow terminal
    assert "read 12.28 MiB of experts (tensors as allocated; " in flat and "at full size)" in flat  # read, not alloc


def test_a_probe_of_the_scaled_experts_gives_a_scaled_run_its_figures(cli, tmp_path):
    """`probe --recipe R --scale S` times the experts `run R --scale S` allocates: the run then
    takes platform.json's figures as they are instead of measuring its own."""
    platform = tmp_path / "platform.json"
    r = cli("probe", "--quick", "--recipe", "tiny", "--scale", "0.5", "-o", platform, "--json")
    assert r.code == 0, r.err
    (cpu,) = json.loads(platform.read_text())["host"]["cpu_expert"]
    assert cpu["shape"] == {"hidden": 128, "inter": 64, "dtype": "float32"}
    r = cli("run", "tiny", "--cold-path", "cpu", "--platform", platform, "--steps", "4", "--scale", "0.5", "--json")
    assert r.code == 0, r.err
    paths = json.loads(r.out)["summary"]["cold_paths"]
    assert paths["rates"].startswith(f"{platform}: no GPU") and paths["rates_not_used"] is None
    assert cli("probe", "--scale", "0.5").code == 2  # --scale needs the recipe whose experts it shrinks


def test_on_one_cpu_the_cpus_share_is_computed_in_the_calling_thread():
    """Without a GPU a worker thread only brought a second OpenMP thread team beside the caller's,
    which left cores idle: the CPU's share runs in the thread that calls the split, and no worker
    exists. With a GPU the share runs in the worker, so that it overlaps the device's."""
    import threading

    for shared_cpu in (True, False):
        split = ColdSplit("cpu", ColdRates(None, ((1, 2.0),), 0.0, shared_cpu=shared_cpu), choose_device("cpu"))
        ran_in = []

        def cpu_compute(x, ids, w, ran_in=ran_in):
            ran_in.append(threading.get_ident())
            return torch.zeros(x.shape[0], 4)

        bank = _Bank(np.array([0, -1, -1, -1]), 1 << 20)
        split(torch.zeros(2, 4), torch.tensor([[1, 2], [3, 1]]), torch.ones(2, 2), bank,
              lambda ids: torch.zeros(2, 4), cpu_compute)
        assert (split.pool is None) == shared_cpu
        assert (ran_in == [threading.get_ident()]) == shared_cpu
        split.close()
