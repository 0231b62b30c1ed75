"""`hotsplit selftest` always reports: an exception of any kind in one check is that check's FAIL
row, the other checks still run, the JSON document is printed, and the exit code is 1."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hotsplit_runtime import selftest
from hotsplit_runtime.device import choose_device

CUDA_ERROR = "CUDA error: invalid argument\nSearch for `cudaErrorInvalidValue' in the CUDA runtime API documentation"
ALL_CHECKS = [selftest.REFERENCE, selftest.SWAPS, selftest.FP8_EXPERTS, selftest.MXFP4_EXPERTS, selftest.GRAPH,
              selftest.ZERO_COPY, selftest.STEP_TIME]


def _raise(exc):
    def fail(*args, **kwargs):
        raise exc
    return fail


def by_name(doc):
    return {c["name"]: c for c in doc["checks"]}


def test_a_check_raising_a_device_error_is_its_fail_row_and_the_others_run(cli, monkeypatch):
    monkeypatch.setattr(selftest, "check_swaps", _raise(RuntimeError(CUDA_ERROR)))
    r = cli("selftest", "--json")
    assert r.code == 1
    doc = json.loads(r.out)  # one valid document, nothing else on stdout
    assert [c["name"] for c in doc["checks"]] == ALL_CHECKS
    assert doc["ok"] is False
    checks = by_name(doc)
    swaps = checks[selftest.SWAPS]
    assert swaps["ok"] is False and swaps["value"] == "error"
    assert swaps["detail"].startswith("RuntimeError: CUDA error: invalid argument (at tests/runtime/test_selftest.py:")
    assert "Search for" not in swaps["detail"]  # the first line only
    assert swaps["error"]["type"] == "RuntimeError" and swaps["error"]["message"] == \
        "RuntimeError: CUDA error: invalid argument"
    assert "Traceback" in swaps["error"]["traceback"]
    for name in (selftest.REFERENCE, selftest.FP8_EXPERTS, selftest.MXFP4_EXPERTS):  # ran after the failure too
        assert checks[name]["ok"] is True and checks[name]["error"] is None
    assert checks[selftest.STEP_TIME]["value"].startswith("x")
    assert "step_time" in doc["measures"]
    assert r.err.startswith("error: selftest failed: runtime = reference (swaps mid-run);")
    assert "Traceback" not in r.err  # no traceback without --debug


def test_human_output_shows_the_fail_row_and_the_error(cli, monkeypatch):
    monkeypatch.setattr(selftest, "check_reference", _raise(torch.AcceleratorError(CUDA_ERROR)))
    r = cli("selftest")
    assert r.code == 1
    row = next(line for line in r.out.splitlines() if line.startswith("runtime = reference"))
    assert "FAIL" in row and "error" in row
    assert ("FAIL runtime = reference (random hot sets): AcceleratorError: CUDA error: invalid argument "
            "(at tests/runtime/test_selftest.py:") in r.out  # the error on one line below the table
    assert sum(" pass " in line for line in r.out.splitlines()) == 3  # swaps, fp8 and mxfp4 still ran
    assert r.err.startswith("error: selftest failed: runtime = reference (random hot sets);")


def test_debug_prints_the_caught_tracebacks_to_stderr(capsys, monkeypatch):
    from hotsplit_cli.cli import main
    from hotsplit_cli.core.errors import HotsplitError

    monkeypatch.setattr(selftest, "check_fp8", _raise(ValueError("bad block")))
    with pytest.raises(HotsplitError, match="selftest failed"):  # --debug: errors raise, with a traceback
        main(["--debug", "selftest", "--json"])
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is False
    assert "runtime = reference (fp8 experts):\nTraceback" in err and "ValueError: bad block" in err


def test_a_measure_that_raises_is_a_fail_row_not_a_crash(monkeypatch):
    monkeypatch.setattr(selftest, "step_time_ratio", _raise(torch.AcceleratorError(CUDA_ERROR)))
    result = selftest.run_selftest(choose_device("cpu"))
    assert result["ok"] is False
    assert [c["name"] for c in result["checks"]] == ALL_CHECKS
    row = by_name(result)[selftest.STEP_TIME]
    assert row["ok"] is False and row["detail"].startswith("AcceleratorError: CUDA error: invalid argument")
    assert "step_time" not in result["measures"]  # a measure that raised leaves no half-filled entry
    assert all(c["ok"] is not False for c in result["checks"] if c["name"] != selftest.STEP_TIME)


def test_the_zero_copy_measure_that_raises_is_a_fail_row(monkeypatch):
    cpu = choose_device("cpu")
    info = dataclasses.replace(cpu, zero_copy=True)  # so that the measure runs
    monkeypatch.setattr(selftest, "measure_zero_copy", _raise(torch.AcceleratorError(CUDA_ERROR)))
    measures = {}
    row = selftest.isolated(selftest.ZERO_COPY, lambda: selftest.check_zero_copy(info, measures), cpu)
    assert row.ok is False and row.detail.startswith("AcceleratorError: CUDA error: invalid argument")
    assert measures == {}


def test_an_asynchronous_device_error_is_charged_to_the_check_that_launched_the_work(monkeypatch):
    info = dataclasses.replace(choose_device("cpu"), is_cuda=True)
    monkeypatch.setattr(torch.cuda, "synchronize", _raise(RuntimeError("CUDA error: an illegal memory access")))
    row = selftest.isolated("kernel check", lambda: selftest.Check("kernel check", True, "ok"), info)
    assert row.ok is False and row.name == "kernel check"
    assert row.detail.startswith("RuntimeError: CUDA error: an illegal memory access")


def test_an_error_without_a_message_names_its_type():
    row = selftest.failed("x", ValueError())
    assert row.detail == "ValueError" and row.error["at"] is None


def test_ctrl_c_is_not_swallowed():
    info = choose_device("cpu")
    with pytest.raises(KeyboardInterrupt):
        selftest.isolated("x", _raise(KeyboardInterrupt()), info)


def test_step_time_ratio_spread_is_over_the_interleaved_pairs(monkeypatch):
    """The ratio is of the two medians; its spread, the 10th-90th percentile of run/reference over
    the pairs, each pair timed back to back (the fake clock hands out the durations in call order)."""
    run = [2.0, 2.0, 3.0, 2.0, 10.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    ref = [1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0]
    durations = iter([x for pair in zip(run, ref, strict=True) for x in pair])
    calls = []

    def fake_time_ms(fn, info, reps):
        calls.append(reps)  # the warm-up steps call the model directly, never through time_ms
        return next(durations)

    monkeypatch.setattr(selftest, "time_ms", fake_time_ms)
    r = selftest.step_time_ratio(choose_device("cpu"), torch.float32, batch=2, hot_fraction=0.5, reps=len(run))
    assert (r["runtime_ms"], r["reference_ms"]) == (2.0, 2.0) and r["ratio"] == 1.0
    pairs = sorted(a / b for a, b in zip(run, ref, strict=True))  # 1.0 x6, 1.5, 2.0, 2.0, 5.0
    assert r["ratio_p10"] == pytest.approx(1.0)
    assert r["ratio_p90"] == pytest.approx(pairs[8] + 0.1 * (pairs[9] - pairs[8]))  # numpy's linear rule: 2.3, not 5
    assert len(calls) == len(run) * 2


class KernelNumerics:
    """The Triton kernels' bf16 arithmetic on a GPU, in torch on a CPU: gate and up accumulated in
    float32 and not rounded, the activation rounded to bf16 for the down projection, the experts'
    sum in float32. `wrong_cold` serves each cold expert with its neighbour's weights (a bug)."""

    name, capturable = "kernel-numerics", False

    def __init__(self, wrong_cold: bool = False):
        self.wrong_cold = wrong_cold

    def __call__(self, x, ids, w, bank, counts_E=None):
        from hotsplit_probes.cpu_expert import expert_groups

        slots, E = bank.served_E.tolist(), bank.num_experts
        out, w_A = torch.zeros(ids.shape[0], x.shape[1]), w.reshape(-1).float()
        for e, tok, idx in expert_groups(ids, E):
            src = (e + 1) % E if self.wrong_cold and slots[e] < 0 else e
            w13, w2 = bank.weights_of(src, slots[src])
            gate, up = (x[tok].float() @ w13.float().T).chunk(2, dim=-1)
            act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).float()
            out.index_add_(0, tok, (act @ w2.float().T) * w_A[idx, None])
        return out.to(x.dtype)


