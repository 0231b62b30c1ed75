"""The one timing module: what each helper times, on fake clocks and counting syncs."""

from __future__ import annotations

import pytest
from hotsplit_probes import timing


def test_median_ms_syncs_around_every_call_and_takes_the_median(monkeypatch):
    ticks = iter([0.0, 0.001, 1.0, 1.005, 2.0, 2.003])  # calls of 1, 5 and 3 ms
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(ticks))
    events = []
    ms = timing.median_ms(lambda: events.append("call"), 3, lambda: events.append("sync"))
    assert ms == pytest.approx(3.0)
    assert events == ["sync", "call", "sync"] * 3


def test_per_call_ms_divides_each_sample_by_its_calls():
    calls = []

    def clock(run):  # every batch "takes" 2 ms per call it makes
        before = len(calls)
        run()
        return (len(calls) - before) * 0.002

    ms = timing.per_call_ms(lambda: calls.append(1), clock)
    assert ms == pytest.approx(2.0)
    assert len(calls) >= 2 + 3  # the warm-up, the estimate and at least three samples


def test_wall_clock_times_one_run():
    assert 0 <= timing.wall_clock(lambda: None) < 1.0
