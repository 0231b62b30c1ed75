"""Piped tables are laid out without rich's engine, and must print exactly what rich would."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console

from hotsplit_cli.output import PIPED_WIDTH, Output, PlainTable

WORDS = ["", "a", "12.5%", "0.00 GiB", "greedy", "certified optimal", "1..3", "-", "émoji", "日本", "x" * 27]


def _rich_text(t: PlainTable, width: int = 80) -> str:
    c = Console(file=io.StringIO(), width=width, soft_wrap=True, highlight=False)  # as output._console
    c.print(t.to_rich())
    return c.file.getvalue()


def test_plain_tables_print_exactly_what_rich_prints():
    rnd = random.Random(0)
    laid_out = 0
    for _ in range(400):
        cols = [rnd.choice(WORDS) or "c" for _ in range(rnd.randint(1, 6))]
        t = PlainTable(cols, rnd.choice([None, "title", "a title longer than some of these tables are wide"]))
        for _ in range(rnd.randint(0, 5)):
            t.add_row(*(rnd.choice(WORDS) for _ in cols))
        text = t.render(80)
        if text is None:
            continue
        laid_out += 1
        assert text + "\n" == _rich_text(t)
    assert laid_out > 200  # most of them took the fast path


@pytest.mark.parametrize("cells, title", [
    (("[bold]x[/bold]", "1"), None),  # markup: rich renders it
    ((":smile:", "1"), None),  # an emoji code
    (("y" * 50, "z" * 40), None),  # wider than the console
    (("a", "b"), "t" * 90),  # a title wider than the console
])
def test_what_rich_would_render_differently_goes_to_rich(cells, title, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    t = PlainTable(("k", "v"), title)
    t.add_row(*cells)
    assert t.render(80) is None
    out = io.StringIO()
    o = Output(out=out)
    o.print(t)
    assert out.getvalue() == _rich_text(t, PIPED_WIDTH)  # piped: rich lays it out, never wrapped at 80


def test_output_uses_plain_tables_when_piped_and_prints_them():
    out = io.StringIO()
    o = Output(out=out)
    t = o.table("layer", "hit rate", title="per layer")
    assert isinstance(t, PlainTable)
    t.add_row("1", "50.00%")
    o.print(t)
    assert out.getvalue() == "per layer\nlayer  hit rate\n1        50.00%\n"
