"""Did a run achieve what it was told to expect? Achieved vs predicted, with a band (numpy free).

Hit rate (the plan). Two predictions: the in-sample figure (`hit_rate`, exact on the traffic the
plan was fitted on) and, when its histogram had windows, the out-of-sample forecast (forecast.py:
pooled over held-out windows, with the lowest and highest window).
- in-sample: the band is the figure itself, widened by the held-out spread of one window
  ((high - low) / 2 each side); without a forecast it is exact (a run on the fitted traffic).
- out-of-sample: from the lowest held-out window up to the higher of the highest held-out
  window and the in-sample figure (traffic like the fit's is new traffic too, and the fit's
  own rate is what the plan achieves on it).
Balancedness (the placement): the same two, from `place`'s `fitted` and `out_of_sample`
(placement/held_out.py), judged on the run's loads summed over windows of the histogram's size.
Cold-path time (the platform file): per cold expert read, predicted by the cost model, banded
by the relative spread s of the rate it used (a factor 1 + s either way); no band when the rate's
source records no spread.
A run on another task's traffic is outside both when its routing is not the fit's (docs/simulate.md).
The in-sample figures are about the routing the histogram counted (`Fit`, hotset/fitted_traffic.py):
on other traffic the in-sample verdict says so, and an exact band (no spread to widen it) is kept
only while it can hold (the run replays that routing with the plan's hot set kept); otherwise the
prediction is given plainly, without a band.
The summary's warning (`expectation_warning`): an achieved hit rate more than EXPECTED_GAP_LIMIT
from the plan's expectation, and why the two may differ.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hotsplit_cli.hotset.forecast import Band

EXACT = 1e-9  # a figure without a spread is judged to rounding
EXPECTED_GAP_LIMIT = 0.10  # an achieved hit rate further than this from the plan's expectation is flagged


@dataclass(frozen=True)
class Fit:
    """What a run did to the in-sample figures' premise: `same` says whether its traffic is the
    routing the histogram counted (None: cannot be told before the run), `traffic` says what it
    replays instead; `changed` is why the plan's set did not hold (e.g. swaps), None when it held."""

    same: bool | None
    traffic: str = ""
    changed: str | None = None
    part: bool = False  # the run replays a part of the routing the histogram counted

    @property
    def note(self) -> str | None:
        """Why an in-sample figure does not apply to this run; None when it may."""
        if self.same is False and self.part:
            return f"the run replays part of the histogram's traffic ({self.traffic}): in-sample is for all of it"
        if self.same is False:
            return f"the run's traffic is not the histogram's ({self.traffic}): in-sample does not apply here"
        return None

    def after(self, swaps: int) -> Fit:
        """The fit once the run is done: swaps made mean the plan's hot set did not hold."""
        return self if not swaps else replace(self, changed=f"the run made {swaps} swaps: the plan's hot set "
                                                            "did not hold")

    def rules_out_exact(self) -> str | None:
        """Why an exact in-sample figure cannot be this run's; None when it can."""
        if self.same is False:
            return f"the run's traffic is {'part of' if self.part else 'not'} the histogram's ({self.traffic})"
        return self.changed


@dataclass(frozen=True)
class Verdict:
    """One prediction judged: WITHIN when low <= achieved <= high; no verdict without a band."""

    name: str  # stable key, e.g. "hit_rate.in_sample"
    figure: str  # what was predicted, as a user reads it, e.g. "hit rate (plan, in-sample)"
    achieved: float
    predicted: float
    low: float | None  # None: no band (`band` says why)
    high: float | None
    band: str  # where the band comes from
    unit: str = "fraction"  # fraction (printed as %) | ratio | ms
    note: str | None = None  # why the prediction does not apply to this run (its traffic is another)

    @property
    def within(self) -> bool | None:
        if self.low is None or self.high is None:
            return None
        return self.low - EXACT <= self.achieved <= self.high + EXACT

    @property
    def word(self) -> str:
        return {True: "WITHIN", False: "OUTSIDE", None: "NO BAND"}[self.within]

    def to_doc(self) -> dict:
        return {"name": self.name, "figure": self.figure, "unit": self.unit, "achieved": self.achieved,
                "predicted": self.predicted, "low": self.low, "high": self.high, "band": self.band,
                "within": self.within, "verdict": self.word, "applies": self.note is None, "note": self.note}


def _in_sample(name: str, what: str, in_sample: float, forecast: Band | None, achieved: float, unit: str,
               fit: Fit) -> Verdict:
    """The in-sample figure banded by half the held-out range; without a spread the band is exact,
    kept only while the run can meet it (`fit`), else the figure is given without a band."""
    half = 0.0 if forecast is None else (forecast.high - forecast.low) / 2
    args = (f"{name}.in_sample", f"{what}, in-sample)", achieved, in_sample)
    if half > EXACT:
        return Verdict(*args, in_sample - half, in_sample + half, "+- half the held-out windows' range", unit,
                       fit.note)
    why = "no held-out windows" if forecast is None else "the held-out windows give no spread"
    ruled_out = fit.rules_out_exact()
    if ruled_out is None:
        return Verdict(*args, in_sample, in_sample, f"exact: {why}", unit, fit.note)
    plain = f"no band: exact only on the routing the histogram counted, with the plan's hot set kept ({why})"
    return Verdict(*args, None, None, plain if fit.note else f"{plain}; {ruled_out}", unit, fit.note)


