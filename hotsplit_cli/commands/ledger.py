"""`hotsplit ledger RECIPE`: the memory ledger and the expert-parallel All-to-All ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from hotsplit_cli.analysis.ledger import (
    COMM_SHARE_LIMIT,
    DEFAULT_ACT_BYTES,
    DEFAULT_CROSS_RATIO,
    DEFAULT_LINK_GBPS,
    HOT_EXPERT_FACTOR,
    CommModel,
    Ledger,
    StoredExperts,
    build_ledger,
    with_ep,
)
from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import GIB, load_recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.core.jsonio import schema_tag
from hotsplit_cli.core.units import decimal_bytes, duration
from hotsplit_cli.hotset.budget import resolve_hot_budget
from hotsplit_cli.hotset.host_memory import host_fit
from hotsplit_cli.hotset.planfile import check_plan_precision, check_plan_ranks, load_plan
from hotsplit_cli.hotset.sizes import uniform_precision
from hotsplit_cli.options import HotGibOpt, JsonOpt, PlatformOpt, PrecisionOpt, RecipeArg
from hotsplit_cli.output import Output, gib, pct
from hotsplit_cli.traffic.hist import load_hist

EpOpt = Annotated[
    int | None, typer.Option("--ep", show_default="the recipe's parallel.ep", help="Expert-parallel size N.")
]
TokensOpt = Annotated[
    int | None,
    typer.Option(
        "--tokens", show_default="the recipe's traffic.batch", help="Tokens each card routes per engine step."
    ),
]
ActBytesOpt = Annotated[
    int,
    typer.Option("--act-bytes", help=f"Bytes per activation element ({DEFAULT_ACT_BYTES}: bf16)."),
]
LinkOpt = Annotated[
    float,
    typer.Option(
        "--link-gbps",
        help=f"Per-card, per-direction interconnect bandwidth in GB/s = 1e9 B/s "
        f"({DEFAULT_LINK_GBPS:g}: NVLink 4, H100/H200 SXM).",
    ),
]
CrossOpt = Annotated[
    float,
    typer.Option(
        "--cross-ratio",
        help="Multiplier on the placement-blind remote share (N-1)/N "
        "(< 1 when placement keeps tokens local).",
    ),
]
StepOpt = Annotated[
    float | None,
    typer.Option(
        "--step-ms", show_default="none: no check",
        help="Compute time of one engine step without All-to-All (ms); enables the "
        f"check that comm stays under {100 * COMM_SHARE_LIMIT:.0f}% of the step.",
    ),
]
LedgerPlanOpt = Annotated[
    Path | None,
    typer.Option("--plan", show_default="none",
                 help="plan.json: count its budget, its hot set and (auto) each expert's stored precision."),
]
HistOpt = Annotated[
    Path | None,
    typer.Option(
        "--hist", show_default="none",
            help=f"Routing histogram: flag experts above {HOT_EXPERT_FACTOR:g}x their layer mean."
    ),
]


_MAX_HOT_LINES = 20  # a 58-layer histogram can flag hundreds; --json lists all


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("ledger")(ledger)


def ledger(
    recipe: RecipeArg,
    hot_gib: HotGibOpt = None,
    precision: PrecisionOpt = None,
    ep: EpOpt = None,
    tokens: TokensOpt = None,
    act_bytes: ActBytesOpt = DEFAULT_ACT_BYTES,
    link_gbps: LinkOpt = DEFAULT_LINK_GBPS,
    cross_ratio: CrossOpt = DEFAULT_CROSS_RATIO,
    step_ms: StepOpt = None,
    hist: HistOpt = None,
    plan: LedgerPlanOpt = None,
    platform: PlatformOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Memory and expert-parallel All-to-All ledgers of a recipe.

    Parameters, expert bytes, what stays on the GPU and what the hot budget holds."""
    out = Output(json_out)
    rec = load_recipe(recipe)
    knobs = resolve_knobs(rec.knobs, flags={"hot_gib": hot_gib, "precision": precision})
    if ep is not None:
        rec = with_ep(rec, ep)
    stored, hot = _plan_inputs(rec, knobs, plan)
    comm = CommModel(
        tokens_per_step=tokens if tokens is not None else rec.traffic.batch,
        act_bytes=act_bytes,
        link_gbps=link_gbps,
        cross_ratio=cross_ratio,
        step_ms=step_ms,
    )
    histogram = load_hist(hist) if hist is not None else None
    result = build_ledger(
        rec,
        comm,
        reserve_gib=knobs.vram_reserve_gib,
        hot_gib=hot[0],
        hot_source=hot[1],
        hist=histogram,
        hist_path=hist,
        warn=out.warn,
        host=host_fit(rec, platform, precision=knobs.precision if stored is None else "native",
                      bank_bytes=None if stored is None else stored.node_bank_bytes(rec)),
        precision=knobs.precision,
        stored=stored,
    )
    doc = {"schema": schema_tag("ledger"), **result.to_doc(), "histogram": str(hist) if hist else None}
    if plan is not None:  # ledgers without a plan keep their shape
        doc["plan"] = str(plan)
    out.emit(doc, lambda: _render(out, result))


