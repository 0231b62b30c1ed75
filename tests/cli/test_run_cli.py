"""`hotsplit run` and `hotsplit selftest` through the CLI: exit codes, stdout, stderr, files."""

import json
from pathlib import Path

import pytest
import torch

from hotsplit_cli.cli import main
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.jsonio import write_json_atomic
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace

torch.set_num_threads(1)
FAST = ["--steps", "40", "--scale", "0.25"]


def run(capsys, *args):
    code = main(["run", "tiny", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_prints_hit_rate_lines_and_a_summary(capsys, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_DYN_STEPS", "10")
    code, out, err = run(capsys, *FAST)
    assert code == 0, err
    assert sum(line.startswith("step ") for line in out.splitlines()) == 4 and "window" in out
    for row in ("tokens/s", "hit rate (overall)", "hit rate expected by the plan", "bytes copied (real)",
                "cold bytes read per step"):
        assert row in out


def test_run_json_is_one_document_and_log_jsonl_has_every_record(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_DYN_STEPS", "10")
    log = tmp_path / "log.jsonl"
    code, out, err = run(capsys, *FAST, "--json", "--log-jsonl", str(log))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "hotsplit.run/1" and doc["summary"]["steps"] == 40
    assert doc["summary"]["tokens"] == 40 * 16 and doc["plan"]["expected_hit_rate"] > 0
    assert doc["knobs"]["dyn_steps"] == 10 and doc["scale"] == 0.25
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in lines] == [10, 20, 30, 40]
    for key in ("step", "hit_rate_window", "hit_rate_total", "swaps", "bytes_copied", "copy_ms"):
        assert key in lines[0]
    assert "hit " in err  # the human lines go to stderr in JSON mode


def test_hot_gib_flag_beats_env(capsys, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_HOT_GIB", "0.001")
    code, out, _ = run(capsys, *FAST, "--json", "--hot-gib", "0.02")
    assert code == 0
    doc = json.loads(out)
    assert doc["knobs"]["hot_gib"] == 0.02 and doc["plan"]["budget_bytes"] == int(0.02 * (1 << 30))


BAD = [
    ("HOTSPLIT_HOT_GIB", "-1"), ("HOTSPLIT_HOT_GIB", "lots"), ("HOTSPLIT_HOT_GIB", "nan"),
    ("HOTSPLIT_DYNAMIC", "2"), ("HOTSPLIT_DYNAMIC", "yes please"),
    ("HOTSPLIT_DYN_STEPS", "0"), ("HOTSPLIT_DYN_STEPS", "-5"), ("HOTSPLIT_DYN_STEPS", "1.5"),
    ("HOTSPLIT_DYN_STEPS", ""),
    ("HOTSPLIT_DYN_MAX_SWAPS", "-1"), ("HOTSPLIT_DYN_MAX_SWAPS", "two"),
    ("HOTSPLIT_DYN_MARGIN", "0.9"), ("HOTSPLIT_DYN_MARGIN", "inf"), ("HOTSPLIT_DYN_MARGIN", "x"),
    ("HOTSPLIT_VRAM_RESERVE_GIB", "-0.5"), ("HOTSPLIT_VRAM_RESERVE_GIB", "big"),
    ("HOTSPLIT_NUMA_POLICY", "interleave"), ("HOTSPLIT_NUMA_POLICY", ""),
]


@pytest.mark.parametrize("env,value", BAD)
def test_every_bad_knob_refuses_to_start_with_exit_2(capsys, monkeypatch, tmp_path, env, value):
    monkeypatch.setenv(env, value)
    log = tmp_path / "log.jsonl"
    code, out, err = run(capsys, *FAST, "--log-jsonl", str(log))
    assert code == 2 and out == ""
    assert err.startswith(f"error: {env}:") and len(err.strip().splitlines()) == 1
    assert not log.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["--hot-gib", "-1"], ["--steps", "0"], ["--scale", "0"], ["--scale", "2"]])
def test_bad_flags_refuse_with_exit_2(capsys, args):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and err.startswith("error: --")


def test_bad_recipe_knob_refuses_with_its_path(capsys, tmp_path):
    text = load_recipe("tiny").path.read_text().replace("dyn_steps: 50", "dyn_steps: 0")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    code = main(["run", str(bad)])
    _, err = capsys.readouterr()
    assert code == 2 and "hotsplit.dyn_steps: must be >= 1, got 0" in err


def test_trace_with_static_plan_reports_the_plans_hit_rate(capsys, tmp_path, monkeypatch):
    m = load_recipe("tiny").model
    trace = synthetic_trace(zipf_shares(m.num_moe_layers, m.num_experts, 1.2, 3), m.moe_layer_ids, 30, 8, m.top_k,
                            drift_every=10, seed=5)
    path = tmp_path / "trace.npz"
    save_trace(path, trace)
    monkeypatch.setenv("HOTSPLIT_DYNAMIC", "0")
    code, out, err = run(capsys, "--trace", str(path), "--scale", "0.25", "--json")
    assert code == 0, err
    s = json.loads(out)["summary"]
    assert s["steps"] == 30 and s["hit_rate"] == s["expected_hit_rate"]


def test_plan_file_sets_the_hot_set(capsys, tmp_path):
    plan = {"schema": "hotsplit.plan/1", "hit_rate": 0.5, "layer_hit_rate": [0.5] * 4,
            "ranks": [{"rank": 0, "hot": {"1": [0, 1, 2], "2": [3], "3": [], "4": [31]}, "hot_bytes": 5 * 196608}]}
    path = tmp_path / "plan.json"
    write_json_atomic(path, plan)
    code, out, err = run(capsys, *FAST, "--plan", str(path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["plan"]["hot_experts"] == 5 and doc["summary"]["expected_hit_rate"] == 0.5


@pytest.mark.parametrize("hot,msg", [({"0": [1]}, "layer 0 is not a MoE layer"), ({"1": [32]}, "is not an expert id")])
def test_bad_plan_file_is_a_clear_error(capsys, tmp_path, hot, msg):
    path = tmp_path / "plan.json"
    write_json_atomic(path, {"schema": "hotsplit.plan/1", "ranks": [{"rank": 0, "hot": hot}]})
    code, out, err = run(capsys, *FAST, "--plan", str(path))
    assert code == 1 and out == "" and msg in err and err.startswith("error:")


def test_plot_is_written(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "hit.png"
    code, _, err = run(capsys, *FAST, "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_missing_output_folder_refuses_before_running(capsys, tmp_path):
    code, out, err = run(capsys, *FAST, "--log-jsonl", str(tmp_path / "nope" / "x.jsonl"))
    assert code == 2 and "does not exist" in err


def test_selftest_passes_on_this_machine(capsys):
    code = main(["selftest", "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 0, err
    assert doc["ok"] and {c["name"] for c in doc["checks"]} >= {"runtime = reference (random hot sets)",
                                                                 "runtime = reference (swaps mid-run)"}
    skipped = [c for c in doc["checks"] if c["ok"] is None]
    if not torch.cuda.is_available():
        assert any(c["name"] == "CUDA graph replay" for c in skipped)


def test_run_is_lazy_about_torch():
    # `hotsplit run --help` is answered without importing torch (or what comes with it).
    import subprocess
    import sys

    code = ("import sys\nfrom hotsplit_cli.cli import main\nrc = main(['run', '--help'])\n"
            "print(rc, sorted(m for m in ('torch', 'triton', 'transformers') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--log-jsonl" in r.stdout  # the help of `run` was printed
    assert r.stdout.splitlines()[-1] == "0 []"


def test_run_executes_a_plan_made_by_hotsplit_plan(capsys, tmp_path, monkeypatch):
    plan = tmp_path / "plan.json"
    hist = Path(__file__).resolve().parents[2] / "examples" / "hist-tiny.json"
    assert main(["plan", str(hist), "--recipe", "tiny", "-o", str(plan)]) == 0
    capsys.readouterr()
    monkeypatch.setenv("HOTSPLIT_DYNAMIC", "0")
    code, out, err = run(capsys, *FAST, "--plan", str(plan), "--json")
    assert code == 0, err
    doc = json.loads(out)
    written = json.loads(plan.read_text())
    assert doc["plan"]["hot_experts"] == written["ranks"][0]["hot_experts"]
    assert doc["summary"]["expected_hit_rate"] == written["hit_rate"]


# ---- --trace: the whole trace unless --steps says otherwise ----


@pytest.fixture
def short_recipe(tmp_path):
    """tiny with run.steps 8, so that a 24-step trace is longer than the recipe's run."""
    import yaml

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml").read_text())
    doc["run"].update(steps=8, scale=0.25)
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def trace24(tmp_path):
    m = load_recipe("tiny").model
    trace = synthetic_trace(zipf_shares(m.num_moe_layers, m.num_experts, 1.2, 3), m.moe_layer_ids, 24, 8, m.top_k,
                            seed=5)
    return save_trace(tmp_path / "trace24.npz", trace)


def test_trace_is_replayed_whole_without_steps(capsys, short_recipe, trace24, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_DYNAMIC", "0")
    assert main(["run", str(short_recipe), "--trace", str(trace24), "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["summary"]["steps"] == 24 and doc["trace_steps"] == 24
    assert doc["traffic"] == f"trace {trace24} (24 of 24 trace steps)"
    assert "24 steps on cpu" in err and "(24 of 24 trace steps)" in err  # the header
    assert "warnings" not in doc  # a static plan made from the replayed steps hits exactly its expectation


def test_steps_within_the_trace_say_how_much_is_replayed(capsys, short_recipe, trace24):
    assert main(["run", str(short_recipe), "--trace", str(trace24), "--steps", "10", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["steps"] == 10 and doc["traffic"].endswith("(10 of 24 trace steps)")
    assert doc["plan"]["source"] == f"planned from trace {trace24} (10 of 24 trace steps)"


def test_steps_beyond_the_trace_are_refused_before_anything_is_written(capsys, short_recipe, trace24, tmp_path):
    log = tmp_path / "log.jsonl"
    code = main(["run", str(short_recipe), "--trace", str(trace24), "--steps", "25", "--log-jsonl", str(log)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and not log.exists()
    assert err == (f"error: --steps 25: the trace {trace24} has 24 steps; pass --steps 24 or less, or drop "
                   "--steps to replay the whole trace\n")


# ---- a plan made from other traffic than the run's ----


@pytest.fixture
def mismatched_plan(capsys, tmp_path):
    """A plan from a histogram that ranks tiny's synthetic traffic upside down (its coldest experts hot)."""
    from hotsplit_cli.traffic.hist import save_hist
    from tests.conftest import make_hist

    m, t = load_recipe("tiny").model, load_recipe("tiny").traffic
    shares = zipf_shares(m.num_moe_layers, m.num_experts, t.skew, t.seed)  # what `run tiny` routes
    hist = tmp_path / "upside-down.json"
    save_hist(hist, make_hist(1e4 / shares, layers=m.moe_layer_ids, top_k=m.top_k, model="tiny"))
    plan = tmp_path / "plan.json"
    assert main(["plan", str(hist), "--recipe", "tiny", "-o", str(plan)]) == 0
    capsys.readouterr()
    return hist, plan


def test_gap_to_the_plans_expectation_is_flagged_with_both_sources(capsys, mismatched_plan, monkeypatch):
    hist, plan = mismatched_plan
    monkeypatch.setenv("HOTSPLIT_DYNAMIC", "0")
    code, out, err = run(capsys, *FAST, "--plan", str(plan), "--json")
    assert code == 0, err
    doc = json.loads(out)
    made_from = f"histogram {hist} (generated in tests)"
    assert doc["plan"]["made_from"] == made_from
    s = doc["summary"]
    assert s["expected_gap"] == pytest.approx(s["hit_rate"] - s["expected_hit_rate"]) and s["expected_gap"] < -0.10
    (warning,) = doc["warnings"]
    assert warning.startswith(f"hit rate {100 * s['hit_rate']:.1f}% is {-100 * s['expected_gap']:.1f} points below "
                              f"the {100 * s['expected_hit_rate']:.1f}% the plan expected")
    assert warning.endswith(f"the plan was made from {made_from}; this run's traffic: synthetic skew 1.1, "
                            "hotspot moves every 150 steps")
    assert f"warning: {warning}" in err

    code, out, err = run(capsys, *FAST, "--plan", str(plan))
    assert code == 0 and f"warning: {warning}" in err
    lines = out.splitlines()
    assert "points lower: see below)" in next(x for x in lines if x.startswith("hit rate expected by the plan"))
    assert f"plan made from: {made_from}" in lines
    assert "this run's traffic: synthetic skew 1.1, hotspot moves every 150 steps" in lines


def test_expectation_warning_threshold():
    from hotsplit_cli.hotset.verdict import expectation_warning
    from hotsplit_cli.hotset.windows import RunSummary

    def summary(hit, expected):
        return RunSummary(10, 80, 1.0, 80.0, hit, None, expected, 0, 0, 0.0, 0.0, [], False)

    assert expectation_warning(summary(0.50, None), "a", "b") is None
    assert expectation_warning(summary(0.70, 0.80), "a", "b") is None  # 10.0 points: not over 10
    assert expectation_warning(summary(0.69, 0.80), "hist h.json", "trace t").endswith(
        "11.0 points below the 80.0% the plan expected: the plan was made from hist h.json; this run's traffic: "
        "trace t")
    assert "points above" in expectation_warning(summary(0.95, 0.80), "a", "b")
    assert expectation_warning(summary(0.5, 0.8), "t", "t").endswith(
        "the plan was made before the run from its own traffic (t)")


def test_ctrl_c_mid_run_says_exactly_what_was_written(capsys, tmp_path, monkeypatch):
    import hotsplit_runtime.from_recipe as from_recipe

    from tests.conftest import interrupt_at

    pytest.importorskip("matplotlib")
    real = from_recipe.prepare_run

    def interrupted_at_step_25(*args, **kwargs):
        p = real(*args, **kwargs)
        interrupt_at(p.engine, 25)
        return p

    monkeypatch.setattr(from_recipe, "prepare_run", interrupted_at_step_25)
    monkeypatch.setenv("HOTSPLIT_DYN_STEPS", "10")
    log, png = tmp_path / "log.jsonl", tmp_path / "hit.png"
    code, out, err = run(capsys, *FAST, "--log-jsonl", str(log), "--plot", str(png))
    assert code == 130 and "(interrupted)" in out
    assert err.splitlines()[-1] == f"error: interrupted at step 25 of 40; wrote {log} (3 records) and {png}"
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [10, 20, 25]
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hit.png", "log.jsonl"]  # no temp file left


def test_ctrl_c_mid_run_without_output_files_says_nothing_was_written(capsys, monkeypatch):
    import hotsplit_runtime.from_recipe as from_recipe
    from hotsplit_runtime.engine import ArraySource

    real = from_recipe.prepare_run

    def interrupted_at_once(*args, **kwargs):
        p = real(*args, **kwargs)

        def steps():
            raise KeyboardInterrupt
            yield

        p.engine.source = ArraySource("synthetic", p.engine.source.tokens_per_step, steps())
        return p

    monkeypatch.setattr(from_recipe, "prepare_run", interrupted_at_once)
    code, _, err = run(capsys, *FAST)
    assert code == 130 and err.splitlines()[-1] == "error: interrupted at step 0 of 40; nothing was written"


def test_a_gap_from_drifting_traffic_names_the_drift_and_dynamic_mode():
    """The Quickstart's run warns 13 points below the plan: say that the traffic drifted after the
    plan was made, and that following it is dynamic mode's job."""
    from hotsplit_cli.hotset.verdict import expectation_warning
    from hotsplit_cli.hotset.windows import RunSummary

    s = RunSummary(steps=600, tokens=9600, elapsed_s=1.0, tokens_per_s=1.0, hit_rate=0.68, hit_rate_last_window=0.7,
                   expected_hit_rate=0.816, swaps=70, bytes_copied=0, copy_ms=0.0, cold_bytes_per_step=0.0,
                   layer_hit_rate=[0.68], interrupted=False)
    traffic = "synthetic skew 1.1, hotspot moves every 150 steps"
    w = expectation_warning(s, traffic, traffic, drift_every=150, dynamic=True)
    assert w.endswith("the traffic drifted after the plan was made (its hotspot moves every 150 steps, the plan "
                      "knows where it started); following it is what dynamic mode is for: it made 70 swaps (more per "
                      "update: HOTSPLIT_DYN_MAX_SWAPS; sooner: HOTSPLIT_DYN_STEPS)")
    assert "HOTSPLIT_DYNAMIC=1 turns it on" in expectation_warning(s, traffic, traffic, 150, dynamic=False)
    assert "drifted" not in expectation_warning(s, traffic, traffic)  # no drift known: the old reason
