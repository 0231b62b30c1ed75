"""`run` judges each cold path's time per cold expert read against the platform file's cost model,
banded by the probe's measured spread; a platform file of an older probe, without spreads, gets
no band and says so."""

from __future__ import annotations

import json

import pytest

from tests.planning.test_coldpath_predictions import cpu_platform


def _run(cli, platform, json_out=True):
    r = cli("run", "tiny", "--cold-path", "cpu", "--platform", platform, "--steps", "3",
            *(["--json"] if json_out else []))
    assert r.code == 0, r.err
    return r


def test_each_path_is_judged_within_the_probes_spread(cli, tmp_path):
    doc = json.loads(_run(cli, cpu_platform(tmp_path / "p.json", spread=0.25)).out)
    paths = doc["summary"]["cold_paths"]
    verdicts = {v["name"]: v for v in doc["verdicts"]}
    assert set(verdicts) == {f"cold_path.{k}" for k in ("gpu", "cpu") if paths[k]["experts"]}
    for key, v in verdicts.items():
        p = paths[key.split(".")[1]]
        assert v["unit"] == "ms" and p["spread"] == pytest.approx(0.25)
        assert v["achieved"] == pytest.approx(p["ms"] / p["experts"])
        assert v["predicted"] == pytest.approx(p["predicted_ms"] / p["experts"])
        assert (v["low"], v["high"]) == (pytest.approx(v["predicted"] / 1.25), pytest.approx(v["predicted"] * 1.25))
        assert v["within"] is (v["low"] <= v["achieved"] <= v["high"])  # time is this machine's: judged, not fixed
        assert v["verdict"] == ("WITHIN" if v["within"] else "OUTSIDE")


def test_a_platform_file_without_spreads_gets_no_band(cli, tmp_path):
    path = cpu_platform(tmp_path / "p.json")
    doc = json.loads(path.read_text())
    for cell in doc["host"]["cpu_expert"][0]["by_tokens"]:
        del cell[1]["spread_gbps"]  # as an older probe wrote it
    path.write_text(json.dumps(doc))
    verdicts = json.loads(_run(cli, path).out)["verdicts"]
    assert verdicts and all(v["verdict"] == "NO BAND" and v["within"] is None and v["low"] is None
                            for v in verdicts)
    assert all(v["band"] == "no band: the platform file records no spread" for v in verdicts)
    text = _run(cli, path, json_out=False).out
    assert "cold path CPU (cpu), ms per cold expert read: achieved" in text
    assert "(no band: the platform file records no spread): NO BAND" in text
