"""Router lookahead as measured on the user's model: the optional `lookahead` block of a
`hotsplit.hist/1` file (docs/prefetch.md has the schema and the hidden state it is measured on).

For each MoE layer after the first, the next layer's router was applied to the previous MoE
layer's output hidden state and its first G experts (the router's own top-k, then by its
selection score) were guessed for every counted token. Counters, per predicted layer:
*guesses* made (tokens x G), *useful* (guessed and routed), *wasted* = guesses - useful,
*routed* assignments (tokens x top_k), *recall* = useful / routed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.core.errors import HistogramError
from hotsplit_cli.traffic.hist import Histogram
from hotsplit_cli.traffic.predict import MeasuredRecall

COUNTERS = ("tokens", "guesses", "useful", "wasted", "routed")
LAYER_KEYS = {"layer", "after", "recall", *COUNTERS}
BLOCK_KEYS = {"measured_on", "guesses_per_token", "layers", "overall"}
OVERALL_KEYS = {"recall", "wasted_per_useful", *COUNTERS}


@dataclass(frozen=True)
class LayerLookahead:
    """One predicted MoE layer's counters (`after`: the model layer whose output was read)."""

    layer: int
    after: int
    tokens: int
    guesses: int
    useful: int
    routed: int

    @property
    def wasted(self) -> int:
        return self.guesses - self.useful

    @property
    def recall(self) -> float:
        return self.useful / self.routed if self.routed else 0.0

    def to_doc(self) -> dict:
        return {"layer": self.layer, "after": self.after, "tokens": self.tokens, "guesses": self.guesses,
                "useful": self.useful, "wasted": self.wasted, "routed": self.routed, "recall": self.recall}


@dataclass(frozen=True)
class Lookahead:
    """A histogram's measured router lookahead: per predicted layer, and pooled over them."""

    measured_on: str  # checkpoint, prompts, tokens (as the measurement wrote it)
    guesses_per_token: int  # G: the widening (knob prefetch_guesses, at most the experts per layer)
    layers: tuple[LayerLookahead, ...]

    def total(self, name: str) -> int:
        return sum(getattr(x, name) for x in self.layers)

    @property
    def recall(self) -> float:
        routed = self.total("routed")
        return self.total("useful") / routed if routed else 0.0

    @property
    def wasted_per_useful(self) -> float:
        useful = self.total("useful")
        return self.total("wasted") / useful if useful else math.inf

    def measured(self) -> MeasuredRecall:
        """The pooled figures the prefetch planner prices staging with."""
        return MeasuredRecall(self.recall, self.wasted_per_useful, self.guesses_per_token, self.layers[0].tokens)

    def summary(self) -> str:
        """One line: the pooled recall, and the weakest and strongest layer's."""
        by_layer = sorted(x.recall for x in self.layers)
        return (f"router lookahead: recall {100 * self.recall:.1f}% at {self.guesses_per_token} guesses per token, "
                f"{self.wasted_per_useful:.2f} wasted per useful (layers {100 * by_layer[0]:.1f}%-"
                f"{100 * by_layer[-1]:.1f}%)")

    def to_doc(self) -> dict:
        overall = {k: self.total(k) for k in COUNTERS}
        overall["tokens"] = self.layers[0].tokens
        wpu = self.wasted_per_useful
        overall.update(recall=self.recall, wasted_per_useful=None if math.isinf(wpu) else wpu)
        return {"measured_on": self.measured_on, "guesses_per_token": self.guesses_per_token,
                "layers": [x.to_doc() for x in self.layers], "overall": overall}


def lookahead_guesses(recipe_knobs: dict | None, flag: str | None) -> int:
    """Knob prefetch_guesses (flag > environment > recipe > default): the widening router
    lookahead is measured at; UsageError names a bad value."""
    import os


    return resolve_knobs(recipe_knobs, os.environ, {"prefetch_guesses": flag}).prefetch_guesses


def load_lookahead(hist: Histogram, where: str) -> Lookahead | None:
    """The `lookahead` block of `hist` (read from `where`), checked against its MoE layers; None
    when it has none."""
    return lookahead_from_doc(hist.blocks.get("lookahead"), hist.layers, where)


