"""The one finite-and-non-negative rule (hotsplit_cli/core/checks.py) and the exact words each reader
gives it: histogram files, the planner, live counts, placement windows, serving-engine dumps."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.core.checks import NEGATIVE, NOT_FINITE, check_finite_nonneg, index_str
from hotsplit_cli.core.errors import HistogramError, InputFileError, PlanError


def _raised(a, error=PlanError) -> str:
    with pytest.raises(error) as exc:
        check_finite_nonneg(np.asarray(a, dtype=np.float64), error, lambda idx, problem: f"{idx} {problem}")
    return exc.value.message


def test_a_non_finite_entry_is_named_before_an_earlier_negative_one():
    assert _raised([[-1.0, 2.0], [3.0, np.inf]]) == f"(1, 1) {NOT_FINITE}"


def test_the_first_offending_entry_in_row_major_order_is_named():
    assert _raised([[1.0, 2.0, 3.0], [4.0, -5.0, -6.0]]) == f"(1, 1) {NEGATIVE}"
    assert _raised([[[0.0, 1.0]], [[np.nan, np.nan]]]) == f"(1, 0, 0) {NOT_FINITE}"


def test_the_callers_error_type_is_raised_and_good_counts_pass():
    assert "(0,)" in _raised([-0.5], InputFileError)
    check_finite_nonneg(np.zeros((2, 3)), PlanError, lambda *_: "never")


def test_index_str_writes_a_json_path():
    assert (index_str((1, 2)), index_str((0,)), index_str(())) == ("[1][2]", "[0]", "")


# Each reader's message, word for word: the rule is shared, the wording is the caller's.
def test_histogram_reader_message():
    from hotsplit_cli.traffic.hist import validate_counts

    with pytest.raises(HistogramError) as exc:
        validate_counts(np.array([[1.0, 2.0], [3.0, -4.0]]), (0, 1), "h.json")
    assert exc.value.message == "h.json: `counts[1][1]` is -4.0 (counts must be >= 0)"
    with pytest.raises(HistogramError) as exc:
        validate_counts(np.array([[1.0, np.nan]]), (0,), "h.json")
    assert exc.value.message == "h.json: `counts[0][1]` is nan (must be finite)"


def test_planner_messages():
    from hotsplit_cli.hotset.planner import check_counts, propose_swaps

    with pytest.raises(HistogramError) as exc:
        check_counts(np.array([[1.0, 2.0], [np.inf, 1.0]]))
    assert exc.value.message == "counts[1][0] is not finite"
    with pytest.raises(HistogramError) as exc:
        check_counts(np.array([[1.0, -2.0]]), "live")
    assert exc.value.message == "live[0][1] is negative"
    with pytest.raises(PlanError) as exc:
        propose_swaps(np.array([[1.0, -1.0]]), np.array([[True, False]]), 1, 1.0)
    assert exc.value.message == "live counts must be finite and >= 0"


def test_placement_windows_message():
    from hotsplit_cli.placement.algorithm import check_windows

    with pytest.raises(PlanError) as exc:
        check_windows(np.array([[[1.0, np.nan]]]))
    assert exc.value.message == "counts must be finite and >= 0"


def test_serving_dump_message(tmp_path):
    from hotsplit_cli.traffic.serving_import import read_sglang

    path = tmp_path / "d.json"
    path.write_text('{"logical_count": [[1, 2], [3, -4]]}')
    with pytest.raises(InputFileError) as exc:
        read_sglang([path])
    assert exc.value.message == f"{path}: `logical_count[1, 1]` is negative"
