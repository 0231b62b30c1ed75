"""WindowBook: the per-window accounting shared by synthetic runs and checkpoint serving."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.core.errors import RuntimeFailure
from hotsplit_cli.hotset.planner import Swap
from runtime.windows import WindowBook, moves_by_layer, validate_swaps

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
