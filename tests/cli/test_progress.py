"""Progress bars on long work: the shared helper (off when piped and under --json, drawn on a
terminal), the callbacks the library calls, and every long command drawing one."""

from __future__ import annotations

import json
from io import StringIO

import numpy as np
import pytest
from rich.console import Console

from hotsplit_cli.analysis.simulate import POLICIES, SimConfig, simulate
from hotsplit_cli.output import Output


def tty(buf: StringIO) -> Console:
    return Console(file=buf, force_terminal=True, width=100, highlight=False)


def test_no_bar_when_stderr_is_not_a_terminal():
    err = StringIO()
    out = Output(err=err)
    with out.progress("working", 3) as advance:
        for _ in range(3):
            advance(1)
    assert not out.shows_progress and err.getvalue() == ""


def test_no_bar_under_json_even_on_a_terminal():
    buf = StringIO()
    out = Output(json_mode=True, err=tty(buf))
    with out.progress("working", 3) as advance:
        advance(3)
    assert not out.shows_progress and buf.getvalue() == ""


def test_bar_on_a_terminal_counts_what_the_callback_is_told():
    buf = StringIO()
    out = Output(err=tty(buf))
    with out.progress("working", 5) as advance:
        advance(2)
        advance(3)
    text = buf.getvalue()
    assert out.shows_progress and "working" in text and "5/5" in text


def test_lines_printed_during_a_bar_go_above_it_when_both_are_the_terminal():
    o, e = StringIO(), StringIO()
    out = Output(out=tty(o), err=tty(e))
    with out.progress("working", 1):
        out.print("step 10 hit")
    out.print("summary")
    assert "step 10 hit" in e.getvalue() and "step 10 hit" not in o.getvalue()
    assert "summary" in o.getvalue()


def test_stdout_to_a_file_keeps_its_lines_while_the_bar_draws():
    o, e = StringIO(), StringIO()
    out = Output(out=o, err=tty(e))
    with out.progress("working", 1):
        out.print("step 10 hit")
    assert o.getvalue() == "step 10 hit\n" and "step 10 hit" not in e.getvalue()


# ---- the library's callbacks ----


def test_simulate_tells_every_step_of_every_policy():
    rng = np.random.default_rng(0)
    counts_SLE = rng.integers(0, 3, size=(23, 2, 8)).astype(np.float64)
    hot = np.zeros((2, 8), dtype=bool)
    hot[:, :2] = True
    for policies in (POLICIES, ("lru",), ("dynamic", "oracle")):
        ticks: list[int] = []
        simulate(counts_SLE, hot, SimConfig(100, 400, 5, 5, 2, 1.25), policies, ticks.append)
        assert sum(ticks) == 23 * len(policies)


def test_run_tells_every_layer_built_and_every_step():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from hotsplit_runtime.from_recipe import prepare_run

    from hotsplit_cli.config.knobs import resolve_knobs
    from hotsplit_cli.config.recipe import load_recipe

    rec = load_recipe("tiny")
    built: list[int] = []
    p = prepare_run(rec, resolve_knobs(rec.knobs, env={}), steps=23, scale=0.25, advance=built.append)
    assert sum(built) == rec.model.num_moe_layers
    steps: list[int] = []
    s = p.engine.run(p.steps, advance=steps.append)
    assert steps == [1] * 23 and s.steps == 23


def test_synthetic_balance_tells_every_step():
    pytest.importorskip("torch")
    from hotsplit_runtime.hf.synthetic import synthetic_routing

    from hotsplit_cli.config.recipe import load_recipe

    ticks: list[int] = []
    synthetic_routing(load_recipe("tiny"), 7, 4, 0, ticks.append)
    assert sum(ticks) == 7


# ---- every long command draws a bar on a terminal, none under --json or when piped ----


@pytest.fixture
def terminal(monkeypatch):
    """stdout and stderr count as a terminal (rich honours FORCE_COLOR; TTY_COMPATIBLE wins over it)."""
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")


@pytest.fixture
def piped(monkeypatch):
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)


@pytest.fixture
def trace_file(tmp_path):
    from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
    from hotsplit_cli.traffic.trace import save_trace

    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4), steps=60, batch=8, top_k=4,
                         drift_every=30, seed=0)
    return save_trace(tmp_path / "trace.npz", tr)


@pytest.fixture
def fake_probe(monkeypatch, gpu_sources):  # noqa: F811
    monkeypatch.setattr("hotsplit_cli.commands.probe._sources", lambda: gpu_sources)


COMMANDS = {  # name: (argv, the bar's description)
    "run": (["run", "tiny", "--steps", "20", "--scale", "0.25"], "tiny: steps"),
    "balance": (["balance", "tiny", "--steps", "5"], "balance (synthetic)"),
    "simulate": (["simulate", "--trace", "{trace}", "--recipe", "tiny"], "replaying 60 steps x 6 policies"),
    "probe": (["probe", "--full"], "measuring bandwidth"),
}


def _argv(name, trace_file):
    argv, bar = COMMANDS[name]
    return [a.format(trace=trace_file) for a in argv], bar


@pytest.mark.parametrize("name", COMMANDS)
def test_long_command_draws_a_bar_on_a_terminal(cli, name, trace_file, terminal, fake_probe):
    argv, bar = _argv(name, trace_file)
    r = cli(*argv)
    assert r.code == 0, r.err
    assert bar in r.err and bar not in r.out


@pytest.mark.parametrize("name", COMMANDS)
def test_no_bar_under_json_on_a_terminal(cli, name, trace_file, terminal, fake_probe):
    argv, bar = _argv(name, trace_file)
    r = cli(*argv, "--json")
    assert r.code == 0, r.err
    json.loads(r.out)
    assert bar not in r.err


@pytest.mark.parametrize("name", COMMANDS)
def test_no_bar_when_piped(cli, name, trace_file, piped, fake_probe):
    argv, bar = _argv(name, trace_file)
    r = cli(*argv)
    assert r.code == 0, r.err
    assert bar not in r.err and "\x1b[" not in r.err
