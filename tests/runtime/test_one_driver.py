"""One driver: a single rank and an expert-parallel rank step through the same loop, and the
job's figures come from one reduction that, over one rank, gives that rank's own figures."""

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hotsplit_runtime import engine as engine_mod
from hotsplit_runtime import ranks
from hotsplit_runtime.device import choose_device
from hotsplit_runtime.distributed import rank as rank_mod
from hotsplit_runtime.distributed.summary import RankTotals, RankWindow, reduce_summaries, reduce_windows
from hotsplit_runtime.from_recipe import prepare_run

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import UsageError

torch.set_num_threads(1)
RUNTIME = Path(engine_mod.__file__).parent


def _tiny():
    r = load_recipe("tiny")
    return dataclasses.replace(r, traffic=dataclasses.replace(r.traffic, drift_every=10, batch=8),
                               run=dataclasses.replace(r.run, scale=0.25))


def _loops_over_steps(tree: ast.AST) -> list[str]:
    """Functions with a `for` over a routing source's `.steps()`."""
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if (isinstance(node, ast.For) and isinstance(node.iter, ast.Call)
                        and isinstance(node.iter.func, ast.Attribute) and node.iter.func.attr == "steps"):
                    found.append(fn.name)
    return found


def test_the_runtime_has_one_step_loop_and_a_rank_runs_it():
    loops = {str(p.relative_to(RUNTIME)): _loops_over_steps(ast.parse(p.read_text()))
             for p in RUNTIME.rglob("*.py")}
    assert {k: v for k, v in loops.items() if v} == {"engine.py": ["_steps"]}
    calls = [n for n in ast.walk(ast.parse(Path(rank_mod.__file__).read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "run"]
    assert calls, "run_rank must step through Engine.run"


def test_a_rank_is_a_frozen_value_and_parallelism_is_applied_in_one_place():
    """The builders read a settled `Rank` and apply the parallelism they are given; no builder
    branches on the job's size, and no strategy object is handed through the build."""
    for name in ("from_recipe.py", "hf/run.py"):
        src = (RUNTIME / name).read_text()
        assert "ep is None" not in src and "ep is not None" not in src and "world ==" not in src, name
        assert "EPMoE" not in src and "EPCheckpoint" not in src, name
    with pytest.raises(dataclasses.FrozenInstanceError):
        ranks.Rank.single(_tiny(), resolve_knobs(_tiny().knobs, {})).rank = 1  # type: ignore[misc]
    assert not hasattr(rank_mod, "EPRankContext") and not (RUNTIME / "rank_context.py").exists()


def test_one_rank_reduced_is_that_rank_own_figures():
    """The reduction the job uses, over a single rank's windows and totals, reproduces what the
    rank's own bookkeeping reported: the same code serves 1 and N ranks."""
    r = _tiny()
    k = resolve_knobs(r.knobs, {"HOTSPLIT_DYN_STEPS": "5", "HOTSPLIT_DYN_MAX_SWAPS": "2"})
    p = prepare_run(r, k, steps=23)
    eng, windows = p.engine, []

    def on_record(rec):
        hits_L, assigned_L, cold = eng.window_counts
        loads = np.zeros((1, len(hits_L)), dtype=np.int64)
        windows.append(RankWindow(rec, hits_L, assigned_L, cold, eng.book.hits, eng.book.assigned, loads))
    s = eng.run(p.steps, on_record)
    assert len(windows) == 5 and s.swaps > 0  # 4 full windows, one partial; swaps happened
    for w in windows:
        job = reduce_windows([w])
        for f in dataclasses.fields(w.record):
            if f.name != "cold_cpu_bytes_per_step":  # a CPU-split figure the job line does not carry
                want = getattr(w.record, f.name)
                assert getattr(job, f.name) == (want if want is None else pytest.approx(want, rel=1e-12)), f.name
        assert job.ranks[0]["hit_rate"] == pytest.approx(w.record.hit_rate_window, rel=1e-12)
    assigned_SL = np.ones((s.steps, len(s.layer_hit_rate)), dtype=np.int64)  # equal loads: rates unweighted
    job = reduce_summaries([RankTotals(s, assigned_SL, eng.book.cold_reads, s.expected_hit_rate, 0, 0, 0.0, 0)])
    for name in ("steps", "tokens", "elapsed_s", "tokens_per_s", "hit_rate", "swaps", "bytes_copied", "copy_ms",
                 "cold_bytes_per_step", "expected_hit_rate"):
        assert getattr(job, name) == pytest.approx(getattr(s, name), rel=1e-12), name
    assert job.layer_hit_rate == pytest.approx(s.layer_hit_rate, rel=1e-12)


def test_a_single_rank_context_refuses_an_expert_parallel_recipe_before_building():
    r = _tiny()
    r = dataclasses.replace(r, parallel=dataclasses.replace(r.parallel, ep=2))
    built = []
    with pytest.raises(UsageError, match="parallel.ep is 2"):
        prepare_run(r, resolve_knobs(r.knobs, {}), steps=2, advance=built.append)
    assert built == []


def test_runtime_hf_has_no_window_bookkeeping_and_only_its_step_is_its_own():
    pytest.importorskip("transformers", minversion="5.0")
    from hotsplit_runtime.hf.steps import CheckpointEngine

    used = set()
    for p in (RUNTIME / "hf").rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            used.add(n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None)
    books = {"WindowBook", "window_start", "decide", "dyn_steps", "landed", "moves_by_layer", "perf_counter"}
    assert not used & books, used & books
    own = {k for k in vars(CheckpointEngine) if not k.startswith("__")}
    assert own == {"_init_forward", "_forward", "tokens"}  # run, _steps, step, close_window: Engine's
    assert not (RUNTIME / "hf" / "serve.py").exists()


def _checkpoint_recipe(tmp_path, folder):
    from hotsplit_runtime.hf.loader import load_model, read_config

    config = read_config(folder)
    hm = load_model(folder, choose_device("cpu"), torch.float32)
    (tmp_path / "p.jsonl").write_text('{"prompt": "the cat sat on the mat"}\n{"prompt": "one two three"}\n')
    one = 3 * config.hidden_size * config.moe_intermediate_size * 4  # fp32
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({
        "name": "ckpt", "model": {"kind": "hf", "path": str(folder), "family": config.model_type,
                                  "expert_dtype": "fp32", "total_params": 1.0e6,
                                  "hidden_size": config.hidden_size,
                                  "moe_intermediate_size": config.moe_intermediate_size,
                                  "num_hidden_layers": config.num_hidden_layers, "moe_layers": list(hm.layer_ids),
                                  "num_experts": hm.num_experts, "top_k": hm.top_k},
        "traffic": {"kind": "prompts", "path": str(tmp_path / "p.jsonl"), "max_new_tokens": 6, "batch": 2},
        "run": {"device": "cpu"}, "hotsplit": {"hot_gib": 3 * one / 2**30, "dyn_steps": 2, "dyn_margin": 1.0}}))
    return load_recipe(str(tmp_path / "r.yaml"))


def test_a_checkpoint_run_is_engine_run_with_swaps_published_before_the_next_forward(checkpoints, tmp_path,
                                                                                      monkeypatch):
    """Each forward is one step of the one loop: a window's swaps start after a forward and are
    published before the next one runs, as for a synthetic model."""
    from hotsplit_runtime import api
    from hotsplit_runtime.hf import capture, steps

    events, runs = [], []
    for cls, name in ((capture.Forward, "__call__"), (steps.CheckpointMoE, "begin_swaps"),
                      (steps.CheckpointMoE, "publish_ready"), (engine_mod.Engine, "run")):
        real = getattr(cls, name)

        def spy(self, *a, _real=real, _name=name, **kw):
            events.append(_name)
            if _name == "run":
                runs.append(type(self))
            return _real(self, *a, **kw)
        monkeypatch.setattr(cls, name, spy)
    recipe = _checkpoint_recipe(tmp_path, checkpoints["qwen3_moe"])
    knobs = resolve_knobs(recipe.knobs, {})
    records = []

    class Records(api.Watch):
        def record(self, rec):
            records.append(rec)
    out = api.run(api.RunRequest(recipe, knobs), Records())
    assert runs == [steps.CheckpointEngine] and len(out.texts) == 2
    forwards = [i for i, e in enumerate(events) if e == "__call__"]
    swaps = [i for i, e in enumerate(events) if e == "begin_swaps"]
    assert swaps and out.summary.swaps > 0 and records == out.summary.records
    for s in swaps:  # between this swap and the next forward, a publication
        nxt = next((f for f in forwards if f > s), len(events))
        assert "publish_ready" in events[s:nxt]
    # One calibration forward (the prefill of the one batch) plans the hot set; every other is a step.
    assert out.summary.steps == records[-1].step == len(forwards) - 1


def test_renamed_collectives_are_called_only_through_the_dispatch_shims():
    """torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor; older torch (a GPU
    machine's 2.11) has only the old names. dispatch.py binds whichever exists, so no other module
    may name either spelling on `dist`."""
    renamed = {"all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor"}
    direct = [f"{p.relative_to(RUNTIME)}:{n.lineno}" for p in RUNTIME.rglob("*.py")
              for n in ast.walk(ast.parse(p.read_text()))
              if isinstance(n, ast.Attribute) and n.attr in renamed and isinstance(n.value, ast.Name)
              and n.value.id == "dist" and p.name != "dispatch.py"]
    assert direct == []
