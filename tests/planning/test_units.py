"""How quantities are written: one formatter per kind, with the probe's and the ledger's cases."""

from __future__ import annotations

import pytest

from hotsplit_cli.core.units import gib, pct, size


def test_gib_picks_the_readable_unit_or_the_fixed_one():
    assert gib(3 << 30) == "3.00 GiB" and gib(5 << 20) == "5.00 MiB" and gib(100) == "0.10 KiB"
    assert gib(5 << 20, unit="GiB") == "0.00 GiB" and gib(None, unit="GiB") == "-"
    assert gib(int(1.5 * (1 << 30)), unit="MiB") == "1536.00 MiB"
    with pytest.raises(ValueError, match="unit must be one of"):
        gib(1, unit="TB")


def test_size_writes_whole_buffer_sizes_without_decimals():
    assert size(64 << 20) == "64 MiB" and size(3 << 19) == "1.50 MiB" and size(2048 * 1024) == "2 MiB"
    assert size(512) == "512 B" and size(None) == "-"


def test_pct():
    assert pct(0.6219) == "62.2%" and pct(0.6219, 2) == "62.19%" and pct(None) == "-"
