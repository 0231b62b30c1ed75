"""WindowBook: the per-window accounting shared by synthetic runs and checkpoint serving."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.core.errors import PlanError, RuntimeFailure
from hotsplit_cli.hotset.planner import Swap, SwapRule
from hotsplit_cli.hotset.verdict import expectation_warning
from hotsplit_cli.hotset.windows import HitRateRecord, RunSummary, WindowBook, moves_by_layer, validate_swaps

KNOBS = resolve_knobs({"dyn_steps": 4, "dyn_max_swaps": 1}, env={})


def test_records_totals_and_copy_time_of_landed_swaps():
    book = WindowBook(2, KNOBS, expert_bytes=1000)
    r1 = book.close(4, hits_L=[3, 1], assigned_L=[4, 4], cold_reads=6, swaps=2, copy_ms=0.0)
    assert (r1.hit_rate_window, r1.bytes_copied, r1.cold_bytes_per_step) == (0.5, 2000, 6 * 1000 / 4)
    assert r1.layer_hit_rate == [0.75, 0.25]
    book.landed(1.5)  # the two copies finished between steps
    r2 = book.close(10, hits_L=[4, 4], assigned_L=[4, 4], cold_reads=0)
    assert r2.copy_ms == 1.5 and r2.hit_rate_total == 12 / 16 and r2.swaps_total == 2
    book.landed(0.25)  # landed after the last record: only the summary can count it
    s = book.summary(steps=10, tokens=80, elapsed_s=2.0, expected_hit_rate=0.7)
    assert s.copy_ms == 1.75 and s.tokens_per_s == 40.0 and s.hit_rate == 0.75
    assert s.cold_bytes_per_step == 600.0 and s.hit_rate_last_window == 1.0 and s.records == [r1, r2]


def test_three_planner_failures_in_a_row_abort_and_a_success_resets():
    answers = iter([[Swap(0, 0, 1, 1.0, 1.0)] * 2, [], [Swap(5, 0, 1, 1.0, 1.0)], [Swap(0, 1, 0, 1.0, 1.0)],
                    [Swap(0, 1, 0, 1.0, 1.0)]])
    book = WindowBook(1, KNOBS, 1, propose=lambda *a: next(answers))
    hot = np.array([[True, False]])
    assert book.decide(np.ones((1, 2)), hot, 4)[1] == "2 swaps proposed in layer 0, dyn_max_swaps is 1"
    assert book.decide(np.ones((1, 2)), hot, 8) == ([], None)
    assert "layer 5" in book.decide(np.ones((1, 2)), hot, 12)[1]
    assert "not hot->cold" in book.decide(np.ones((1, 2)), hot, 16)[1]
    with pytest.raises(RuntimeFailure, match="failed 3 updates in a row at step 20"):
        book.decide(np.ones((1, 2)), hot, 20)


def test_moves_by_layer_and_swap_checks():
    swaps = [Swap(1, 0, 3, 1.0, 1.0), Swap(0, 2, 5, 1.0, 1.0), Swap(1, 1, 4, 1.0, 1.0)]
    assert moves_by_layer(swaps) == {1: [(0, 3), (1, 4)], 0: [(2, 5)]}
    hot = np.zeros((2, 6), dtype=bool)
    hot[:, :3] = True
    validate_swaps(swaps, hot, max_swaps=2)
    with pytest.raises(Exception, match="swapped twice"):
        validate_swaps([Swap(0, 0, 3, 1.0, 1.0), Swap(0, 0, 4, 1.0, 1.0)], hot, max_swaps=2)


# ---- the accounting, field by field (each check below was seen to fail with a planted mutant) ----

HOT = np.zeros((2, 6), dtype=bool)
HOT[:, :3] = True


def test_swap_checks_name_the_layer_and_refuse_anything_but_hot_out_cold_in():
    with pytest.raises(PlanError) as exc:
        validate_swaps([Swap(2, 0, 3, 1.0, 1.0)], HOT, max_swaps=2)  # layers are 0 and 1; 6 experts
    assert exc.value.message == "swap names layer 2, the model has 2"
    with pytest.raises(PlanError, match="swap names layer -1"):
        validate_swaps([Swap(-1, 0, 3, 1.0, 1.0)], HOT, max_swaps=2)
    for out_e, in_e in ((0, 1), (3, 4), (4, 0)):  # hot -> hot, cold -> cold, cold -> hot
        with pytest.raises(PlanError, match=f"swap {out_e}->{in_e} in layer 1 is not hot->cold"):
            validate_swaps([Swap(1, out_e, in_e, 1.0, 1.0)], HOT, max_swaps=2)
    with pytest.raises(PlanError, match="3 swaps proposed in layer 0, dyn_max_swaps is 2"):
        validate_swaps([Swap(0, 0, 3, 1, 1), Swap(0, 1, 4, 1, 1), Swap(0, 2, 5, 1, 1)], HOT, max_swaps=2)
    with pytest.raises(PlanError, match="layer 0: expert swapped twice"):
        validate_swaps([Swap(0, 0, 3, 1, 1), Swap(0, 1, 3, 1, 1)], HOT, max_swaps=2)
    validate_swaps([Swap(0, 0, 3, 1, 1), Swap(1, 0, 3, 1, 1)], HOT, max_swaps=1)  # one per layer


def test_decide_hands_the_rule_the_counts_hot_set_and_knobs_and_returns_its_swaps():
    knobs = resolve_knobs({"dyn_steps": 4, "dyn_max_swaps": 2, "dyn_margin": 1.5}, env={})
    seen = []

    def spy(counts, hot, max_swaps, margin):
        seen.append((counts, hot, max_swaps, margin))
        return [Swap(0, 1, 4, 9.0, 1.0)]

    book = WindowBook(2, knobs, 1, propose=spy)
    counts = np.arange(12.0).reshape(2, 6)
    assert book.decide(counts, HOT, 4) == ([Swap(0, 1, 4, 9.0, 1.0)], None)
    (c, h, m, g), = seen
    assert c is counts and h is HOT and (m, g) == (2, 1.5)


def test_without_a_rule_given_the_book_uses_a_fresh_swap_rule_with_the_knobs_decay():
    knobs = resolve_knobs({"dyn_steps": 4, "dyn_max_swaps": 1, "dyn_decay": 0.5}, env={})
    counts = np.array([[1.0, 1.0, 1.0, 50.0, 0.0, 0.0], [9.0, 9.0, 9.0, 0.0, 0.0, 0.0]])
    swaps, err = WindowBook(2, knobs, 1).decide(counts, HOT, 4)
    assert err is None
    assert swaps == SwapRule(0.5)(counts, HOT, knobs.dyn_max_swaps, knobs.dyn_margin)
    assert [(s.layer, s.in_expert) for s in swaps] == [(0, 3)]


def test_a_fresh_book_aborts_at_the_third_failure_in_a_row_not_before():
    book = WindowBook(1, KNOBS, 1, propose=lambda *a: [Swap(3, 0, 1, 1.0, 1.0)])
    hot = np.array([[True, False]])
    for step in (4, 8):
        assert book.decide(np.ones((1, 2)), hot, step) == ([], "swap names layer 3, the model has 1")
    with pytest.raises(RuntimeFailure) as exc:
        book.decide(np.ones((1, 2)), hot, 12)
    assert exc.value.message == "the planner failed 3 updates in a row at step 12: swap names layer 3, the model has 1"
    assert exc.value.hint == "run with HOTSPLIT_DYNAMIC=0 to keep the plan fixed, or check the live counts"


def test_records_and_summary_add_up_over_windows():
    book = WindowBook(3, KNOBS, expert_bytes=100)
    book.landed(1.0)
    book.landed(2.0)  # two copies landed before the first close: both count
    r1 = book.close(1, hits_L=[1, 0, 2], assigned_L=[1, 0, 4], cold_reads=3, swaps=2, copy_ms=0.5,
                    error="a planner error", cpu_reads_total=2)
    assert r1 == HitRateRecord(
        step=1, hit_rate_window=3 / 5, hit_rate_total=3 / 5, swaps=2, swaps_total=2, bytes_copied=200,
        copy_ms=3.5, cold_bytes_per_step=300.0, layer_hit_rate=[1.0, 0.0, 0.5], planner_error="a planner error",
        cold_cpu_bytes_per_step=200.0)  # a 1-step window; a layer with no assignment has rate 0
    r2 = book.close(5, hits_L=[0, 3, 0], assigned_L=[2, 3, 0], cold_reads=8, swaps=1, copy_ms=0.25,
                    cpu_reads_total=6)
    assert r2 == HitRateRecord(
        step=5, hit_rate_window=3 / 5, hit_rate_total=6 / 10, swaps=1, swaps_total=3, bytes_copied=100,
        copy_ms=0.25, cold_bytes_per_step=8 * 100 / 4, layer_hit_rate=[0.0, 1.0, 0.0], planner_error=None,
        cold_cpu_bytes_per_step=(6 - 2) * 100 / 4)  # 4 steps since step 1; the CPU's reads since then
    r3 = book.close(6, hits_L=[0, 0, 0], assigned_L=[0, 0, 0], cold_reads=0)
    assert (r3.hit_rate_window, r3.hit_rate_total, r3.cold_cpu_bytes_per_step) == (0.0, 6 / 10, None)
    s = book.summary(steps=6, tokens=30, elapsed_s=3.0, expected_hit_rate=0.5)
    assert s.to_doc() == {
        "steps": 6, "tokens": 30, "elapsed_s": 3.0, "tokens_per_s": 10.0, "hit_rate": 0.6,
        "hit_rate_last_window": 0.0, "expected_hit_rate": 0.5, "swaps": 3, "bytes_copied": 300, "copy_ms": 3.75,
        "cold_bytes_per_step": 11 * 100 / 6, "layer_hit_rate": [1 / 3, 1.0, 0.5], "interrupted": False,
        "cold_paths": None, "expected_gap": pytest.approx(0.1)}
    assert s.records == [r1, r2, r3]
    again = book.summary(steps=6, tokens=30, elapsed_s=3.0, expected_hit_rate=None, interrupted=True)
    assert (again.copy_ms, again.interrupted, again.expected_hit_rate) == (3.75, True, None)


def test_a_summary_before_any_step_is_all_zeros():
    s = WindowBook(2, KNOBS, 100).summary(steps=0, tokens=0, elapsed_s=0.0, expected_hit_rate=None)
    assert (s.tokens_per_s, s.hit_rate, s.hit_rate_last_window, s.cold_bytes_per_step) == (0.0, 0.0, None, 0.0)
    assert s.layer_hit_rate == [0.0, 0.0] and s.records == []


def test_a_layer_with_one_assignment_has_its_own_rate():
    book = WindowBook(2, KNOBS, 1)
    rec = book.close(4, hits_L=[1, 0], assigned_L=[1, 1], cold_reads=0)
    assert rec.layer_hit_rate == [1.0, 0.0]
    assert book.summary(4, 8, 1.0, None).layer_hit_rate == [1.0, 0.0]
    assert book.summary(4, 8, 0.5, None).tokens_per_s == 16.0  # under a second of run time


def test_windows_without_assignments_have_rate_zero_so_far():
    book = WindowBook(2, KNOBS, 1)
    rec = book.close(4, hits_L=[0, 0], assigned_L=[0, 0], cold_reads=0)
    assert (rec.hit_rate_window, rec.hit_rate_total) == (0.0, 0.0)


def _summary(hit: float, expected: float, steps: int = 600):
    return RunSummary(steps=steps, tokens=9600, elapsed_s=1.0, tokens_per_s=1.0, hit_rate=hit, hit_rate_last_window=0.7,
                      expected_hit_rate=expected, swaps=70, bytes_copied=0, copy_ms=0.0, cold_bytes_per_step=0.0,
                      layer_hit_rate=[hit], interrupted=False)


def test_the_expectation_warning_in_full():
    t = "synthetic"
    assert expectation_warning(_summary(0.68, 0.816), t, t, drift_every=150) == (  # dynamic by default
        "hit rate 68.0% is 13.6 points below the 81.6% the plan expected: the traffic drifted after the plan was made "
        "(its hotspot moves every 150 steps, the plan knows where it started); following it is what dynamic mode is "
        "for: it made 70 swaps (more per update: HOTSPLIT_DYN_MAX_SWAPS; sooner: HOTSPLIT_DYN_STEPS)")
    assert expectation_warning(_summary(0.68, 0.816), t, t, drift_every=150, dynamic=False).endswith(
        "following it is what dynamic mode is for: it is off here (HOTSPLIT_DYNAMIC=1 turns it on)")
    own = "the plan was made before the run from its own traffic (synthetic)"
    # the hotspot has not moved yet after exactly drift_every steps; above the plan, drift is no excuse
    assert expectation_warning(_summary(0.68, 0.816, steps=150), t, t, drift_every=150).endswith(own)
    assert expectation_warning(_summary(0.95, 0.816), t, t, drift_every=150) == (
        f"hit rate 95.0% is 13.4 points above the 81.6% the plan expected: {own}")
