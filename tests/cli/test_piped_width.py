"""Piped output is not cut at 80 columns: a wide table stays one line per row."""

from __future__ import annotations

import io

from hotsplit_cli.output import Output


def test_a_wide_table_is_not_wrapped_when_piped(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    stream = io.StringIO()
    out = Output(out=stream)
    t = out.table("layer", *(f"rank {r} GPU experts" for r in range(4)))
    t.add_row("3", *("36: 1,2,10,28,40,44,51,60,61,70,72,80,..." for _ in range(4)))
    out.print(t)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and max(map(len, lines)) > 120


def test_columns_still_sets_the_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    stream = io.StringIO()
    out = Output(out=stream)
    out.print("x " * 50)
    assert out.out.width == 60
