"""What a `hotsplit run` prints, shared by single-rank, checkpoint and expert-parallel runs:
the run's description, its hit-rate lines (and JSON lines), the summary table, the plan's origin
beside this run's traffic, and the hit-rate plot."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from hotsplit_cli.core.jsonio import write_atomic
from hotsplit_cli.hotset.verdict import cold_path_verdicts, expectation_warning, gap_flagged, hit_rate_verdicts
from hotsplit_cli.output import Output, gib, pct
from hotsplit_cli.plotting import integer_step_ticks

MIB = 1 << 20


def describe(say, name: str, header, ranks: int = 1) -> None:
    """What a synthetic run is about to do: device and kernel, traffic, cold bank, plan, cold path.
    With `ranks` > 1 (rank 0 describes an EP job) the plan's figures are rank 0's, and say so."""
    doc, plan, bank = header.doc, header.doc["plan"], header.cold_bank
    say(f"{name}: {header.steps} steps on {header.device_name} ({doc['kernel']}"
        f"{', CUDA graph' if doc['cuda_graph'] else ''}; experts {header.expert_format}),"
        f" traffic: {doc['traffic']}")
    how = bank["method"] + (f"; {bank['fallback']}" if bank["fallback"] else "")
    say(f"cold bank: {gib(bank['requested_bytes'])} of host memory ({how}), {bank['numa']}")
    whose = "plan" if ranks == 1 else f"plan, rank 0 of {ranks} (each rank its own hot set)"
    say(f"{whose}: {plan['hot_experts']} hot experts, {gib(plan['hot_bytes'])} real"
        f" ({plan['source']}); expected hit rate {pct(plan['expected_hit_rate'])}")
    if doc["cold_path"]["rates"]:
        say(escape(f"cold path: {doc['cold_path']['mode']} ({doc['cold_path']['rates']})"))


def checkpoint_words(rec, header) -> str:
    """A checkpoint run's first words: the recipe, the checkpoint's model type and folder, and
    the prompts it generates from."""
    return f"{rec.name}: {header.family} checkpoint {rec.model.path}, {header.doc['traffic']}"


def wrote(log_jsonl: Path | None, records: int, plot: Path | None) -> str:
    """What an interrupted run leaves on disk: the records so far and the plot of them."""
    files = ([f"{log_jsonl} ({records} records)"] if log_jsonl else []) + ([str(plot)] if plot else [])
    return f"wrote {' and '.join(files)}" if files else "nothing was written"


def format_line(r) -> str:
    """A hit-rate record (hotset/windows.py) as `step   600  hit rate: window  71.2%, cumulative  68.9%
    swaps  3  copied  0.56 MiB in  0.21 ms  cold ...` (the plot's words: the last window, and
    everything so far)."""
    line = (f"step {r.step:>7}  hit rate: window {100 * r.hit_rate_window:5.1f}%, cumulative "
            f"{100 * r.hit_rate_total:5.1f}%"
            f"  swaps {r.swaps:>3}  copied {r.bytes_copied / MIB:8.2f} MiB in {r.copy_ms:7.2f} ms"
            f"  cold {r.cold_bytes_per_step / MIB:8.2f} MiB/step")
    if r.cold_cpu_bytes_per_step is not None:
        line += f" ({r.cold_cpu_bytes_per_step / MIB:.2f} on the CPU)"
    if r.prefetch is not None:
        p = r.prefetch
        line += f"  staged {p['prefetched']} ({p['useful']} read)"
    if r.planner_error:
        line += f"  planner failed: {r.planner_error}"
    return line


def format_job_line(r) -> str:
    """An expert-parallel job's window (runtime/distributed/summary.py `JobRecord`)."""
    return f"{format_line(r)}  balance {r.balancedness:.3f}"


def logged(log_jsonl: Path | None, watch, runner):
    """`runner()` with `watch` writing each hit-rate record as a JSON line in `log_jsonl` too
    (streamed into a temp file that is renamed when the run ends, even by Ctrl-C; each line
    flushed, so a tail sees it as it happens)."""
    if log_jsonl is None:
        return runner()
    box = {}

    def write(fh):
        watch.log = fh
        box["result"] = runner()
        if box["result"] is None:  # another rank of the job reports: it writes the file
            raise _OtherRankReports
    try:
        write_atomic(log_jsonl, write)
    except _OtherRankReports:
        return None
    return box["result"]


