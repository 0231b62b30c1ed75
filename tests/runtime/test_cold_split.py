"""The CPU cold path in the runtime: every split of the cold experts between the device and the CPU
computes what the all-resident reference does, through dynamic swaps; counters and the run CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hotsplit_runtime import cold_split
from hotsplit_runtime.cold_split import ColdSplit, SplitExperts
from hotsplit_runtime.device import choose_device
from hotsplit_runtime.selftest import _geom, build_pair, random_hot, random_moves

from hotsplit_cli.hotset.coldpath import ColdRates, LayerSplit

CPU = choose_device("cpu")
EQUAL = ColdRates(10.0, ((1, 10.0), (16, 10.0)))  # device and CPU alike: the split halves


def _split_model(hot_fraction: float, mode: str, rates: ColdRates = EQUAL, seed: int = 0):
    g = _geom(CPU, "sigmoid", shared=True)
    rng = np.random.default_rng(seed)
    model, ref = build_pair(g, 2, random_hot(2, g.num_experts, hot_fraction, rng), CPU, torch.float32, seed)
    split = ColdSplit(mode, rates, CPU)
    model.compute = SplitExperts(model.compute, split)
    return model, ref, split, rng, g


def _run_against_reference(model, ref, rng, g, steps: int = 6) -> None:
    for s in range(steps):
        x = torch.randn(8, g.hidden, generator=torch.Generator().manual_seed(s))
        torch.testing.assert_close(model.step(x), ref.step(x), atol=1e-4, rtol=1e-4)
        model.begin_swaps(random_moves(model, 2, rng))  # dynamic swaps between steps
        model.publish_ready(wait=True)


@pytest.mark.parametrize("mode, rates", [
    ("split", EQUAL),
    ("split", ColdRates(10.0, ())),  # no CPU rate: everything stays on the device
    ("cpu", EQUAL),  # every cold expert on the CPU
    ("split", ColdRates(None, ((1, 5.0),))),  # no device rate: every cold expert on the CPU
])
def test_every_split_equals_the_reference_through_swaps(mode, rates):
    model, ref, split, rng, g = _split_model(0.5, mode, rates)
    _run_against_reference(model, ref, rng, g)
    c = split.counters
    assert c.layers > 0
    if mode == "cpu" or rates.zero_copy_gbps is None:
        assert c.gpu_experts == 0 and c.cpu_experts > 0
    elif not rates.cpu_points:
        assert c.cpu_experts == 0 and c.cpu_layers == 0
    else:
        assert c.cpu_experts > 0 and c.gpu_experts > 0


def test_random_splits_equal_the_reference(monkeypatch):
    draw = np.random.default_rng(7)

    def random_split(bytes_N, tokens_N, rates, mode="split"):
        return LayerSplit(draw.random(len(bytes_N)) < 0.5, 0.0, 0.0)

    monkeypatch.setattr(cold_split, "split_cold", random_split)
    model, ref, split, rng, g = _split_model(0.25, "split")
    _run_against_reference(model, ref, rng, g, steps=10)
    assert split.counters.cpu_layers > 0 and split.counters.gpu_experts > 0


def test_an_empty_cold_set_never_calls_the_cpu(monkeypatch):
    model, ref, split, rng, g = _split_model(1.0, "cpu")
    monkeypatch.setattr(split.pool, "submit", lambda *a: pytest.fail("no cold expert: nothing for the CPU"))
    x = torch.randn(8, g.hidden, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model.step(x), ref.step(x), atol=1e-4, rtol=1e-4)
    assert split.counters.layers == 0


def test_the_cpu_gets_only_its_tokens_activations(monkeypatch):
    """The CPU receives the rows of the tokens routed to its experts (host tensors), and their
    assignments to other experts are left to the device."""
    model, ref, split, rng, g = _split_model(0.0, "split")
    seen = []
    submit = split.pool.submit

    def spy(fn, cpu_compute, x, ids, w):
        seen.append((x, ids, w))
        return submit(fn, cpu_compute, x, ids, w)

    monkeypatch.setattr(split.pool, "submit", spy)
    x = torch.randn(8, g.hidden, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(model.step(x), ref.step(x), atol=1e-4, rtol=1e-4)
    assert len(seen) == model.num_layers  # every expert is cold: the CPU takes part in every layer
    for x_cpu, ids, w in seen:
        assert x_cpu.device.type == ids.device.type == w.device.type == "cpu"
        assert x_cpu.shape == (ids.shape[0], g.hidden) and ids.shape[0] <= 8
        assert ((ids >= 0).sum(dim=1) > 0).all()  # every row handed over has work on the CPU
        assert ((ids >= 0).sum(dim=1) < g.top_k).any() or split.counters.gpu_experts == 0


def test_in_mode_cpu_the_cpu_gets_every_cold_assignment_and_no_hot_one(monkeypatch):
    """Mode cpu with hot experts: the CPU is handed exactly the cold assignments (the hot ones stay
    with the device, though the host bank could compute them too)."""
    model, ref, split, rng, g = _split_model(0.5, "cpu")
    seen = []
    submit = split.pool.submit

    def spy(fn, cpu_compute, x, ids, w):
        seen.append(ids.clone())
        return submit(fn, cpu_compute, x, ids, w)

    monkeypatch.setattr(split.pool, "submit", spy)
    x = torch.randn(8, g.hidden, generator=torch.Generator().manual_seed(5))
    routed = []
    real_route = model.compute.__call__
    monkeypatch.setattr(model, "compute", lambda x_TH, ids_TK, w_TK, bank, counts_E=None: (
        routed.append((ids_TK.clone(), bank.served_E.copy())) or real_route(x_TH, ids_TK, w_TK, bank, counts_E)))
    torch.testing.assert_close(model.step(x), ref.step(x), atol=1e-4, rtol=1e-4)
    assert len(seen) == len(routed) == model.num_layers
    for ids_cpu, (ids_TK, served_E) in zip(seen, routed, strict=True):
        flat = ids_TK.reshape(-1).numpy()
        cold = np.sort(flat[served_E[flat] < 0])
        assert 0 < len(cold) < len(flat)  # both kinds in every layer
        assert np.array_equal(np.sort(ids_cpu[ids_cpu >= 0].numpy()), cold)


def test_counters_add_up_and_report_per_path(monkeypatch):
    """The counters and the report agree with what was actually handed out: the distinct experts
    in each CPU job (seen at the worker's door) and each layer's distinct cold experts (seen where
    the split is decided), counted apart from the counters."""
    model, ref, split, rng, g = _split_model(0.5, "split")
    cold_per_call, cpu_per_call = [], []
    decide = split._split

    def counting_split(expert_bytes, tokens_N):
        cold_per_call.append(len(tokens_N))
        return decide(expert_bytes, tokens_N)

    submit = split.pool.submit

    def counting_submit(fn, cpu_compute, x, ids, w):
        cpu_per_call.append(len(torch.unique(ids[ids >= 0])))
        return submit(fn, cpu_compute, x, ids, w)

    monkeypatch.setattr(split, "_split", counting_split)
    monkeypatch.setattr(split.pool, "submit", counting_submit)
    _run_against_reference(model, ref, rng, g, steps=3)
    c = split.counters
    cold, on_cpu = sum(cold_per_call), sum(cpu_per_call)
    assert 0 < on_cpu < cold  # equal rates: both paths served some
    assert (c.cpu_experts, c.gpu_experts) == (on_cpu, cold - on_cpu)
    assert (c.layers, c.cpu_layers) == (len(cold_per_call), len(cpu_per_call))
    bank_bytes = model.banks[0].expert_bytes
    assert c.gpu_bytes == c.gpu_experts * bank_bytes and c.cpu_bytes == c.cpu_experts * bank_bytes
    doc = split.report(real_expert_bytes=1000)
    assert doc["gpu"]["bytes"] == (cold - on_cpu) * 1000 and doc["cpu"]["experts"] == on_cpu
    assert doc["cpu_share"] == on_cpu / cold
    assert doc["cpu"]["ms"] > 0 and doc["cpu"]["predicted_ms"] > 0 and doc["gpu"]["ms"] > 0


def test_a_layers_split_is_the_cost_models_remembered_per_token_counts(monkeypatch):
    """The split of a layer's cold experts is `split_cold`'s, computed once per (token counts, expert
    bytes) while the rates stay, again for new rates, and forgotten past SPLITS_REMEMBERED."""
    split = ColdSplit("split", EQUAL, CPU)
    calls = []
    real = cold_split.split_cold
    monkeypatch.setattr(cold_split, "split_cold", lambda *a: calls.append(a) or real(*a))
    tokens = np.array([1, 3, 1, 2])
    got = split._split(1000, tokens)
    want = real(np.full(4, 1000.0), tokens, EQUAL, "split")
    assert np.array_equal(got.to_cpu_N, want.to_cpu_N) and (got.gpu_s, got.cpu_s) == (want.gpu_s, want.cpu_s)
    assert split._split(1000, tokens.copy()) is got and len(calls) == 1
    split._split(1000, np.array([1, 3, 2, 1]))  # other counts (their order is the experts')
    split._split(2000, tokens)
    assert len(calls) == 3
    split.rates = ColdRates(10.0, ((1, 5.0),))
    split._split(1000, tokens)
    assert len(calls) == 4 and calls[-1][2] is split.rates
    monkeypatch.setattr(cold_split, "SPLITS_REMEMBERED", 2)
    split._split(1000, np.array([5]))
    split._split(1000, np.array([6]))  # the third: the memory starts again
    assert len(split._splits) == 1


def test_host_weights_are_the_cold_bank_in_host_memory():
    model, ref, split, rng, g = _split_model(0.5, "split")
    bank = model.banks[0]
    for e in range(bank.num_experts):
        w13, w2 = bank.host_weights_of(e)
        assert w13.device.type == "cpu"
        assert w13.data_ptr() >= bank.cold_EB.data_ptr()  # a view into the cold bank, not a copy
        torch.testing.assert_close(w13, bank.weights_of(e, -1)[0])
        # made once with the bank, not per call: making them cost ~14 us per expert, a fifth of a small expert
        assert bank.host_weights_of(e)[0] is w13


def test_the_cpu_path_computes_a_native_bank_over_its_stacked_host_views(monkeypatch):
    """The CPU's share runs through one grouped compute over two views of the host cold bank (the
    function the probe times), never a copy of it; a stored (fp8) bank has no stack and keeps the
    per-expert dequantising compute."""
    from hotsplit_probes import cpu_expert
    from hotsplit_runtime.precision import stored_format

    model, ref, split, rng, g = _split_model(0.0, "cpu", ColdRates(None, ((1, 5.0),), shared_cpu=True))
    calls = []
    real = cold_split.stacked_experts

    def spy(x, ids, w, w13, w2):
        calls.append((w13, w2))
        return real(x, ids, w, w13, w2)

    monkeypatch.setattr(cold_split, "stacked_experts", spy)
    _run_against_reference(model, ref, rng, g, steps=2)
    assert len(calls) == 2 * model.num_layers and cpu_expert.stacked_experts is real
    for (w13, w2), bank in zip(calls, model.banks * 2, strict=True):
        assert w13 is bank.host_stack[0] and w2 is bank.host_stack[1]
        assert w13.untyped_storage().data_ptr() == w2.untyped_storage().data_ptr() == bank.cold_EB.data_ptr()
        assert w13.shape == (g.num_experts, 2 * g.inter, g.hidden) and w2.shape == (g.num_experts, g.hidden, g.inter)
        for e in range(g.num_experts):
            assert torch.equal(w13[e], bank.host_weights_of(e)[0]) and torch.equal(w2[e], bank.host_weights_of(e)[1])
    stored, _ = build_pair(g, 1, np.zeros((1, g.num_experts), dtype=bool), CPU, torch.float32, 0,
                           stored=stored_format("mxfp4"))
    assert stored.banks[0].precision == "mxfp4" and stored.banks[0].host_stack is None


def test_with_nothing_for_the_device_only_the_cpu_computes():
    """Mode cpu with every expert cold: the device's compute is not called (no empty call, no
    layer cost charged for one), and the output is the CPU's, equal to the reference."""
    model, ref, split, rng, g = _split_model(0.0, "cpu", ColdRates(None, ((1, 5.0),), shared_cpu=True, layer_ms=0.5))
    model.compute.inner = lambda *a: pytest.fail("nothing is left for the device")
    for s in range(3):
        x = torch.randn(8 if s else 1, g.hidden, generator=torch.Generator().manual_seed(s))
        torch.testing.assert_close(model.step(x), ref.step(x), atol=1e-4, rtol=1e-4)
    assert split.counters.gpu_experts == 0 and split.counters.hot_pred_ms == 0.0 and split.counters.gpu_ms == 0.0
    assert split.counters.cpu_layers == 3 * model.num_layers