def _plan_inputs(rec, knobs, plan_path: Path | None):
    """(an auto plan's stored precisions or None, (hot GiB, its source)): with --plan, the plan's
    budget and hot set at the precision it was made at; else the knobs' budget, one precision."""
    if plan_path is None:
        if knobs.precision == "auto":
            raise UsageError(f"{knobs.origin('precision')} auto: ledger counts the precisions an auto plan chose, "
                             "and no --plan was given",
                             "pass --plan made with `hotsplit plan --precision auto --max-error E`, or a uniform "
                             "--precision")
        uniform_precision(knobs)
        return None, (knobs.hot_gib, knobs.sources["hot_gib"])
    plan = load_plan(plan_path)
    check_plan_ranks(plan, rec)
    check_plan_precision(plan, knobs)
    budget = resolve_hot_budget(rec, knobs, None, plan)
    m = rec.model
    hot = (budget.hot_gib, "plan")
    if knobs.precision != "auto":
        return None, hot
    layers = m.moe_layer_ids
    return StoredExperts(plan.precision_LE(layers, m.num_experts),
                         int(plan.hot_LE(layers, m.num_experts, model=rec.name).sum())), hot


def _params(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} B"


def _render(out: Output, led: Ledger) -> None:
    m = led.memory
    out.print(
        escape(
            f"ledger: {led.recipe} ({led.model}), {m.expert_dtype} experts"
            f"{'' if m.precision == 'native' else f' stored {m.precision}'}, "
            f"tp {m.tp} x ep {m.ep} = {m.ranks} ranks"
        )
    )
    _render_params(out, m)
    _render_banks(out, m)
    _render_gpu(out, m)
    _render_a2a(out, led.a2a)
    _render_flags(out, led)


def _render_params(out: Output, m) -> None:
    t = out.table("parameters", "count", title="Parameters")
    t.add_row("total", _params(m.total_params))
    active = _params(m.active_params)
    if m.active_params:
        active += f" ({pct(m.active_params / m.total_params)} of total)"
    t.add_row("active per token", active)
    t.add_row("routed experts", _params(m.routed_expert_params))
    t.add_row("dense (rest: attention, embeddings, dense/shared MLP)", _params(m.dense_params))
    out.print(t)


def _render_banks(out: Output, m) -> None:
    t = out.table("expert bytes", "value", title="Expert bytes")
    if m.stored is None:
        t.add_row("one expert, whole", gib(m.expert_bytes_full))
        t.add_row(f"one expert, per rank (1/tp = 1/{m.tp})", gib(m.expert_bytes))
    for p, row in (m.stored or {}).items():  # auto: each precision the plan stores experts at
        t.add_row(f"{p}: {row['experts']} experts, each whole / per rank (1/tp = 1/{m.tp})",
                  f"{gib(row['expert_bytes_full'])} / {gib(row['expert_bytes'])}")
    t.add_row(
        f"all routed experts ({m.num_experts} x {m.num_moe_layers} layers)", gib(m.bank_bytes_total)
    )
    t.add_row(f"per rank ({m.experts_per_rank} experts)", gib(m.bank_bytes_per_rank))
    out.print(t)

    t = out.table("cold banks", "size", title="Host memory (every expert of every rank, page-locked)")
    t.add_row("per rank", gib(m.bank_bytes_per_rank))
    # Each host pins the banks of its own ranks; how ranks spread over hosts is not in the recipe.
    t.add_row(f"all {m.ranks} ranks (tp {m.tp} x ep {m.ep}), summed over their hosts",
              gib(m.host_bytes_all_ranks))
    out.print(t)