class _OtherRankReports(Exception):
    """Leaves this rank's temp file unwritten (write_atomic removes it)."""


def cold_path_rows(paths: dict | None) -> list[tuple[str, str]]:
    """Summary rows of a CPU cold path: per path the cold bytes served (as allocated, and at full
    size), and the time achieved vs predicted for the tensors as allocated."""
    if not paths:
        return []
    rows = [("cold path", f"{paths['mode']}: the CPU computed {100 * paths['cpu_share']:.1f}% of the distinct cold "
                          f"experts, in {paths['layers_with_cpu']} of {paths['layers']} layer calls")]
    for key, label in (("gpu", "device"), ("cpu", "CPU")):
        p = paths[key]
        share = ("its hot and cold experts" if paths.get("hot_modelled") else "its cold share (hot experts not "
                 "modelled)") if key == "gpu" else "its cold share"
        allocated = p.get("allocated_bytes", p["bytes"])
        full = "" if allocated == p["bytes"] else f"; {gib(p['bytes'])} at full size"
        rows.append((f"  {label}", f"read {gib(allocated)} of experts (tensors as allocated{full}); "
                                   f"{p['ms']:,.2f} ms achieved vs "
                                   f"{p['predicted_ms']:,.2f} ms predicted for {share}"))
    if paths.get("rates_not_used"):
        rows.append(("  rates not used", paths["rates_not_used"]))
    return rows


def prefetch_rows(prefetch: dict | None) -> list[tuple[str, str]]:
    """Summary rows of the staging slots (runtime/prefetch.py): the counters `simulate` reports."""
    if not prefetch:
        return []
    p = prefetch
    look = p.get("lookahead")  # router lookahead (runtime/lookahead_stage.py), else the trace predictor
    predictor = (f"router lookahead: recall {pct(look['recall'])} at {look['guesses_per_token']} guesses per token "
                 f"({look['useful']:,} of {look['routed']:,} routed)" if look
                 else f"co-activation table fitted on {p['fit']}")
    return [("prefetch", f"{p['slots']} staging slots ({p['pool']} pool), {p['guesses']} guesses per token, "
                         f"{predictor}"),
            ("  staged", f"{p['prefetched']:,} experts: {p['useful']:,} useful, {p['wasted']:,} wasted; "
                         f"{p['staged_hits']:,.0f} routed assignments served staged ({pct(p['staged_hit_rate'])} of "
                         "all, counted in the hit rate)"),
            ("  PCIe bytes per step (real)", f"{p['pcie_bytes_per_step'] / MIB:,.2f} MiB (cold reads, staged "
                                             f"copies and swaps)")]


def verdicts(plan_file, achieved_hit_rate: float, cold_paths: dict | None, balance: list | None = None,
             who: str = "", fit=None) -> list[dict]:
    """Every prediction the run was given, judged (hotset/verdict.py): the plan's hit rates (none
    without a plan file; `fit`: whether the run replayed the plan's histogram), the placement's
    `balance` verdicts (EP), the cold paths' times."""
    out = [] if plan_file is None else hit_rate_verdicts(plan_file.hit_rate, plan_file.out_of_sample,
                                                         achieved_hit_rate, fit)
    return [v.to_doc() for v in [*out, *(balance or []), *cold_path_verdicts(cold_paths, who)]]


def precision_rows(p: dict) -> list[tuple[str, str]]:
    """The run document's `precision` as a summary row: the stored precision, a checkpoint's
    next-token agreement with its release, and the plan's expected error (no row at native
    precision with no expected error)."""
    if p["stored"] == "native" and p["expected_error"] is None:
        return []
    agreement = (f"next-token agreement with native {pct(p['agreement'], 2)} of {p['tokens']} tokens (teacher-forced)"
                 if p["agreement"] is not None else f"not compared with native ({p['note']})")
    expected = "none in the plan" if p["expected_error"] is None else f"{p['expected_error']:.4f}"
    return [(f"precision {p['stored']}", f"{agreement}; expected error {expected}")]


def _figure(x: float, unit: str) -> str:
    return {"fraction": lambda: pct(x, 2), "ms": lambda: f"{x:,.4f} ms"}.get(unit, lambda: f"{x:.4f}")()


