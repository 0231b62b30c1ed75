"""Shipped recipes: they load, their byte counts match hand computations, bad recipes are refused."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import pytest
import yaml

from hotsplit_cli.cli import main
from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import GIB, RECIPES_DIR, load_recipe, parse_recipe
from hotsplit_cli.core.errors import RecipeError, UsageError
from hotsplit_cli.hotset.sizes import (
    bank_bytes_per_rank,
    dense_bytes_per_rank,
    derive_hot_budget,
    expert_bytes_per_rank,
)

SHIPPED = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
REAL = [name for name in SHIPPED if name not in ("tiny", "tiny-ep4")]  # made-up CPU demos
MIB = 1 << 20


def test_every_expected_recipe_is_shipped():
    expected = {
        "tiny",
        "tiny-ep4",
        "deepseek-v3",
        "deepseek-v2-lite",
        "glm-4.5",
        "glm-4.5-air",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "mixtral-8x7b",
        "gpt-oss-120b",
        "mimo-v2-flash",
    }
    assert expected <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipe_loads_and_its_knobs_resolve(name):
    rec = load_recipe(name)
    assert rec.name == name
    knobs = resolve_knobs(rec.knobs, env={})
    assert knobs.dyn_steps >= 1
    assert expert_bytes_per_rank(rec) > 0


@pytest.mark.parametrize("name", REAL)
def test_real_recipe_cites_its_source_config(name):
    text = (RECIPES_DIR / f"{name}.yaml").read_text()
    assert re.search(r"^# Source config: https://huggingface\.co/\S+/config\.json", text, re.M), name
    rec = load_recipe(name)
    assert rec.model.active_params is not None and 0 < rec.model.active_params < rec.model.total_params


@pytest.mark.parametrize("name", REAL)
def test_real_deployment_does_not_fit_every_expert(name):
    # The product's point: the auto hot budget holds only part of the rank's expert bank.
    rec = load_recipe(name)
    knobs = resolve_knobs(rec.knobs, env={})
    budget = derive_hot_budget(rec, knobs.vram_reserve_gib)
    assert 0 < budget.hot_gib < budget.bank_gib


@pytest.mark.parametrize("name", SHIPPED)
def test_scaled_cpu_run_allocates_well_under_one_gib(name):
    # Upper bound of what `hotsplit run` allocates for experts: the scaled bank in fp32 twice
    # (every expert in the cold bank plus at most as many hot slots).
    rec = load_recipe(name)
    m, s = rec.model, rec.run.scale
    hidden, inter = max(1, round(m.hidden_size * s)), max(1, round(m.moe_intermediate_size * s))
    bank_bytes = m.num_experts * m.num_moe_layers * 3 * hidden * inter * 4
    assert 2 * bank_bytes < 512 * MIB, f"{name}: {2 * bank_bytes / MIB:.0f} MiB"


# Routed parameters written out: 3 (gate, up, down) x hidden x moe_intermediate x experts x MoE layers.
ROUTED = {
    "deepseek-v3": (3 * 7168 * 2048 * 256 * 58, 653_908_770_816),
    "deepseek-v3-ep8": (3 * 7168 * 2048 * 256 * 58, 653_908_770_816),
    "deepseek-v2-lite": (3 * 2048 * 1408 * 64 * 26, 14_394_851_328),
    "glm-4.5": (3 * 5120 * 1536 * 160 * 89, 335_963_750_400),
    "glm-4.5-air": (3 * 4096 * 1408 * 128 * 45, 99_656_663_040),
    "qwen3-30b-a3b": (3 * 2048 * 768 * 128 * 48, 28_991_029_248),
    "qwen3-235b-a22b": (3 * 4096 * 1536 * 128 * 94, 227_096_395_776),
    "mixtral-8x7b": (3 * 4096 * 14336 * 8 * 32, 45_097_156_608),
    "gpt-oss-120b": (3 * 2880 * 2880 * 128 * 36, 114_661_785_600),
    "mimo-v2-flash": (3 * 4096 * 2048 * 256 * 47, 302_795_194_368),
}


def _billions(pattern: str, text: str) -> tuple[float, float]:
    """The number (in parameters) that `pattern`'s group 1 quotes in billions, and one unit of its
    last quoted digit (the rounding the comment allows)."""
    match = re.search(pattern, text)
    assert match, pattern
    decimals = len(match.group(1).partition(".")[2])
    return float(match.group(1)) * 1e9, 10.0 ** -decimals * 1e9


@pytest.mark.parametrize("name", REAL)
def test_parameter_counts_are_the_published_ones(name):
    # Each real recipe's comment quotes the model card: "<N>B total", "<M>B active(ated)", the
    # routed experts worked out ("... x 58 = 653.9B") and the rest ("~17.1B").
    comment = " ".join(line.lstrip("# ") for line in (RECIPES_DIR / f"{name}.yaml").read_text().splitlines()
                       if line.startswith("#"))
    number = r"(\d+(?:\.\d+)?)B"
    total, _ = _billions(number + " total", comment)
    active, _ = _billions(number + " (?:activated|active|used per token)", comment)
    routed_quoted, routed_unit = _billions(r"x \d+ = " + number, comment)
    rest, rest_unit = _billions("~" + number, comment)
    m = load_recipe(name).model
    formula, literal = ROUTED[name]
    assert m.routed_expert_params == formula == literal
    assert abs(literal - routed_quoted) <= routed_unit / 2
    assert (m.total_params, m.active_params) == (total, active)
    # The rest (attention, embeddings, dense and shared MLPs): the model card's total less the
    # routed experts, as the comment quotes it, and a few percent of an MoE model.
    assert abs(m.dense_params - rest) <= rest_unit
    assert 0 < m.dense_params < 0.1 * m.total_params


def test_layer_ids_follow_the_configs():
    assert load_recipe("deepseek-v3").model.moe_layer_ids == tuple(range(3, 61))
    assert load_recipe("glm-4.5").model.moe_layer_ids == tuple(range(3, 92))
    assert load_recipe("glm-4.5-air").model.moe_layer_ids == tuple(range(1, 46))
    assert load_recipe("deepseek-v2-lite").model.moe_layer_ids == tuple(range(1, 27))
    assert load_recipe("mimo-v2-flash").model.moe_layer_ids == tuple(
        range(1, 48)
    )  # moe_layer_freq [0, 1 x 47]
    assert load_recipe("qwen3-235b-a22b").model.num_moe_layers == 94
    ds = load_recipe("deepseek-v3").model
    assert (ds.router, ds.n_group, ds.topk_group, ds.routed_scaling_factor) == ("sigmoid", 8, 4, 2.5)


def test_deepseek_v3_fp8_expert_bytes_by_hand():
    rec = load_recipe("deepseek-v3")
    assert (rec.parallel.tp, rec.model.expert_dtype) == (8, "fp8")
    inter = 2048 // 8  # 256 rows of gate/up per rank
    weights = 3 * 7168 * inter  # 1 byte per fp8 value
    # one fp32 scale per 128x128 block: gate and up are [256, 7168] -> 2 x 56 blocks each,
    # down is [7168, 256] -> 56 x 2 blocks
    scales = (2 * 56 + 2 * 56 + 56 * 2) * 4
    assert weights == 5_505_024 and scales == 1_344
    assert expert_bytes_per_rank(rec) == 5_506_368
    # tp = 1: the whole expert, 3 x 16 x 56 blocks of scales
    whole = parse_recipe({**_raw("deepseek-v3"), "parallel": {"tp": 1, "ep": 1}})
    assert expert_bytes_per_rank(whole) == 3 * 7168 * 2048 + 3 * 16 * 56 * 4 == 44_050_944
    # bank per rank: every expert of the 58 MoE layers, sliced 1/8
    assert bank_bytes_per_rank(rec) == 5_506_368 * 256 * 58


def test_deepseek_v3_ep8_is_the_same_model_served_expert_parallel():
    ep8, tp8 = _raw("deepseek-v3-ep8"), _raw("deepseek-v3")
    assert ep8["model"] == tp8["model"] and ep8["parallel"] == {"tp": 1, "ep": 8}
    rec = load_recipe("deepseek-v3-ep8")
    # Whole experts (tp 1) with 3 x 16 x 56 block scales; 256 / 8 = 32 of them per layer and rank.
    assert expert_bytes_per_rank(rec) == 44_050_944
    assert bank_bytes_per_rank(rec) == 44_050_944 * 32 * 58
    assert dense_bytes_per_rank(rec) == 19.08e9  # attention and dense weights on every rank
    budget = derive_hot_budget(rec, 2.0)  # 79.6 - 17.77 - 8 - 2 GiB
    assert budget.hot_gib == pytest.approx(79.6 - 19.08e9 / GIB - 8 - 2)
    assert int(budget.hot_gib * GIB) // expert_bytes_per_rank(rec) == 1263  # of 1856 per rank


def test_deepseek_v3_dense_bytes_are_the_mixed_fp8_bf16_total():
    rec = load_recipe("deepseek-v3")
    # 17.1B parameters: 2 bytes each would be 34 GB; the fp8 checkpoint holds 19.08 GB of them.
    assert rec.model.dense_params == pytest.approx(17.1e9, rel=0.01)
    assert rec.model.dense_weight_bytes == 19.08e9
    assert dense_bytes_per_rank(rec) == 19.08e9 / 8
    as_bf16 = parse_recipe(_set(_drop(_raw("deepseek-v3"), "model.dense_bytes"), "model.dense_dtype_bytes", 2))
    assert dense_bytes_per_rank(as_bf16) == pytest.approx(2 * rec.model.dense_params / 8)


def test_gpt_oss_120b_mxfp4_expert_bytes_by_hand():
    rec = load_recipe("gpt-oss-120b")
    assert (rec.model.expert_dtype, rec.model.expert_bias, rec.parallel.tp) == ("mxfp4", True, 1)
    hidden = inter = 2880
    gate_up = 2 * inter * hidden // 2 + 2 * inter * (hidden // 32)  # [5760, 2880]: 4-bit values + e8m0 per 32
    down = hidden * inter // 2 + hidden * (inter // 32)  # [2880, 2880]
    bias = (2 * inter + hidden) * 2  # bf16 gate_up_proj_bias and down_proj_bias
    assert (gate_up, down, bias) == (8_812_800, 4_406_400, 17_280)
    assert expert_bytes_per_rank(rec) == 13_236_480
    # 128 x 36 experts = 56.8 GiB: with ~3.9 GiB of bf16 rest this is the ~60.8 GiB checkpoint
    assert bank_bytes_per_rank(rec) / GIB == pytest.approx(56.81, abs=0.01)


def test_mixtral_bf16_expert_bytes_with_tp_by_hand():
    rec = load_recipe("mixtral-8x7b")
    assert (rec.model.expert_dtype, rec.parallel.tp) == ("bf16", 2)
    per_rank = 3 * 4096 * (14336 // 2) * 2  # gate, up [7168, 4096] and down [4096, 7168], 2 bytes each
    assert per_rank == 176_160_768 == 168 * MIB
    assert expert_bytes_per_rank(rec) == per_rank
    assert bank_bytes_per_rank(rec) == per_rank * 8 * 32  # EP 1: every expert, half of each


# --- bad recipes -------------------------------------------------------------------------------


def _raw(name: str = "tiny") -> dict:
    return yaml.safe_load((RECIPES_DIR / f"{name}.yaml").read_text())


def _set(doc: dict, dotted: str, value) -> dict:
    doc = copy.deepcopy(doc)
    *parents, leaf = dotted.split(".")
    node = doc
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return doc


def _drop(doc: dict, dotted: str) -> dict:
    doc = copy.deepcopy(doc)
    *parents, leaf = dotted.split(".")
    node = doc
    for p in parents:
        node = node[p]
    del node[leaf]
    return doc


BAD = [
    # unknown key at each level
    (lambda d: _set(d, "colour", "blue"), "colour: unknown key"),
    (lambda d: _set(d, "model.hiden_size", 8), "model.hiden_size: unknown key"),
    (lambda d: _set(d, "parallel.pp", 2), "parallel.pp: unknown key"),
    (lambda d: _set(d, "hardware.hbm_gib", 80), "hardware.hbm_gib: unknown key"),
    (lambda d: _set(d, "traffic.zipf", 1.0), "traffic.zipf: unknown key"),
    (lambda d: _set(d, "run.threads", 4), "run.threads: unknown key"),
    (lambda d: _set(d, "hotsplit.dyn_step", 5), "hotsplit.dyn_step: unknown key"),
    # missing keys
    (lambda d: _drop(d, "model.hidden_size"), "model.hidden_size: missing"),
    (lambda d: _drop(d, "model.total_params"), "model.total_params: missing"),
    # out of range
    (lambda d: _set(d, "model.top_k", 0), "model.top_k: must be >= 1, got 0"),
    (lambda d: _set(d, "model.top_k", 33), "model.top_k: must be <= 32, got 33"),
    (lambda d: _set(d, "run.scale", 2.0), "run.scale: must be <= 1.0, got 2.0"),
    (lambda d: _set(d, "hardware.kv_cache_gib", -1), "hardware.kv_cache_gib: must be >= 0.0, got -1.0"),
    (lambda d: _set(d, "model.expert_dtype", "int3"), "model.expert_dtype: must be one of"),
    # wrong type
    (lambda d: _set(d, "model.num_experts", "many"), "model.num_experts: must be an int, got 'many'"),
    (lambda d: _set(d, "parallel.tp", 1.5), "parallel.tp: must be an int, got 1.5"),
    (lambda d: _set(d, "model.norm_topk_prob", "yes"), "model.norm_topk_prob: must be true/false"),
    (lambda d: _set(d, "model", [1, 2]), "model: must be a mapping"),
    # parallelism that does not divide the model
    (lambda d: _set(d, "parallel.ep", 3), "parallel.ep: 3 does not divide model.num_experts (32)"),
    (lambda d: _set(d, "parallel.tp", 3), "parallel.tp: 3 does not divide model.moe_intermediate_size (128)"),
    (lambda d: _set(d, "model.total_params", 1.0e6), "model.total_params: 1e+06 is below the routed experts"),
    # dense weights given twice, two ways
    (lambda d: _set(_set(d, "model.dense_bytes", 1e9), "model.dense_dtype_bytes", 2),
     "model.dense_bytes: give it or model.dense_dtype_bytes, not both"),
    (lambda d: _set(d, "model.dense_bytes", -1), "model.dense_bytes: must be >= 0.0"),
]


@pytest.mark.parametrize("mutate, message", BAD, ids=[m for _, m in BAD])
def test_bad_recipe_raises_recipe_error_naming_the_key(mutate, message):
    with pytest.raises(RecipeError) as err:
        parse_recipe(mutate(_raw()))
    assert message in err.value.message
    assert err.value.exit_code == 2


BAD_KNOBS = [
    ("hotsplit.dyn_steps", 0, "hotsplit.dyn_steps: must be >= 1, got 0"),
    ("hotsplit.dyn_margin", 0.5, "hotsplit.dyn_margin: must be >= 1, got 0.5"),
    ("hotsplit.numa_policy", "everywhere", "hotsplit.numa_policy: must be one of preferred, bind, off"),
    ("hotsplit.dynamic", "maybe", "hotsplit.dynamic: must be 0 or 1, got 'maybe'"),
]


@pytest.mark.parametrize("key, value, message", BAD_KNOBS, ids=[k for k, _, _ in BAD_KNOBS])
def test_bad_knob_value_in_recipe_is_refused_naming_the_key(key, value, message):
    with pytest.raises(UsageError) as err:  # refused when the recipe is loaded
        parse_recipe(_set(_raw(), key, value))
    assert message in err.value.message
    assert err.value.exit_code == 2


CLI_BAD = [BAD[1], BAD[6], BAD[7], BAD[9], BAD[14], BAD[18]]


@pytest.mark.parametrize("mutate, message", CLI_BAD, ids=[m for _, m in CLI_BAD])
@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["human", "json"])
def test_bad_recipe_through_the_cli_exits_2(tmp_path, capsys, mutate, message, json_flag):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(mutate(_raw())))
    before = sorted(tmp_path.iterdir())
    rc = main(["ledger", str(path), *json_flag])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == before  # nothing written


def test_bad_knob_value_through_the_cli_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_set(_raw(), "hotsplit.dyn_steps", 0)))
    rc = main(["ledger", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.startswith("error: hotsplit.dyn_steps: must be >= 1, got 0")


def test_unknown_recipe_name_lists_the_shipped_ones(capsys):
    rc = main(["ledger", "deepseek-v9"])
    _, err = capsys.readouterr()
    assert rc == 2
    assert "recipe 'deepseek-v9': no such file" in err and "deepseek-v3" in err


def test_full_size_geometry_is_what_the_planner_sees_whatever_the_scale():
    raw = _raw("deepseek-v3")
    small = parse_recipe(_set(raw, "run.scale", 0.001))
    full = parse_recipe(_set(raw, "run.scale", 1.0))
    assert expert_bytes_per_rank(small) == expert_bytes_per_rank(full)
    assert math.isclose(bank_bytes_per_rank(small), bank_bytes_per_rank(full))


def test_every_recipe_key_the_parser_takes_is_documented():
    """docs/recipes.md is the reference an error hint points to: it must name every key."""
    source = (Path(__file__).resolve().parents[2] / "hotsplit_cli" / "config" / "recipe.py").read_text()
    keys = set(re.findall(r'\.take\("(\w+)"', source))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "recipes.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", doc, flags=re.M))
    assert len(keys) > 30
    assert keys <= documented, sorted(keys - documented)
