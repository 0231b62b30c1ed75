"""What every command shares: output paths checked before any work, one-line errors, a true
message on Ctrl-C, a quiet stop when the reader of stdout goes away."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# Every option that names a file a command writes, with the other arguments the command needs.
OUTPUTS = [
    (["plan", "{hist}", "--recipe", "tiny"], "--output"),
    (["probe"], "--output"),
    (["balance", "tiny"], "--output"),
    (["balance", "tiny"], "--trace"),
    (["place", "{hist}", "--ranks", "4"], "--output"),
    (["rerank", "{hist}", "{hist}"], "--output"),
    (["hist", "import", "{hist}", "--from", "sglang"], "--output"),
    (["hist", "show", "{hist}"], "--plot"),
    (["simulate", "--trace", "t.npz", "--recipe", "tiny"], "--plot"),
    (["run", "tiny"], "--plot"),
    (["run", "tiny"], "--log-jsonl"),
]


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


def _bad_paths(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (path, what the message says)."""
    (tmp_path / "somedir").mkdir()
    return {"folder": (str(tmp_path / "somedir"), "is a folder; name a file inside it"),
            "dot": (".", "is a folder"),
            "missing parent": (str(tmp_path / "nope" / "out.json"), f"folder {tmp_path / 'nope'} does not exist; "
                                                                      "create it first"),
            "device": (os.devnull, "is not a regular file")}


