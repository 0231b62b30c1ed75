"""The break-even swap rule (hotset/admission.py): each test of a swap worked by hand, the state it
keeps across windows, and its refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset.admission import BreakEvenRule, make_swap_rule
from hotsplit_cli.hotset.planner import SwapRule


def test_a_swap_that_pays_worked_by_hand():
    # One layer, expert 0 hot. Windows of 4 steps, decay 0.5: a horizon of 4 / 0.5 = 8 steps.
    # Counts 4 and 16: rates 1 and 4 per step, active in 63.2% and 98.2% of steps; 8 x 0.350 =
    # 2.8 reads saved > the 1 copy; 16 > 1.25 x 4; lead 12 > 2 x sqrt(20) = 8.9. So it swaps.
    rule = BreakEvenRule(decay=0.5, window_steps=4, sigmas=2.0)
    assert rule.horizon == 8.0
    swaps = rule(np.array([[4.0, 0.0, 16.0]]), np.array([[True, False, False]]), 2, 1.25)
    assert [(s.layer, s.out_expert, s.in_expert, s.in_count, s.out_count) for s in swaps] == [(0, 0, 2, 16.0, 4.0)]


def test_each_test_alone_can_refuse_a_swap():
    rule = BreakEvenRule(decay=0.5, window_steps=4, sigmas=2.0)
    rule.steps = 4.0
    assert rule.pays(16.0, 4.0, 1.25)
    # Noise: 12 against 4 leads by 8 = 2 x sqrt(16), not more.
    assert not rule.pays(12.0, 4.0, 1.25)
    # Bytes: both are active in every step (rates 10 and 20): the swap serves more assignments
    # hot but saves 8 x (1 - e^-20 - (1 - e^-10)) = 0.0004 reads, less than the copy.
    assert not rule.pays(80.0, 40.0, 1.25)
    # Margin: over 40 steps, 30 against 20 saves 8 x (0.528 - 0.393) = 1.07 reads; with no noise
    # test it pays at margin 1, and 30 is not more than 1.5 x 20.
    rule = BreakEvenRule(decay=0.5, window_steps=4, sigmas=0.0)
    rule.steps = 40.0
    assert rule.pays(30.0, 20.0, 1.0) and not rule.pays(30.0, 20.0, 1.5)


def test_the_score_decays_and_remembers_the_steps_it_covers():
    rule = BreakEvenRule(decay=0.5, window_steps=4, sigmas=0.0)
    hot = np.array([[True, False]])
    assert rule(np.array([[8.0, 0.0]]), hot, 1, 1.0) == []
    # Second window: score 0.5 x [8, 0] + [0, 6] = [4, 6] over 0.5 x 4 + 4 = 6 steps.
    swaps = rule(np.array([[0.0, 6.0]]), hot, 1, 1.0)
    assert rule.score_LE.tolist() == [[4.0, 6.0]] and rule.steps == 6.0
    p_in, p_out = 1 - math.exp(-1.0), 1 - math.exp(-4 / 6)
    assert 8 * (p_in - p_out) > 1  # pays, so the slot moves
    assert [(s.out_expert, s.in_expert) for s in swaps] == [(0, 1)]


def test_at_most_max_swaps_per_layer_strongest_with_weakest():
    rule = BreakEvenRule(decay=0.0, window_steps=1, sigmas=0.0)
    rule.horizon = math.inf  # every gain pays: the pairing and the cap alone decide
    counts = np.array([[1.0, 2.0, 3.0, 9.0, 8.0, 7.0], [5.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    hot = np.array([[True, True, True, False, False, False], [True, False, False, False, False, False]])
    swaps = rule(counts, hot, 2, 1.0)
    assert [(s.layer, s.out_expert, s.in_expert) for s in swaps] == [(0, 0, 3), (0, 1, 4)]


def test_decay_one_never_forgets_and_pays_any_gain():
    rule = BreakEvenRule(decay=1.0, window_steps=2, sigmas=0.0)
    assert rule.horizon == math.inf
    rule(np.array([[2.0, 1.0]]), np.array([[True, False]]), 1, 1.0)
    assert rule(np.array([[0.0, 2.0]]), np.array([[True, False]]), 1, 1.0)[0].in_expert == 1  # 2 vs 3
    assert rule.steps == 4.0


@pytest.mark.parametrize("counts, hot, match", [
    (np.ones((2, 3)), np.ones((3, 2), dtype=bool), "must match"),
    (-np.ones((1, 2)), np.array([[True, False]]), "finite and >= 0"),
    (np.full((1, 2), np.nan), np.array([[True, False]]), "finite and >= 0"),
])
def test_bad_counts_are_refused(counts, hot, match):
    with pytest.raises(PlanError, match=match):
        BreakEvenRule(0.8, 8, 2.0)(counts, hot, 2, 1.25)


def test_counts_of_another_shape_than_the_first_window_are_refused():
    rule = BreakEvenRule(0.8, 8, 2.0)
    rule(np.ones((1, 2)), np.array([[True, False]]), 2, 1.25)
    with pytest.raises(PlanError, match="do not match the earlier windows"):
        rule(np.ones((2, 2)), np.array([[True, False]] * 2), 2, 1.25)


@pytest.mark.parametrize("args, match", [((1.5, 8, 2.0), "decay"), ((0.8, 0, 2.0), "window_steps"),
                                         ((0.8, 8, -1.0), "sigmas"), ((0.8, 8, math.nan), "sigmas")])
def test_bad_rule_knobs_are_refused(args, match):
    with pytest.raises(PlanError, match=match):
        BreakEvenRule(*args)


def test_bad_swap_knobs_are_refused():
    with pytest.raises(PlanError, match="bad swap knobs"):
        BreakEvenRule(0.8, 8, 2.0)(np.ones((1, 2)), np.array([[True, False]]), 2, 0.5)


def test_the_rule_is_chosen_by_name():
    assert isinstance(make_swap_rule("credit", 0.8, 8, 2.0), SwapRule)
    rule = make_swap_rule("breakeven", 0.5, 4, 3.0)
    assert isinstance(rule, BreakEvenRule) and (rule.decay, rule.window_steps, rule.sigmas) == (0.5, 4, 3.0)
    with pytest.raises(PlanError, match="unknown swap rule 'lfu'"):
        make_swap_rule("lfu", 0.8, 8, 2.0)