# ----------------------------------------------------------------------------- the run CLI


def test_run_with_the_split_reports_both_paths(cli, tmp_path, fixed_rates_platform):
    """With fixed rates (the device path and the CPU alike) the split serves both paths, however
    loaded the machine is."""
    log = tmp_path / "log.jsonl"
    r = cli("run", "tiny", "--cold-path", "split", "--steps", "60", "--json", "--log-jsonl", str(log),
            "--platform", fixed_rates_platform)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["knobs"]["cold_path"] == "split" and doc["cold_path"]["mode"] == "split"
    assert doc["cold_path"]["rates"].startswith(f"{fixed_rates_platform}: ") and not doc["cuda_graph"]
    assert "CPU 10.0 GB/s at 1 token" in doc["cold_path"]["rates"]
    paths = doc["summary"]["cold_paths"]
    assert doc["kernel"].endswith("CPU cold path (split)")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # The split the run made is the one the cost model gives for these fixed rates (the same
    # function plan --platform predicts with), and the bytes each path read agree with it.
    cpu_n, gpu_n = paths["cpu"]["experts"], paths["gpu"]["experts"]
    assert cpu_n + gpu_n > 0
    assert all(0 <= r["cold_cpu_bytes_per_step"] <= r["cold_bytes_per_step"] for r in records)
    assert any(r["cold_cpu_bytes_per_step"] > 0 for r in records) == (cpu_n > 0)


