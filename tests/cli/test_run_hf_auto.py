"""A user's own checkpoint end to end at precision auto: `recipe --model`, `balance --model`
(histogram and each expert's measured error), `plan --precision auto --max-error`, then `run
--model`'s recipe with that plan. A checkpoint run replays no trace (it generates), so its hit
rate and cold bytes are checked against an independent count of the same generation's routing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")
torch = pytest.importorskip("torch")

from hotsplit_runtime.hf.capture import Generation  # noqa: E402
from hotsplit_runtime.hf.loader import load_model, load_tokenizer  # noqa: E402
from hotsplit_runtime.mixed_bank import MixedBank  # noqa: E402

from hotsplit_cli.config.recipe import load_recipe  # noqa: E402
from hotsplit_cli.hotset.planfile import load_plan  # noqa: E402
from tests.conftest import cpu_without_triton  # noqa: E402
from tests.fakes.hf import SENTENCES, build_checkpoint, reference_texts  # noqa: E402
from tests.runtime.test_hf_stored_precision import stored_reference  # noqa: E402

MAX_NEW = 4


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """(folder, recipe, plan, prompts): a checkpoint, its recipe, and an auto plan mixing fp8 and
    mxfp4 among both hot and cold experts, made by the CLI from its measured histogram."""
    from hotsplit_cli.cli import main

    root = tmp_path_factory.mktemp("auto_chain")
    ckpt = build_checkpoint(root / "ck", "qwen3_moe", moe_intermediate_size=32)
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": s}) + "\n" for s in SENTENCES[:4]))
    recipe, hist, plan = root / "r.yaml", root / "h.json", root / "plan.json"
    assert main(["recipe", "--model", str(ckpt), "--gpu-mem-gib", "1", "-o", str(recipe)]) == 0
    assert main(["balance", "--model", str(ckpt), "--prompts", str(prompts), "--max-new-tokens", "3",
                 "-o", str(hist)]) == 0
    assert main(["plan", str(hist), "--recipe", str(recipe), "--hot-gib", "0.00002", "--precision", "auto",
                 "--max-error", "0.1", "-o", str(plan)]) == 0
    doc = yaml.safe_load(recipe.read_text())
    doc["traffic"] = {"kind": "prompts", "path": str(prompts), "max_new_tokens": MAX_NEW, "batch": 1}
    doc["run"] = {"device": "cpu"}
    doc["hotsplit"] = {"dyn_steps": 10_000}  # the plan's hot set throughout: what the count below assumes
    recipe.write_text(yaml.safe_dump(doc))
    experts = json.loads(plan.read_text())["precision"]["experts"]
    assert all(experts[p]["hot"] and experts[p]["cold"] for p in ("fp8", "mxfp4"))
    return ckpt, recipe, plan, prompts


def _independent_count(ckpt, recipe, plan_path):
    """(hit rate, cold bytes per step, texts) of the same generation counted here: the plan's hot
    set fixed, each step's distinct cold experts at their plan's stored bytes."""
    r, plan = load_recipe(recipe), load_plan(plan_path)
    m = r.model
    P = plan.precision_LE(m.moe_layer_ids, m.num_experts)
    hot_LE = plan.hot_LE(m.moe_layer_ids, m.num_experts)
    table = json.loads(plan_path.read_text())["precision"]["expert_bytes"]
    sizes_LE = np.vectorize(table.get)(P.astype(str)).astype(np.int64)
    hm = load_model(ckpt, cpu_without_triton(), torch.float32, precision="auto", precision_LE=P)
    for bank, hot in zip(hm.banks, hot_LE, strict=True):
        bank.set_hot(hot)
    prompts = [json.loads(x)["prompt"] for x in r.traffic.path.read_text().splitlines()]
    gen = Generation(hm, load_tokenizer(ckpt), prompts, MAX_NEW, 1)
    hits = total = cold = steps = 0
    for forward in gen.forwards():
        counts_LE = forward()
        hits, total = hits + counts_LE[hot_LE].sum(), total + counts_LE.sum()
        cold, steps = cold + sizes_LE[(counts_LE > 0) & ~hot_LE].sum(), steps + 1
    return hits / total, cold / steps, gen.texts(), P


def test_balance_plan_auto_run_on_a_checkpoint(cli, chain, tmp_path):
    ckpt, recipe, plan, prompts = chain
    log = tmp_path / "run.jsonl"
    r = cli("run", recipe, "--precision", "auto", "--plan", plan, "--json", "--log-jsonl", log)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    s = doc["summary"]
    hit, cold, texts, P = _independent_count(ckpt, recipe, plan)
    assert s["swaps"] == 0 and s["hit_rate"] == pytest.approx(hit, rel=1e-12) and 0 < hit < 1
    assert s["cold_bytes_per_step"] == pytest.approx(cold, rel=1e-12) and cold > 0
    assert doc["texts"] == texts
    names, n = np.unique(P.astype(str), return_counts=True)
    assert doc["allocated"]["expert_format"] == "auto: " + ", ".join(f"{k} {p}" for p, k in zip(names, n, strict=True))
    m = load_recipe(recipe).model
    want = reference_texts(ckpt, [json.loads(x)["prompt"] for x in prompts.read_text().splitlines()], MAX_NEW,
                           weights=stored_reference(ckpt, tmp_path / "ref", P, m.moe_layer_ids))
    assert doc["texts"] == want  # transformers on each expert's read-back weights


def test_the_loaded_banks_hold_each_expert_at_its_plans_precision(chain):
    ckpt, recipe, plan_path, _ = chain
    m = load_recipe(recipe).model
    P = load_plan(plan_path).precision_LE(m.moe_layer_ids, m.num_experts)
    hm = load_model(ckpt, cpu_without_triton(), torch.float32, precision="auto", precision_LE=P)
    for bank, row in zip(hm.banks, P, strict=True):
        assert isinstance(bank, MixedBank)
        for ids, sub in zip(bank.ids, bank.subs, strict=True):
            assert set(row[ids]) == {sub.precision}


def _refused(cli, recipe, plan, log, *extra, code: int = 1) -> str:
    """The one-line refusal (exit 1: the plan does not fit; 2: a usage error), nothing written."""
    r = cli("run", recipe, "--precision", "auto", "--plan", plan, "--log-jsonl", log, *extra)
    assert r.code == code and r.out == "" and len(r.err.strip().splitlines()) == 1, r.err
    assert not log.exists()
    return r.err


def test_an_auto_plan_that_does_not_fit_the_checkpoint_is_refused_in_one_line_writing_nothing(cli, chain,
                                                                                                tmp_path):
    _, recipe, plan, _ = chain
    log = tmp_path / "run.jsonl"
    doc = json.loads(plan.read_text())
    by_layer = doc["precision"]["by_layer"]
    bad = tmp_path / "extra_layer.json"
    bad.write_text(json.dumps({**doc, "precision": {**doc["precision"], "by_layer": {**by_layer, "7": by_layer["1"]}}}))
    assert "`precision.by_layer` names layer 7, which recipe 'r' has no MoE layer at" in _refused(cli, recipe, bad,
                                                                                                  log)
    short = {**by_layer, "2": {p: [e for e in ids if e != 0] for p, ids in by_layer["2"].items()}}
    bad = tmp_path / "short.json"
    bad.write_text(json.dumps({**doc, "precision": {**doc["precision"], "by_layer": short}}))
    assert "`precision.by_layer[2]` leaves experts without a precision" in _refused(cli, recipe, bad, log)
    assert "cold_path cpu: the CPU cold path computes experts of one stored precision" in \
        _refused(cli, recipe, plan, log, "--cold-path", "cpu", code=2)
    beyond = {**by_layer, "1": {**by_layer["1"], "fp8": [*by_layer["1"]["fp8"], 8]}}
    bad = tmp_path / "beyond.json"
    bad.write_text(json.dumps({**doc, "precision": {**doc["precision"], "by_layer": beyond}}))
    assert "`precision.by_layer[1]` names an expert twice or beyond 7" in _refused(cli, recipe, bad, log)
    assert "prefetch lookahead: staging slots are sized for one stored precision" in \
        _refused(cli, recipe, plan, log, "--prefetch", "lookahead", code=2)
    r = cli("run", recipe, "--precision", "auto", "--log-jsonl", log)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and not log.exists()
    assert "run stores each expert at the precision an auto plan chose for it, and no --plan was given" in r.err


def test_gpt_oss_as_released_in_mxfp4_runs_an_auto_plan_and_refuses_fp8_in_one_line(cli, checkpoints, tmp_path):
    """Its native and mxfp4 experts both keep the release's bytes (the same text either way); an
    expert at fp8 would store the release in about twice the bytes: refused, nothing written."""
    from tests.fakes.hf import mxfp4_release

    ckpt = mxfp4_release(checkpoints["gpt_oss"], tmp_path / "gpt_oss")
    prompts, recipe, hist, plan = (tmp_path / n for n in ("p.jsonl", "r.yaml", "h.json", "plan.json"))
    prompts.write_text("".join(json.dumps({"prompt": s}) + "\n" for s in SENTENCES[:2]))
    assert cli("recipe", "--model", ckpt, "--gpu-mem-gib", "1", "-o", recipe).code == 0
    assert cli("balance", "--model", ckpt, "--prompts", prompts, "--max-new-tokens", "2", "-o", hist).code == 0
    r = cli("plan", hist, "--recipe", recipe, "--hot-gib", "0.00002", "--precision", "auto", "--max-error", "0.1",
            "-o", plan)
    assert r.code == 0, r.err
    doc = yaml.safe_load(recipe.read_text())
    doc["traffic"] = {"kind": "prompts", "path": str(prompts), "max_new_tokens": 3, "batch": 1}
    doc["run"] = {"device": "cpu"}
    recipe.write_text(yaml.safe_dump(doc))
    texts = []
    for i, layer in enumerate((None, {"native": [0, 1, 2, 3], "mxfp4": [4, 5, 6, 7]},
                               {"native": [0, 1, 2, 3, 4, 5, 6], "fp8": [7]})):
        d = json.loads(plan.read_text())
        if layer is not None:
            d["precision"]["by_layer"]["1"] = layer
        path, log = tmp_path / f"plan{i}.json", tmp_path / f"run{i}.jsonl"
        path.write_text(json.dumps(d))
        r = cli("run", recipe, "--precision", "auto", "--plan", path, "--json", "--log-jsonl", log)
        texts.append(json.loads(r.out)["texts"] if r.code == 0 else r)
    assert texts[0] == texts[1]
    refused = texts[2]
    errors = [x for x in refused.err.splitlines() if x.startswith("error:")]
    assert refused.code == 2 and refused.out == "" and len(errors) == 1 and not (tmp_path / "run2.jsonl").exists()
    assert "precision fp8: the checkpoint's experts are released in mxfp4, and fp8 would store them" in errors[0]
