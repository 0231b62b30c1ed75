"""One output object for human and JSON modes.

Human output goes to stdout as rich tables on a terminal and plain aligned text when piped;
`--json` prints exactly one JSON document on stdout and nothing else. Warnings, progress and
hints always go to stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from .jsonio import dumps


class StdoutClosed(Exception):
    """The process reading our output closed the pipe (`hotsplit ... | head -1`)."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit 1 here; the CLI stops quietly instead (cli.main).
        self.quiet = True
        raise StdoutClosed


class Output:
    def __init__(self, json_mode: bool = False, out=None, err=None):
        self.json_mode = json_mode
        self.out = _Console(file=out or sys.stdout, highlight=False, soft_wrap=True)
        self.err = _Console(file=err or sys.stderr, highlight=False, soft_wrap=True)

    @property
    def fancy(self) -> bool:
        return self.out.is_terminal

    def table(self, *columns: str, title: str | None = None) -> Table:
        """A table that is boxed on a terminal and plain aligned columns when piped."""
        t = Table(title=title, box=box.SIMPLE_HEAD if self.fancy else None, show_edge=False,
                  pad_edge=False, title_justify="left", header_style="bold" if self.fancy else "")
        for i, col in enumerate(columns):
            t.add_column(col, justify="left" if i == 0 else "right")
        return t

    def print(self, *things: Any) -> None:
        """Human output (suppressed in JSON mode)."""
        if not self.json_mode:
            self.out.print(*things)

    def emit(self, doc: Any, render: Callable[[], None] | None = None) -> None:
        """The command's result: JSON document in JSON mode, else the human rendering."""
        if self.json_mode:
            try:
                sys.stdout.write(dumps(doc).decode())
                sys.stdout.flush()
            except BrokenPipeError:
                raise StdoutClosed from None
        elif render is not None:
            render()

    def warn(self, msg: str) -> None:
        self.err.print(f"warning: {msg}")

    def note(self, msg: str) -> None:
        self.err.print(msg)

    @contextmanager
    def progress(self, description: str, total: float | None):
        """A rich progress bar on stderr (only on a terminal); yields advance(n)."""
        if not self.err.is_terminal:
            yield lambda n=1: None
            return
        from rich.progress import BarColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

        with Progress("[progress.description]{task.description}", BarColumn(), "{task.completed}/{task.total}",
                      TimeElapsedColumn(), TimeRemainingColumn(), console=self.err, transient=True) as p:
            task = p.add_task(description, total=total)
            yield lambda n=1: p.advance(task, n)


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def gib(n_bytes: float | None, digits: int = 2) -> str:
    """Bytes in GiB, or in MiB / KiB when that is the more readable unit."""
    if n_bytes is None:
        return "-"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n_bytes) >= (1 << shift) or unit == "KiB":
            return f"{n_bytes / (1 << shift):.{digits}f} {unit}"
    return f"{n_bytes} B"
