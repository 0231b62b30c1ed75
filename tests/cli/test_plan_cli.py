import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hotsplit_cli.traffic.hist import save_hist
from tests.conftest import make_hist

ROOT = Path(__file__).resolve().parents[2]


def test_plan_writes_a_deterministic_plan(cli, tiny_hist, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.005", "-o", a)
    assert r.code == 0, r.err
    assert "hit rate" in r.out and "LP bound" in r.out
    assert cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.005", "-o", b).code == 0
    assert a.read_bytes() == b.read_bytes()
    doc = json.loads(a.read_text())
    assert doc["schema"] == "hotsplit.plan/1"
    assert doc["histogram"]["path"] == str(tiny_hist) and len(doc["histogram"]["sha256"]) == 64
    assert doc["expert_bytes"] == 3 * 256 * 128 * 2
    hot = doc["ranks"][0]["hot"]
    assert set(hot) == {"1", "2", "3", "4"} and all(v == sorted(v) for v in hot.values())
    n_hot = sum(len(v) for v in hot.values())
    assert n_hot == int(0.005 * 2**30) // doc["expert_bytes"]
    assert doc["ranks"][0]["hot_bytes"] == n_hot * doc["expert_bytes"] <= doc["budget_bytes"]
    assert doc["bound"]["hit_rate"] >= doc["hit_rate"]
    assert set(doc["layer_hit_rate"]) == {"1", "2", "3", "4"}


def test_plan_hit_rate_is_exact(cli, tmp_path):
    counts = np.zeros((4, 32))
    counts[:, 0] = 30
    counts[:, 1] = 10
    counts[0, 2] = 60
    hist = tmp_path / "h.json"
    save_hist(hist, make_hist(counts, layers=(1, 2, 3, 4), top_k=4))
    one = 3 * 256 * 128 * 2
    r = cli("plan", hist, "--recipe", "tiny", "--hot-gib", str(5 * one / 2**30), "--json")
    doc = json.loads(r.out)
    # Best 5 experts: 60, 30 x4 -> 180 of 220.
    assert doc["hit_rate"] == pytest.approx(180 / 220)
    assert doc["ranks"][0]["hot"]["1"] == [0, 2]


def test_json_mode_prints_only_json_with_the_plans_values(cli, tiny_hist):
    """stdout is one JSON document and stderr is empty; its values are those worked out here
    from the histogram alone (equal expert sizes: the hot set is the top counts, ties by layer
    then expert; the LP bound adds the fraction of the next count that the budget leaves room for)."""
    from hotsplit_cli.traffic.hist import load_hist

    r = cli("plan", tiny_hist, "--recipe", "tiny", "--json")
    assert r.code == 0 and r.err == ""
    doc = json.loads(r.out)
    counts = load_hist(tiny_hist).counts_LE
    one = 3 * 256 * 128 * 2  # recipes/tiny.yaml: hidden 256, moe_intermediate 128, bf16 gate/up/down
    budget = int(0.01 * 2**30)  # its hot_gib
    n = budget // one
    order = np.argsort(-counts.ravel(), kind="stable")
    hot = np.zeros(counts.size, dtype=bool)
    hot[order[:n]] = True
    hot = hot.reshape(counts.shape)
    total = counts.sum()
    assert (doc["hot_gib"], doc["budget_bytes"], doc["expert_bytes"]) == (0.01, budget, one)
    assert doc["ranks"][0]["hot"] == {str(layer): np.flatnonzero(hot[i]).tolist()
                                      for i, layer in enumerate((1, 2, 3, 4))}
    assert doc["ranks"][0]["hot_experts"] == n and doc["ranks"][0]["hot_bytes"] == n * one
    assert doc["hit_rate"] == pytest.approx(counts[hot].sum() / total, rel=1e-12)
    assert doc["greedy_hit_rate"] == doc["hit_rate"] and doc["certified_optimal"] is True
    assert doc["layer_hit_rate"] == pytest.approx(
        {str(layer): counts[i][hot[i]].sum() / counts[i].sum() for i, layer in enumerate((1, 2, 3, 4))}, rel=1e-12)
    fraction = budget / one - n
    bound = (counts[hot].sum() + fraction * counts.ravel()[order[n]]) / total
    assert doc["bound"]["hit_rate"] == pytest.approx(bound, rel=1e-12)
    assert doc["bound"]["gap"] == pytest.approx(bound - doc["hit_rate"], rel=1e-9)


def test_auto_budget_says_how_it_was_derived(cli, tiny_hist, tmp_path, monkeypatch):
    recipe = tmp_path / "r.yaml"
    text = (ROOT / "recipes" / "tiny.yaml").read_text().replace("hot_gib: 0.01 ", "hot_gib: null ")
    recipe.write_text(text.replace("vram_reserve_gib: 0.0", "vram_reserve_gib: 0.45"))
    monkeypatch.delenv("HOTSPLIT_HOT_GIB", raising=False)
    r = cli("plan", tiny_hist, "--recipe", recipe)
    assert r.code == 0, r.err
    assert "GPU 0.50 (recipe hardware.gpu_mem_gib) - dense weights" in r.out and "reserve 0.45" in r.out


def test_env_budget_is_used_and_flag_wins(cli, tiny_hist, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_HOT_GIB", "0.002")
    doc = json.loads(cli("plan", tiny_hist, "--recipe", "tiny", "--json").out)
    assert doc["hot_gib"] == 0.002 and doc["budget_source"] == "HOTSPLIT_HOT_GIB"
    doc = json.loads(cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.003", "--json").out)
    assert doc["hot_gib"] == 0.003 and doc["budget_source"] == "--hot-gib"


def _bad_hist(tmp_path, text):
    p = tmp_path / "bad.json"
    p.write_text(text)
    return p


BAD_HISTS = [
    ('{"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 4, "tokens": 1, "layers": [1], '
     '"num_experts": 2, "counts": [[1, NaN]]}', "counts[0][1]` is nan"),
    ('{"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 4, "tokens": 1, "layers": [1], '
     '"num_experts": 2, "counts": [[1, -1]]}', "counts must be >= 0"),
    ('{"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 4, "tokens": 1, "layers": [1, 2], '
     '"num_experts": 2, "counts": [[1, 1], [1]]}', "ragged"),
    ('{"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 4, "tokens": 1, "layers": [1], '
     '"num_experts": 2, "counts": [[0, 0]]}', "all zero"),
    ('{"schema": "other/1"}', "schema 'other/1'"),
    ('{"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 4, "tokens": 1, "layers": [1], '
     '"num_experts": 2, "counts": [[1, 2]]}', "2 experts per layer but recipe 'tiny' has 32"),
    ('{"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 4, "tokens": 1, "layers": [0], '
     '"num_experts": 32, "counts": [' + ",".join(["[" + ",".join(["1"] * 32) + "]"]) + "]}",
     "layer 0 is not a MoE layer"),
]


@pytest.mark.parametrize("text, message", BAD_HISTS)
def test_bad_histograms_fail_cleanly_and_write_nothing(cli, tmp_path, text, message):
    hist = _bad_hist(tmp_path, text)
    out = tmp_path / "plan.json"
    r = cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.01", "-o", out)
    assert r.code == 1
    assert r.err.startswith("error: ") and message in r.err and r.err.count("\n") == 1
    assert "Traceback" not in r.err and r.out == ""
    assert not out.exists()


def test_failure_never_clobbers_an_existing_plan(cli, tiny_hist, tmp_path):
    out = tmp_path / "plan.json"
    assert cli("plan", tiny_hist, "--recipe", "tiny", "-o", out).code == 0
    before = out.read_bytes()
    bad = _bad_hist(tmp_path, '{"schema": "hotsplit.hist/1"}')
    assert cli("plan", bad, "--recipe", "tiny", "-o", out).code == 1
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["bad.json", "plan.json", "hist.json"])


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--hot-gib", "-3"], {}, "--hot-gib: must be >= 0"),
        (["--hot-gib", "abc"], {}, "--hot-gib: must be a finite number"),
        ([], {"HOTSPLIT_HOT_GIB": "x"}, "HOTSPLIT_HOT_GIB: must be a finite number"),
        ([], {"HOTSPLIT_DYN_STEPS": "0"}, "HOTSPLIT_DYN_STEPS: must be >= 1"),
        (["--no-such-flag"], {}, "No such option"),
    ],
)
def test_usage_errors_exit_2_and_write_nothing(cli, tiny_hist, tmp_path, monkeypatch, args, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "plan.json"
    r = cli("plan", tiny_hist, "--recipe", "tiny", "-o", out, *args)
    assert r.code == 2, r.err
    assert r.err.startswith("error: ") and message in r.err
    assert not out.exists()


def test_missing_histogram_and_recipe(cli, tmp_path):
    r = cli("plan", tmp_path / "nope.json", "--recipe", "tiny")
    assert r.code == 1 and "no such file" in r.err
    r = cli("plan", tmp_path / "nope.json")  # without --recipe the histogram names its recipe: read first
    assert r.code == 1 and "no such file" in r.err
    r = cli("plan", tmp_path / "nope.json", "--recipe", "no-such-recipe")
    assert r.code == 2 and "shipped recipes:" in r.err


def test_budget_below_one_expert_plans_nothing(cli, tiny_hist):
    doc = json.loads(cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0", "--json").out)
    assert doc["hit_rate"] == 0 and doc["ranks"][0]["hot_experts"] == 0


def test_debug_shows_traceback(cli, tmp_path):
    with pytest.raises(Exception, match="no such file"):
        cli("--debug", "plan", tmp_path / "nope.json", "--recipe", "tiny")


def test_plan_runs_with_torch_blocked(tiny_hist, tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from hotsplit_cli.cli import main\n"
        f"rc = main(['plan', {str(tiny_hist)!r}, '--recipe', 'tiny', '-o', {str(tmp_path / 'p.json')!r}])\n"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
        "sys.exit(rc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p.json").exists()


def test_help_does_not_import_torch():
    code = "import sys\nfrom hotsplit_cli.cli import main\nmain(['--help'])\nprint('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip().endswith("False"), r.stdout + r.stderr


def test_plan_with_placement_plans_each_rank_among_its_replicas(cli, tmp_path):
    import yaml

    rec = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    rec["parallel"] = {"tp": 1, "ep": 2}
    recipe = tmp_path / "ep.yaml"
    recipe.write_text(yaml.safe_dump(rec))
    counts = np.ones((4, 32))
    counts[:, 5] = 1000  # one very hot expert per layer: it gets a replica on both ranks
    hist = tmp_path / "h.json"
    save_hist(hist, make_hist(counts, layers=(1, 2, 3, 4), top_k=4))
    placement = tmp_path / "placement.json"
    r = cli("place", hist, "--ranks", "2", "--redundant", "2", "-o", placement, "--recipe", recipe)
    assert r.code == 0, r.err
    one = 3 * 256 * 128 * 2
    r = cli("plan", hist, "--recipe", recipe, "--placement", placement, "--hot-gib", str(4 * one / 2**30), "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["parallel"]["ep"] == 2 and len(doc["ranks"]) == 2
    for rank in doc["ranks"]:
        assert rank["hot_bytes"] <= doc["budget_bytes"]
        assert all(v == [5] for v in rank["hot"].values())  # each rank serves its replica of expert 5
    assert doc["hit_rate"] == pytest.approx(4000 / counts.sum())
    assert doc["placement"]["physical_experts"] == 34


@pytest.fixture
def ds3_hist(tmp_path):
    """A DeepSeek-V3 histogram (MoE layers 3..60, 256 experts, top-8) with 4 windows."""
    rng = np.random.default_rng(3)
    windows = rng.zipf(1.5, size=(4, 58, 256)).clip(max=1000).astype(np.float64)
    hist = make_hist(windows.sum(0), layers=range(3, 61), top_k=8, model="deepseek-ai/DeepSeek-V3")
    path = tmp_path / "ds3-hist.json"
    save_hist(path, replace(hist, windows_WLE=windows, steps_per_window=8))
    return path


def test_plan_placement_with_the_shipped_expert_parallel_deepseek_v3(cli, ds3_hist, tmp_path):
    placement, plan = tmp_path / "placement.json", tmp_path / "plan.json"
    r = cli("place", ds3_hist, "--recipe", "deepseek-v3-ep8", "--ranks", "8", "--redundant", "32", "-o", placement)
    assert r.code == 0, r.err
    r = cli("plan", ds3_hist, "--recipe", "deepseek-v3-ep8", "--placement", placement, "-o", plan, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    warnings = doc.pop("warnings")  # stdout's document adds the warnings to the plan file's
    assert doc == json.loads(plan.read_text())
    assert len(warnings) == 1 and warnings[0].startswith("the placement's 32 redundant replicas per layer take hot")
    assert doc["parallel"] == {"tp": 1, "ep": 8, "ranks": 8} and len(doc["ranks"]) == 8
    assert doc["placement"]["physical_experts"] == 288 and doc["expert_bytes"] == 44_050_944
    assert doc["budget_source"] == "auto"  # the recipe's hardware: 79.6 - 17.77 - 8 - 2 GiB
    for rank in doc["ranks"]:
        assert 0 < rank["hot_bytes"] <= doc["budget_bytes"]


def test_plan_placement_refuses_a_tp_recipe_or_another_rank_count(cli, ds3_hist, tmp_path):
    placement, plan = tmp_path / "placement.json", tmp_path / "plan.json"
    assert cli("place", ds3_hist, "--ranks", "4", "-o", placement).code == 0
    r = cli("plan", ds3_hist, "--recipe", "deepseek-v3", "--placement", placement, "-o", plan)
    assert r.code == 1 and r.out == "" and not plan.exists()
    assert r.err.strip() == ("error: --placement is for expert parallelism, but recipe 'deepseek-v3' has tp=8; "
                             "use a recipe with tp: 1 and ep > 1 (e.g. the shipped deepseek-v3-ep8)")
    r = cli("plan", ds3_hist, "--recipe", "deepseek-v3-ep8", "--placement", placement, "-o", plan)
    assert r.code == 1 and r.out == "" and not plan.exists()
    assert r.err.strip() == ("error: the placement spreads the experts over 4 ranks, recipe 'deepseek-v3-ep8' has "
                             "ep=8; place with --ranks 8, or use a recipe with ep: 4")


def test_plan_with_platform_predicts_cold_reads_per_batch(cli, tiny_hist, tmp_path):
    platform = tmp_path / "platform.json"
    assert cli("probe", "--quick", "-o", platform).code == 0
    doc = json.loads(cli("plan", tiny_hist, "--recipe", "tiny", "--platform", platform, "--json").out)
    costs = doc["decode_cost"]
    assert [c["batch"] for c in costs] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    cold = [c["cold_bytes"] for c in costs]
    assert cold == sorted(cold) and cold[0] > 0  # more tokens touch more distinct cold experts
    assert all(c["cold_bytes"] == pytest.approx(c["cold_experts"] * doc["expert_bytes"]) for c in costs)
    # A CPU-only platform has no GPU free memory: the automatic budget comes from the recipe's GPU.
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", platform, "--hot-gib", "")
    assert r.code == 0, r.err
    assert f"recipe hardware.gpu_mem_gib: {platform} has no GPU with a measured free memory" in r.out


def test_plan_without_platform_predicts_at_the_recipes_stated_rate(cli, tiny_hist, tmp_path):
    import yaml

    from hotsplit_cli.config.recipe import RECIPES_DIR

    data = yaml.safe_load((RECIPES_DIR / "tiny.yaml").read_text())
    assert "decode_cost" not in json.loads(cli("plan", tiny_hist, "--recipe", "tiny", "--json").out)
    data["hardware"]["pcie_gbps"] = 25.0
    recipe = tmp_path / "tiny25.yaml"
    recipe.write_text(yaml.safe_dump(data))
    doc = json.loads(cli("plan", tiny_hist, "--recipe", recipe, "--json").out)
    assert doc["decode_cost_read_gbps"] == {"gbps": 25.0, "source": "recipe hardware.pcie_gbps, not measured"}
    for c in doc["decode_cost"]:
        assert c["cold_read_ms"] == pytest.approx(c["cold_bytes"] / 25e9 * 1e3)
    r = cli("plan", tiny_hist, "--recipe", recipe)
    assert r.code == 0 and "at 25.0 GB/s (recipe hardware.pcie_gbps, not measured)" in r.out


# ---- budgets larger than the GPU: a warning, and the plan still made ----


@pytest.fixture
def v3_hist(tmp_path):
    """A histogram of DeepSeek-V3's shape (58 MoE layers 3..60 x 256 experts)."""
    counts = np.random.default_rng(0).integers(1, 100, size=(58, 256)).astype(np.float64)
    path = tmp_path / "v3.json"
    save_hist(path, make_hist(counts, layers=range(3, 61), top_k=8, model="deepseek-ai/DeepSeek-V3"))
    return path


def test_budget_over_the_gpu_from_env_is_a_warning_not_a_refusal(cli, v3_hist, tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_HOT_GIB", "100")  # the recipe's H100 has 79.6 GiB
    out = tmp_path / "plan.json"
    r = cli("plan", v3_hist, "--recipe", "deepseek-v3", "--json", "-o", out)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    want = ("hot budget 100.00 GiB + dense 2.22 + KV 8.00 + reserve 2.00 = 112.22 GiB exceeds GPU memory 79.60 GiB "
            "(recipe hardware.gpu_mem_gib); planned anyway (for a larger GPU?)")
    assert doc["warnings"] == [want] and r.err.splitlines() == [f"warning: {want}", f"wrote {out}"]
    assert doc["hot_gib"] == 100 and doc["budget_source"] == "HOTSPLIT_HOT_GIB" and out.exists()
    assert "warnings" not in json.loads(out.read_text())  # the plan file holds the plan only


def test_budget_over_the_gpu_from_the_flag_warns_in_human_mode(cli, tiny_hist):
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "1e9")  # tiny's GPU: 0.5 GiB
    assert r.code == 0, r.err
    assert r.err.startswith("warning: hot budget 1000000000.00 GiB + dense") and "exceeds GPU memory 0.50 GiB" in r.err
    assert "hit rate 100.00%" in r.out


def test_budget_within_the_gpu_or_auto_gives_no_warning(cli, tiny_hist, v3_hist):
    assert cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.01").err == ""
    assert cli("plan", v3_hist, "--recipe", "deepseek-v3").err == ""  # auto never exceeds the GPU


def test_budget_over_the_gpu_counts_the_probed_free_memory(cli, tiny_hist, tmp_path):
    platform = tmp_path / "platform.json"
    platform.write_text(json.dumps({"schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z",
                                    "host": {"numa_nodes": []}, "gpus": [{"index": 0, "mem_free_bytes": 1 << 28}],
                                    "reasons": []}))
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.3", "--platform", platform, "--json")
    assert r.code == 0, r.err
    (warning,) = json.loads(r.out)["warnings"]
    assert f"exceeds GPU memory 0.25 GiB ({platform}: smallest free GPU memory)" in warning


def test_small_budget_is_shown_in_the_unit_that_shows_it(cli, tiny_hist):
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.001")
    assert r.code == 0, r.err
    assert "hot budget 1.02 MiB per rank (from --hot-gib)" in r.out.splitlines()
    rank_row = next(x for x in r.out.splitlines() if x.startswith("0 "))
    assert rank_row.split()[-3:-1] == ["1.02", "MiB"]  # the budget column, same unit and digits
