import json

import numpy as np
import pytest

from hotsplit_cli.core.errors import HistogramError
from hotsplit_cli.traffic.hist import load_hist, save_hist
from tests.conftest import make_hist


def _doc(**over):
    doc = {
        "schema": "hotsplit.hist/1", "model": "m", "source": "generated in tests", "created": "2026-01-01T00:00:00Z",
        "top_k": 2, "tokens": 10, "layers": [3, 4], "num_experts": 3, "counts": [[1, 2, 3], [4, 5, 6]],
    }
    doc.update(over)
    return doc


def _write(tmp_path, doc, raw=None):
    p = tmp_path / "h.json"
    p.write_text(raw if raw is not None else json.dumps(doc))
    return p


def test_round_trip_keeps_every_field(tmp_path):
    counts = np.arange(12, dtype=float).reshape(2, 6) + 1
    windows = np.stack([counts, counts * 2])
    h = make_hist(counts, layers=(3, 5))
    h = type(h)(**{**h.__dict__, "windows_WLE": windows, "steps_per_window": 100})
    save_hist(tmp_path / "h.json", h)
    back = load_hist(tmp_path / "h.json")
    assert back.layers == (3, 5)
    np.testing.assert_array_equal(back.counts_LE, counts)
    np.testing.assert_array_equal(back.windows_WLE, windows)
    assert back.steps_per_window == 100
    assert back.source == "generated in tests"


@pytest.mark.parametrize(
    "over, raw, message",
    [
        ({"counts": [[1, 2, 3], [4, -5, 6]]}, None, "`counts[1][1]` is -5.0"),
        ({"counts": [[1, 2, 3], [4, 5]]}, None, "`counts[1]` has 2 entries"),
        ({"layers": [3]}, None, "2 rows but `layers` names 1"),
        ({"num_experts": 4}, None, "`num_experts` is 4"),
        ({"counts": [[0, 0, 0], [0, 0, 0]]}, None, "all zero"),
        ({"layers": [3, 3]}, None, "`layers[1]` repeats layer 3"),
        ({"schema": "hotsplit.hist/9"}, None, "schema 'hotsplit.hist/9'"),
        ({"counts": [[1, "x", 3], [4, 5, 6]]}, None, "`counts[0][1]` is not a number"),
        ({"top_k": 0}, None, "`top_k` must be an int >= 1"),
        (None, '{"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 2, "tokens": 1, '
               '"layers": [0], "num_experts": 2, "counts": [[1, NaN]]}', "`counts[0][1]` is nan"),
        (None, '{"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 2, "tokens": 1, '
               '"layers": [0], "num_experts": 2, "counts": [[1, Infinity]]}', "`counts[0][1]` is inf"),
        (None, '{"schema": "hotsplit.hist/1", "counts": [[1, 2', "not valid JSON"),
    ],
)
def test_reader_names_file_field_and_index(tmp_path, over, raw, message):
    p = _write(tmp_path, _doc(**(over or {})), raw)
    with pytest.raises(HistogramError) as exc:
        load_hist(p)
    assert message in str(exc.value)
    assert str(p) in str(exc.value)


def test_missing_field_is_named(tmp_path):
    doc = _doc()
    del doc["top_k"]
    with pytest.raises(HistogramError, match="missing field `top_k`"):
        load_hist(_write(tmp_path, doc))


def test_windows_must_match_counts(tmp_path):
    p = _write(tmp_path, _doc(windows={"steps_per_window": 5, "counts": [[[1, 2, 3]]]}))
    with pytest.raises(HistogramError, match=r"`windows.counts\[0\]` has shape \[1, 3\]"):
        load_hist(p)


def test_save_refuses_bad_counts_and_keeps_old_file(tmp_path):
    good = make_hist([[1, 2]])
    path = tmp_path / "h.json"
    save_hist(path, good)
    before = path.read_bytes()
    with pytest.raises(HistogramError):
        save_hist(path, make_hist([[1, -2]]))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["h.json"]  # no temp file left behind


def _with_windows(windows, counts=((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))):
    h = make_hist(counts, layers=(3, 4))
    return type(h)(**{**h.__dict__, "windows_WLE": np.asarray(windows, dtype=np.float64), "steps_per_window": 5})


@pytest.mark.parametrize("bad, message", [
    (-5.0, "`windows.counts[1][0][2]` is -5.0 (counts must be >= 0)"),
    (np.nan, "`windows.counts[1][0][2]` is nan (must be finite)"),
    (np.inf, "`windows.counts[1][0][2]` is inf (must be finite)"),
])
def test_save_refuses_bad_window_values_in_one_line_and_writes_nothing(tmp_path, bad, message):
    windows = np.ones((2, 2, 3))
    windows[1, 0, 2] = bad
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    save_hist(old, make_hist([[1, 2]]))
    before = old.read_bytes()
    for path in (new, old):
        with pytest.raises(HistogramError) as exc:
            save_hist(path, _with_windows(windows))
        assert str(exc.value) == f"{path}: {message}" and "\n" not in str(exc.value)
    assert not new.exists() and old.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


@pytest.mark.parametrize("windows, message", [
    (np.ones((2, 2, 4)), "`windows.counts[0]` has shape [2, 4], expected [2, 3]"),
    (np.ones((2, 3)), "`windows.counts` must be [windows, layers, experts], got shape [2, 3]"),
    (np.ones((0, 2, 3)), "`windows.counts` must be [windows, layers, experts], got shape [0, 2, 3]"),
])
def test_save_refuses_windows_of_the_wrong_shape(tmp_path, windows, message):
    with pytest.raises(HistogramError) as exc:
        save_hist(tmp_path / "h.json", _with_windows(windows))
    assert message in str(exc.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cell, message", [
    ("-5", "`windows.counts[1][0][2]` is -5.0 (counts must be >= 0)"),
    ("NaN", "`windows.counts[1][0][2]` is nan (must be finite)"),
    ("Infinity", "`windows.counts[1][0][2]` is inf (must be finite)"),
])
def test_load_refuses_bad_window_values_naming_the_entry(tmp_path, cell, message):
    windows = f'{{"steps_per_window": 5, "counts": [[[1, 2, 3], [4, 5, 6]], [[1, 2, {cell}], [4, 5, 6]]]}}'
    raw = json.dumps(_doc())[:-1] + f', "windows": {windows}}}'
    p = _write(tmp_path, None, raw)
    with pytest.raises(HistogramError) as exc:
        load_hist(p)
    assert str(exc.value) == f"{p}: {message}"
