"""The one loop's hooks: a rank of an expert-parallel job steps, closes windows, times and
summarises in `Engine.run`, adding only its rebalancing and its refusal to stop alone."""

import dataclasses

import numpy as np
import pytest
import torch
from hotsplit_runtime.distributed.dispatch import ExchangeStats
from hotsplit_runtime.distributed.rank import RankLoop, run_rank
from hotsplit_runtime.engine import Engine
from hotsplit_runtime.from_recipe import prepare_run

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe


def _prepared(steps=12, **env):
    r = load_recipe("tiny")
    r = dataclasses.replace(r, run=dataclasses.replace(r.run, scale=0.25))
    knobs = resolve_knobs(r.knobs, {f"HOTSPLIT_{k.upper()}": str(v) for k, v in {"dyn_steps": 4, **env}.items()})
    return prepare_run(r, knobs, steps=steps)


class _ExchangeFake:
    def __init__(self):
        self.stats, self.control = ExchangeStats(), None


@pytest.fixture(autouse=True)
def _no_job(monkeypatch):
    """No process group here: the job's agreement on Ctrl-C at a window is "go on"."""
    monkeypatch.setattr("hotsplit_runtime.distributed.rank.job_stops", lambda control: False)


def test_a_rank_runs_the_engines_loop_with_its_hooks(monkeypatch):
    p = _prepared()
    model = p.engine.model
    model.exchange = _ExchangeFake()
    calls = []
    real_run = Engine.run

    def spy(self, steps, on_record=None, advance=None, hooks=None):
        calls.append(hooks)
        return real_run(self, steps, on_record, advance, hooks)
    monkeypatch.setattr(Engine, "run", spy)
    windows = []
    out = run_rank(p.engine, p.steps, lambda rec, loads: windows.append((rec.step, loads.shape)))
    assert len(calls) == 1 and isinstance(calls[0], RankLoop)
    assert [w[0] for w in windows] == [4, 8, 12] and out.summary.steps == 12
    assert out.summary.records == p.engine.book.records


class _Rebalancer:
    def __init__(self):
        self.events = []

    def after_step(self, step):
        self.events.append(("after", step))

    def maybe(self, step):
        self.events.append(("maybe", step))

    def finish(self):
        self.events.append(("finish",))


def test_rank_hooks_rebalance_every_eplb_steps_but_not_after_the_last():
    p = _prepared(steps=12)
    rb = _Rebalancer()
    p.engine.run(p.steps, hooks=RankLoop(None, eplb_steps=6, rebalancer=rb))
    assert [e for e in rb.events if e[0] != "after"] == [("maybe", 6), ("finish",)]
    assert [e[1] for e in rb.events if e[0] == "after"] == list(range(1, 13))


def test_a_rank_cannot_stop_alone_but_a_single_rank_stops_with_its_summary(monkeypatch):
    def interrupted(self, routed):
        raise KeyboardInterrupt
    p = _prepared()
    monkeypatch.setattr(Engine, "step", interrupted)
    assert p.engine.run(p.steps).interrupted
    with pytest.raises(KeyboardInterrupt):
        p.engine.run(p.steps, hooks=RankLoop(None, eplb_steps=0))


@pytest.mark.parametrize("hooks", [None, RankLoop(None, eplb_steps=0)], ids=["single-rank", "ep-rank"])
def test_every_path_waits_for_the_device_before_timing(monkeypatch, hooks):
    p = _prepared(steps=4)
    info = dataclasses.replace(p.engine.model.info, is_cuda=True)
    monkeypatch.setattr(p.engine.model, "info", info)
    order = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: order.append("sync"))
    real_counter = __import__("time").perf_counter

    def counter():
        order.append("clock")
        return real_counter()
    monkeypatch.setattr("hotsplit_runtime.engine.time.perf_counter", counter)
    p.engine.run(p.steps, hooks=hooks)
    assert order.count("sync") == 1 and order[order.index("sync") + 1] == "clock", order
    assert np.isfinite(p.engine.book.records[-1].hit_rate_total)
