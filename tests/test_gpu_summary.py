"""scripts/gpu_checks.sh and the summary it prints (scripts/gpu_summary.py), on the CPU: the
script's syntax and shape, the pytest log parsing, and a summary of a run where things failed."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_checks.sh"


def _summary_module():
    spec = importlib.util.spec_from_file_location("gpu_summary_under_test", ROOT / "scripts" / "gpu_summary.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gs = _summary_module()

# `pytest -o addopts= -v -rfE` as the script runs it (captured, trimmed).
LOG = """\
============================= test session starts ==============================
collecting ... collected 20 items / 16 deselected / 4 selected

tests/test_runtime_bank.py::test_cuda_zero_copy_view_reads_pinned_memory_in_place PASSED [ 25%]
tests/test_runtime_bank.py::test_cuda_swaps_in_flight_equal_reference FAILED [ 50%]
tests/test_hf_models.py::test_cuda_cold_bank_zero_copy_matches_transformers[qwen3_moe] PASSED [ 75%]
tests/test_hf_models.py::test_cuda_cold_bank_zero_copy_matches_transformers[gpt_oss] ERROR [100%]

=================================== FAILURES ===================================
E   torch.AcceleratorError: CUDA error: invalid argument
=========================== short test summary info ============================
FAILED tests/test_runtime_bank.py::test_cuda_swaps_in_flight_equal_reference - torch.AcceleratorError: CUDA error
ERROR tests/test_hf_models.py::test_cuda_cold_bank_zero_copy_matches_transformers[gpt_oss] - RuntimeError
============= 1 failed, 2 passed, 171 deselected, 1 error in 12.31s =============
"""
KILLED = """\
collecting ... collected 9 items

