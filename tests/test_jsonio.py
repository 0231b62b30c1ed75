"""Atomic writes: the umask's mode for a new file, the old mode kept for a replaced one."""

from __future__ import annotations

import os
import stat

import pytest

from hotsplit_cli.errors import InputFileError
from hotsplit_cli.jsonio import write_json_atomic


@pytest.fixture
def umask():
    """Set the process umask for one test (and restore it)."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask, want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=oct)
def test_new_file_gets_the_umask_mode(tmp_path, umask, mask, want):
    umask(mask)
    out = write_json_atomic(tmp_path / "a.json", {"x": 1})
    assert mode(out) == want


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=oct)
def test_every_command_output_gets_the_umask_mode(cli, tiny_hist, tmp_path, umask, mask):
    umask(mask)
    plan, hist = tmp_path / "plan.json", tmp_path / "h.json"
    assert cli("plan", tiny_hist, "--recipe", "tiny", "-o", plan).code == 0
    assert cli("balance", "tiny", "--steps", "10", "-o", hist, "--trace", tmp_path / "t.npz").code == 0
    for p in (plan, hist, tmp_path / "t.npz"):
        assert mode(p) == 0o666 & ~mask, p


def test_replaced_file_keeps_its_mode_as_cp_does(tmp_path, umask):
    umask(0o022)
    out = tmp_path / "a.json"
    out.write_text("{}")
    out.chmod(0o640)
    write_json_atomic(out, {"x": 2})
    assert mode(out) == 0o640 and out.read_text().startswith('{\n  "x": 2')


def test_a_folder_is_refused_with_nothing_left_behind(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(InputFileError, match="is a folder"):
        write_json_atomic(tmp_path / "d", {"x": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["d"] and list((tmp_path / "d").iterdir()) == []
