"""The printed line starts the engine: its program, the model argument to fill in, absolute paths,
and only flags the engine declares."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.export.engines import ascend_eplb_command, sglang_server_flags
from tests.export.helpers import make_placement, make_plan, synthetic_hist
from tests.export.test_export_cli import refused

SGLANG = ["python", "-m", "sglang.launch_server"]
PROGRAMS = {"sglang": SGLANG, "ktransformers": SGLANG,
            "trtllm": ["trtllm-serve"], "vllm-ascend": ["vllm", "serve"], "llama.cpp": ["llama-server"]}
FILES = {"sglang": "s.json", "ktransformers": "kt.pt", "trtllm": "lb.yaml", "vllm-ascend": "m.json",
         "llama.cpp": "a.txt"}


@pytest.fixture
def made(tmp_path, monkeypatch):
    """A tiny plan and placement, and the test in their folder so that -o can be relative."""
    monkeypatch.chdir(tmp_path)
    hist = synthetic_hist(tmp_path / "h.json", "tiny")
    make_plan(tmp_path, hist, "tiny", "0.004")
    make_placement(tmp_path, hist, 4, 4)
    return tmp_path


def export_doc(cli, engine: str, *extra: str) -> dict:
    src = "plan.json" if engine in ("ktransformers", "llama.cpp") else "placement.json"
    r = cli("export", src, "--to", engine, "--recipe", "tiny", "-o", FILES[engine], *extra, "--json")
    assert r.code == 0, r.err
    return json.loads(r.out)


@pytest.mark.parametrize("engine", list(PROGRAMS))
def test_the_line_names_the_program_the_model_and_absolute_paths(cli, made, engine):
    doc = export_doc(cli, engine)
    flags = doc["flags"]
    assert flags[:len(PROGRAMS[engine])] == PROGRAMS[engine]
    assert doc["fill_in"] and all(name in flags for name in doc["fill_in"])
    absolute = str(made / FILES[engine])
    named = engine in ("sglang", "ktransformers", "vllm-ascend")  # llama.cpp's args are the file's own text
    assert doc["file"] == FILES[engine] and any(absolute in arg for arg in flags) == named
    assert FILES[engine] not in flags  # never the relative name: the line must work from any folder
    if engine == "llama.cpp":
        assert f"$(cat {absolute})" in doc["notes"][1]
    if engine == "trtllm":
        assert doc["snippet"] == f"moe_config:\n  load_balancer: {absolute}\n"
        assert str(made / "extra_llm_api_options.yaml") in flags


@pytest.mark.parametrize("engine", ["sglang", "ktransformers"])
def test_sglang_lines_use_only_flags_sglang_declares(cli, made, engine):
    flags = export_doc(cli, engine)["flags"]
    assert {f for f in flags if f.startswith("--")} <= sglang_server_flags()
    if engine == "sglang":  # SGLang refuses ep_size above tp_size
        assert flags[flags.index("--tp-size") + 1] == flags[flags.index("--ep-size") + 1] == "4"
    else:  # without --kt-weight-path SGLang-kt runs no expert on the CPU
        assert "--kt-weight-path" in flags and "--kt-cpuinfer" in flags


def test_vllm_ascend_starts_as_many_ranks_as_its_map_lists(cli, made):
    doc = export_doc(cli, "vllm-ascend")
    flags = doc["flags"]
    assert flags[flags.index("--tensor-parallel-size") + 1] == "4"
    assert "the map needs 4 expert-parallel ranks" in doc["notes"][0]
    guide = ascend_eplb_command()
    assert all(f in guide for f in flags if f.startswith("--"))


def test_the_trtllm_note_comes_before_its_snippet(cli, made):
    r = cli("export", "placement.json", "--to", "trtllm", "--recipe", "tiny", "-o", "lb.yaml")
    lines = r.out.splitlines()
    note = next(i for i, line in enumerate(lines) if "put the snippet below in" in line)
    assert note < lines.index("moe_config:") and lines[lines.index("moe_config:") - 1].startswith("note:")
    assert shlex.split(lines[1])[:1] == ["trtllm-serve"]


def test_online_above_the_layer_count_is_refused(cli, made):
    refused(cli, made, 2, "placement.json", "--to", "trtllm", "--recipe", "tiny", "--online", "5", "-o", "lb.yaml",
            says="--online 5: must be 0 (static) to 4, the placement's MoE layers")
    assert export_doc(cli, "trtllm", "--online", "4")["flags"][0] == "trtllm-serve"