def print_verdicts(out: Output, docs: list[dict]) -> None:
    """One line per verdict: achieved, predicted, band and WITHIN / OUTSIDE / NO BAND."""
    for v in docs:
        unit = v["unit"]
        band = (f"band {_figure(v['low'], unit)} - {_figure(v['high'], unit)}: {v['band']}" if v["within"] is not None
                else v["band"])
        note = "" if v.get("note") is None else f": {v['note']}"
        out.print(escape(f"{v['figure']}: achieved {_figure(v['achieved'], unit)}, predicted "
                         f"{_figure(v['predicted'], unit)} ({band}): {v['verdict']}{note}"))


def origin(out: Output, summary, made_from: str, traffic: str, drift_every: int | None = None,
            dynamic: bool = True) -> list[tuple[str, str]]:
    """Summary rows naming the routing the plan was made from next to this run's traffic; a
    warning when the achieved hit rate is far from the plan's expectation."""
    warning = expectation_warning(summary, made_from, traffic, drift_every, dynamic)
    if warning:
        out.warn(warning)
    return [("plan made from", made_from), ("this run's traffic", traffic)]


def render_summary(out: Output, title: str, s, first: list, extra: list, origin: list) -> None:
    """The summary table shared by synthetic and checkpoint runs (`s`: a RunSummary), then the
    `origin` lines (what the plan was made from, this run's traffic)."""
    expected = pct(s.expected_hit_rate)
    if gap_flagged(s):
        side = "lower" if s.expected_gap < 0 else "higher"
        expected += f" (achieved {100 * abs(s.expected_gap):.1f} points {side}: see below)"
    t = out.table("summary", "value", title=title)
    for row in [*first,
                ("steps", f"{s.steps}"),
                ("tokens", f"{s.tokens}"),
                ("tokens/s", f"{s.tokens_per_s:,.1f}"),
                ("hit rate (overall)", pct(s.hit_rate) + (f" ({pct(s.hot_hit_rate)} hot, the rest staged)"
                                                          if s.prefetch else "")),
                ("hit rate (last window)", pct(s.hit_rate_last_window)),
                ("hit rate expected by the plan", expected),
                ("swaps", f"{s.swaps}"),
                ("bytes copied (real)", f"{s.bytes_copied / MIB:,.2f} MiB"),
                *extra,
                ("cold bytes read per step (real)", f"{s.cold_bytes_per_step / MIB:,.2f} MiB")]:
        t.add_row(*row)
    out.print(t)
    for label, text in origin:
        out.print(escape(f"{label}: {text}"))


def draw_hit_rates(ax, summary, title: str) -> None:
    recs = summary.records
    if len(recs) <= 1:  # one window has no curve: bars of what it can show, and why there is one
        return draw_one_window(ax, summary, title)
    steps = [r.step for r in recs]
    ax.plot(steps, [100 * r.hit_rate_window for r in recs], marker="o", label="window")
    ax.plot(steps, [100 * r.hit_rate_total for r in recs], label="cumulative")
    if summary.expected_hit_rate is not None:
        ax.axhline(100 * summary.expected_hit_rate, linestyle=":", color="gray", label="plan expected")
    for i, r in enumerate(recs):
        if r.swaps:
            ax.axvline(r.step, color="tab:red", alpha=0.3, label="swaps" if i == next(
                j for j, q in enumerate(recs) if q.swaps) else None)
    integer_step_ticks(ax, steps)
    ax.set_xlabel("engine step")
    ax.set_ylabel("hit rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"hotsplit run {title}")
    ax.legend(loc="lower right")


def one_window_note(summary) -> str:
    """Why the plot of a run with one window has bars, not a curve."""
    if len(summary.records) > 1:
        return ""
    return f" (one window: bars, not a curve; HOTSPLIT_DYN_STEPS below {summary.steps} gives more points)"


def draw_one_window(ax, summary, title: str) -> None:
    """A run shorter than two windows (steps <= dyn_steps): its one hit rate next to the plan's."""
    labels = [f"run (steps 1-{summary.steps})"]
    values = [100 * summary.hit_rate]
    if summary.expected_hit_rate is not None:
        labels.append("plan expected")
        values.append(100 * summary.expected_hit_rate)
    bars = ax.bar(labels, values, color=["tab:blue", "gray"][:len(values)])
    ax.bar_label(bars, fmt="%.1f%%")
    ax.set_ylabel("hit rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"hotsplit run {title}: one window ({summary.steps} steps, updates every dyn_steps): no curve")
