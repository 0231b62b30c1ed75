"""The trace a run replays: which file (one rule, traffic/trace.py `replay_file`), and the counts
of its replayed steps (`Replay.counts_LE`), what the plan is made from and the verdict judges."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import load_run_replay, replay_file, save_trace

ROOT = Path(__file__).resolve().parents[2]


def _recipe(kind: str, path: str | None = None):
    return SimpleNamespace(traffic=SimpleNamespace(kind=kind, path=path))


def test_the_trace_flag_wins_then_a_trace_recipes_own_then_none():
    assert replay_file(_recipe("trace", "own.npz"), Path("given.npz")) == Path("given.npz")
    assert replay_file(_recipe("trace", "own.npz"), None) == "own.npz"
    assert replay_file(_recipe("synthetic"), None) is None
    assert load_run_replay(_recipe("synthetic"), None, 3) is None


def test_a_replay_counts_only_the_steps_it_runs(tmp_path):
    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=2), (1, 2, 3, 4), steps=10, batch=8, top_k=4, seed=2)
    path = save_trace(tmp_path / "t.npz", tr)
    tiny = load_recipe("tiny")
    part, whole = load_run_replay(tiny, path, 4), load_run_replay(tiny, path, None)
    assert (part.steps, whole.steps) == (4, 10)
    assert np.array_equal(part.counts_LE(32), tr.counts_SLE(32)[:4].sum(axis=0))
    assert np.array_equal(whole.counts_LE(32), tr.counts_LE(32))
    assert part.describe() == f"trace {path} (4 of 10 trace steps)"
    with pytest.raises(UsageError, match="--steps 11: the trace"):
        load_run_replay(tiny, path, 11)


def test_which_trace_a_run_replays_is_decided_in_one_place():
    """No other module of the library or the runtime reads a recipe's traffic kind for its trace."""
    rule = re.compile(r"""kind\s*[!=]=\s*["']trace["']""")
    where = [str(p.relative_to(ROOT)) for folder in ("hotsplit_cli", "runtime") for p in (ROOT / folder).rglob("*.py")
             if rule.search(p.read_text())]
    assert where == ["hotsplit_cli/traffic/trace.py"]