tests/test_runtime_bank.py::test_cuda_graph_replay_equals_reference FAILED [ 11%]
tests/test_probe_gpu.py::test_measure_gpu_small_sweep
"""


def test_script_syntax_is_valid():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_script_passes_shellcheck():
    assert subprocess.run(["shellcheck", "-S", "warning", str(SCRIPT)]).returncode == 0


def test_script_runs_every_cuda_test_and_bounds_every_step():
    text = SCRIPT.read_text()
    assert not re.search(r"pytest[^\n]*\s-x\b", text)  # no stop at the first failure
    files = re.search(r"CUDA_TEST_FILES=\(([^)]*)\)", text).group(1).split()
    assert files and all((ROOT / f).is_file() for f in files)
    assert "CUDA_LAUNCH_BLOCKING=1 timeout" in text and 'timeout -k 5 "$limit" "$@"' in text
    assert "bench_runtime.py \"${args[@]}\"" in text and "--full-size" in text
    assert "[ -f benchmarks/bench_cold_path.py ]" in text
    assert "trap finish EXIT" in text and "gpu_checks.tar.gz" in text and "summary.txt" in text
    # the EP tests run with every rank on the GPU
    assert re.search(r"HOTSPLIT_TEST_EP_DEVICE=cuda run_step ep_tests .*\n.*tests/runtime/test_ep\.py", text)
    assert re.search(r"STEPS\+=\(ep_run ep_tests\)", text)


def test_failed_ids_from_result_lines_and_short_summary_each_once():
    assert gs.failed_test_ids(LOG) == [
        "tests/test_runtime_bank.py::test_cuda_swaps_in_flight_equal_reference",
        "tests/test_hf_models.py::test_cuda_cold_bank_zero_copy_matches_transformers[gpt_oss]"]
    assert gs.pytest_counts(LOG) == "1 failed, 2 passed, 171 deselected, 1 error in 12.31s"
    assert gs.stopped_during(LOG) is None


def test_a_killed_run_names_its_failures_so_far_and_the_test_it_was_in():
    assert gs.failed_test_ids(KILLED) == ["tests/test_runtime_bank.py::test_cuda_graph_replay_equals_reference"]
    assert gs.pytest_counts(KILLED) is None
    assert gs.stopped_during(KILLED) == "tests/test_probe_gpu.py::test_measure_gpu_small_sweep"


def test_failed_tests_command_prints_one_id_a_line(tmp_path, capsys):
    log = tmp_path / "cuda_tests.out"
    log.write_text(LOG)
    assert gs.main(["--failed-tests", str(log)]) == 0
    assert capsys.readouterr().out.splitlines() == gs.failed_test_ids(LOG)


def _selftest_doc(fail: str | None = None) -> dict:
    checks = [{"name": "runtime = reference (random hot sets)", "ok": True, "value": "max err 0", "detail": "",
               "error": None},
              {"name": "zero-copy read", "ok": True, "value": "51.0 GB/s raw", "detail": "", "error": None}]
    if fail:
        checks.insert(1, {"name": "runtime = reference (swaps mid-run)", "ok": False, "value": "error",
                          "detail": fail, "error": {"message": fail}})
    return {"ok": fail is None, "kernel": "triton", "checks": checks,
            "measures": {"zero_copy": {"raw_gbps": 51.0, "cold_path_gbps": 45.0, "cold_vs_raw": 45 / 51,
                                       "cold_path_fp8_gbps": 38.0}}}


def _platform(zero_copy_gbps: float) -> dict:
    return {"schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z",
            "host": {"numa_nodes": [{}]}, "reasons": [],
            "gpus": [{"index": 0, "cuda_index": 0, "summary": {"zero_copy_read_gbps": zero_copy_gbps}}]}


def test_summary_of_a_run_with_failures_skips_and_reruns(tmp_path):
    w = tmp_path
    (w / "status.tsv").write_text("\n".join("\t".join(r) for r in [
        ("selftest", "first", "1", "40", "90", ""), ("probe", "first", "0", "30", "45", ""),
        ("bench_full", "first", "124", "120", "120", "timed out after 120 s"),
        ("cuda_tests", "first", "1", "50", "90", ""),
        ("bench_runtime", "first", "skipped", "0", "30", "budget: 12 s left"),
        ("selftest", "blocking", "1", "45", "90", ""), ("cuda_tests", "blocking", "1", "20", "90", "")]) + "\n")
    first_line = "RuntimeError: CUDA error: invalid argument (at runtime/moe.py:222)"
    (w / "selftest.out").write_text(json.dumps(_selftest_doc(first_line)))
    (w / "selftest.blocking.out").write_text(json.dumps(_selftest_doc("RuntimeError: CUDA error: at the launch")))
    (w / "probe.out").write_text(json.dumps(_platform(50.0)))
    (w / "bench_full.out").write_text("")
    (w / "bench_full.err").write_text("compiling\nstill compiling\n")
    (w / "cuda_tests.out").write_text(LOG)
    (w / "cuda_tests.blocking.out").write_text(KILLED)
    text = gs.summary(w)
    assert "selftest: ok False | kernel triton" in text
    assert re.search(r"runtime = reference \(swaps mid-run\)\s+FAIL\s+error\s+" + re.escape(first_line), text)
    assert "cold path 45.0 GB/s vs probe zero-copy read 50.0 GB/s = 90% (target >= 80%: ok)" in text
    assert "cold path, fp8 experts 38.0 GB/s vs probe zero-copy read 50.0 GB/s = 76% (target >= 80%: MISSED)" in text
    assert "bench_full: no JSON document (rc 124, timed out after 120 s); its stderr ends:\n    compiling" in text
    assert "CUDA tests: 1 failed, 2 passed, 171 deselected, 1 error in 12.31s" in text
    assert "  FAILED tests/test_hf_models.py::test_cuda_cold_bank_zero_copy_matches_transformers[gpt_oss]" in text
    assert "CUDA tests re-run, blocking: did not finish" in text
    assert "  stopped during tests/test_probe_gpu.py::test_measure_gpu_small_sweep" in text
    assert "bench_runtime: skipped (budget: 12 s left)" in text
    assert "selftest re-run with CUDA_LAUNCH_BLOCKING=1: rc 1" in text
    assert "FAIL                   error  RuntimeError: CUDA error: at the launch" in text


def test_an_unreadable_result_is_said_in_its_place_and_the_rest_still_shows(tmp_path):
    (tmp_path / "status.tsv").write_text("selftest\tfirst\t0\t30\t90\t\n")
    (tmp_path / "selftest.out").write_text('{"ok": true, "kernel"')  # truncated
    (tmp_path / "cuda_tests.out").write_text(LOG)
    text = gs.summary(tmp_path)
    assert "selftest: unreadable (JSONDecodeError" in text
    assert "CUDA tests: 1 failed" in text
    assert "bench_full: not run" in text


def test_a_full_size_document_is_rendered_by_the_benchmarks_own_table(tmp_path):
    from tests.conftest import load_benchmark

    fullsize = load_benchmark("fullsize")
    doc = {"full_size": True, "scale": 1.0, "device": "cuda:0", "kernel": "torch-grouped", "d2d_copy_gbps": 4000.0,
           "zero_copy_gbps": 55.0, "zero_copy_source": "measured", "launch_ms": 0.01, "reasons": {},
           "targets": fullsize.TARGETS, "models": [], "rows": [], "errors": 0}
    (tmp_path / "bench_full.out").write_text(json.dumps(doc))
    assert gs.full_size_lines(tmp_path) == fullsize.table_lines(doc)


def test_the_kernels_cold_path_by_precision_is_rendered_by_the_benchmarks_own_report(tmp_path):
    from tests.conftest import load_benchmark

    bench = load_benchmark("bench_cold_formats")
    doc = {"device": "cuda:0", "kernel": "triton", "hidden": 7168, "inter": 2048, "experts": 32, "raw_gbps": 50.0,
           "rows": [{"precision": "fp8", "gbps": 40.0, "read_bytes": 1_409_630_208, "vs_raw": 0.8},
                    {"precision": "mxfp4", "error": "RuntimeError: boom"}]}
    (tmp_path / "status.tsv").write_text("cold_formats\tfirst\t1\t20\t30\t\n")
    (tmp_path / "cold_formats.out").write_text(json.dumps(doc))
    lines = gs.cold_formats_lines(tmp_path)
    assert lines == bench.report_lines(doc)
    assert lines[0].endswith("raw zero-copy read 50.0 GB/s")
    assert lines[1:] == ["  fp8    40 GB/s of stored bytes (1409.6 MB a step) = 80% of the raw read",
                         "  mxfp4  error: RuntimeError: boom"]
    assert "\n".join(lines) in gs.summary(tmp_path)
    (tmp_path / "cold_formats.out").write_text("")
    assert gs.cold_formats_lines(tmp_path)[0] == "cold_formats: no JSON document (rc 1); its stderr ends:"


def test_the_script_measures_the_kernels_cold_path_at_fp8_and_mxfp4():
    text = SCRIPT.read_text()
    assert re.search(r"STEPS=\([^)]*\bcold_formats\b", text)
    assert "benchmarks/bench_cold_formats.py" in text and (ROOT / "benchmarks" / "bench_cold_formats.py").is_file()


def _prefetch_timing_doc() -> dict:
    """A `prefetch_timing` step's document as a GPU run writes it (figures made up, shapes real)."""
    def row(batch, graph, off, on, copy, waited, compute):
        return {"batch": batch, "graph": graph, "off_ms": off, "trace_ms": on, "ratio": on[1] / off[1],
                "ratio_p10": 0.9, "ratio_p90": 1.2,
                "overlap": {"steps": 3, "copy_ms": copy, "exposed_ms": waited, "compute_ms": compute,
                            "layers_staged_per_step": 7.0,
                            "hidden_fraction": 1 - sum(waited) / sum(copy)}}
    return {"recipe": "deepseek-v2-lite", "scale": 0.25, "layers": 8, "experts": 64, "top_k": 6,
            "hot_fraction": 0.25, "rounds": 3, "steps_per_round": 8,
            "prefetch": {"slots": 4, "pool": "shared", "guesses": 12}, "device": "cuda:0",
            "traffic": "synthetic Zipf(1.0) trace, predictor fitted on another draw", "overlap_reason": None,
            "load_average": [0.5, 0.7],
            "rows": [row(1, False, [1.0, 1.1, 1.2], [0.9, 1.0, 1.4], [0.4, 0.4, 0.4], [0.1, 0.1, 0.1],
                         [0.8, 0.9, 1.0]),
                     row(1, True, [0.5, 0.6, 0.7], [0.6, 0.7, 0.8], [0.4, 0.4, 0.4], [0.4, 0.4, 0.4],
                         [0.3, 0.3, 0.3]),
                     {"batch": 32, "graph": None, "error": "RuntimeError: CUDA error: out of memory"}]}


