"""A placement's held-out balancedness (placement/held_out.py) against refits by hand, and what a
placement file records for a run's verdict (old files without it still read)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.file import placement_prediction
from hotsplit_cli.placement.held_out import held_out_balance
from hotsplit_cli.placement.report import PlaceRequest, place_from_hist
from hotsplit_cli.traffic.hist import Histogram, save_hist

R = 4


def _dealt(windows_WLE: np.ndarray) -> Placement:
    """A layout that depends on the counts: experts by fitted totals, dealt to the ranks in turn."""
    totals_LE = windows_WLE.sum(axis=0)
    L, E = totals_LE.shape
    rows = []
    for counts_E in totals_LE:
        order = np.argsort(-counts_E, kind="stable")
        rows.append(np.concatenate([order[r::R] for r in range(R)]))  # rank r's slots, in slot order
    return Placement(tuple(range(L)), R, np.stack(rows).astype(np.int64))


def _by_hand(windows_WLE: np.ndarray, k: int) -> tuple[float, float]:
    """(sum of mean rank loads, sum of max) of window k on the layout dealt from windows [0, k)."""
    order_LE = np.argsort(-windows_WLE[:k].sum(axis=0), axis=1, kind="stable")
    mean = peak = 0.0
    for li, order in enumerate(order_LE):
        loads = [windows_WLE[k, li, order[r::R]].sum() for r in range(R)]
        mean, peak = mean + np.mean(loads), peak + max(loads)
    return mean, peak


@pytest.mark.parametrize("num_windows", [2, 5, 8])
def test_held_out_balance_equals_refits_by_hand(num_windows):
    windows = np.random.default_rng(num_windows).gamma(0.5, 40.0, size=(num_windows, 3, 16))
    held = held_out_balance(windows, _dealt)
    first = -(-num_windows // 2)
    parts = [_by_hand(windows, k) for k in range(first, num_windows)]
    assert held.reason is None and held.origins == tuple(range(first, num_windows))
    np.testing.assert_allclose(held.balancedness_K, [m / p for m, p in parts], rtol=1e-12)
    assert held.band.expected == pytest.approx(sum(m for m, _ in parts) / sum(p for _, p in parts), rel=1e-12)
    assert held.band.low == pytest.approx(min(m / p for m, p in parts))
    assert held.band.high == pytest.approx(max(m / p for m, p in parts))


def test_one_window_has_no_band_and_says_how_to_get_windows():
    held = held_out_balance(np.ones((1, 2, 8)), _dealt)
    assert held.band is None and "--window-steps" in held.reason
    assert held.to_doc() == {"available": False, "reason": held.reason}


def test_place_records_the_band_and_the_window_size_and_old_files_still_read(tmp_path):
    windows = np.random.default_rng(0).gamma(0.5, 40.0, size=(6, 2, 8))
    hist = tmp_path / "h.json"
    save_hist(hist, Histogram("tiny", "test", 2, 100, (1, 2), windows.sum(0), windows_WLE=windows,
                              steps_per_window=4))
    report = place_from_hist(PlaceRequest(hist, 2))
    path = tmp_path / "pl.json"
    path.write_text(json.dumps({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in report.doc.items()}))
    pred = placement_prediction(path)
    oos = report.doc["out_of_sample"]
    assert oos["available"] and oos["origins"] == [3, 4, 5]
    assert (pred.fitted, pred.steps_per_window, pred.windows) == (report.doc["fitted"]["balancedness"], 4, 6)
    assert (pred.out_of_sample.expected, pred.out_of_sample.low) == (oos["expected"], oos["low"])
    old = json.loads(path.read_text())
    del old["out_of_sample"], old["source"]["steps_per_window"]
    path.write_text(json.dumps(old))
    pred = placement_prediction(path)
    assert pred.out_of_sample is None and pred.steps_per_window is None and pred.fitted is not None


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["out_of_sample"].update(low="x"), "out_of_sample"),
    (lambda d: d["out_of_sample"].pop("high"), "out_of_sample"),
    (lambda d: d["fitted"].update(balancedness=1.5), "outside [0, 1]"),
    (lambda d: d["source"].update(steps_per_window=[4]), "source"),
])
def test_a_malformed_prediction_is_refused_by_plan_naming_the_file_and_nothing_is_written(cli, tmp_path, edit,
                                                                                          field):
    import yaml

    from tests.cli.test_plan_forecast import ROOT

    rec = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    rec["parallel"] = {"tp": 1, "ep": 2}
    recipe = tmp_path / "ep.yaml"
    recipe.write_text(yaml.safe_dump(rec))
    windows = np.random.default_rng(2).gamma(0.5, 40.0, size=(4, 4, 32))
    hist = tmp_path / "h.json"
    save_hist(hist, Histogram("tiny", "test", 4, 100, (1, 2, 3, 4), windows.sum(0), windows_WLE=windows,
                              steps_per_window=4))
    placement, plan = tmp_path / "pl.json", tmp_path / "plan.json"
    assert cli("place", hist, "--ranks", "2", "-o", placement, "--recipe", recipe).code == 0
    doc = json.loads(placement.read_text())
    edit(doc)
    placement.write_text(json.dumps(doc))
    r = cli("plan", hist, "--recipe", recipe, "--placement", placement, "-o", plan)
    lines = r.err.strip().splitlines()
    assert r.code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {placement}: ") and field in lines[0]
    assert "re-create it with `hotsplit place`" in lines[0] and not plan.exists()
