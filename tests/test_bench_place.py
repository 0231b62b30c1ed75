"""benchmarks/bench_place.py's comparison with SGLang's shipped EPLB: skipped in one line without
sglang, and the algorithm files loaded as they are when the package's own imports are missing."""

from __future__ import annotations

import sys

from tests.conftest import load_benchmark


def test_without_sglang_the_comparison_is_skipped_in_one_line(monkeypatch, capsys):
    bench = load_benchmark("bench_place")
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    bench.sglang_check([])
    out = capsys.readouterr().out
    assert out.splitlines() == ["note: sglang is not installed: the comparison with SGLang's own `deepseek` and "
                                "`deepseek_vec` algorithms is skipped"]


def test_the_algorithm_files_are_loaded_when_the_package_import_fails(tmp_path, monkeypatch):
    """`pip install --no-deps sglang` leaves the package's serving imports missing; the two files,
    which import only torch, are still run as shipped."""
    pkg = tmp_path / "sglang"
    algos = pkg / "srt" / "eplb" / "eplb_algorithms"
    algos.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import a_missing_serving_dependency\n")
    for name in ("deepseek", "deepseek_vec"):
        (algos / f"{name}.py").write_text(f"WHO = {name!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, mod)
    bench = load_benchmark("bench_place")
    mods, how = bench.sglang_algorithms()
    assert [m.WHO for m in mods] == ["deepseek", "deepseek_vec"]
    assert how.startswith("`import sglang` needs a_missing_serving_dependency; loaded ")


def test_a_package_without_the_algorithm_files_is_named(tmp_path, monkeypatch):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("import a_missing_serving_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, mod)
    mods, how = load_benchmark("bench_place").sglang_algorithms()
    assert mods is None and how.startswith("sglang has no ") and how.endswith("deepseek.py")


def test_the_flat_only_row_quotes_eplbs_mean_over_the_same_pair_modes(capsys):
    """The variance row is flat only; the EPLB mean beside it is computed over the flat
    pair-modes of the EPLB row printed above it, not written into the label."""
    import numpy as np

    bench = load_benchmark("bench_place")
    rng = np.random.default_rng(3)
    pairs = [(f"p{i}", rng.gamma(0.5, size=(bench.L, bench.E)) * 1e5,
              rng.gamma(0.5, size=(bench.L, bench.E)) * 1e5) for i in range(2)]
    bench.later_window_methods(pairs)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in capsys.readouterr().out.splitlines()}
    eplb = [float(x) for x in rows["EPLB port (reference)"].split(" | ")[1].split()]
    assert len(eplb) == 4  # flat, hier per pair
    (label,) = [k for k in rows if k.startswith("replicas by variance")]
    assert label.endswith(f"(flat only: mean of the flat pairs, EPLB {np.mean(eplb[0::2]):.4f})")
    assert rows[label].split(" | ")[1].split()[1::2] == ["-", "-"]
