"""`hotsplit selftest`: the runtime's correctness and speed on this machine's device."""

from __future__ import annotations

import sys

import typer
from hotsplit_runtime import api
from rich.text import Text

from hotsplit_cli.core.errors import HotsplitError
from hotsplit_cli.core.jsonio import schema_tag
from hotsplit_cli.options import DeviceOpt, JsonOpt
from hotsplit_cli.output import Output


def selftest(
    ctx: typer.Context,
    device: DeviceOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Check the hot/cold runtime against an all-resident reference and measure its speed.

    Zero-copy GB/s and step time vs the reference. Every check runs, each isolated; the report is
    always printed. Exits 1 when any check failed."""
    out = Output(json_out)
    device_name, result = api.selftest(device)
    doc = {"schema": schema_tag("selftest"), **result}

    def render():
        t = out.table("check", "result", "value", "detail", title=f"hotsplit selftest on {device_name} "
                      f"({result['kernel']})")
        for c in result["checks"]:
            t.add_row(c["name"], {True: "pass", False: "FAIL", None: "-"}[c["ok"]], c["value"], c["detail"])
        out.print(t)
        for c in result["checks"]:  # each error on one unwrapped line, as plain text (no markup)
            if c["error"]:
                out.print(Text(f"FAIL {c['name']}: {c['detail']}"))

    out.emit(doc, render)
    if not result["ok"]:
        failed = [c["name"] for c in result["checks"] if c["ok"] is False]
        if ctx.obj is not None and ctx.obj.debug:  # --debug: the tracebacks the checks caught, for a bug report
            for c in result["checks"]:
                if c["error"]:
                    print(f"{c['name']}:\n{c['error']['traceback']}", file=sys.stderr)  # no markup
        raise HotsplitError(f"selftest failed: {', '.join(failed)}", "rerun with --json and report the document")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("selftest")(selftest)
