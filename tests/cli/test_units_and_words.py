"""Figures are written in units that show them (no `0.00 GiB` for megabytes, no `0.000 ms` for
microseconds), bytes read are not called allocated, a warning never precedes the error that
refuses its input, and `balance` spells --window-steps as `simulate` does."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotsplit_cli.core.units import decimal_bytes, duration, gib
from hotsplit_cli.traffic.hist import save_hist
from tests.conftest import make_hist


@pytest.mark.parametrize("ms, text", [(0, "0 ms"), (0.0169, "16.9 us"), (0.5, "500 us"), (1.0, "1 ms"),
                                      (16.95, "16.9 ms"), (None, "-")])
def test_duration_keeps_three_figures(ms, text):
    assert duration(ms) == text


@pytest.mark.parametrize("n, text", [(0, "0 B"), (512, "512 B"), (32768, "32.8 kB"), (24.3e6, "24.3 MB"),
                                     (2.5e9, "2.5 GB")])
def test_decimal_bytes_keep_three_figures(n, text):
    assert decimal_bytes(n) == text


def test_zero_bytes_read_as_zero():
    assert gib(0) == "0 B" and gib(0, unit="GiB") == "0.00 GiB" and gib(3 << 20) == "3.00 MiB"


def test_the_ledger_of_a_small_recipe_shows_every_figure(cli):
    r = cli("ledger", "tiny")
    assert r.code == 0, r.err
    assert "0.00 GiB" not in r.out and "0.000 ms" not in r.out and "0.000 MB" not in r.out
    assert "24.00 MiB" in r.out and "32.8 kB" in r.out


def test_place_refuses_negative_redundancy_without_a_warning_first(cli, tmp_path):
    hist = tmp_path / "h.json"
    save_hist(hist, make_hist(np.ones((4, 32)), layers=(1, 2, 3, 4), top_k=4, model="tiny"))
    r = cli("place", hist, "--ranks", "4", "--redundant", "-4", "--json")
    assert r.code == 2 and r.out == ""
    assert r.err.startswith("error:") and "redundant replicas" not in r.err and len(r.err.splitlines()) == 1


def test_balance_takes_window_steps_and_still_its_earlier_spelling(cli, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert cli("balance", "tiny", "--steps", "8", "--window-steps", "4", "-o", a).code == 0
    assert cli("balance", "tiny", "--steps", "8", "--windows-steps", "4", "-o", b).code == 0
    assert json.loads(a.read_text())["windows"] == json.loads(b.read_text())["windows"]
    r = cli("balance", "tiny", "--steps", "8", "--window-steps", "4", "--windows-steps", "4", "-o", tmp_path / "c.json")
    assert r.code == 2 and not (tmp_path / "c.json").exists()
    helped = cli("balance", "--help").out
    assert "--window-steps" in helped and "--windows-steps" not in helped
