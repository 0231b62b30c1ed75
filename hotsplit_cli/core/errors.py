"""The error hierarchy. The CLI turns each into `error: <what failed>; <what to do>`.

`UsageError` (a bad flag, knob or recipe value) exits 2; every other `HotsplitError` exits 1.
Messages carry the numbers; `hint` says what to do next.
"""

from __future__ import annotations

import re


class HotsplitError(Exception):
    """Base of every error a user can cause or fix."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        return one_line_error(self.message, self.hint)


def one_line_error(message: str, hint: str | None = None) -> str:
    """`error: <message>; <hint>` on one line: line breaks inside either part become spaces and
    trailing punctuation is dropped before the parts are joined (no `failed.;`)."""
    parts = [_clause(message)] + ([_clause(hint)] if hint else [])
    return "error: " + "; ".join(p for p in parts if p)


def _clause(text: str) -> str:
    text = re.sub(r"\s*\n\s*", " ", str(text)).strip()
    # A closing full stop or separator goes; an ellipsis or a path such as `.` stays.
    return re.sub(r"(?<![\s./])\.$|\s*[;:,]+$", "", text)


class UsageError(HotsplitError):
    """A bad command-line flag, environment variable or recipe value: refuse to start."""

    exit_code = 2


class InputFileError(HotsplitError):
    """A file that is missing, unreadable, malformed or of the wrong schema."""


class HistogramError(InputFileError):
    """A routing histogram that breaks a rule of `hotsplit.hist/1`."""


class RecipeError(UsageError):
    """A recipe with an unknown, missing or out-of-range key (named by its path)."""


class PlanError(HotsplitError):
    """The planner cannot produce a plan (budget, sizes or shapes)."""


class BudgetOverflowError(PlanError):
    """Internal invariant: a plan exceeded its budget. Never clipped silently."""


class RuntimeFailure(HotsplitError):
    """The runtime could not continue (device, memory, repeated planner failures)."""


class UnsupportedModelError(HotsplitError):
    """A checkpoint whose architecture or expert layout the runtime cannot run."""


class Interrupted(HotsplitError):
    """Ctrl-C stopped the work; the message says what was written before it stopped."""

    exit_code = 130


class StdoutClosed(Exception):
    """The process reading our output closed the pipe (`hotsplit ... | head -1`): not an error,
    the CLI stops quietly with 141 (cli.main); a rank of an expert-parallel run tells its
    launcher the same way."""
