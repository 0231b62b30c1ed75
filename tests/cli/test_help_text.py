"""--help reads cleanly: no type on flags, one metavar style, one-line command summaries."""

from __future__ import annotations

import re

import pytest

from hotsplit_cli.cli import app

COMMANDS = [["plan"], ["run"], ["balance"], ["hist", "import"], ["hist", "show"], ["place"], ["ledger"], ["probe"],
            ["selftest"], ["simulate"], ["rerank"], ["export"]]


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")


def test_flags_show_no_type_placeholder(cli, wide):
    for args in [[], *COMMANDS]:
        r = cli(*args, "--help")
        assert r.code == 0
        for flag in ("--json", "--debug", "--help", "--version"):
            for line in r.out.splitlines():
                if f" {flag} " in line:
                    assert "<bool>" not in line, (args, line)


def test_usage_metavariables_are_one_style(cli, wide):
    for args in COMMANDS:
        usage = next(line for line in cli(*args, "--help").out.splitlines() if "Usage:" in line)
        names = re.findall(r"[\[{]+([^\]}]+)[\]}]+", usage.split("[OPTIONS]", 1)[1])
        assert all(n == n.upper() and not n.endswith("...") for n in names), (args, usage)
        assert "[[" not in usage and "}..." not in usage.replace("{FILE}...", ""), usage


def test_every_command_summary_is_one_sentence_on_one_line():
    for group in (app, *(g.typer_instance for g in app.registered_groups)):
        for cmd in group.registered_commands:
            doc = (cmd.callback.__doc__ or "").strip()
            first = doc.split("\n\n")[0]
            assert "\n" not in first and first.endswith("."), (cmd.name, first)
