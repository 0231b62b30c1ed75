"""A histogram's `quality` block survives every path that writes a histogram again: load and
save, and `rerank` (its errors are the model's experts', so the re-ranked histogram keeps them)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hotsplit_cli.cli import main
from hotsplit_cli.core.errors import HistogramError
from hotsplit_cli.hotset.quality import load_quality
from hotsplit_cli.hotset.rerank import rerank
from hotsplit_cli.traffic.hist import Histogram, load_hist, save_hist
from hotsplit_cli.traffic.quality import Quality, filled, quality_summary

from .quality_fixture import write_quality_hist


def _same(a: Quality, b: Quality) -> None:
    assert a.measured_on == b.measured_on and a.model == b.model
    assert set(a.error_LE) == set(b.error_LE)
    for p in a.error_LE:
        np.testing.assert_array_equal(a.error_LE[p], b.error_LE[p])  # nan where never routed, on both


def test_load_then_save_keeps_the_quality_block(tmp_path):
    src = write_quality_hist(tmp_path / "h.json")
    doc = json.loads(src.read_text())
    doc["quality"]["expert_error"]["fp8"][1][2] = None  # an expert with no measured error
    src.write_text(json.dumps(doc))
    h = load_hist(src)
    assert h.quality is not None and np.isnan(h.quality.error_LE["fp8"][1, 2])
    again = tmp_path / "again.json"
    save_hist(again, h)
    _same(load_quality(again, h.counts_LE.shape), load_quality(src, h.counts_LE.shape))
    assert json.loads(again.read_text())["quality"] == json.loads(src.read_text())["quality"]


def test_save_refuses_a_bad_quality_block_and_writes_nothing(tmp_path):
    h = load_hist(write_quality_hist(tmp_path / "h.json"))
    bad = dataclasses.replace(h.quality, error_LE={"fp8": -h.quality.error_LE["fp8"][:, :3]})
    out = tmp_path / "out.json"
    with pytest.raises(HistogramError, match=r"quality\.expert_error\.fp8\[0\]` must list"):
        save_hist(out, dataclasses.replace(h, quality=bad))
    assert not out.exists()


def _toy(layers, counts, quality=None):
    return Histogram("toy", "generated for a test", 1, int(counts.sum()), layers, counts, quality=quality)


def test_rerank_keeps_mines_errors_in_refs_layer_order_and_fills_gaps_from_refs():
    counts = np.array([[5.0, 0.0, 1.0], [2.0, 2.0, 2.0]])
    mine_q = Quality("mine", {"fp8": np.array([[0.1, np.nan, 0.3], [0.4, 0.5, 0.6]])},
                     {"fp8": {"agreement": 0.9, "mean_kl": 0.01, "tokens": 9}})
    ref_q = Quality("ref", {"fp8": np.full((2, 3), 0.7), "mxfp4": np.full((2, 3), 0.9)}, {})
    ref = _toy((1, 2), np.ones((2, 3)), ref_q)
    mine = _toy((2, 1), counts[::-1].copy(), mine_q)  # mine's rows are layers 2, 1
    out = rerank(ref, mine, 0.0).hist.quality
    np.testing.assert_array_equal(out.error_LE["fp8"], [[0.4, 0.5, 0.6], [0.1, 0.7, 0.3]])
    np.testing.assert_array_equal(out.error_LE["mxfp4"], np.full((2, 3), 0.9))
    assert out.measured_on == "mine; the rest: ref" and out.model == mine_q.model
    # only one side measured: that side's, unchanged
    assert rerank(ref, _toy((1, 2), counts), 0.0).hist.quality is ref_q
    assert filled(None, None) is None and filled(mine_q, None) is mine_q


def test_cli_rerank_writes_the_quality_block(tmp_path, capsys):
    ref = write_quality_hist(tmp_path / "ref.json", seed=1)
    mine = write_quality_hist(tmp_path / "mine.json", seed=2, tokens_per_window=64)
    out = tmp_path / "out.json"
    assert main(["rerank", str(ref), str(mine), "-o", str(out), "--strength", "0"]) == 0
    capsys.readouterr()
    h = load_hist(out)
    mine_q = load_hist(mine).quality
    assert h.quality.measured_on.startswith(mine_q.measured_on)
    known = ~np.isnan(mine_q.error_LE["fp8"])
    np.testing.assert_array_equal(h.quality.error_LE["fp8"][known], mine_q.error_LE["fp8"][known])


def test_summary_counts_routed_experts_only():
    q = Quality("x", {"fp8": np.array([[0.1, np.nan, 0.3]]), "mxfp4": np.array([[np.nan] * 3])},
                {"fp8": {"agreement": 0.5, "mean_kl": 0.2, "tokens": 4}})
    fp8, mx = quality_summary(q)
    assert fp8 == {"precision": "fp8", "experts": 2, "median_error": pytest.approx(0.2), "max_error": 0.3,
                   "agreement": 0.5, "mean_kl": 0.2, "tokens": 4}
    assert mx["experts"] == 0 and mx["median_error"] is None and mx["agreement"] is None
