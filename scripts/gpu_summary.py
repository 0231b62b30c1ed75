"""The summary table of a `scripts/gpu_checks.sh` run, from the folder its steps wrote into.

    python scripts/gpu_summary.py WORKDIR          # the summary, on stdout
    python scripts/gpu_summary.py --failed-tests LOG  # failing pytest ids of a `pytest -v -rfE` log

Every section is read on its own: a missing or unreadable result is said in its place, and the
summary itself never fails. Files in WORKDIR: status.tsv (one line per step run: name, run,
rc, seconds, limit, note) and per step `<name>.out` / `<name>.err` (a re-run with
CUDA_LAUNCH_BLOCKING=1: `<name>.blocking.out` / `.err`).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

COLD_TARGET = 0.80  # the cold expert path against the probe's zero-copy read
_RESULT = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+::\S+)")
_COUNTS = re.compile(r"^=+ (.*\b(passed|failed|error|errors|skipped|deselected|no tests ran)\b.*) =+$")


def failed_test_ids(log: str) -> list[str]:
    """Ids of the tests that failed or errored, in order, each once: from the `-v` result lines
    (present even when the run was killed part-way) and the `-rfE` short summary."""
    ids: list[str] = []
    for line in log.splitlines():
        m = _RESULT.match(line)
        found = m.group(1) if m and m.group(2) in ("FAILED", "ERROR") else None
        s = _SUMMARY.match(line)
        found = found or (s.group(2) if s else None)
        if found and found not in ids:
            ids.append(found)
    return ids


def pytest_counts(log: str) -> str | None:
    """pytest's closing line (`2 failed, 7 passed in 12.3s`), None when the run did not finish."""
    for line in reversed(log.splitlines()):
        m = _COUNTS.match(line.strip())
        if m:
            return m.group(1)
    return None


def stopped_during(log: str) -> str | None:
    """The test a killed or crashed run was in: a `-v` line with a test id and no result."""
    lines = [x for x in log.splitlines() if x.strip()]
    if lines and "::" in lines[-1] and not _RESULT.match(lines[-1]) and pytest_counts(log) is None:
        return lines[-1].split()[0]
    return None


