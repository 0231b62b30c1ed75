"""Messages that say what is wrong in the user's words (issue: wording)."""

from __future__ import annotations

import pytest

from hotsplit_cli.config.recipe import RECIPES_DIR


def test_a_missing_checkpoint_folder_is_named_as_missing(cli, tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "p.txt").write_text("hello\n")
    r = cli("balance", "--model", tmp_path / "nosuch", "--prompts", tmp_path / "p.txt")
    assert r.code == 1 and r.err.startswith(f"error: {tmp_path / 'nosuch'}: no such folder"), r.err


def test_a_folder_given_as_a_recipe_is_named_as_a_folder(cli, tmp_path):
    r = cli("ledger", tmp_path)
    assert r.code == 2 and r.err.startswith(f"error: recipe '{tmp_path}': is a folder, not a recipe YAML file"), r.err


def test_a_misspelt_recipe_key_is_named_with_its_near_match(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((RECIPES_DIR / "tiny.yaml").read_text().replace("  top_k: 4", "  topk: 4"))
    r = cli("ledger", bad)
    assert r.code == 2
    assert r.err.startswith("error: model.topk: unknown key (did you mean model.top_k?)"), r.err


def test_progress_lines_put_labels_before_values_as_the_plot_words_them():
    from hotsplit_cli.commands._run_report import format_line
    from hotsplit_cli.hotset.windows import HitRateRecord

    r = HitRateRecord(step=50, hit_rate_window=0.82, hit_rate_total=0.815, swaps=0, swaps_total=0, bytes_copied=0,
                      copy_ms=0.0, cold_bytes_per_step=0.0, layer_hit_rate=[0.82])
    assert format_line(r).startswith("step      50  hit rate: window  82.0%, cumulative  81.5%  swaps")
