"""Shared test helpers: run the CLI in-process and build small histograms."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from hotsplit_cli.hist import Histogram, save_hist


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """Run `hotsplit ARGS...` in-process; returns exit code, stdout and stderr separately."""
    from hotsplit_cli.cli import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def make_hist(counts_LE, layers=None, top_k: int = 2, model: str = "test") -> Histogram:
    counts_LE = np.asarray(counts_LE, dtype=np.float64)
    layers = tuple(range(counts_LE.shape[0])) if layers is None else tuple(layers)
    return Histogram(model=model, source="generated in tests", top_k=top_k,
                     tokens=int(counts_LE.sum() // top_k), layers=layers, counts_LE=counts_LE)


@pytest.fixture
def tiny_hist(tmp_path):
    """A histogram matching recipes/tiny.yaml (MoE layers 1..4, 32 experts, top-4)."""
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 1000, size=(4, 32)).astype(np.float64)
    path = tmp_path / "hist.json"
    save_hist(path, make_hist(counts, layers=(1, 2, 3, 4), top_k=4, model="tiny"))
    return path


@pytest.fixture
def triton_interpreted(monkeypatch):
    """The Triton kernels built for the interpreter. triton.jit reads TRITON_INTERPRET when it is
    applied, to the kernels and to triton's own library alike, so both must have seen it.
    (test_runtime_bank.py re-runs every test using this in a fresh interpreter process.)"""
    import sys

    built = sys.modules.get("runtime.triton_kernels")  # the kernels, once imported in this process
    if built is not None:
        if not built.INTERPRET:
            pytest.skip("the Triton kernels were built without TRITON_INTERPRET=1 in this process")
    elif "triton" in sys.modules and not sys.modules["triton"].knobs.runtime.interpret:
        pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when triton is first imported
    pytest.importorskip("triton")