@pytest.fixture
def gpu_sized(monkeypatch):
    """The selftest's GPU geometry (hidden 1024) on this CPU."""
    small = selftest._geom
    monkeypatch.setattr(selftest, "_geom", lambda info, router, shared: dataclasses.replace(
        small(info, router, shared), hidden=1024, inter=512, shared_inter=512 if shared else 0))


@pytest.mark.parametrize("seed", [0, 3])
def test_the_kernels_bf16_rounding_passes_and_a_wrong_expert_fails(gpu_sized, monkeypatch, seed):
    """The H200's selftest failed at 6.25e-2 on bf16 rounding alone: outputs near 0 that are the
    difference of summands of size ~4 (this arithmetic gives the same 6.25e-2). Each router
    choosing for itself, seeds 1-7 here also tip a near-tie in layer 2 to another expert. Checked
    on one routing against the row's size, the rounding passes and one wrong expert still fails."""
    info = choose_device("cpu")
    monkeypatch.setattr(selftest, "choose_compute", lambda info, precision="native": KernelNumerics())
    right = selftest.check_reference(info, torch.bfloat16, seed)
    assert right.ok, right.detail
    assert 1e-2 < float(right.value.split()[-1]) < 0.1  # rounding of the kernels' kind, not zero
    monkeypatch.setattr(selftest, "choose_compute", lambda info, precision="native": KernelNumerics(True))
    wrong = selftest.check_reference(info, torch.bfloat16, seed)
    assert wrong.ok is False and wrong.detail.startswith("runtime differs from the reference")


def test_the_mxfp4_check_runs_the_fp8_checks_steps_on_mxfp4_experts_and_catches_a_wrong_read(monkeypatch):
    """check_mxfp4 builds its banks in mxfp4 and passes where the runtime reads them right; a
    runtime that reads the wrong nibble of each byte fails it (the reference keeps its weights)."""
    from hotsplit_runtime.precision import Mxfp4Experts

    info = choose_device("cpu")
    row = selftest.check_mxfp4(info, torch.float32)
    assert (row.name, row.ok) == (selftest.MXFP4_EXPERTS, True)
    assert row.detail == "6 steps, mxfp4 (e2m1, one e8m0 scale per 32 inputs), swaps between them"
    decode = Mxfp4Experts.decode

    def nibbles_swapped(self, views, dtype):
        b1, b2, s1, s2 = views
        return decode(self, ((b1 >> 4) | (b1 << 4), (b2 >> 4) | (b2 << 4), s1, s2), dtype)

    monkeypatch.setattr(Mxfp4Experts, "decode", nibbles_swapped)
    row = selftest.check_mxfp4(info, torch.float32)
    assert row.ok is False and row.value.startswith("max err")
