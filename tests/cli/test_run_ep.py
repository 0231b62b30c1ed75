"""`hotsplit run` with parallel.ep > 1, through real processes: the plain launcher and torchrun
agree, rank 0 reports for the job, a killed rank or Ctrl-C stops every rank with one line.
Every job is bounded in time and its whole session is killed afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.runtime.ep.harness import REPO, env_for_ranks, kill_tagged, run_job, tagged_pids, torchrun

HOTSPLIT = [sys.executable, "-m", "hotsplit_cli"]
FAIL_CLI = str(REPO / "tests" / "runtime" / "ep" / "fail_cli.py")
STEPS = ["--steps", "20"]


def _doc(done):
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_plain_start_and_torchrun_agree(tmp_path):
    log = tmp_path / "ep.jsonl"
    plain = _doc(run_job([*HOTSPLIT, "run", "tiny-ep4", "--json", *STEPS, "--log-jsonl", str(log)]))
    under = _doc(run_job(torchrun(4, ["-m", "hotsplit_cli", "run", "tiny-ep4", "--json", *STEPS])))
    for doc in (plain, under):
        s = doc["summary"]
        assert doc["parallel"] == {"ep": 4, "backend": "gloo", "nodes": 1}
        assert [r["rank"] for r in s["ranks"]] == [0, 1, 2, 3]
        # steps x ranks x tokens x top_k x layers
        assert sum(r["assignments"] for r in s["ranks"]) == 20 * 4 * 16 * 4 * 4
        assert 0 < s["balancedness"] <= 1
        assert s["exchange"]["measured_bytes_per_layer"] > 0 and s["exchange"]["predicted_bytes_per_layer"] > 0
        assert s["exchange"]["mode"] == "a2a"  # the default exchange
        assert [r["cold_paths"] for r in s["ranks"]] == [None] * 4  # cold_path gpu: no CPU path to report
    assert [r["hit_rate"] for r in plain["summary"]["ranks"]] == [r["hit_rate"] for r in under["summary"]["ranks"]]
    assert plain["summary"]["balancedness"] == under["summary"]["balancedness"]
    assert plain["summary"]["hit_rate"] == under["summary"]["hit_rate"]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in lines] == [20]
    assert [r["rank"] for r in lines[0]["ranks"]] == [0, 1, 2, 3] and "balancedness" in lines[0]
    assert sum(r["assignments"] for r in lines[0]["ranks"]) == sum(r["assignments"] for r in plain["summary"]["ranks"])


def test_rank_zero_prints_for_the_job(tmp_path):
    done = run_job([*HOTSPLIT, "run", "tiny-ep4", "--steps", "4"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("hotsplit run tiny-ep4 (ep 4)") == 1
    assert done.stdout.count("expert parallel: 4 ranks") == 1
    assert done.stdout.count("step       4  hit") == 1
    assert "error" not in done.stderr


def test_a_world_that_is_not_the_recipes_ep_is_refused():
    done = run_job(torchrun(2, ["-m", "hotsplit_cli", "run", "tiny-ep4", *STEPS]))
    assert done.returncode != 0
    lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert lines == ["error: parallel.ep is 4 but the launcher started 2 ranks; launch 4 ranks (torchrun "
                     "--nproc-per-node, --nnodes), or change parallel.ep"], done.stderr[-3000:]  # said once


def _rank_pid(tag: str, rank: int) -> int | None:
    for pid in tagged_pids(tag):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return pid
    return None


def _start_long_run(tag: str, launcher: str = "plain"):
    args = [*HOTSPLIT, "run", "tiny-ep4", "--steps", "100000"]
    if launcher == "torchrun":
        args = torchrun(4, args[1:])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for_ranks(tag),
                            cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 200
    for line in proc.stdout:  # the header: every rank is built and stepping
        if line.startswith("expert parallel:") or time.monotonic() > deadline:
            break
    if proc.poll() is not None:  # it ended before its header: say why, not only that no rank is there
        pytest.fail(f"the job ended before it started stepping (exit {proc.returncode}): {proc.stderr.read()[-3000:]}")
    return proc


def _finish(proc, limit_s: float):
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the job did not stop within {limit_s} s")
    return proc.returncode, err, time.monotonic() - t0


@pytest.mark.parametrize("how, launcher", [("kill-rank", "plain"), ("ctrl-c", "plain"), ("kill-rank", "torchrun")])
def test_a_killed_rank_or_ctrl_c_stops_every_rank(how, launcher):
    tag = uuid.uuid4().hex
    proc = _start_long_run(tag, launcher)
    try:
        time.sleep(1.0)
        assert len(tagged_pids(tag)) == 5  # the launcher and its 4 ranks
        if how == "kill-rank":
            pid = _rank_pid(tag, 2)
            assert pid is not None, "rank 2 not found"
            os.kill(pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        rc, err, took = _finish(proc, 60)
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        if launcher == "torchrun":
            # torchrun's own report names the rank and the signal; the ranks that lost their peer
            # say nothing of their own (no traceback of a rank), or at most one of them says so
            # once, when torchrun is slower than the grace to stop it.
            assert rc != 0 and (lines == [] or len(lines) == 1 and "lost its peers" in lines[0]), err[-3000:]
            assert "rank      : 2" in err and "Signal 9 (SIGKILL)" in err, err[-3000:]
            _no_rank_traceback(err)
        elif how == "kill-rank":
            want = ["error: rank 2 of 4 was killed by SIGKILL; every rank was stopped"]
            assert rc == 1 and lines == want, err[-2000:]
        else:
            assert rc == 130 and len(lines) == 1 and "interrupted" in lines[0], err[-2000:]
        time.sleep(0.5)
        assert tagged_pids(tag) == []  # no rank left behind
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"hotsplit-hotsplit-{proc.pid}-")]
    finally:
        kill_tagged(tag)


CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"  # torchrun's report


def _no_rank_traceback(err: str) -> None:
    """The only traceback in `err` is torchrun's own, the one that ends in its failure report."""
    before = err.partition(CHILD_FAILED)[0]
    n = before.count("Traceback (most recent call last)")
    assert n <= 1 and (n == 0 or "distributed/run.py" in before.rsplit("Traceback", 1)[1]), err[-3000:]