@pytest.mark.parametrize("args, flag", OUTPUTS, ids=[f"{a[0]} {f}" for a, f in OUTPUTS])
def test_every_output_path_is_checked_before_any_work(cli, tiny_hist, tmp_path, args, flag):
    argv = [a.format(hist=tiny_hist) for a in args]
    for name, (path, says) in _bad_paths(tmp_path).items():
        before = _files(tmp_path)
        r = cli(*argv, flag, path)
        assert r.code == 2, (name, r.err)
        assert r.err.splitlines() == [r.err.strip()] and r.err.startswith(f"error: {flag} {path}: "), (name, r.err)
        assert says in r.err and "Traceback" not in r.err, (name, r.err)
        assert r.out == "" and _files(tmp_path) == before, name


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_read_only_folder_is_refused(cli, tiny_hist, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        r = cli("plan", tiny_hist, "--recipe", "tiny", "-o", ro / "plan.json")
    finally:
        ro.chmod(0o700)
    assert r.code == 2 and f"cannot create a file in {ro}" in r.err and list(ro.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_folder_where_no_file_can_be_created_is_refused(cli, tiny_hist):
    # /proc refuses new files even to root: the check creates a file to find out.
    r = cli("plan", tiny_hist, "--recipe", "tiny", "-o", "/proc/plan.json")
    assert r.code == 2 and r.err.startswith("error: --output /proc/plan.json: cannot create a file in /proc")
    assert r.out == ""


def test_invalid_yaml_recipe_is_one_line_with_its_position(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: [\n  bad\n")
    r = cli("ledger", bad)
    assert r.code == 2 and r.out == ""
    # libyaml (PyYAML's C loader, used where it is built) and the pure-Python loader word it apart.
    problem = ("did not find expected ',' or ']'" if getattr(yaml, "__with_libyaml__", False)
               else "expected ',' or ']', but got '<stream end>'")
    assert r.err.splitlines() == [f"error: {bad}: not valid YAML: line 4, column 1: {problem}; "
                                  "fix the recipe's YAML syntax"]


def test_unknown_command_has_no_doubled_punctuation(cli):
    r = cli("frobnicate")
    assert r.code == 2 and r.err == "error: No such command 'frobnicate'; see `hotsplit --help`\n"


def test_messages_end_clean_and_stay_on_one_line():
    from hotsplit_cli.core.errors import HotsplitError

    assert HotsplitError("it failed.", "do this.").render() == "error: it failed; do this"
    assert HotsplitError("bad value:\n  12", "fix it;").render() == "error: bad value: 12; fix it"
    assert HotsplitError("e.g. 1, 2 ...").render() == "error: e.g. 1, 2 ..."
    assert HotsplitError("cannot write .").render() == "error: cannot write ."


def test_selftest_device_error_names_the_flag(cli):
    r = cli("selftest", "--device", "tpu")
    assert r.code == 2 and r.out == ""
    assert r.err == "error: --device: must be auto, cpu, cuda or cuda:N, got 'tpu'\n"


def test_a_bug_is_one_line_and_a_traceback_only_with_debug(cli, tiny_hist, monkeypatch):
    import hotsplit_cli.commands.hist_show as hist_show

    def boom(*args):
        raise ValueError("boom\nsecond line")

    monkeypatch.setattr(hist_show, "hist_report", boom)
    r = cli("hist", "show", tiny_hist)
    assert r.code == 1 and r.err == ("error: unexpected ValueError: boom second line; this is a bug in hotsplit: "
                                     "rerun with --debug and report the traceback\n")
    with pytest.raises(ValueError, match="boom"):
        cli("--debug", "hist", "show", tiny_hist)
    assert cli("hist", "show", tiny_hist).code == 1  # --debug was that run's alone: no traceback now


def test_ctrl_c_after_a_file_was_written_says_so(cli, tiny_hist, tmp_path, monkeypatch):
    from hotsplit_cli.output import Output

    def interrupted(self, doc, render=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(Output, "emit", interrupted)
    plan = tmp_path / "plan.json"
    r = cli("plan", tiny_hist, "--recipe", "tiny", "-o", plan)
    assert r.code == 130 and plan.is_file()
    assert r.err.splitlines()[-1] == f"error: interrupted; wrote {plan} before it"


def test_ctrl_c_before_anything_was_written_says_nothing_was(cli, tiny_hist, tmp_path, monkeypatch):
    import hotsplit_cli.hotset.planfile as planfile

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(planfile, "load_hist", interrupted)
    r = cli("plan", tiny_hist, "--recipe", "tiny", "-o", tmp_path / "plan.json")
    assert r.code == 130 and r.err.splitlines()[-1] == "error: interrupted; nothing was written"
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["human", "json"])
def test_closed_stdout_pipe_stops_quietly_with_the_file_written(tmp_path, json_flag):
    """`hotsplit balance tiny -o x.json | head -1`, with the reader gone before the first line."""
    out = tmp_path / "x.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "hotsplit_cli", "balance", "tiny", "--steps", "20", "-o", str(out),
                          *json_flag], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=env)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=120) == 141, err  # 128 + SIGPIPE, as a shell reports a tool stopped by the pipe
    assert err == "" and out.is_file() and out.read_bytes().startswith(b"{")


def test_every_command_module_is_registered():
    from hotsplit_cli import cli

    # `_name.py` is a private part of a command (commands/_run_ep.py: run's expert-parallel ranks).
    modules = {p.stem for p in (ROOT / "hotsplit_cli" / "commands").glob("*.py") if not p.stem.startswith("_")}
    registered = {c.callback.__module__.rsplit(".", 1)[-1]
                  for typer_app in (cli.app, cli.hist_app) for c in typer_app.registered_commands}
    assert registered == modules


def test_a_command_module_that_cannot_be_imported_stops_the_cli(monkeypatch):
    # A missing command module is a broken install, not a command to leave out of --help quietly.
    import importlib

    import hotsplit_cli.commands

    monkeypatch.delattr(hotsplit_cli.commands, "place")
    monkeypatch.setitem(sys.modules, "hotsplit_cli.commands.place", None)
    monkeypatch.delitem(sys.modules, "hotsplit_cli.cli")
    with pytest.raises(ImportError, match="hotsplit_cli.commands.place"):
        importlib.import_module("hotsplit_cli.cli")


def test_debug_after_the_command_shows_the_traceback_of_the_real_error(tmp_path, capsys):
    from hotsplit_cli.cli import main
    from hotsplit_cli.core.errors import HotsplitError

    with pytest.raises(HotsplitError, match="no such file"):  # not typer's "No such option: --debug"
        main(["plan", str(tmp_path / "none.json"), "--recipe", "tiny", "--debug"])


def test_hist_import_of_json_dumps_needs_no_torch(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    dump = tmp_path / "dump.json"
    dump.write_text('{"logical_count": [[1, 2, 3, 4], [4, 3, 2, 1]]}')
    code = ("import sys; from hotsplit_cli.cli import main; "
            f"rc = main(['hist', 'import', {str(dump)!r}, '--from', 'sglang', '--top-k', '2', '-o', "
            f"{str(tmp_path / 'h.json')!r}]); print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.stdout.split()[-2:] == ["0", "False"], out.stderr
