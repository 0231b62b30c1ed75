"""The cold banks against the host memory a recipe (hardware.host_mem_gib) gives: ledger flags
it with both figures, plan warns, run refuses before it allocates."""

from __future__ import annotations

import json

import numpy as np
import yaml

from hotsplit_cli.cli import main
from hotsplit_cli.config.recipe import resolve_recipe_path


def _with_host(tmp_path, name: str, host_gib: float, **run):
    doc = yaml.safe_load(resolve_recipe_path(name).read_text())
    doc["hardware"]["host_mem_gib"] = host_gib
    doc.setdefault("run", {}).update(run)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_ledger_deepseek_v3_on_a_256_gib_host_says_the_cold_banks_do_not_fit(tmp_path, capsys):
    assert main(["ledger", str(_with_host(tmp_path, "deepseek-v3", 256)), "--json"]) == 0
    flags = json.loads(capsys.readouterr().out)["flags"]
    host = [f["message"] for f in flags if f["kind"] == "host_mem"]
    assert host == ["the cold banks need 609.15 GiB page-locked per node, above 80% of the 256.00 GiB host memory "
                    "(recipe hardware.host_mem_gib)"]


def test_ledger_says_nothing_when_the_host_holds_the_banks(tmp_path, capsys):
    assert main(["ledger", str(_with_host(tmp_path, "deepseek-v3", 1024)), "--json"]) == 0
    assert not [f for f in json.loads(capsys.readouterr().out)["flags"] if f["kind"] == "host_mem"]


def test_plan_warns_with_both_figures(tmp_path, capsys):
    from hotsplit_cli.traffic.hist import save_hist
    from tests.conftest import make_hist

    hist = tmp_path / "h.json"
    save_hist(hist, make_hist(np.arange(1, 129, dtype=float).reshape(4, 32), layers=range(1, 5), top_k=4))
    assert main(["plan", str(hist), "--recipe", str(_with_host(tmp_path, "tiny", 0.0001))]) == 0
    assert "the cold banks need 0.02 GiB page-locked per node, above 80% of the 0.00 GiB host memory" \
        in capsys.readouterr().err


def test_run_whose_cold_bank_cannot_fit_is_refused_before_it_allocates(tmp_path, capsys, monkeypatch):
    import hotsplit_runtime.from_recipe as from_recipe

    def allocates(*args, **kwargs):
        raise AssertionError("the run allocated")

    monkeypatch.setattr(from_recipe, "prepare_run", allocates)
    code = main(["run", str(_with_host(tmp_path, "tiny", 0.005))])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("error: the cold banks need 0.02 GiB page-locked per node, above 80% of the 0.00 GiB")


def test_the_banks_are_judged_at_their_stored_precision(tmp_path, capsys):
    """Stored precisions shrink the banks: DeepSeek-V3's 609 GiB of fp8 cold banks do not fit in
    80% of a 640 GiB host, the same experts stored at mxfp4 do."""
    from hotsplit_cli.config.recipe import load_recipe
    from hotsplit_cli.hotset.host_memory import node_bank_bytes

    rec = load_recipe("tiny")
    assert node_bank_bytes(rec, precision="fp8") < 0.6 * node_bank_bytes(rec)
    recipe = str(_with_host(tmp_path, "deepseek-v3", 640))
    for precision, flagged in (("native", True), ("mxfp4", False)):
        assert main(["ledger", recipe, "--precision", precision, "--json"]) == 0
        flags = json.loads(capsys.readouterr().out)["flags"]
        assert bool([f for f in flags if f["kind"] == "host_mem"]) == flagged, precision


def test_a_scaled_run_is_judged_on_what_it_pins():
    """--scale shrinks hidden and expert sizes: the bank it pins is scale^2 of the full one."""
    from hotsplit_cli.config.recipe import load_recipe
    from hotsplit_cli.hotset.host_memory import node_bank_bytes

    rec = load_recipe("tiny")
    assert node_bank_bytes(rec, 0.25) == node_bank_bytes(rec) // 16
