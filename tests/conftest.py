"""Shared test helpers: run the CLI in-process and build small histograms; every test runs
without TRITON_INTERPRET unless it asks for the interpreter (`triton_interpreted`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest

from hotsplit_cli.traffic.hist import Histogram, save_hist

# Whether this test process was started with TRITON_INTERPRET=1 (a user may export it): triton,
# once imported, stays in the mode it was imported in, whatever the tests set afterwards.
STARTED_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
RERUN = "test_runtime_bank.py::test_triton_kernel_tests_run_in_a_fresh_interpreter_process"


@pytest.fixture(autouse=True)
def _without_triton_interpreter(monkeypatch):
    """Pin each test's environment: the CPU runtime without Triton, as on a machine without
    TRITON_INTERPRET; the interpreter tests set it themselves (`triton_interpreted`)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def interpreter_mode() -> bool | None:
    """Whether the Triton kernels of this process run in the interpreter: fixed by the first import
    of triton (or build of the kernels); None while neither has happened."""
    import sys

    built = sys.modules.get("hotsplit_runtime.triton_kernels")  # the kernels, once imported in this process
    if built is not None:
        return bool(built.INTERPRET)
    if "triton" not in sys.modules:
        return None
    # triton.knobs reads the environment as it is now; triton's own library was jitted at import.
    import triton.language as tl

    return type(tl.standard.sigmoid).__name__ == "InterpretedFunction"


def cpu_without_triton():
    """`choose_device("cpu")` as without TRITON_INTERPRET, for module- and session-level devices
    (set up before the autouse fixture above pins the environment)."""
    from hotsplit_runtime.device import choose_device

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TRITON_INTERPRET", raising=False)
        return choose_device("cpu")


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


def load_benchmark(name: str):
    """A script of benchmarks/ imported as a module (they are scripts, not a package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def interrupt_at(engine, step: int) -> None:
    """Make `engine`'s traffic raise KeyboardInterrupt (Ctrl-C) when step `step` is drawn."""
    from hotsplit_runtime.engine import ArraySource

    inner = engine.source.steps()

    def steps():
        for i, routed in enumerate(inner):
            if i == step:
                raise KeyboardInterrupt
            yield routed

    engine.source = ArraySource("synthetic", engine.source.tokens_per_step, steps())


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


def write_fixed_rates_platform(path, cpu_gbps: float = 10.0):
    """A platform.json of a machine without a GPU whose CPU expert rate is `cpu_gbps` at every
    token count and whose hand-off costs nothing, measured on recipes/tiny.yaml's experts as the
    CPU runtime computes them (256x128 float32): a tiny run takes these rates as they are, never
    rates measured at run time (which under load vary from run to run). A CPU run's device path is
    this same CPU, so the split's decision is fixed too."""
    from hotsplit_cli.core.jsonio import write_json_atomic

    cells = [[t, {"median_gbps": cpu_gbps}] for t in (1, 4, 16)]
    write_json_atomic(path, {
        "schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z",
        "host": {"numa_nodes": [{}], "copy_gbps": None, "mem_available_bytes": None,
                 "cpu_expert": [{"node": None, "by_tokens": cells, "handoff_ms": 0.0,
                                 "shape": {"hidden": 256, "inter": 128, "dtype": "float32"}}]},
        "gpus": [], "reasons": []})
    return path


@pytest.fixture
def fixed_rates_platform(tmp_path):
    """platform.json with fixed cold-path rates (`write_fixed_rates_platform`)."""
    return write_fixed_rates_platform(tmp_path / "fixed-rates-platform.json")


@pytest.fixture
def triton_interpreted(monkeypatch):
    """The Triton kernels built for the interpreter. triton.jit reads TRITON_INTERPRET when it is
    applied, to the kernels and to triton's own library alike, so both must have seen it.
    (test_runtime_bank.py re-runs every test using this in a fresh interpreter process.)"""
    if interpreter_mode() is False:
        pytest.skip(f"triton was imported (or the kernels built) without TRITON_INTERPRET=1 in this process; "
                    f"{RERUN} runs this test again in its own process")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when triton is first imported
    pytest.importorskip("triton")


@pytest.fixture
def gpu_sources(tmp_path):
    """The probe's fake two-GPU, two-node machine (tests/fakes/machine.py), for probe, planning
    and CLI tests alike."""
    from tests.fakes.machine import fake_gpu_sources

    return fake_gpu_sources(tmp_path)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """A tiny random checkpoint of every supported family, built once per session (tests/fakes/hf.py)."""
    pytest.importorskip("transformers", minversion="5.0")
    from hotsplit_runtime.hf.loader import FAMILIES

    from tests.fakes.hf import build_checkpoint

    root = tmp_path_factory.mktemp("hf")
    return {f: build_checkpoint(root / f, f) for f in FAMILIES}