def lookahead_from_doc(block: object, layers: tuple[int, ...], where: str) -> Lookahead | None:
    """Check a `lookahead` block (None when absent) against the histogram's MoE layer ids: one
    entry per layer after the first, in order; every derived figure must agree with the counters.
    HistogramError names the field."""
    if block is None:
        return None
    if not isinstance(block, dict) or set(block) != BLOCK_KEYS:
        raise HistogramError(f"{where}: `lookahead` must be an object with exactly {', '.join(sorted(BLOCK_KEYS))}")
    measured_on = block["measured_on"]
    if not isinstance(measured_on, str) or not measured_on.strip():
        raise HistogramError(f"{where}: `lookahead.measured_on` must say where the lookahead was measured")
    per_token = _count(block["guesses_per_token"], f"{where}: `lookahead.guesses_per_token`", 1)
    rows = block["layers"]
    if not isinstance(rows, list) or [r.get("layer") if isinstance(r, dict) else None for r in rows] != \
            list(layers[1:]):
        raise HistogramError(f"{where}: `lookahead.layers` must list one entry per MoE layer after the first, in "
                             f"order (layers {list(layers[1:])})")
    parsed = tuple(_layer(r, layers[i], per_token, f"{where}: `lookahead.layers[{i}]") for i, r in enumerate(rows))
    if len({x.tokens for x in parsed}) != 1:
        raise HistogramError(f"{where}: `lookahead.layers` count different tokens per layer (every token passes "
                             "every MoE layer)")
    look = Lookahead(measured_on.strip(), per_token, parsed)
    _check_overall(block["overall"], look, f"{where}: `lookahead.overall")
    return look


def _count(x: object, where: str, minimum: int = 0) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
        raise HistogramError(f"{where} must be an int >= {minimum}, got {x!r}")
    return x


def _layer(row: dict, before: int, per_token: int, where: str) -> LayerLookahead:
    if set(row) != LAYER_KEYS:
        raise HistogramError(f"{where}` must have exactly {', '.join(sorted(LAYER_KEYS))}")
    n = {k: _count(row[k], f"{where}.{k}`") for k in ("after", *COUNTERS)}
    if not before <= n["after"] < row["layer"]:
        raise HistogramError(f"{where}.after` is {n['after']}: the layer read must lie between MoE layer {before} "
                             f"and the predicted layer {row['layer']}")
    if n["tokens"] < 1 or n["guesses"] != n["tokens"] * per_token:
        raise HistogramError(f"{where}.guesses` is {n['guesses']}: must be tokens ({n['tokens']}, >= 1) x "
                             f"guesses_per_token ({per_token})")
    if n["useful"] > min(n["guesses"], n["routed"]) or n["wasted"] != n["guesses"] - n["useful"]:
        raise HistogramError(f"{where}.useful` is {n['useful']}: must be at most guesses and routed, with wasted "
                             "= guesses - useful")
    x = LayerLookahead(row["layer"], n["after"], n["tokens"], n["guesses"], n["useful"], n["routed"])
    _agrees(row["recall"], x.recall, f"{where}.recall`")
    return x


def _check_overall(raw: object, look: Lookahead, where: str) -> None:
    if not isinstance(raw, dict) or set(raw) != OVERALL_KEYS:
        raise HistogramError(f"{where}` must have exactly {', '.join(sorted(OVERALL_KEYS))}")
    expect = look.to_doc()["overall"]
    for key in COUNTERS:
        if raw[key] != expect[key] or isinstance(raw[key], bool):
            raise HistogramError(f"{where}.{key}` is {raw[key]!r}, but the layers give {expect[key]}")
    _agrees(raw["recall"], expect["recall"], f"{where}.recall`")
    if expect["wasted_per_useful"] is None:
        if raw["wasted_per_useful"] is not None:
            raise HistogramError(f"{where}.wasted_per_useful` must be null when no guess was useful")
    else:
        _agrees(raw["wasted_per_useful"], expect["wasted_per_useful"], f"{where}.wasted_per_useful`")


def _agrees(x: object, expect: float, where: str) -> None:
    """A derived figure as written: a number equal to the one the counters give."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isclose(x, expect, rel_tol=1e-9,
                                                                                   abs_tol=1e-12):
        raise HistogramError(f"{where} is {x!r}, but the counters give {expect!r}")