def test_without_a_platform_file_the_rates_are_measured_now(cli):
    """No platform.json: the run measures the rates itself and says so. What the split then does
    depends on how busy the machine is, so only its bookkeeping is checked."""
    r = cli("run", "tiny", "--cold-path", "split", "--steps", "10", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    measured = "measured now for the experts this run allocates: no GPU: the device path is this CPU"
    assert doc["cold_path"]["rates"].startswith(measured)
    paths = doc["summary"]["cold_paths"]
    assert paths["layers"] > 0 and paths["gpu"]["experts"] + paths["cpu"]["experts"] > 0


def test_the_default_run_has_no_cpu_path(cli):
    r = cli("run", "tiny", "--steps", "20", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["cold_path"] == {"mode": "gpu", "rates": None} and doc["summary"]["cold_paths"] is None


@pytest.mark.parametrize("args, env, message", [
    (["--cold-path", "gpus"], {}, "--cold-path: must be one of gpu, cpu, split, got 'gpus'"),
    ([], {"HOTSPLIT_COLD_PATH": "fast"}, "HOTSPLIT_COLD_PATH: must be one of gpu, cpu, split, got 'fast'"),
    (["--platform", "nowhere.json"], {}, "--platform nowhere.json: no such file"),
])
def test_bad_cold_path_settings_exit_2_with_one_line(cli, monkeypatch, args, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = cli("run", "tiny", "--steps", "5", *args)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and r.out == "" and len(lines) == 1 and lines[0].startswith(f"error: {message}")


def test_fp8_banks_refuse_the_cpu_path_in_one_line():
    """Where experts stay fp8 in the banks (Triton), the CPU would dequantise them: refused."""
    from hotsplit_runtime.fp8 import RELEASE_FP8

    from hotsplit_cli.core.errors import UsageError

    g = _geom(CPU, "sigmoid", shared=True)
    model, _ = build_pair(g, 1, np.zeros((1, g.num_experts), dtype=bool), CPU, torch.float32,
                          stored=RELEASE_FP8)
    bank = model.banks[0]
    with pytest.raises(UsageError, match=r"^cold_path split: the CPU cannot compute fp8 experts"):
        cold_split.make_split("split", CPU, bank)
    assert cold_split.make_split("gpu", CPU, bank) is None


def test_the_cpu_worker_runs_on_the_gpu_nodes_cpus(monkeypatch):
    import dataclasses
    import os
    from types import SimpleNamespace

    first = min(os.sched_getaffinity(0))
    monkeypatch.setattr(cold_split, "read_numa_node", lambda node: SimpleNamespace(cpus=(first, 4096)))
    before = os.sched_getaffinity(0)
    split = ColdSplit("split", EQUAL, dataclasses.replace(CPU, numa_node=0))
    assert split.cpus == (first,)  # the node's CPUs this process may use
    assert split.pool.submit(os.sched_getaffinity, 0).result() == {first}
    assert split.pool.submit(torch.get_num_threads).result() == 1  # one thread per CPU of the node
    assert os.sched_getaffinity(0) == before  # the rest of the process keeps its CPUs
    split.close()
    assert ColdSplit("split", EQUAL, CPU).cpus is None  # no GPU node: the worker is not pinned


def test_device_time_is_folded_in_as_layers_finish():
    """On a GPU each layer's device time is two CUDA events: those already done are read at once,
    the rest when the report is made, so a long run holds only the events still in flight."""
    from hotsplit_runtime.cold_split import PathCounters

    class Ev:
        def __init__(self, t, done):
            self.t, self.done = t, done

        def query(self):
            return self.done

        def synchronize(self):
            self.done = True

        def elapsed_time(self, end):
            return end.t - self.t

    c = PathCounters()
    c._events += [(Ev(0, True), Ev(2, True)), (Ev(3, True), Ev(4, False)), (Ev(5, True), Ev(9, True))]
    c.settle(wait=False)
    assert c.gpu_ms == 2 and len(c._events) == 2  # the second layer is still running: it and later wait
    c.settle()
    assert c.gpu_ms == 2 + 1 + 4 and c._events == []
