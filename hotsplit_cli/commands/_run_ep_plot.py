"""`run --plot` of an expert-parallel run: three panels side by side.

1. the job's hit rate per window (as a single-rank run draws it);
2. per window, each rank's load (the assignments it received / the window's mean over ranks)
   and the window's balancedness (per exchange: mean / max rank load, summed);
3. each rank's load over the run, the bottleneck rank in red.
Live rebalances that changed the map are vertical lines on 1 and 2 at the step they applied.
"""

from __future__ import annotations

from pathlib import Path

from hotsplit_cli.plotting import integer_step_ticks, save_png

from . import _run_report as report

HEADROOM = 1.15  # the top of the load bars' axis over the largest bar: room for its label below the title


def plot_ep_run(path: Path, s, fig, title: str) -> None:
    """Write the EP run's PNG (`s`: the job's RunSummary, `fig`: its EPFigures)."""
    def draw(figure, ax):
        ax.remove()
        hits, balance, loads = figure.subplots(1, 3, gridspec_kw={"width_ratios": [3, 3, 2]})
        draw_ep_axes(hits, balance, loads, s, fig, title)

    save_png(path, draw, figsize=(17, 4.5), dpi=100)


def draw_ep_axes(hits, balance, loads, s, fig, title: str) -> None:
    report.draw_hit_rates(hits, s, title)
    draw_window_balance(balance, s.records)
    applied = [r for r in fig.rebalances if r["skipped"] is None]
    for ax in (hits, balance):
        mark_rebalances(ax, applied)
    draw_run_loads(loads, fig)


def draw_window_balance(ax, records) -> None:
    """Per window: each rank's load over the window's mean, and the window's balancedness."""
    steps = [r.step for r in records]
    ranks = len(records[0].ranks) if records else 0
    top = 1.0
    for rank in range(ranks):
        ratio = [_load_over_mean(r.ranks, rank) for r in records]
        top = max(top, *ratio)
        ax.plot(steps, ratio, marker=".", linewidth=1, alpha=0.8, label=f"rank {rank} load / mean")
    ax.plot(steps, [r.balancedness for r in records], color="black", marker="o", linewidth=2.5, zorder=3,
            label="balancedness (per exchange)")
    integer_step_ticks(ax, steps)
    ax.set_ylim(0, HEADROOM * top)
    ax.set_xlabel("engine step (window end)")
    ax.set_ylabel("per window")
    ax.set_title("per window: each rank's load and the balancedness", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)


def _load_over_mean(ranks: list[dict], rank: int) -> float:
    mean = sum(r["assignments"] for r in ranks) / len(ranks)
    return ranks[rank]["assignments"] / mean if mean else 1.0


def mark_rebalances(ax, applied: list[dict]) -> None:
    """A vertical line at each applied rebalance; one that lowered the balance in red."""
    seen = set()
    for r in applied:
        worse = bool(r.get("worse"))
        label = "rebalance (lowered the balance)" if worse else "rebalance applied"
        ax.axvline(r["step"], color="tab:red" if worse else "tab:green", linestyle="--", linewidth=1.5,
                   label=None if label in seen else label)
        seen.add(label)
    if applied:
        ax.legend(loc="lower right", fontsize=8)


def draw_run_loads(ax, fig) -> None:
    """Each rank's assignments over the run, the mean, the bottleneck rank in red."""
    assigned = [r["assignments"] for r in fig.ranks]
    top = fig.bottleneck["rank"]
    bars = ax.bar([str(r["rank"]) for r in fig.ranks], assigned,
                  color=["tab:red" if r["rank"] == top else "tab:blue" for r in fig.ranks])
    ax.bar_label(bars, fmt="%d", fontsize=8)
    ax.set_ylim(0, HEADROOM * max(assigned, default=1))
    ax.axhline(sum(assigned) / len(assigned), linestyle=":", color="gray", label="mean")
    ax.set_xlabel("rank")
    ax.set_ylabel("routed assignments received")
    # The totals over the run: balancedness is per exchange (step and layer), so it is lower.
    ax.set_title(f"load over the run: rank {top} leads {fig.bottleneck['lead']:.2f}x the mean\n"
                 f"(balancedness per exchange {fig.balancedness:.3f})", fontsize=10)
    ax.legend(loc="lower right")
