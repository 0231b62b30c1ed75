"""Checks added for behaviours a mutation run (docs/testing.md) found untested: the exact text of
errors users read, a digest of a file longer than one read, and the masks a cold-path mode returns."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.core.jsonio import read_json_doc
from hotsplit_cli.hotset.coldpath import ColdRates, split_cold
from hotsplit_cli.traffic.hist import file_sha256


def test_a_wrong_schema_is_one_line_naming_both_schemas_and_what_to_do(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"schema": "hotsplit.plan/3"}')
    with pytest.raises(InputFileError) as exc:
        read_json_doc(path, "plan", versions=(1, 2))
    assert exc.value.render() == (f"error: {path}: schema 'hotsplit.plan/3' is not hotsplit.plan/1 or "
                                  "hotsplit.plan/2; was it written by another tool or a newer hotsplit?")


def test_file_sha256_is_the_digest_of_every_byte_across_reads(tmp_path):
    """Longer than one 1 MiB read, and not a whole number of them."""
    data = np.random.default_rng(0).integers(0, 256, (3 << 20) + 12345, dtype=np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    path.write_bytes(b"")
    assert file_sha256(path) == hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("mode, on_cpu", [("gpu", [False, False, False]), ("cpu", [True, True, True]),
                                          ("split", [True, False, False])])
def test_every_mode_returns_a_boolean_mask_that_selects_experts(mode, on_cpu):
    """The runtime indexes expert ids with `to_cpu_N`: it must be a bool mask in every mode."""
    split = split_cold([1e9, 1e9, 1e9], [1, 1, 1], ColdRates(1.0, ((1, 1.0),)), mode)
    assert split.to_cpu_N.dtype == bool and split.to_cpu_N.tolist() == on_cpu
    assert np.array([7, 8, 9])[split.to_cpu_N].tolist() == [e for e, c in zip([7, 8, 9], on_cpu, strict=True) if c]


def test_an_unknown_cold_path_names_the_choices():
    with pytest.raises(UsageError) as exc:
        split_cold([1.0], [1], ColdRates(1.0, ()), "both")
    assert exc.value.message == "cold_path: must be one of gpu, cpu, split, got 'both'"
