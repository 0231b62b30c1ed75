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
