"""Atomic writes (the umask's mode for a new file, the old mode kept for a replaced one) and reading."""

from __future__ import annotations

import os
import stat

import pytest

from hotsplit_cli.core.errors import HistogramError, InputFileError
from hotsplit_cli.core.jsonio import read_json, read_json_doc, write_atomic, write_json_atomic


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


OLD = b'{\n  "old": [1, 2, 3]\n}\n'


@pytest.mark.parametrize("failure", [ValueError("bad value"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_a_failing_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, failure):
    """The callback writes half a document, then fails (an error, or Ctrl-C): the old file is
    byte-identical, and the folder holds nothing else."""
    out = tmp_path / "a.json"
    out.write_bytes(OLD)

    def write(fh):
        fh.write(b'{"new": [4, 5')
        fh.flush()
        raise failure

    with pytest.raises(type(failure)):
        write_atomic(out, write)
    assert out.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_failing_first_write_creates_nothing(tmp_path):
    def write(fh):
        fh.write(b"{")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic(tmp_path / "new.json", write)
    assert list(tmp_path.iterdir()) == []


def test_the_target_holds_the_old_bytes_until_the_new_file_is_complete(tmp_path):
    """While the callback writes, the target is untouched and the bytes go to another file in the
    same folder (so that the final rename is atomic)."""
    out = tmp_path / "a.json"
    out.write_bytes(OLD)
    seen = {}

    def write(fh):
        fh.write(b'{"new": 1}\n')
        fh.flush()
        seen["target"] = out.read_bytes()
        seen["others"] = sorted(p.name for p in tmp_path.iterdir() if p.name != "a.json")

    write_atomic(out, write)
    assert seen["target"] == OLD and out.read_bytes() == b'{"new": 1}\n'
    assert len(seen["others"]) == 1 and seen["others"][0].startswith(".a.json.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_folder_is_refused_with_nothing_left_behind(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(InputFileError, match="is a folder"):
        write_json_atomic(tmp_path / "d", {"x": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["d"] and list((tmp_path / "d").iterdir()) == []


def test_read_json_refuses_nan_unless_the_caller_checks_values_itself(tmp_path):
    path = tmp_path / "n.json"
    path.write_text('{"counts": [[1, NaN, Infinity]]}')
    with pytest.raises(InputFileError, match="n.json: not valid JSON"):
        read_json(path)
    counts = read_json(path, nonfinite=True)["counts"][0]
    assert counts[0] == 1 and counts[1] != counts[1] and counts[2] == float("inf")


@pytest.mark.parametrize("text, message", [
    (None, "no such file"), ('{"a": [1, 2', "not valid JSON"), ('{"a": NaN', "not valid JSON")])
def test_read_json_raises_the_callers_error_naming_the_file(tmp_path, text, message):
    path = tmp_path / "x.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(HistogramError, match=message) as exc:
        read_json(path, HistogramError, nonfinite=True)
    assert str(path) in exc.value.message


def test_read_json_doc_checks_the_schema(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"schema": "hotsplit.plan/2"}')
    with pytest.raises(InputFileError, match=r"schema 'hotsplit.plan/2' is not hotsplit.plan/1"):
        read_json_doc(path, "plan")
    assert read_json_doc(path, "plan", versions=(1, 2)) == {"schema": "hotsplit.plan/2"}
    path.write_text("[1]")
    with pytest.raises(InputFileError, match="expected a JSON object, got list"):
        read_json_doc(path, "plan")
