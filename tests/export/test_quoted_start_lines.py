"""The start lines README.md and docs/ quote are the ones `hotsplit export` prints: every quoted
line that starts an engine's program is checked against a real export."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.export.helpers import ROOT
from tests.export.test_start_lines import PROGRAMS, export_doc, made  # noqa: F401 (a fixture)

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def quoted_lines(text: str) -> list[str]:
    """Every inline code span (wrapped lines joined) that starts with an engine's program."""
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # code blocks hold commands, not quotes
    spans = re.findall(r"`([^`]+)`", prose.replace("\n", " "))
    starts = {" ".join(p) for p in PROGRAMS.values()}
    return [" ".join(s.split()) for s in spans if any(s.startswith(p + " ") for p in starts)]


def engine_of(line: str) -> str:
    """Which export a quoted line is (SGLang and KTransformers share SGLang's server)."""
    if line.startswith("python -m sglang.launch_server"):
        return "ktransformers" if "--kt-" in line else "sglang"
    return next(e for e, p in PROGRAMS.items() if line.startswith(" ".join(p) + " ") and e not in ("sglang",
                                                                                                  "ktransformers"))


def flags_of(words: list[str] | str) -> set[str]:
    words = shlex.split(words) if isinstance(words, str) else words
    return {w for w in words if re.fullmatch(r"--?[a-z][\w-]*", w)}


def test_every_quoted_start_line_has_the_flags_export_prints(cli, made):  # noqa: F811
    quoted = [(path.name, line) for path in DOCS for line in quoted_lines(path.read_text())]
    assert {engine_of(line) for _, line in quoted} == set(PROGRAMS)  # every engine's line is quoted somewhere
    printed = {e: export_doc(cli, e)["flags"] for e in PROGRAMS}
    for where, line in quoted:
        engine = engine_of(line)
        optional = flags_of(" ".join(re.findall(r"\[([^\]]*)\]", line)))  # `[--tp-size T]`: printed when tp > 1
        want = flags_of(printed[engine])
        have = flags_of(line.replace("[", " ").replace("]", " "))
        assert have <= want | optional, (where, line, sorted(have - want))  # no flag the export no longer prints
        tail = {"-ngl", "--n-cpu-moe", "-ot"} if engine == "llama.cpp" else set()  # the .txt's, said beside it
        assert want - have <= tail, (where, line, sorted(want - have))  # no flag it prints left unquoted


def test_the_readme_quotes_the_lines_its_own_example_prints(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    steps = [["balance", "deepseek-v2-lite", "--steps", "16", "-o", "v2l-hist.json"],
             ["plan", "v2l-hist.json", "--recipe", "deepseek-v2-lite", "--hot-gib", "8", "-o", "v2l-plan.json"]]
    for args in steps:  # as the README runs them
        assert cli(*args).code == 0
    readme = quoted_lines((ROOT / "README.md").read_text())
    for engine, out in (("ktransformers", "v2l-kt.pt"), ("llama.cpp", "v2l-llama.txt")):
        r = cli("export", "v2l-plan.json", "--to", engine, "-o", out)
        assert r.code == 0, r.err
        line = r.out.splitlines()[r.out.splitlines().index(f"start {engine} with:") + 1]
        assert line.replace(f"{tmp_path}/", "") in readme, line
    assert "-ngl 999 --n-cpu-moe 20" in (ROOT / "README.md").read_text()
    assert (tmp_path / "v2l-llama.txt").read_text().strip() == "-ngl 999 --n-cpu-moe 20"


@pytest.mark.parametrize("text, engine", [
    ("`llama-server -m M.gguf -ngl 9`", "llama.cpp"),
    ("`python -m sglang.launch_server --model-path M\n--kt-weight-path W`", "ktransformers"),
    ("`vllm serve M --x`", "vllm-ascend"),
])
def test_a_quoted_line_is_found_across_wrapped_lines(text, engine):
    (line,) = quoted_lines(text)
    assert engine_of(line) == engine
