"""A run with one window draws what one window can show and says why (was: one dot at step 200
on an axis running 190-210 with fractional ticks); two windows tick at whole steps."""

from __future__ import annotations

import pytest


def _spy_on_hit_rates(monkeypatch) -> dict:
    """Draw `run --plot`'s hit rates as run does, rendered, and keep the axes and the summary."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    drawn = {}
    from hotsplit_cli.commands import run as run_cmd

    real = run_cmd._draw_hit_rates

    def spy(ax, summary, title):
        real(ax, summary, title)
        ax.figure.canvas.draw()  # tick labels are set when drawn
        drawn["ax"], drawn["summary"] = ax, summary

    monkeypatch.setattr(run_cmd, "_draw_hit_rates", spy)
    return drawn


def test_a_one_window_run_draws_bars_and_says_why(cli, tmp_path, monkeypatch):
    drawn = _spy_on_hit_rates(monkeypatch)
    plot = tmp_path / "hit.png"
    r = cli("run", "tiny", "--steps", "20", "--plot", plot)  # dyn_steps 50: one window
    assert r.code == 0, r.err and plot.stat().st_size > 0
    s, ax = drawn["summary"], drawn["ax"]
    assert len(s.records) == 1
    assert [t.get_text() for t in ax.get_xticklabels()] == ["run (steps 1-20)", "plan expected"]
    assert [p.get_height() for p in ax.patches] == pytest.approx([100 * s.hit_rate, 100 * s.expected_hit_rate])
    assert "one window (20 steps" in ax.get_title()
    assert f"plot: {plot} (one window: bars, not a curve; HOTSPLIT_DYN_STEPS below 20 gives more points)" in r.out


def test_a_two_window_run_ticks_at_its_windows_whole_steps(cli, tmp_path, monkeypatch):
    """Two windows at steps 20 and 24: ticks 20 and 24 (matplotlib's own read 20.0, 20.5, ... 24.0)."""
    drawn = _spy_on_hit_rates(monkeypatch)
    monkeypatch.setenv("HOTSPLIT_DYN_STEPS", "20")
    r = cli("run", "tiny", "--steps", "24", "--plot", tmp_path / "hit.png")
    assert r.code == 0, r.err
    ax = drawn["ax"]
    assert list(ax.get_xticks()) == [20, 24]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["20", "24"]
