"""Next-layer predictors on small traces counted by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.traffic.predict import count_predictions, fit_predictor, token_members_NLE
from hotsplit_cli.traffic.trace import Trace

E = 4


def members(layer0, layer1):
    """One step of top-1 tokens, one list per MoE layer."""
    ids_SLTK = np.array([layer0, layer1])[None, :, :, None]
    return token_members_NLE(Trace(ids_SLTK, (1, 2)), E)


# fit: expert 0 at layer 0 is always followed by 2, expert 1 by 2 or 3 (half each);
# layer 1 shares: e2 3/4, e3 1/4. Judge: token 0 goes 1 -> 3, token 1 goes 0 -> 2.
FIT = members([0, 0, 1, 1], [2, 2, 3, 2])
JUDGE = members([1, 0], [3, 2])


def counts(kind, guesses, hot_LE=None):
    c = count_predictions(fit_predictor(kind, FIT), JUDGE, guesses, hot_LE)
    return c.predicted, c.useful, c.wasted, c.cold_reads, c.covered


def test_cooccurrence_table_is_the_conditional_share():
    p = fit_predictor("cooccur", FIT)
    np.testing.assert_allclose(p.cooccur_LEE[0, 0], [0, 0, 1, 0])
    np.testing.assert_allclose(p.cooccur_LEE[0, 1], [0, 0, 0.5, 0.5])
    # token 0 (expert 1): e2 and e3 tie at 1/2; e2 wins on frequency, then e3, then ids 0, 1
    assert p.rank_NE(JUDGE, 1)[0].tolist() == [2, 3, 0, 1]


def test_cooccurrence_counters():
    assert counts("cooccur", 1) == (2, 1, 1, 2, 0.5)  # both guess e2; only token 1 routes there
    assert counts("cooccur", 2) == (4, 2, 2, 2, 1.0)  # widening to 2 catches token 0's e3


def test_previous_token_puts_its_experts_first():
    p = fit_predictor("previous", FIT)
    # fit pairs (n-1, n) at layer 1: (2, 2), (2, 3), (3, 2): P(stay on 2) = 1/2, P(enter 2) = 1/1
    assert p.stay_LE[1, 2] == 0.5 and p.enter_LE[1, 2] == 1.0 and p.enter_LE[1, 3] == 0.5
    # token 1's previous token routed to e3, so e3 leads; token 0 has none: e2 (enter 1) leads
    assert p.rank_NE(JUDGE, 1)[:, 0].tolist() == [2, 3]
    assert counts("previous", 1) == (2, 0, 2, 2, 0.0)
    assert counts("previous", 2) == (4, 2, 2, 2, 1.0)


def test_most_frequent_baseline():
    assert counts("frequent", 1) == (2, 1, 1, 2, 0.5)


def test_a_hot_expert_is_never_guessed_and_cold_reads_are_the_base():
    hot = np.zeros((2, E), dtype=bool)
    hot[1, 2] = True
    # e2 dropped: both guess e3; token 0 reads e3 cold (covered), token 1's e2 is hot (no read)
    assert counts("cooccur", 1, hot) == (2, 1, 1, 1, 1.0)


def test_padding_tokens_are_not_counted():
    judge = members([1, 0], [3, -1])
    c = count_predictions(fit_predictor("cooccur", FIT), judge, 1)
    assert (c.predicted, c.useful, c.cold_reads) == (1, 0, 1)


def test_bad_guesses_and_unknown_predictor_are_refused():
    with pytest.raises(PlanError, match="guesses must be in 1..4"):
        count_predictions(fit_predictor("cooccur", FIT), JUDGE, 0)
    with pytest.raises(PlanError, match="unknown predictor 'oracle'"):
        fit_predictor("oracle", FIT)
    with pytest.raises(PlanError, match="no previous MoE layer"):
        fit_predictor("cooccur", FIT).probs_NE(JUDGE, 0)


def test_rolling_recall_refits_on_earlier_windows_only():
    from hotsplit_cli.traffic.predict import rolling_recall

    cycle = [0, 1, 2, 3] * 4  # 4 windows of 4 tokens; layer 1 repeats layer 0's expert
    member = token_members_NLE(Trace(np.array([cycle, cycle])[None, :, :, None], (1, 2)), E)
    got = rolling_recall("cooccur", member, 4, 1)
    assert (got["available"], got["origins"], got["expected"], got["low"], got["high"]) == (True, [2, 3], 1.0, 1.0, 1.0)
    # the previous token (always another expert here) never covers a read, on any held-out window
    assert rolling_recall("previous", member, 4, 1)["expected"] == 0.0
    assert rolling_recall("cooccur", member, 16, 1) == {
        "available": False, "reason": "the trace has 1 window of 16 tokens; a held-out recall needs at least 2"}