def test_prefetch_timing_is_rendered_by_the_benchmarks_own_table(tmp_path):
    from tests.conftest import load_benchmark

    bench = load_benchmark("bench_prefetch_gpu")
    doc = _prefetch_timing_doc()
    (tmp_path / "status.tsv").write_text("prefetch_timing\tfirst\t1\t41\t60\t\n")
    (tmp_path / "prefetch_timing.out").write_text(json.dumps(doc))
    lines = gs.prefetch_timing_lines(tmp_path)
    assert lines == bench.table_lines(doc)
    assert lines[0].startswith("prefetch timing: deepseek-v2-lite at scale 0.25, 8 MoE layers x 64 experts, top-6, "
                               "25% hot, on cuda:0; synthetic Zipf(1.0) trace")
    assert lines[2].split() == ["1", "eager", "1.100", "(1.000-1.200)", "1.000", "(0.900-1.400)", "0.909",
                                "(0.90-1.20)"]
    assert lines[3].split()[:2] == ["1", "graph"]
    assert lines[4] == "     32 -      error: RuntimeError: CUDA error: out of memory"
    assert lines[6] == ("    batch  1 eager: copy 0.400 (0.400-0.400), compute waited 0.100 (0.100-0.100), compute "
                        "0.900 (0.800-1.000); 75% hidden (7.0 layers staged a step, 3 steps)")
    assert lines[7].endswith("compute 0.300 (0.300-0.300); 0% hidden (7.0 layers staged a step, 3 steps)")
    assert "\n".join(lines) in gs.summary(tmp_path)
    (tmp_path / "prefetch_timing.out").write_text("")
    (tmp_path / "status.tsv").write_text("prefetch_timing\tfirst\t124\t60\t60\ttimed out after 60 s\n")
    assert gs.prefetch_timing_lines(tmp_path)[0] == ("prefetch_timing: no JSON document (rc 124, timed out after "
                                                     "60 s); its stderr ends:")


def test_the_prefetch_checks_output_is_in_the_summary(tmp_path):
    (tmp_path / "status.tsv").write_text("prefetch\tfirst\t0\t12\t30\t\n")
    (tmp_path / "prefetch.out").write_text("device NVIDIA H200 2.13\nok\n")
    assert "prefetch:\n  device NVIDIA H200 2.13\n  ok\n" in gs.summary(tmp_path)


def test_the_script_times_prefetch_within_its_budget():
    text = SCRIPT.read_text()
    assert re.search(r"STEPS=\([^)]*\bprefetch prefetch_timing\b", text)
    assert re.search(r'run_step prefetch_timing "\$1" 60 "\$PY" benchmarks/bench_prefetch_gpu\.py', text)
    assert '[ "$HAS_CUDA" = 1 ] || args+=(--dry)' in text
    assert 'BUDGET_S="${GPU_CHECKS_BUDGET_S:-400}"' in text
