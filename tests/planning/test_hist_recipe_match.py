"""A histogram and a recipe of different models: refused when the shapes differ, a warning when
only the model names do, in every command that takes both."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.traffic.hist import save_hist
from hotsplit_cli.traffic.recipe_match import _same_model
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace
from tests.conftest import make_hist

TINY_LAYERS = (1, 2, 3, 4)  # recipes/tiny.yaml: 4 MoE layers x 32 experts


def _hist(path, num_experts=32, model="tiny"):
    counts = np.random.default_rng(3).integers(1, 1000, size=(4, num_experts)).astype(np.float64)
    save_hist(path, make_hist(counts, layers=TINY_LAYERS, top_k=4, model=model))
    return path


@pytest.fixture
def other_shape(tmp_path):
    return _hist(tmp_path / "other-shape.json", num_experts=16)


@pytest.fixture
def other_name(tmp_path):
    return _hist(tmp_path / "other-name.json", model="someone/Other-MoE")


def test_hist_show_refuses_a_histogram_of_another_shape(cli, other_shape, tmp_path):
    png = tmp_path / "never.png"
    r = cli("hist", "show", other_shape, "--recipe", "tiny", "--plot", png)
    assert r.code == 1 and r.out == "" and not png.exists()
    assert r.err == (f"error: {other_shape}: 16 experts per layer but recipe 'tiny' has 32; use the recipe of the "
                     "model the histogram was captured on\n")


@pytest.mark.parametrize("which", ["ref", "mine"])
def test_rerank_refuses_a_histogram_of_another_shape(cli, other_shape, tmp_path, which):
    good = _hist(tmp_path / "good.json")
    ref, mine = (other_shape, good) if which == "ref" else (good, other_shape)
    out = tmp_path / "never.json"
    r = cli("rerank", ref, mine, "--recipe", "tiny", "--hot-gib", "0.005", "-o", out)
    assert r.code == 1 and r.out == "" and not out.exists()
    assert r.err.startswith(f"error: {other_shape}: 16 experts per layer but recipe 'tiny' has 32;")
    assert len(r.err.splitlines()) == 1


def test_hist_show_refuses_layers_the_recipe_does_not_have(cli, tmp_path):
    path = tmp_path / "layers.json"
    save_hist(path, make_hist(np.ones((4, 32)), layers=(0, 1, 2, 3), top_k=4, model="tiny"))
    r = cli("hist", "show", path, "--recipe", "tiny")
    assert r.code == 1 and r.out == "" and "layer 0 is not a MoE layer of recipe 'tiny'" in r.err


def _commands(hist, tmp_path):
    trace = tmp_path / "trace.npz"
    save_trace(trace, synthetic_trace(zipf_shares(4, 32, 1.1, 0), TINY_LAYERS, 20, 8, 4))
    return {
        "hist show": ["hist", "show", hist, "--recipe", "tiny"],
        "rerank": ["rerank", hist, _hist(tmp_path / "mine.json"), "--recipe", "tiny"],
        "plan": ["plan", hist, "--recipe", "tiny"],
        "place": ["place", hist, "--ranks", "4", "--recipe", "tiny"],
        "ledger": ["ledger", "tiny", "--hist", hist],
        "simulate": ["simulate", "--trace", trace, "--recipe", "tiny", "--fit", hist],
    }


@pytest.mark.parametrize("command", ["hist show", "rerank", "plan", "place", "ledger", "simulate"])
def test_a_histogram_naming_another_model_is_a_warning(cli, other_name, tmp_path, command):
    args = _commands(other_name, tmp_path)[command]
    want = (f"{other_name}: a histogram of model 'someone/Other-MoE', but recipe 'tiny' is 'tiny' "
            "(same shape: used as given; is it the right histogram?)")
    r = cli(*args, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["warnings"] == [want]
    assert f"warning: {want}" in r.err.splitlines()
    r = cli(*args)
    assert r.code == 0 and f"warning: {want}" in r.err.splitlines() and want not in r.out


@pytest.mark.parametrize("command", ["hist show", "rerank", "plan", "place", "ledger", "simulate"])
def test_a_histogram_of_the_recipes_model_gives_no_warning(cli, tmp_path, command):
    r = cli(*_commands(_hist(tmp_path / "tiny.json"), tmp_path)[command], "--json")
    assert r.code == 0, r.err
    assert "warnings" not in json.loads(r.out) and "warning" not in r.err


def test_same_model_names():
    v3 = load_recipe("deepseek-v3")  # recipe deepseek-v3, model deepseek-ai/DeepSeek-V3
    assert _same_model("deepseek-ai/DeepSeek-V3", v3)
    assert _same_model("DeepSeek-V3", v3)  # `balance --model /models/DeepSeek-V3` names the folder
    assert _same_model("deepseek-v3", v3) and _same_model("unknown", v3)  # `hist import` without a recipe
    assert not _same_model("deepseek-ai/DeepSeek-V2-Lite", v3)


@pytest.mark.parametrize("command", ["hist show", "rerank", "plan", "place", "ledger", "simulate"])
def test_each_command_checks_the_histogram_once(cli, other_name, tmp_path, command, monkeypatch):
    """One check per run, wherever the command's library function makes it (plan and ledger
    used to check twice). Every check that passes the shape test compares the model names once."""
    from hotsplit_cli.traffic import recipe_match

    calls = []
    same = recipe_match._same_model
    monkeypatch.setattr(recipe_match, "_same_model", lambda *a: calls.append(a) or same(*a))
    r = cli(*_commands(other_name, tmp_path)[command], "--json")
    assert r.code == 0, r.err
    files = 2 if command == "rerank" else 1  # rerank reads two histograms (REF and MINE)
    assert len(calls) == files, f"{command} checked {len(calls)} times for {files} histogram(s)"
