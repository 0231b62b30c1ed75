"""One output object for human and JSON modes.

Human output goes to stdout as rich tables on a terminal and plain aligned text when piped;
`--json` prints exactly one JSON document on stdout and nothing else. Warnings, progress and
hints always go to stderr; under `--json` the warnings also go in the document's `warnings` list.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from hotsplit_cli.core.errors import StdoutClosed
from hotsplit_cli.core.jsonio import dumps
from hotsplit_cli.core.units import gib, pct  # noqa: F401 - the commands take them from here with Output


@dataclass(frozen=True)
class Switches:
    """What the whole command line asks of this run, read once by the entry point (cli.main) and
    handed to the commands as their context's `obj`."""

    debug: bool = False  # show tracebacks: --debug anywhere in the command line, or HOTSPLIT_DEBUG=1

    @classmethod
    def of(cls, argv: list[str], environ=os.environ) -> Switches:
        return cls("--debug" in argv or environ.get("HOTSPLIT_DEBUG", "") not in ("", "0"))


def _no_progress(n: float = 1) -> None:
    pass


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit 1 here; the CLI stops quietly instead (cli.main).
        self.quiet = True
        raise StdoutClosed


def _rich_table(columns, title: str | None, fancy: bool) -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD if fancy else None, show_edge=False,
              pad_edge=False, title_justify="left", header_style="bold" if fancy else "")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    return t


class PlainTable:
    """The piped form of `Output.table`: what rich prints for a table without a box (columns two
    spaces apart, the first left-aligned, the others right-aligned, the title on its own line),
    laid out directly, since rich's layout engine costs more than the command
    itself on a 58-layer plan. Anything rich would treat differently (a table wider than the
    console or a title wider than it, markup or emoji codes in a cell) goes to rich."""

    def __init__(self, columns, title: str | None = None):
        self.columns, self.title = tuple(columns), title
        self.rows: list[tuple] = []

    def add_row(self, *cells) -> None:
        self.rows.append(cells)

    def to_rich(self) -> Table:
        t = _rich_table(self.columns, self.title, fancy=False)
        for row in self.rows:
            t.add_row(*row)
        return t

    def render(self, width: int) -> str | None:
        """The table as text, or None where rich must lay it out."""
        from rich.cells import cell_len

        lines = [self.columns, *self.rows]
        if any(not isinstance(c, str) or "[" in c or ":" in c or "\n" in c for row in lines for c in row):
            return None
        if any(len(row) != len(self.columns) for row in self.rows):
            return None
        widths = [max(cell_len(row[i]) for row in lines) for i in range(len(self.columns))]
        total = sum(widths) + 2 * (len(widths) - 1)
        if total > width or (self.title is not None and (cell_len(self.title) > width or "[" in self.title
                                                          or ":" in self.title or "\n" in self.title)):
            return None

        def line(row) -> str:
            return "  ".join(c + " " * (w - cell_len(c)) if i == 0 else " " * (w - cell_len(c)) + c
                             for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        out = [self.title] if self.title is not None else []
        return "\n".join(out + [line(row) for row in lines])


class Output:
    """`out` and `err` are files (default: stdout, stderr) or ready rich Consoles."""

    def __init__(self, json_mode: bool = False, out=None, err=None):
        self.json_mode = json_mode
        self.out = _console(out or sys.stdout)
        self.err = _console(err or sys.stderr)
        self._above_bar: Console | None = None  # while a progress bar is live on a shared terminal
        self.warnings: list[str] = []  # every warning so far, for the JSON document

    @property
    def fancy(self) -> bool:
        return self.out.is_terminal

    @property
    def shows_progress(self) -> bool:
        """Progress bars are drawn on stderr only on a terminal, and never under --json."""
        return not self.json_mode and self.err.is_terminal

    def table(self, *columns: str, title: str | None = None) -> Table | PlainTable:
        """A table that is boxed on a terminal and plain aligned columns when piped."""
        if not self.fancy:
            return PlainTable(columns, title)
        return _rich_table(columns, title, fancy=True)

    def print(self, *things: Any) -> None:
        """Human output (suppressed in JSON mode)."""
        if self.json_mode:
            return
        console = self._above_bar or self.out
        if len(things) == 1 and isinstance(things[0], PlainTable):
            text = things[0].render(console.width)
            if text is not None:
                console.out(text, highlight=False)
                return
        console.print(*(x.to_rich() if isinstance(x, PlainTable) else x for x in things))

    def emit(self, doc: Any, render: Callable[[], None] | None = None) -> None:
        """The command's result: JSON document in JSON mode, else the human rendering.

        A JSON object gets the warnings given before it, if any, as `warnings` (a list of strings);
        without warnings the document is exactly what the command made (e.g. the file it wrote)."""
        if self.json_mode:
            if isinstance(doc, dict) and self.warnings:
                doc = {**doc, "warnings": list(self.warnings)}
            try:
                sys.stdout.write(dumps(doc).decode())
                sys.stdout.flush()
            except BrokenPipeError:
                raise StdoutClosed from None
        elif render is not None:
            render()

    def warn(self, msg: str) -> None:
        """A warning on stderr, kept for the JSON document (give warnings before `emit`)."""
        self.warnings.append(msg)
        self.err.print(f"warning: {msg}", markup=False)

    def note(self, msg: str) -> None:
        self.err.print(msg)

    @contextmanager
    def progress(self, description: str, total: float | None) -> Iterator[Callable[[float], None]]:
        """A transient rich progress bar on stderr; yields `advance(n)`, the callback library code
        takes. Off (a no-op `advance`) under --json and when stderr is not a terminal. While the
        bar is live and stdout is the terminal too, human lines are printed above the bar."""
        if not self.shows_progress:
            yield _no_progress
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=self.err, transient=True,
                      redirect_stdout=False, redirect_stderr=False) as p:
            task = p.add_task(description, total=total)
            if self.out.is_terminal:
                self._above_bar = self.err
            try:
                yield lambda n=1: p.advance(task, n)
            finally:
                self._above_bar = None


PIPED_WIDTH = 1 << 12  # columns of piped output: wide enough that no table wraps; a reader's tool cuts lines


def _console(target) -> Console:
    """A console on `target`; piped (not a terminal) and without COLUMNS, as wide as PIPED_WIDTH:
    rich's 80-column default would wrap every wide table mid-cell for `grep` or a file."""
    if isinstance(target, Console):
        return target
    console = _Console(file=target, highlight=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPED_WIDTH
    return console


