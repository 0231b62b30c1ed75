"""placement/evaluate.py worked out by hand: balance figures, physical counts, the held-out fit
choice and the three baselines (each check was a surviving mutant)."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.core.errors import PlanError, UsageError
from hotsplit_cli.placement.algorithm import Geometry, Placement, place_experts
from hotsplit_cli.placement.evaluate import (
    Balance,
    choose_fit,
    eplb_layout,
    evaluate,
    physical_counts,
    random_layout,
    trivial_layout,
)


def test_balance_of_a_layout_by_hand():
    # 2 ranks, 2 slots each; expert 0 twice (on both ranks), experts 1 and 2 once
    p = Placement((0,), 2, np.array([[0, 1, 0, 2]]))
    counts = np.array([[[8.0, 3.0, 1.0]], [[0.0, 2.0, 2.0]]])  # two windows
    # window 1: ranks 4 + 3 = 7 and 4 + 1 = 5; window 2: 2 and 2
    assert evaluate(counts, p) == Balance(7.0 + 2.0, 9.0 / 8.0, 8.0 / 9.0)
    assert evaluate(np.zeros((1, 1, 3)), p) == Balance(0.0, 1.0, 1.0)  # no traffic: perfectly even
    assert evaluate(np.array([[[0.5, 0.25, 0.0]]]), p) == Balance(0.5, 0.5 / 0.375, 0.75)  # a peak below 1 counts


def test_physical_counts_and_their_refusals():
    p = Placement((0, 1), 2, np.array([[0, 1, 0, 2], [2, 2, 1, 0]]))
    values, ranks = physical_counts([[8, 3, 1], [6, 4, 10]], p)
    assert values.tolist() == [[4.0, 3.0, 4.0, 1.0], [5.0, 5.0, 4.0, 6.0]]
    assert ranks.tolist() == [[0, 0, 1, 1], [0, 0, 1, 1]]
    with pytest.raises(PlanError) as exc:
        physical_counts(np.ones((3, 3)), p)
    assert exc.value.message == "placement has 2 layers, counts have 3"
    with pytest.raises(PlanError) as exc:
        physical_counts(np.ones((2, 2)), p)  # the layout names expert 2
    assert exc.value.message == "placement names expert 2, counts have 2 experts"
    physical_counts(np.ones((2, 3)), p)  # expert 2 of 3 is fine


def _turns(W: int, seed: int = 0) -> np.ndarray:
    """Experts 0 and 1 take turns being hot, window by window, over a noisy floor."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(1, 2, size=(W, 2, 8))
    w[0::2, :, 0] += 40
    w[1::2, :, 1] += 40
    return w