def _two_sided(name: str, what: str, in_sample: float | None, forecast: Band | None, achieved: float,
               unit: str, fit: Fit | None) -> list[Verdict]:
    """The in-sample figure (banded by half the held-out range) and the out-of-sample band."""
    fit = fit or Fit(None)
    out = [] if in_sample is None else [_in_sample(name, what, in_sample, forecast, achieved, unit, fit)]
    if forecast is not None:
        top = forecast.high if in_sample is None else max(forecast.high, in_sample)
        args = (f"{name}.out_of_sample", f"{what}, out-of-sample)", achieved, forecast.expected)
        if top - forecast.low > EXACT or forecast.low >= 1 - EXACT:  # every held-out window at 1: nothing missed
            out.append(Verdict(*args, forecast.low, top, "held-out windows' lowest .. max(highest, in-sample)", unit))
        else:  # one held-out window (or identical ones below 1): a figure on new traffic is not exact
            out.append(Verdict(*args, None, None, "no band: the held-out windows give no spread (capture more "
                                                  "windows with `hotsplit balance --window-steps N`)", unit))
    return out


def hit_rate_verdicts(in_sample: float | None, forecast: Band | None, achieved: float,
                      fit: Fit | None = None) -> list[Verdict]:
    """The plan's hit-rate predictions judged against the `achieved` hit rate (fractions); `fit`:
    whether the run replays the routing the plan was fitted on (None: not known)."""
    return _two_sided("hit_rate", "hit rate (plan", in_sample, forecast, achieved, "fraction", fit)


def balancedness_verdicts(fitted: float | None, forecast: Band | None, achieved: float,
                          steps_per_window: int, fit: Fit | None = None) -> list[Verdict]:
    """The placement's balancedness judged against the run's, over windows of `steps_per_window` steps."""
    return _two_sided("balancedness", f"balancedness per {steps_per_window}-step window (placement", fitted,
                      forecast, achieved, "ratio", fit)


def cold_path_verdicts(paths: dict | None, who: str = "") -> list[Verdict]:
    """Each cold path's time per cold expert read (ms), achieved vs the cost model's, from a run's
    `cold_paths` (runtime/cold_split.py `report`; `who`: e.g. " rank 1"); a path that read no
    expert is not judged."""
    if not paths:
        return []
    out = []
    measured_now = str(paths.get("rates", "")).startswith("measured now")
    for key, label in (("gpu", "device"), ("cpu", "CPU")):
        p = paths[key]
        if not p["experts"] or not p["predicted_ms"]:
            continue
        achieved, predicted, spread = p["ms"] / p["experts"], p["predicted_ms"] / p["experts"], p.get("spread")
        figure = f"cold path {label}{who} ({paths['mode']}), ms per cold expert read"
        if spread is None:
            why = "the rate measured at the start" if measured_now else "the platform file"
            out.append(Verdict(f"cold_path.{key}{who.replace(' ', '.')}", figure, achieved, predicted, None, None,
                               f"no band: {why} records no spread", "ms"))
            continue
        out.append(Verdict(f"cold_path.{key}{who.replace(' ', '.')}", figure, achieved, predicted,
                           predicted / (1 + spread),
                           predicted * (1 + spread), f"the rate's measured spread {100 * spread:.0f}%: a factor "
                                                     f"{1 + spread:.2f} either way", "ms"))
    return out


def prediction_error(pairs: list[tuple[float, float | None]]) -> dict:
    """How far predictions were from what was achieved: (predicted, achieved) pairs, those without
    an achieved figure left out. {"count", "mean_abs", "max_abs"} (None figures when none is judged)."""
    errors = [abs(p - a) for p, a in pairs if a is not None]
    if not errors:
        return {"count": 0, "mean_abs": None, "max_abs": None}
    return {"count": len(errors), "mean_abs": sum(errors) / len(errors), "max_abs": max(errors)}


def gap_flagged(summary) -> bool:
    """The achieved hit rate is more than EXPECTED_GAP_LIMIT from the plan's expectation
    (`summary`: a run's, hotset/windows.py `RunSummary`)."""
    gap = summary.expected_gap
    return gap is not None and round(abs(gap), 9) > EXPECTED_GAP_LIMIT  # 0.7 - 0.8 is not over 0.1


def expectation_warning(summary, made_from: str, traffic: str, drift_every: int | None = None,
                        dynamic: bool = True) -> str | None:
    """Why a hit rate more than EXPECTED_GAP_LIMIT from the plan's expectation may differ: the
    routing the plan was made from next to the routing this run saw; for synthetic traffic whose
    hotspot moves every `drift_every` steps, that drift, which dynamic mode is there to follow.
    None when within the limit."""
    if not gap_flagged(summary):
        return None
    gap = summary.expected_gap
    side = "below" if gap < 0 else "above"
    why = (f"the plan was made before the run from its own traffic ({traffic})" if made_from == traffic
           else f"the plan was made from {made_from}; this run's traffic: {traffic}")
    if drift_every and summary.steps > drift_every and gap < 0:
        follow = (f"it made {summary.swaps} swaps (more per update: HOTSPLIT_DYN_MAX_SWAPS; sooner: "
                  "HOTSPLIT_DYN_STEPS)" if dynamic else "it is off here (HOTSPLIT_DYNAMIC=1 turns it on)")
        why = (f"the traffic drifted after the plan was made (its hotspot moves every {drift_every} steps, the plan "
               f"knows where it started); following it is what dynamic mode is for: {follow}")
    return (f"hit rate {100 * summary.hit_rate:.1f}% is {100 * abs(gap):.1f} points {side} the "
            f"{100 * summary.expected_hit_rate:.1f}% the plan expected: {why}")
