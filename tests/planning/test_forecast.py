"""Rolling-origin hit rates (hotset/forecast.py) against an independent numpy computation."""

import numpy as np
import pytest

from hotsplit_cli.hotset.forecast import origins_of, rolling_origin
from hotsplit_cli.hotset.planner import plan_hot_set


def _top_n_mask(counts_LE: np.ndarray, n: int) -> np.ndarray:
    """Equal expert sizes: the n largest counts, plain numpy (distinct floats: no ties to break)."""
    mask = np.zeros(counts_LE.size, dtype=bool)
    mask[np.argsort(-counts_LE.ravel(), kind="stable")[:n]] = True
    return mask.reshape(counts_LE.shape)


@pytest.mark.parametrize("num_windows", [2, 3, 7, 10])
def test_rolling_origin_equals_refits_by_hand(num_windows):
    rng = np.random.default_rng(num_windows)
    windows = rng.gamma(0.6, 50.0, size=(num_windows, 3, 16))
    n = 11
    held = rolling_origin(windows, lambda c: plan_hot_set(c, 1, n).hot_RLE)
    rates, hits, totals = [], 0.0, 0.0
    first = max(1, int(np.ceil(num_windows / 2)))
    for k in range(first, num_windows):
        hot = _top_n_mask(windows[:k].sum(axis=0), n)
        rates.append((windows[k] * hot).sum() / windows[k].sum())
        hits += (windows[k] * hot).sum()
        totals += windows[k].sum()
    assert held.reason is None and held.origins == tuple(range(first, num_windows))
    np.testing.assert_allclose(held.rate_K, rates, rtol=1e-12)
    assert held.overall.expected == pytest.approx(hits / totals, rel=1e-12)
    assert (held.overall.low, held.overall.high) == (pytest.approx(min(rates)), pytest.approx(max(rates)))
    assert held.to_doc()["available"] is True


def test_rank_rates_are_kept_per_origin():
    windows = np.random.default_rng(1).gamma(0.6, 50.0, size=(6, 2, 8))
    fit = lambda c: np.stack([plan_hot_set(c, 1, 4).hot_RLE[0]] * 2)  # noqa: E731
    half = lambda c, hot: np.array([(c * hot[0]).sum() / c.sum(), 0.5])  # noqa: E731
    held = rolling_origin(windows, fit, half)
    assert held.rank_rate_KR.shape == (len(origins_of(6)), 2)
    assert held.ranks[1].to_doc() == {"expected": 0.5, "low": 0.5, "high": 0.5}
    assert held.ranks[0].expected == pytest.approx(held.rate_K.mean())


@pytest.mark.parametrize("windows", [None, np.ones((1, 2, 4))])
def test_without_two_windows_it_says_why_and_how_to_get_them(windows):
    held = rolling_origin(windows, lambda c: pytest.fail("nothing to fit"))
    assert held.overall is None
    assert "balance --window-steps" in held.reason
    assert held.to_doc() == {"available": False, "reason": held.reason}


def test_windows_that_route_nothing_give_no_forecast():
    held = rolling_origin(np.zeros((4, 2, 4)), lambda c: pytest.fail("nothing to fit"))
    assert held.overall is None and "route no tokens" in held.reason