def _render_gpu(out: Output, m) -> None:
    t = out.table("per rank", "memory", title="GPU memory per rank")
    t.add_row("GPU memory", gib(m.gpu_mem_gib * GIB))
    t.add_row("- dense weights (/tp)", gib(m.dense_gib * GIB))
    t.add_row("- KV cache", gib(m.kv_cache_gib * GIB))
    t.add_row("- reserve", gib(m.reserve_gib * GIB))
    t.add_row("= room for hot experts", gib(m.room_gib * GIB))
    t.add_row(f"hot budget ({m.hot_source})", gib(None if m.hot_gib is None else m.hot_gib * GIB))
    held = (
        "-" if m.hot_experts is None else f"{m.hot_experts} of {m.experts_per_rank} ({pct(m.hot_fraction)})"
    )
    t.add_row("hot experts it holds", held)
    out.print(t)


def _render_a2a(out: Output, a) -> None:
    t = out.table("All-to-All", "value", title=f"Expert-parallel All-to-All (EP {a.ep})")
    t.add_row(
        "expert memory per card",
        f"{gib(a.expert_bytes_per_card)} ({a.experts_per_card} experts/layer)",
    )
    t.add_row("tokens per step per card (--tokens)", str(a.tokens_per_step))
    t.add_row("activation bytes (--act-bytes)", f"{a.act_bytes} B")
    t.add_row("link bandwidth (--link-gbps)", f"{a.link_gbps:g} GB/s (1e9 B/s, per direction)")
    t.add_row(
        "message = tokens x top_k x hidden x act",
        f"{a.tokens_per_step} x {a.top_k} x {a.hidden_size} x {a.act_bytes} B"
        f" = {decimal_bytes(a.message_bytes)}",
    )
    t.add_row(
        "remote share = (N-1)/N x cross-ratio", f"{a.remote_fraction:.4f} (cross-ratio {a.cross_ratio:g})"
    )
    t.add_row(
        "per MoE layer (dispatch + combine)",
        f"{decimal_bytes(a.a2a_bytes_per_layer)} -> {duration(a.a2a_ms_per_layer)}",
    )
    t.add_row(f"per step ({a.num_moe_layers} MoE layers)", duration(a.a2a_ms_per_step))
    t.add_row(
        "all-gather 2 x tokens x H x act x (N-1)",  # per layer: the exchange's other mode
        f"{decimal_bytes(a.ag_rs_bytes_per_layer)} -> {duration(a.ag_rs_ms_per_layer)}",
    )
    if a.step_ms is None:
        t.add_row("share of step", "- (give --step-ms)")
    else:
        t.add_row(
            "share of step (compute --step-ms + comm)",
            f"{pct(a.comm_share)} of {duration(a.step_ms + a.a2a_ms_per_step)}",
        )
    out.print(t)
    out.print("model: bandwidth bound, no latency, comm not overlapped with compute")


def _render_flags(out: Output, led: Ledger) -> None:
    if led.hot_experts is not None:
        n = len(led.hot_experts)
        out.print(f"histogram: {n} expert(s) above {HOT_EXPERT_FACTOR:g}x their layer mean")
    if not led.flags:
        out.print("flags: none")
        return
    out.print("flags:")
    hot = [f for f in led.flags if f.kind == "hot_expert"]
    for f in [f for f in led.flags if f.kind != "hot_expert"] + hot[:_MAX_HOT_LINES]:
        out.print(escape(f"  [{f.kind}] {f.message}"))
    if len(hot) > _MAX_HOT_LINES:
        out.print(f"  ... and {len(hot) - _MAX_HOT_LINES} more hot experts (all of them in --json)")