def test_the_fit_choice_holds_out_the_last_quarter_and_scores_both_fits_on_it():
    geo = Geometry(4, 4)
    for W in (4, 8, 9):
        w = _turns(W)
        n_out = max(1, W // 4)
        early, late = w[:W - n_out], w[W - n_out:]
        by_windows = evaluate(late, place_experts(early, (0, 1), geo)).balancedness
        by_totals = evaluate(late, place_experts(early.sum(axis=0, keepdims=True), (0, 1), geo)).balancedness
        got = choose_fit(w, (0, 1), geo)
        assert got.held_out == {"windows": n_out, "windows_balancedness": by_windows,
                                "totals_balancedness": by_totals}
        assert got.mode == ("windows" if by_windows > by_totals else "totals")
        assert got.reason == (f"better on the last {n_out} of {W} windows held out "
                              f"({by_windows:.4f} windows vs {by_totals:.4f} totals)")
    assert choose_fit(_turns(8), (0, 1), geo).held_out["windows"] == 2


def test_the_fit_choice_without_enough_windows_and_when_forced():
    geo = Geometry(4, 4)
    assert choose_fit(_turns(1), (0, 1), geo).__dict__ == {"mode": "totals", "reason": "one window", "held_out": None}
    assert choose_fit(_turns(2), (0, 1), geo).reason == "2 windows are too few to hold some out"
    assert choose_fit(_turns(3), (0, 1), geo).reason == "3 windows are too few to hold some out"
    assert choose_fit(_turns(8), (0, 1), geo, "totals").__dict__ == {
        "mode": "totals", "reason": "--fit totals", "held_out": None}
    assert choose_fit(_turns(1), (0, 1), geo).mode == choose_fit(_turns(1), (0, 1), geo, requested="auto").mode


def test_a_tie_on_the_held_out_windows_goes_to_the_totals():
    w = np.ones((4, 1, 4))  # uniform traffic: every layout is perfectly even
    got = choose_fit(w, (0,), Geometry(2, 0))
    assert got.held_out["windows_balancedness"] == got.held_out["totals_balancedness"] == 1.0
    assert got.mode == "totals"


@pytest.mark.parametrize("nodes, groups", [(1, 1), (2, 2)])
def test_the_baselines_carry_their_layers_method_and_nodes(nodes, groups):
    geo = Geometry(4, 4, nodes, groups)
    counts = np.random.default_rng(0).gamma(0.5, 100.0, size=(2, 8))
    for p, method in ((eplb_layout(counts, (5, 7), geo), "totals-only"), (trivial_layout(8, (5, 7), geo), "trivial"),
                      (random_layout(8, (5, 7), geo), "random")):
        assert (p.layers, p.method, p.num_ranks) == ((5, 7), method, 4)
    assert eplb_layout(counts, (5, 7), geo).num_nodes == nodes


def test_the_totals_only_baseline_may_put_two_replicas_on_a_rank():
    counts = np.array([[1000.0, 1, 1, 1]])
    p = eplb_layout(counts, (0,), Geometry(2, 4))  # 8 slots, 4 per rank: expert 0 gets 5 replicas
    assert p.logcnt_LE(4)[0].tolist() == [5, 1, 1, 1]
    one_rank = eplb_layout(counts, (0,), Geometry(1, 4))  # 8 slots on one rank for 4 experts: allowed here
    assert one_rank.logcnt_LE(4)[0].tolist() == [5, 1, 1, 1]
    with pytest.raises(UsageError, match="8 slots per rank exceed the 4 experts"):
        place_experts(counts[None], (0,), Geometry(1, 4))


def test_the_trivial_layout_wraps_redundant_slots_around():
    assert trivial_layout(4, (0, 1), Geometry(3, 2)).phy2log_LP.tolist() == [[0, 1, 2, 3, 0, 1]] * 2


def test_the_random_layout_is_seeded_and_draws_distinct_extras_when_it_can():
    geo = Geometry(4, 4)
    a = random_layout(8, (0, 1), geo)
    assert (a.phy2log_LP == random_layout(8, (0, 1), geo, seed=0).phy2log_LP).all()
    assert (a.phy2log_LP != random_layout(8, (0, 1), geo, seed=1).phy2log_LP).any()
    for row in a.phy2log_LP:
        assert sorted(np.bincount(row, minlength=8).tolist()) == [1] * 4 + [2] * 4  # 4 distinct extras
    many = random_layout(3, (0,), Geometry(3, 6))  # 6 extras of 3 experts: drawn with replacement
    assert np.bincount(many.phy2log_LP[0], minlength=3).sum() == 9
    exact = random_layout(4, (0,), Geometry(2, 4))  # as many extras as experts: still one each
    assert np.bincount(exact.phy2log_LP[0], minlength=4).tolist() == [2, 2, 2, 2]


@pytest.mark.parametrize("geo, message, hint", [
    (Geometry(0, 4), "--ranks, --nodes, --groups must be >= 1 and --redundant >= 0, got ranks=0 nodes=1 groups=1 "
     "redundant=4", None),
    (Geometry(4, 4, 0), "--ranks, --nodes, --groups must be >= 1 and --redundant >= 0, got ranks=4 nodes=0 groups=1 "
     "redundant=4", None),
    (Geometry(4, 4, 1, 0), "--ranks, --nodes, --groups must be >= 1 and --redundant >= 0, got ranks=4 nodes=1 "
     "groups=0 redundant=4", None),
    (Geometry(4, -4), "--ranks, --nodes, --groups must be >= 1 and --redundant >= 0, got ranks=4 nodes=1 groups=1 "
     "redundant=-4", None),
    (Geometry(5, 0), "--ranks 5 does not divide 8 experts + 0 redundant = 8",
     "choose --redundant so that experts + redundant is a multiple of --ranks"),
    (Geometry(4, 4, 2, 3), "--groups 3 does not divide 8 experts", None),
    (Geometry(4, 4, 4, 2), "--nodes 4 does not divide --groups 2", "use --groups as a multiple of --nodes"),
    (Geometry(1, 4), "12 slots per rank exceed the 8 experts a node can hold once",
     "lower --redundant or raise --ranks"),
])
def test_every_geometry_refusal_in_full(geo, message, hint):
    from hotsplit_cli.placement.algorithm import check_geometry

    with pytest.raises(UsageError) as exc:
        check_geometry(8, geo)
    assert (exc.value.message, exc.value.hint) == (message, hint)


def test_counts_that_are_not_windows_by_layers_by_experts_are_refused():
    from hotsplit_cli.placement.algorithm import check_windows

    for bad in (np.ones((2, 3)), np.ones((0, 2, 3)), np.ones((1, 2, 3, 1))):
        with pytest.raises(PlanError) as exc:
            check_windows(bad)
        assert exc.value.message == f"expected counts [windows, layers, experts], got shape {bad.shape}"


def test_duplicates_are_counted_per_layer_and_rank():
    from hotsplit_cli.placement.evaluate import duplicate_count

    p = Placement((0, 1), 2, np.array([[0, 0, 1, 1], [0, 1, 2, 2]]))  # layer 0: both ranks; layer 1: rank 1
    assert duplicate_count(p) == 3