def test_under_torchrun_a_failing_rank_says_its_cause_once():
    """torchrun, rank 2 fails with an error of its own at step 3: the job says it in one line
    naming the rank and the cause (torchrun's report carries the same line); the three ranks
    that only lost their peer print no line and no traceback."""
    env = env_for_ranks()
    env["EP_TEST_FAIL_RANK"] = "2"
    done = run_job(torchrun(4, [FAIL_CLI, "run", "tiny-ep4", "--steps", "20"]), env=env)
    want = "error: rank 2 of 4: the expert bank's disk went away; check the node"
    assert done.returncode != 0
    lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert lines == [want], done.stderr[-3000:]
    _no_rank_traceback(done.stderr)
    report = done.stderr.partition(CHILD_FAILED)[2]
    assert "rank      : 2" in report and want in report  # torchrun's root cause: our line, from the error file
    assert done.stdout.count("expert parallel: 4 ranks") == 1


@pytest.mark.parametrize("knob, where, value, message", [
    ("eplb_steps", "flag", "-1", "error: --eplb-steps: must be >= 0, got -1"),
    ("eplb_steps", "env", "often", "error: HOTSPLIT_EPLB_STEPS: must be an integer, got 'often'"),
    ("eplb_steps", "recipe", -3, "error: hotsplit.eplb_steps: must be >= 0, got -3"),
    ("ep_exchange", "flag", "ring", "error: --ep-exchange: must be one of a2a, allgather, got 'ring'"),
    ("ep_exchange", "env", "all_gather", "error: HOTSPLIT_EP_EXCHANGE: must be one of a2a, allgather, got "
                                         "'all_gather'"),
    ("ep_exchange", "recipe", "A2A", "error: hotsplit.ep_exchange: must be one of a2a, allgather, got 'A2A'"),
])
def test_a_bad_ep_knob_exits_2_with_one_line_and_writes_nothing(tmp_path, knob, where, value, message):
    recipe = "tiny-ep4"
    env = env_for_ranks()
    args = [*HOTSPLIT, "run"]
    if where == "recipe":
        from tests.runtime.ep.harness import tiny_ep_recipe

        recipe = str(tiny_ep_recipe(tmp_path / "r.yaml", 2, **{f"hotsplit.{knob}": value}))
    args += [recipe, "--log-jsonl", str(tmp_path / "log.jsonl")]
    if where == "flag":
        args += [f"--{knob.replace('_', '-')}", value]
    if where == "env":
        env[f"HOTSPLIT_{knob.upper()}"] = value
    done = run_job(args, env=env, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [message]
    assert done.stdout == "" and not (tmp_path / "log.jsonl").exists()


def test_the_ep_flags_beat_the_environment_and_the_recipe():
    from hotsplit_cli.config.knobs import resolve_knobs

    assert resolve_knobs({"eplb_steps": 5}, {"HOTSPLIT_EPLB_STEPS": "7"}, {"eplb_steps": 9}).eplb_steps == 9
    assert resolve_knobs({"eplb_steps": 5}, {"HOTSPLIT_EPLB_STEPS": "7"}, {}).eplb_steps == 7
    assert resolve_knobs({"eplb_steps": 5}, {}, {}).eplb_steps == 5
    assert resolve_knobs({}, {}, {}).eplb_steps == 0
    env = {"HOTSPLIT_EP_EXCHANGE": "a2a"}
    assert resolve_knobs({"ep_exchange": "a2a"}, env, {"ep_exchange": "allgather"}).ep_exchange == "allgather"
    assert resolve_knobs({"ep_exchange": "allgather"}, env, {}).ep_exchange == "a2a"
    assert resolve_knobs({"ep_exchange": "allgather"}, {}, {}).ep_exchange == "allgather"
    assert resolve_knobs({}, {}, {}).ep_exchange == "a2a"


def test_plot_adds_each_ranks_load(tmp_path):
    """--plot of an EP run: the hit rates beside each rank's load, the bottleneck named."""
    pytest.importorskip("matplotlib")
    from tests.runtime.ep.harness import tiny_ep_recipe

    png = tmp_path / "ep.png"
    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 2)
    doc = _doc(run_job([*HOTSPLIT, "run", str(recipe), "--json", "--steps", "8", "--plot", str(png)]))
    assert doc["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width = matplotlib.image.imread(png).shape[:2]
    assert (width, height) == (1700, 450)  # three panels: hit rates, per-window balance, per-rank loads


def test_under_torchrun_a_bad_knob_is_said_once_for_the_job(tmp_path):
    """Each rank is the same command line and refuses the same value: rank 0 says it, once."""
    done = run_job(torchrun(2, ["-m", "hotsplit_cli", "run", "tiny-ep4", "--eplb-steps", "-1",
                                "--log-jsonl", str(tmp_path / "ep.jsonl")]))
    assert done.returncode != 0
    lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert lines == ["error: --eplb-steps: must be >= 0, got -1"], done.stderr[-3000:]
    assert not (tmp_path / "ep.jsonl").exists()


SLOW_RANK0_CLI = str(REPO / "tests" / "runtime" / "ep" / "slow_rank0_cli.py")


@pytest.mark.parametrize("args, want", [
    (["--eplb-steps", "-1"], "error: --eplb-steps: must be >= 0, got -1"),
    (["--ep-exchange", "ring"], "error: --ep-exchange: must be one of a2a, allgather, got 'ring'"),
])
def test_under_torchrun_a_refusal_waits_for_a_slow_rank_zero(tmp_path, args, want):
    """The race: rank 0 starts 4 s after the others, so rank 1 refuses the value first. Rank 1 may
    not exit before rank 0 has said the line (torchrun would stop rank 0 at once): it waits for
    rank 0's mark in the job's store, and the line is said once."""
    env = env_for_ranks()
    env["EP_TEST_RANK0_DELAY_S"] = "4"
    t0 = time.monotonic()
    done = run_job(torchrun(2, [SLOW_RANK0_CLI, "run", "tiny-ep4", *args, "--log-jsonl", str(tmp_path / "ep.jsonl")]),
                   env=env, timeout=120)
    lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert done.returncode != 0 and lines == [want], done.stderr[-3000:]
    assert time.monotonic() - t0 >= 4  # rank 0's line came after its delay, not from a rank that gave up
    assert not (tmp_path / "ep.jsonl").exists()


def test_the_allgather_exchange_prints_no_torch_warning(tmp_path):
    """torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (FutureWarning on every
    call); the exchange uses the current names, so no rank prints a warning (torchrun shows every
    rank's stderr)."""
    from tests.runtime.ep.harness import tiny_ep_recipe

    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 2)
    done = run_job(torchrun(2, ["-m", "hotsplit_cli", "run", str(recipe), "--steps", "4", "--ep-exchange",
                                "allgather"]), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(allgather)" in done.stdout
    assert "Warning" not in done.stderr, done.stderr[-3000:]
