"""One `hotsplit.run/1` shape for the four ways through a run: a synthetic model and a checkpoint,
on one rank and on two. Each `--json` is validated against the one schema below; a checkpoint's
texts are in the same place on 1 and 2 ranks, and the checkpoint header names what was loaded."""

from __future__ import annotations

import json
import sys

import orjson
import pytest
import yaml

pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")

from tests.cli.test_run_hf import _geometry  # noqa: E402
from tests.fakes.hf import SENTENCES, build_checkpoint  # noqa: E402
from tests.runtime.ep.harness import env_for_ranks, run_job, tiny_ep_recipe  # noqa: E402

NUMBER, NULL = (int, float), type(None)
# key: type(s), or a dict for a nested object; every key is required, no other key is allowed.
RANK_SUMMARY = {"steps": int, "tokens": int, "elapsed_s": NUMBER, "tokens_per_s": NUMBER, "hit_rate": NUMBER,
                "hit_rate_last_window": (*NUMBER, NULL), "expected_hit_rate": (*NUMBER, NULL), "swaps": int,
                "bytes_copied": int, "copy_ms": NUMBER, "cold_bytes_per_step": NUMBER, "layer_hit_rate": list,
                "interrupted": bool, "cold_paths": (dict, NULL), "expected_gap": (*NUMBER, NULL)}
JOB_FIGURES = {"ranks": list, "balancedness": NUMBER, "predicted_balancedness": (*NUMBER, NULL), "bottleneck": dict,
               "exchange": dict, "placement": dict, "rebalances": list, "window_balancedness": (dict, NULL),
               "rebalance_error": (dict, NULL)}
RUN_SCHEMA = {
    "schema": str, "recipe": str, "knobs": dict, "device": dict, "kernel": str, "cuda_graph": bool,
    "cold_path": {"mode": str, "rates": (str, NULL)}, "traffic": str, "trace_steps": (int, NULL), "scale": NUMBER,
    "allocated": {"hidden": int, "inter": int, "experts": int, "top_k": int, "dtype": str, "expert_format": str,
                  "cold_bank_bytes": int, "cold_bank_reserved_bytes": int, "cold_bank_method": str,
                  "cold_bank_fallback": (str, NULL)},
    "numa": dict,
    "plan": {"source": str, "made_from": str, "expected_hit_rate": (*NUMBER, NULL), "budget_bytes": (int, NULL),
             "hot_bytes": int, "hot_experts": int, "expert_bytes": int},
    "parallel": {"ep": int, "backend": (str, NULL), "nodes": int},
    "summary": RANK_SUMMARY,  # and, on N ranks, JOB_FIGURES
    "texts": (list, NULL), "verdicts": list,
    "precision": {"stored": str, "expected_error": (*NUMBER, NULL), "agreement": (*NUMBER, NULL), "tokens": int,
                  "note": (str, NULL)},
}
RANK_ROW = {"rank", "assignments", "hit_rate", "expected_hit_rate", "cold_reads", "swaps", "cold_paths"}


def problems(doc, schema: dict, where: str = "") -> list[str]:
    """What in `doc` breaks `schema` (missing, unexpected or mistyped keys), each with its path."""
    if not isinstance(doc, dict):
        return [f"{where or '.'}: not an object"]
    found = [f"{where}{k}: missing" for k in schema if k not in doc]
    found += [f"{where}{k}: not in the schema" for k in doc if k not in schema]
    for k, want in schema.items():
        if k not in doc:
            continue
        if isinstance(want, dict):
            found += problems(doc[k], want, f"{where}{k}.")
        elif isinstance(doc[k], bool) and want is not bool and bool not in (want if isinstance(want, tuple) else ()):
            found.append(f"{where}{k}: a bool")
        elif not isinstance(doc[k], want):
            found.append(f"{where}{k}: {type(doc[k]).__name__}")
    return found


def check_run_document(doc: dict) -> None:
    ranks = doc.get("parallel", {}).get("ep", 1)
    schema = {**RUN_SCHEMA, "summary": {**RANK_SUMMARY, **(JOB_FIGURES if ranks > 1 else {})}}
    assert problems(doc, schema) == [] and doc["schema"] == "hotsplit.run/1"
    for row in doc["summary"].get("ranks", []):  # routed assignments, not tokens
        assert set(row) >= RANK_ROW and "tokens" not in row, row


def test_the_checker_names_what_breaks_the_schema():
    assert problems({"a": 1, "b": "x"}, {"a": int, "c": str}) == ["c: missing", "b: not in the schema"]
    assert problems({"a": {"b": True}}, {"a": {"b": int}}) == ["a.b: a bool"]
    assert problems({"a": None}, {"a": (int, NULL)}) == []


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("doc") / "olmoe", "olmoe")


def _checkpoint_recipe(tmp_path, ckpt, ep: int):
    """No `model.family`: the header names the checkpoint's model type as loaded."""
    g = _geometry(ckpt)
    one = 3 * g["hidden_size"] * g["moe_intermediate_size"] * 2
    prompts = tmp_path / f"p{ep}.jsonl"
    prompts.write_text("".join(orjson.dumps({"prompt": p}).decode() + "\n" for p in (SENTENCES[0], "Hi")))
    recipe = tmp_path / f"r{ep}.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": f"ckpt-ep{ep}", "model": {"kind": "hf", "path": str(ckpt), "expert_dtype": "fp16",
                                          "total_params": 1.0e6, **g},
        "parallel": {"tp": 1, "ep": ep},
        "traffic": {"kind": "prompts", "path": str(prompts), "max_new_tokens": 4, "batch": 1},
        "run": {"device": "cpu"}, "hotsplit": {"hot_gib": 2 * one / 2**30, "dyn_steps": 3}}))
    return recipe, prompts


def _run(args: list) -> tuple[dict, str]:
    done = run_job([sys.executable, "-m", "hotsplit_cli", "run", *map(str, args), "--json"], env=env_for_ranks())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


@pytest.mark.slow
def test_the_four_ways_through_a_run_give_one_document(tmp_path, ckpt):
    texts = {}
    for ep in (1, 2):
        doc, _ = _run([tiny_ep_recipe(tmp_path / f"s{ep}.yaml", ep), "--steps", "4"])
        check_run_document(doc)
        assert doc["parallel"]["ep"] == ep and doc["texts"] is None and doc["summary"]["steps"] == 4
        recipe, prompts = _checkpoint_recipe(tmp_path, ckpt, ep)
        doc, err = _run([recipe])
        check_run_document(doc)
        assert doc["parallel"]["ep"] == ep and doc["traffic"] == f"prompts {prompts}"
        texts[ep] = doc["texts"]
        header = next(line for line in err.splitlines() if line.startswith(f"ckpt-ep{ep}: "))
        assert header.startswith(f"ckpt-ep{ep}: olmoe checkpoint {ckpt}, prompts {prompts}"), header
        assert "synthetic" not in header and "None" not in header, header
    assert len(texts[1]) == 2 and texts[1] == texts[2]  # the same greedy texts, in the same place
