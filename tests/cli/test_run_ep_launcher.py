"""The plain EP launcher as a process: its ranks die with it, what a killed job left is removed by
the next run (by its recorded owner, never by age), and `| head` ends it quietly as it ends a
single-rank run. Every job is bounded in time and its processes are killed afterwards."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path

from hotsplit_runtime.distributed.leftovers import owner_tag

from tests.cli.test_run_ep import HOTSPLIT, _start_long_run
from tests.runtime.ep.harness import kill_tagged, run_job, tagged_pids, tiny_ep_recipe


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_killed_launcher_takes_its_ranks_and_the_next_run_removes_what_it_left(tmp_path):
    tag = uuid.uuid4().hex
    proc = _start_long_run(tag)
    seg = live = None
    try:
        ranks = [p for p in tagged_pids(tag) if p != proc.pid]
        assert len(ranks) == 4
        folders = list(Path("/tmp").glob(f"hotsplit-ep-o{proc.pid}.*"))
        assert len(folders) == 1  # the launcher's log folder, named for it
        owner = owner_tag(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while any(map(_running, ranks)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in ranks if _running(p)], "ranks outlived their launcher by 10 s"
        assert folders[0].is_dir()  # a SIGKILL leaves the launcher no time to remove it
        # What a job killed during set-up leaves in /dev/shm, named for its dead launcher, beside
        # a segment of a job that still runs (this test's process owns it): only the first goes.
        seg = Path(f"/dev/shm/hotsplit-hotsplit-{proc.pid}-test-node0-{owner}-0")
        seg.write_bytes(b"\0" * (3 << 20))
        live = Path(f"/dev/shm/hotsplit-test-{tag}-node0-{owner_tag(os.getpid())}-0")
        live.write_bytes(b"\0")
        recipe = tiny_ep_recipe(tmp_path / "r.yaml", 2)
        done = run_job([*HOTSPLIT, "run", str(recipe), "--steps", "2"], timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        want = (f"removed what ended expert-parallel jobs left: 1 shared-memory segment (3.0 MiB) from /dev/shm "
                f"and 1 log folder ({folders[0]})")
        assert want in done.stderr.splitlines(), done.stderr[-3000:]
        assert not seg.exists() and not folders[0].exists() and live.exists()
    finally:
        kill_tagged(tag)
        for path in (seg, live):
            if path is not None:
                path.unlink(missing_ok=True)


def test_an_ep_run_piped_into_head_exits_quietly_with_141():
    """`hotsplit run tiny-ep4 --steps 200 | head -3`: rank 0's reader goes away; the launcher
    exits 141 without a line, as a single-rank run does."""
    cmd = f"{sys.executable} -m hotsplit_cli run tiny-ep4 --steps 200 | head -3; exit ${{PIPESTATUS[0]}}"
    done = run_job(["bash", "-c", cmd], timeout=200)
    assert done.returncode == 141, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == 3
    assert "error" not in done.stderr, done.stderr[-3000:]


def _trace(path, num_experts: int, steps: int):
    from hotsplit_cli.config.recipe import load_recipe
    from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
    from hotsplit_cli.traffic.trace import save_trace

    m = load_recipe("tiny-ep4").model
    save_trace(path, synthetic_trace(zipf_shares(m.num_moe_layers, num_experts, 1.2, 3), m.moe_layer_ids, steps, 16,
                                     m.top_k, seed=5))
    return path


def test_the_launcher_refuses_a_trace_of_another_model_before_any_rank_starts(cli, tmp_path):
    """A trace with expert ids the recipe does not have (here up to 63 for 32 experts), and
    --steps beyond a trace's 24: refused by the launcher before torch is imported, naming the file and
    the option, never a rank; no rank started (no log folder of this process)."""
    wide, short = _trace(tmp_path / "wide.npz", 64, 4), _trace(tmp_path / "short.npz", 32, 24)
    before = set(Path("/tmp").glob(f"hotsplit-ep-o{os.getpid()}.*"))
    r = cli("run", "tiny-ep4", "--trace", wide, "--log-jsonl", tmp_path / "log.jsonl")
    assert r.code == 1 and r.out == "" and not (tmp_path / "log.jsonl").exists()
    [line] = r.err.splitlines()
    assert line.startswith(f"error: {wide}: `topk_ids[") and line.endswith("but the model has 32 experts"), line
    # Before torch is imported (what makes it take well under a second, not the 10 s and more of
    # starting ranks): checked in a fresh interpreter, as a user's command runs.
    code = ("import sys; from hotsplit_cli.cli import main; "
            f"rc = main(['run', 'tiny-ep4', '--trace', {str(wide)!r}]); print(rc, 'torch' in sys.modules)")
    done = run_job([sys.executable, "-c", code], timeout=120)
    assert done.stdout.split() == ["1", "False"], done.stderr[-2000:]
    r = cli("run", "tiny-ep4", "--trace", short, "--steps", "100")
    assert r.code == 2 and r.err.splitlines() == [
        f"error: --steps 100: the trace {short} has 24 steps; pass --steps 24 or less, or drop --steps to replay the "
        "whole trace"]
    assert "rank" not in r.err
    assert set(Path("/tmp").glob(f"hotsplit-ep-o{os.getpid()}.*")) == before


def test_ctrl_c_keeps_the_summary_log_and_plot_so_far_as_a_single_rank_run_does(tmp_path):
    """Ctrl-C at the plain launcher: every rank stops at the same window, rank 0 prints the
    summary so far, writes --log-jsonl and --plot, and says once what it wrote; exit 130, no torch
    log line, no traceback, no rank left."""
    import subprocess

    from tests.cli.test_run_ep import REPO
    from tests.runtime.ep.harness import env_for_ranks

    tag, log, png = uuid.uuid4().hex, tmp_path / "ep.jsonl", tmp_path / "ep.png"
    proc = subprocess.Popen([*HOTSPLIT, "run", "tiny-ep4", "--steps", "100000", "--log-jsonl", str(log),
                             "--plot", str(png)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_for_ranks(tag), cwd=REPO, start_new_session=True)
    try:
        deadline, head = time.monotonic() + 200, []
        for line in proc.stdout:  # the header, then the first window's line: every rank is stepping
            head.append(line)
            if line.startswith("step ") or time.monotonic() > deadline:
                break
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        out, err = proc.communicate(timeout=90)
        out = "".join(head) + out
        lines = [x for x in err.splitlines() if "interrupted" in x]
        assert proc.returncode == 130 and len(lines) == 1, err[-3000:]
        records = len(log.read_text().splitlines())
        assert records >= 1 and png.stat().st_size > 0
        assert lines[0].startswith("error: interrupted at step ") and lines[0].endswith(
            f"of 100000; wrote {log} ({records} records) and {png}"), lines
        assert "(interrupted)" in out and f"plot: {png}" in out
        assert "death signal" not in err and "Traceback" not in err, err[-3000:]
        time.sleep(0.5)
        assert tagged_pids(tag) == []
    finally:
        kill_tagged(tag)


def test_ctrl_c_under_torchrun_says_the_interrupted_line_once_and_keeps_the_log(tmp_path):
    """torchrun passes its SIGINT on to every rank; they stop at the same window and rank 0 says
    the interrupted line once, with the log it wrote (was: four lines and nothing kept). What
    torchrun prints of its own signal after that is torchrun's."""
    import subprocess

    from tests.cli.test_run_ep import REPO, _no_rank_traceback, torchrun
    from tests.runtime.ep.harness import env_for_ranks

    tag, log = uuid.uuid4().hex, tmp_path / "ep.jsonl"
    proc = subprocess.Popen(torchrun(4, ["-m", "hotsplit_cli", "run", "tiny-ep4", "--steps", "100000", "--log-jsonl",
                                         str(log)]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_for_ranks(tag), cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        for line in proc.stdout:
            if line.startswith("step ") or time.monotonic() > deadline:
                break
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=90)
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        records = len(log.read_text().splitlines())
        assert len(lines) == 1 and lines[0].endswith(f"of 100000; wrote {log} ({records} records)"), err[-3000:]
        _no_rank_traceback(err)  # torchrun's own log lines and traceback of its signal remain torchrun's
        time.sleep(0.5)
        assert tagged_pids(tag) == []
    finally:
        kill_tagged(tag)
