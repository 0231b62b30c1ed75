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


def _commands():
    """(words, click command) of every command, group members included."""
    import typer.main

    def walk(cmd, words):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*words, name])
        else:
            yield words, cmd
    return list(walk(typer.main.get_command(app), []))


def _option_rows(text: str) -> dict[str, str]:
    """Each option's row of a rendered --help (its wrapped lines joined), by its first flag."""
    rows: dict[str, str] = {}
    key, inside = None, False
    for line in text.splitlines():
        if "─ Options" in line or "─ Arguments" in line:
            inside, key = "─ Options" in line, None
            continue
        body = line.strip().strip("│").strip()
        if not inside or not body or body.startswith("╰"):
            continue
        first = body.lstrip("* ").split()[0]
        if first.startswith("-"):
            key = first.rstrip(",")
            rows[key] = body
        elif key is not None:
            rows[key] += " " + body
    return rows


def _meaning(help_text: str) -> str:
    """A knob flag's help without what it overrides."""
    return help_text.split("; overrides")[0].split("(overrides")[0].strip()


def test_every_option_of_every_command_shows_its_default_or_that_it_is_required(cli, monkeypatch):
    from hotsplit_cli.config.knobs import KNOB_NAMES, knob_spec

    monkeypatch.setenv("COLUMNS", "250")
    for words, cmd in _commands():
        rows = _option_rows(cli(*words, "--help").out)
        for p in cmd.params:
            if p.param_type_name != "option" or p.is_flag or p.hidden:
                continue
            row = rows[p.opts[0]]
            where = (words, p.opts[0], row)
            assert ("[required]" in row) == p.required, where
            assert p.required or "[default: " in row, where  # what happens without it
            assert "<str>" not in row and " TEXT " not in row, where  # every value says what it takes
            number = isinstance(p.default, int | float) and not isinstance(p.default, bool)
            if p.name in KNOB_NAMES:
                spec = knob_spec(p.name)
                number = spec.kind in (int, float)
                assert spec.env in row and len(_meaning(p.help).split()) >= 4, where  # the knob's meaning, too
            if number:
                assert "<int" in row or "<float" in row, where
            assert not p.opts[0].startswith("--dyn-") or p.name in KNOB_NAMES, where


def test_what_a_command_cannot_do_without_is_required():
    from hotsplit_cli.export.targets import recipe_engines

    required = {(" ".join(words), p.opts[0]) for words, cmd in _commands() for p in cmd.params if p.required}
    for must in [("export", "--to"), ("export", "--output"), ("recipe", "--output"), ("recipe", "--model"),
                 ("hist import", "--output"), ("simulate", "--recipe"), ("simulate", "--trace")]:
        assert must in required, must
    params = {(" ".join(words), p.opts[0]): p for words, cmd in _commands() for p in cmd.params}
    plan_recipe = params[("plan", "--recipe")]
    assert not plan_recipe.required and "needed when the histogram records none" in plan_recipe.help
    assert plan_recipe.show_default == "the recipe the histogram records"
    export_recipe = params[("export", "--recipe")].help
    assert all(engine in export_recipe for engine in recipe_engines())
