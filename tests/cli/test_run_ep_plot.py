"""The EP run's plot shows EP: each rank's load and the balancedness per window, the applied
rebalances as vertical lines, whole-step x ticks, and bar labels clear of the title (was: hit
rates and run totals only, ticks 20.0, 20.5, ... 24.0, labels touching the title)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("torch")

from hotsplit_runtime.distributed.summary import EPFigures, JobRecord  # noqa: E402

from hotsplit_cli.hotset.windows import RunSummary  # noqa: E402

LOADS = [[100, 120, 80, 100], [90, 110, 100, 100]]  # per window, each rank's assignments


def _record(step: int, loads: list[int], balance: float) -> JobRecord:
    return JobRecord(step=step, hit_rate_window=0.8, hit_rate_total=0.8, swaps=0, swaps_total=0, bytes_copied=0,
                     copy_ms=0.0, cold_bytes_per_step=0.0, layer_hit_rate=[0.8], balancedness=balance,
                     ranks=[{"rank": r, "assignments": t, "hit_rate": 0.8, "cold_reads": 0}
                            for r, t in enumerate(loads)])


def _run():
    records = [_record(20, LOADS[0], 0.81), _record(24, LOADS[1], 0.87)]
    s = RunSummary(steps=24, tokens=96, elapsed_s=1.0, tokens_per_s=96.0, hit_rate=0.8, hit_rate_last_window=0.8,
                   expected_hit_rate=0.82, swaps=0, bytes_copied=0, copy_ms=0.0, cold_bytes_per_step=0.0,
                   layer_hit_rate=[0.8], interrupted=False, records=records)
    totals = [sum(w[r] for w in LOADS) for r in range(4)]
    fig = EPFigures(ranks=[{"rank": r, "assignments": t} for r, t in enumerate(totals)], balancedness=0.84,
                    predicted_balancedness=None, bottleneck={"rank": 1, "load": 230, "lead": 230 / 200},
                    exchange={}, placement={},
                    rebalances=[{"step": 20, "skipped": None, "worse": False},
                                {"step": 24, "skipped": "live balancedness 0.95 or more", "worse": False}])
    return s, fig


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """The EP plot drawn on a real figure, laid out and rendered as save_png does; its axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hotsplit_cli.commands import _run_ep_plot
    from hotsplit_cli.commands._run_ep_plot import plot_ep_run

    kept = {}

    def save_png(path, draw, figsize, dpi):
        figure, ax = plt.subplots(figsize=figsize, dpi=dpi)
        draw(figure, ax)
        figure.tight_layout()
        figure.canvas.draw()
        kept["figure"] = figure

    monkeypatch.setattr(_run_ep_plot, "save_png", save_png)
    plot_ep_run(tmp_path / "ep.png", *_run(), "tiny-ep4")
    yield kept["figure"].axes
    plt.close(kept["figure"])


def test_each_ranks_load_and_the_balancedness_per_window(drawn):
    _, balance, _ = drawn
    curves = {line.get_label(): list(line.get_ydata()) for line in balance.lines if len(line.get_xdata()) == 2}
    for r in range(4):
        assert curves[f"rank {r} load / mean"] == pytest.approx([w[r] / (sum(w) / 4) for w in LOADS])
    assert curves["balancedness (per exchange)"] == pytest.approx([0.81, 0.87])
    assert balance.get_ylim()[0] == 0


def test_applied_rebalances_are_vertical_lines_skipped_ones_are_not(drawn):
    hits, balance, loads = drawn
    for ax in (hits, balance):
        marks = [line for line in ax.lines if line.get_label() == "rebalance applied"]
        assert len(marks) == 1 and list(marks[0].get_xdata()) == [20, 20]
        assert "rebalance applied" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert not [line for line in loads.lines if "rebalance" in line.get_label()]


def test_two_windows_tick_at_whole_steps(drawn):
    hits, balance, _ = drawn
    for ax in (hits, balance):
        assert list(ax.get_xticks()) == [20, 24]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["20", "24"]


def test_the_load_bars_labels_stay_below_the_title(drawn):
    *_, loads = drawn
    labels = [t for t in loads.texts if t.get_text().isdigit()]
    assert sorted(int(t.get_text()) for t in labels) == sorted(sum(w[r] for w in LOADS) for r in range(4))
    title, top = loads.title.get_window_extent().y0, loads.get_window_extent().y1
    for t in labels:
        box = t.get_window_extent()
        assert box.y1 <= top < title  # inside the axes, under the title
        assert title - box.y1 >= box.height  # clear of it by at least a line of the label's text


def test_a_rebalance_that_lowered_the_balance_is_marked_apart():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hotsplit_cli.commands._run_ep_plot import mark_rebalances

    figure, ax = plt.subplots()
    mark_rebalances(ax, [{"step": 8, "worse": False}, {"step": 16, "worse": True}, {"step": 24, "worse": False}])
    marks = [(line.get_xdata()[0], line.get_color()) for line in ax.lines]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(figure)
    assert marks == [(8, "tab:green"), (16, "tab:red"), (24, "tab:green")]
    assert legend == ["rebalance applied", "rebalance (lowered the balance)"]  # one entry per kind
