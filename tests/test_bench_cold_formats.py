"""benchmarks/bench_cold_formats.py on the CPU, tiny: each stored precision's cold path is timed
on its own bytes, a failing precision is its row's error, and bad arguments are refused in one
line with nothing on stdout."""

from __future__ import annotations

import json

from tests.conftest import load_benchmark


def test_each_precision_reads_its_own_stored_bytes(capsys):
    bench = load_benchmark("bench_cold_formats")
    assert bench.main(["--scale", "0.02", "--precisions", "native,fp8,mxfp4", "--reps", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    H, INTER, E = doc["hidden"], doc["inter"], doc["experts"]
    assert (H, INTER, E) == (128, 32, 32)  # DeepSeek-V3's 7168 x 2048 scaled, whole 32-input groups
    rows = {r["precision"]: r for r in doc["rows"]}
    assert list(rows) == ["native", "fp8", "mxfp4"] and doc["raw_gbps"] is None  # no zero-copy on a CPU
    assert rows["native"]["read_bytes"] == E * 3 * H * INTER * 2  # bf16
    # e4m3 values, and one float32 scale per 128x128 block (gate and up 1 x 1 each, down 1 x 1),
    # each scale part 16-byte aligned in the blob
    assert rows["fp8"]["read_bytes"] == E * (3 * H * INTER + 16 + 16)
    assert rows["mxfp4"]["read_bytes"] == E * (3 * H * INTER // 2 + 3 * H * INTER // 32)  # e2m1 pairs, e8m0 per 32
    assert all(r["gbps"] > 0 and r["vs_raw"] is None for r in rows.values())


def test_a_precision_that_fails_is_its_rows_error_and_the_others_still_run(monkeypatch, capsys):
    bench = load_benchmark("bench_cold_formats")
    measured = bench.cold_path_gbps

    def fail_mxfp4(info, g, fmt, reps):
        if fmt is not None and "mxfp4" in fmt.describe():
            raise RuntimeError("CUDA error: an illegal memory access\nmore")
        return measured(info, g, fmt, reps)

    monkeypatch.setattr(bench, "cold_path_gbps", fail_mxfp4)
    assert bench.main(["--scale", "0.02", "--reps", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cold path by stored precision on cpu (torch-grouped; 32 experts, hidden 128, inter 32")
    assert out[1].startswith("  fp8    ") and "GB/s of stored bytes (" in out[1]
    assert out[2] == "  mxfp4  error: RuntimeError: CUDA error: an illegal memory access"


def test_bad_arguments_are_refused_in_one_line(capsys):
    bench = load_benchmark("bench_cold_formats")
    assert bench.main(["--precisions", "fp8,auto", "--scale", "0.02"]) == 2
    assert capsys.readouterr() == ("", "error: --precisions takes native, fp8 and mxfp4, got 'fp8,auto'\n")
    assert bench.main([]) == 2  # full size on a machine without CUDA
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: full-size experts need a CUDA GPU") and err.count("\n") == 1
