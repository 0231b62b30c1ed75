import json

import numpy as np
import pytest

from hotsplit_cli.traffic.hist import save_hist
from hotsplit_cli.traffic.histstats import hist_report
from tests.conftest import make_hist


def _hist():
    # One layer, 10 experts: expert 0 carries 50 of 100, the rest 50/9 each... use integers.
    counts = np.array([[50.0, 14, 6, 6, 6, 6, 3, 3, 3, 3]])
    return make_hist(counts, layers=(7,))


def test_report_numbers_by_hand():
    r = hist_report(_hist(), expert_bytes=1 << 20)
    (layer,) = r.layers
    assert layer.layer == 7 and layer.mean == 10 and layer.max == 50 and layer.max_over_mean == 5
    assert layer.flagged == (0,)  # 50 > 2 x 10; 14 is not
    assert r.top_share[0.10] == pytest.approx(0.50)  # hottest 1 of 10
    assert r.top_share[0.50] == pytest.approx((50 + 14 + 6 * 3) / 100)
    assert r.cover_experts[0.50] == 1
    assert r.cover_experts[0.80] == 5  # 50+14+6+6+6 = 82
    assert r.cover_experts[0.99] == 10
    assert r.cover_bytes[0.80] == 5 << 20


def test_cli_text_json_and_plot(cli, tmp_path):
    path = tmp_path / "h.json"
    save_hist(path, _hist())
    r = cli("hist", "show", path)
    assert r.code == 0 and "> 2x mean" in r.out and "1: 0" in r.out
    legend = next(x for x in r.out.splitlines() if x.startswith("max/mean:"))
    assert "> 2x mean: how many experts carry more than 2x the layer's mean load, and their ids" in legend
    assert ("top 1 of 10: share of the layer's routed assignments on its hottest 1 experts (10% rounded up to whole "
            "experts: 10.0%)") in legend
    doc = json.loads(cli("hist", "show", path, "--json").out)
    assert doc["layers"][0]["flagged_experts"] == [0] and doc["cover_gib"] is None
    pytest.importorskip("matplotlib")
    png = tmp_path / "cov.png"
    assert cli("hist", "show", path, "--plot", png).code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bad_counts_doc() -> dict:
    return {"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 2, "tokens": 50, "layers": [7],
            "num_experts": 10, "counts": [[50, 14, 6, -2, 6, 6, 3, 3, 3, 3]]}


BAD_FILES = [
    # (file text or None for no file, what the one-line error must say after the file name)
    (None, ": no such file; check the path"),
    ("{}", ": schema None is not 'hotsplit.hist/1'; import engine dumps with `hotsplit hist import`"),
    (json.dumps(_bad_counts_doc()), ": `counts[0][3]` is -2.0 (counts must be >= 0)"),
]


@pytest.mark.parametrize("text, message", BAD_FILES, ids=["missing", "no schema", "negative count"])
def test_cli_bad_file_names_the_file_and_what_is_wrong(cli, tmp_path, text, message):
    bad = tmp_path / "bad.json"
    if text is not None:
        bad.write_text(text)
    r = cli("hist", "show", bad)
    assert (r.code, r.out) == (1, "")
    assert r.err == f"error: {bad}{message}\n"


def test_both_top_cuts_are_labelled_with_the_experts_they_count(cli):
    """Issue: per layer "top 10%" was 4 of 32 experts (12.5%), overall 13 of 128: two shares, one label."""
    r = cli("hist", "show", "examples/hist-tiny.json")
    assert r.code == 0, r.err
    assert "top 4 of 32" in r.out and "top 10%" not in r.out
    assert "10% rounded up to whole experts: 12.5%" in r.out
    assert "13 of 128 (10.2%)" in r.out and "7 of 128 (5.5%)" in r.out
