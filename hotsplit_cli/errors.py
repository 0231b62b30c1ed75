"""The error hierarchy. The CLI turns each into `error: <what failed>; <what to do>`.

`UsageError` (a bad flag, knob or recipe value) exits 2; every other `HotsplitError` exits 1.
Messages carry the numbers; `hint` says what to do next.
"""

from __future__ import annotations


class HotsplitError(Exception):
    """Base of every error a user can cause or fix."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        return f"error: {self.message}" + (f"; {self.hint}" if self.hint else "")


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
