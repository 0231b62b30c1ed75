"""`hotsplit balance --model` measures the quality cost of stored precisions into hist.json, says
it, and `plan --precision auto` plans from it (end to end through the CLI)."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from hotsplit_cli.hotset.quality import expected_error
from hotsplit_cli.traffic.hist import load_hist

pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")

from tests.fakes.hf import SENTENCES, build_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("q") / "gpt_oss", "gpt_oss")


@pytest.fixture(scope="module")
def measured(ckpt, tmp_path_factory):
    """(hist path, prompts path, balance's --json document) of one measured balance."""
    root = tmp_path_factory.mktemp("measured")
    prompts, out = root / "p.jsonl", root / "h.json"
    prompts.write_text("".join(json.dumps({"prompt": s}) + "\n" for s in SENTENCES[:4]))
    from hotsplit_cli.cli import main

    code = main(["balance", "--model", str(ckpt), "--prompts", str(prompts), "--max-new-tokens", "3",
                 "--batch-size", "2", "--window-steps", "2", "-o", str(out), "--json"])
    assert code == 0
    return out, prompts


def _balance(cli, ckpt, prompts, *args):
    return cli("balance", "--model", ckpt, "--prompts", prompts, "--max-new-tokens", "2", *args)


def test_the_histogram_records_where_and_what_was_measured(measured):
    out, prompts = measured
    h = load_hist(out)
    q = h.quality
    assert q.measured_on.startswith("checkpoint ") and "gpt_oss" in q.measured_on
    assert q.measured_on.endswith(f", prompts {prompts}, {h.tokens} tokens")
    assert sorted(q.error_LE) == ["fp8", "mxfp4"] and sorted(q.model) == ["fp8", "mxfp4"]
    for p in ("fp8", "mxfp4"):
        np.testing.assert_array_equal(np.isnan(q.error_LE[p]), h.counts_LE == 0)
        assert 0 <= q.model[p]["agreement"] <= 1 and q.model[p]["mean_kl"] >= 0
        assert q.model[p]["tokens"] == h.tokens


def test_human_and_json_output_say_each_precision(cli, ckpt, measured, tmp_path):
    _, prompts = measured
    r = _balance(cli, ckpt, prompts)
    assert r.code == 0, r.err
    lines = [x.strip() for x in r.out.splitlines()]
    assert any(x.startswith("quality of stored precisions, measured on checkpoint") for x in lines)
    for p in ("fp8", "mxfp4"):
        line = next(x for x in lines if x.startswith(f"{p}: expert error median"))
        assert "routed experts; next-token agreement" in line and "mean KL" in line
    r = _balance(cli, ckpt, prompts, "--json")
    doc = orjson.loads(r.out)
    rows = {row["precision"]: row for row in doc["quality"]["precisions"]}
    assert set(rows) == {"fp8", "mxfp4"} and doc["quality"]["measured_on"].startswith("checkpoint ")
    assert rows["fp8"]["max_error"] >= rows["fp8"]["median_error"] > 0 and rows["fp8"]["tokens"] == doc["tokens"]


def test_no_quality_measures_nothing(cli, ckpt, measured, tmp_path):
    _, prompts = measured
    out = tmp_path / "h.json"
    r = _balance(cli, ckpt, prompts, "--no-quality", "-o", out, "--json")
    assert r.code == 0, r.err
    assert orjson.loads(r.out)["quality"] is None
    assert load_hist(out).quality is None and "quality" not in json.loads(out.read_text())


def test_plan_auto_plans_from_the_measured_histogram(cli, measured, tmp_path):
    out, _ = measured
    h = load_hist(out)
    share = h.counts_LE / h.counts_LE.sum()
    fp8, mxfp4 = (expected_error(share, h.quality.error_LE[p]) for p in ("fp8", "mxfp4"))
    assert 0 < fp8 < mxfp4
    budget = (fp8 + mxfp4) / 2  # uniform fp8 is within it, uniform mxfp4 is not
    plan = tmp_path / "plan.json"
    r = cli("plan", out, "--hot-gib", "0.0002", "--precision", "auto", "--max-error", f"{budget:.6f}", "-o", plan)
    assert r.code == 0, r.err
    block = json.loads(plan.read_text())["precision"]
    assert block["knob"] == "auto" and block["expected_error"] <= budget
    assert block["errors_from"] == f"measured: {h.quality.measured_on}"
    assert "measured: checkpoint" in r.out
    refused = tmp_path / "refused.json"
    r = cli("plan", out, "--hot-gib", "0.0002", "--precision", "mxfp4", "--max-error", f"{budget:.6f}", "-o", refused)
    errors = [x for x in r.err.splitlines() if x.startswith("error:")]
    assert r.code == 1 and len(errors) == 1 and "mxfp4" in errors[0] and not refused.exists()