def read_status(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        name, run, rc, secs, limit, note = (line.split("\t") + [""] * 6)[:6]
        rows.append({"step": name, "run": run, "rc": rc, "s": secs, "limit": limit, "note": note})
    return rows


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _tail(path: Path, n: int = 4) -> list[str]:
    return [f"    {x}" for x in _text(path).strip().splitlines()[-n:]]


def _json(work: Path, name: str) -> dict | None:
    text = _text(work / f"{name}.out").strip()
    return json.loads(text) if text else None


def no_document(work: Path, name: str) -> list[str]:
    """Why step run `name` (`step` or `step.blocking`) left no document: skipped, or its exit
    code and the end of its stderr."""
    step, _, blocking = name.partition(".")
    run = "blocking" if blocking else "first"
    r = next((r for r in read_status(work / "status.tsv") if r["step"] == step and r["run"] == run), None)
    if r is None:
        return [f"{name}: not run"]
    if r["rc"] == "skipped":
        return [f"{name}: skipped ({r['note']})"]
    return [f"{name}: no JSON document (rc {r['rc']}{', ' + r['note'] if r['note'] else ''}); its stderr ends:",
            *_tail(work / f"{name}.err")]


def status_lines(work: Path) -> list[str]:
    rows = read_status(work / "status.tsv")
    out = ["steps (re-runs with CUDA_LAUNCH_BLOCKING=1 are 'blocking'; logs <step>[.blocking].out/.err):",
           f"  {'step':16} {'run':9} {'rc':>7} {'s':>5} {'limit':>6}  note"]
    for r in rows:
        out.append(f"  {r['step']:16} {r['run']:9} {r['rc']:>7} {r['s']:>5} {r['limit']:>6}  {r['note']}")
    return out


def selftest_lines(work: Path, name: str = "selftest") -> list[str]:
    doc = _json(work, name)
    if doc is None:
        return no_document(work, name)
    out = [f"{name}: ok {doc['ok']} | kernel {doc['kernel']}"]
    for c in doc["checks"]:
        flag = {True: "pass", False: "FAIL", None: "-"}[c["ok"]]
        out.append(f"  {c['name'][:44]:44} {flag:5} {c['value']:>22}  {c['detail']}")
    return out


def probe_zero_copy_gbps(work: Path) -> float | None:
    """The probe's zero-copy read of GPU 0 (platform.json summary), None without one."""
    from hotsplit_cli.config.platform_file import load_platform

    path = work / "probe.out"
    if not path.exists() or not path.read_text().strip():
        return None
    gpu = load_platform(path).gpu_of_cuda(0)
    return gpu.zero_copy_read_gbps if gpu else None


def cold_path_lines(work: Path) -> list[str]:
    doc = _json(work, "selftest")
    zc = (doc or {}).get("measures", {}).get("zero_copy")
    if not zc:
        return ["cold path: not measured (selftest's zero-copy measure is missing)"]
    probe = probe_zero_copy_gbps(work)
    if not probe:
        return [f"cold path {zc['cold_path_gbps']:.1f} GB/s = {100 * zc['cold_vs_raw']:.0f}% of the selftest's "
                f"raw zero-copy read; no probe figure to compare with"]
    out = []
    for label, key in (("cold path", "cold_path_gbps"), ("cold path, fp8 experts", "cold_path_fp8_gbps")):
        if zc.get(key):
            ratio = zc[key] / probe
            out.append(f"{label} {zc[key]:.1f} GB/s vs probe zero-copy read {probe:.1f} GB/s = {100 * ratio:.0f}% "
                       f"(target >= {100 * COLD_TARGET:.0f}%: {'ok' if ratio >= COLD_TARGET else 'MISSED'})")
    return out


def benchmark_lines(work: Path, step: str, module: str, render: str) -> list[str]:
    """Step `step`'s JSON document, rendered by its benchmark's own function `render` of
    benchmarks/`module`.py."""
    doc = _json(work, step)
    if doc is None:
        return no_document(work, step)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    return getattr(importlib.import_module(module), render)(doc)


def cold_formats_lines(work: Path) -> list[str]:
    """The kernels' cold path per stored precision (benchmarks/bench_cold_formats.py)."""
    return benchmark_lines(work, "cold_formats", "bench_cold_formats", "report_lines")


def full_size_lines(work: Path) -> list[str]:
    return benchmark_lines(work, "bench_full", "fullsize", "table_lines")


def prefetch_timing_lines(work: Path) -> list[str]:
    """Step time with prefetch off and trace, and the staging copies hidden (benchmarks/bench_prefetch_gpu.py)."""
    return benchmark_lines(work, "prefetch_timing", "bench_prefetch_gpu", "table_lines")


def bench_runtime_lines(work: Path) -> list[str]:
    doc = _json(work, "bench_runtime")
    if doc is None:
        return no_document(work, "bench_runtime")
    out = [f"bench_runtime {doc['recipe']} on {doc['device']} ({doc['kernel']}, experts {doc['experts']})"]
    for r in doc["rows"]:
        head = f"  batch {r['batch']:>3} hot {100 * r['hot_fraction']:>3.0f}%"
        out.append(head + (f"  error: {r['error']}" if "error" in r else
                           f"  runtime {r['runtime_ms']:8.3f} ms  reference {r['reference_ms']:8.3f} ms"
                           f"  ratio {r['ratio']:.3f}"))
    return out


def cuda_test_lines(work: Path) -> list[str]:
    out = []
    for name, label in (("cuda_tests", "CUDA tests"), ("cuda_tests.blocking", "CUDA tests re-run, blocking")):
        path = work / f"{name}.out"
        if not path.exists():
            continue
        log = _text(path)
        out.append(f"{label}: {pytest_counts(log) or 'did not finish'}")
        out += [f"  FAILED {t}" for t in failed_test_ids(log)]
        during = stopped_during(log)
        if during:
            out.append(f"  stopped during {during}")
    return out or no_document(work, "cuda_tests")


def text_lines(work: Path, name: str, n: int = 12) -> list[str]:
    text = _text(work / f"{name}.out").strip()
    return [f"{name}:", *[f"  {x}" for x in text.splitlines()[-n:]]] if text else []


def blocking_lines(work: Path) -> list[str]:
    """Each re-run with CUDA_LAUNCH_BLOCKING=1: its exit code, its FAIL rows (selftest), the end
    of its stderr (the tests' failures are listed with the CUDA tests)."""
    out = []
    for r in read_status(work / "status.tsv"):
        if r["run"] != "blocking":
            continue
        name = f"{r['step']}.blocking"
        out.append(f"{r['step']} re-run with CUDA_LAUNCH_BLOCKING=1: rc {r['rc']} {r['note']}".rstrip())
        if r["step"] == "selftest":
            out += [line for line in selftest_lines(work, name) if "FAIL" in line or line.startswith(name)]
        elif r["step"] != "cuda_tests":
            out += _tail(work / f"{name}.err")
    return out


def summary(work: Path) -> str:
    sections: list[tuple[str, Callable[[Path], list[str]]]] = [
        ("env", lambda w: _text(w / "env.out").strip().splitlines()[:3]),
        ("notes", lambda w: _text(w / "notes.txt").strip().splitlines()),
        ("steps", status_lines), ("selftest", selftest_lines), ("cold path", cold_path_lines),
        ("cold path by precision", cold_formats_lines),
        ("prefetch", lambda w: text_lines(w, "prefetch")), ("prefetch timing", prefetch_timing_lines),
        ("full-size", full_size_lines), ("CUDA tests", cuda_test_lines), ("bench_runtime", bench_runtime_lines),
        ("bench_probe", lambda w: text_lines(w, "bench_probe")),
        ("bench_cold_path", lambda w: text_lines(w, "bench_cold_path")),
        ("re-runs", blocking_lines),
    ]
    out: list[str] = []
    for title, lines in sections:
        try:
            got = lines(work)
        except Exception as exc:  # one unreadable result never hides the others
            first = (str(exc).strip().splitlines() or [""])[0]
            got = [f"{title}: unreadable ({type(exc).__name__}: {first})"]
        if got:
            out += [*got, ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--failed-tests":
        print("\n".join(failed_test_ids(_text(Path(argv[1])))))
        return 0
    if len(argv) != 1:
        print("usage: gpu_summary.py WORKDIR | --failed-tests LOG", file=sys.stderr)
        return 2
    print(summary(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
