"""Start small EP jobs on loopback for the tests, bounded in time, leaving no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
JOB_TIMEOUT_S = 240  # a few tiny steps on 4 ranks of a loaded 2-core machine
# The ranks' device: the CPU in the suite; scripts/gpu_checks.sh sets cuda, so the same tests run
# with every rank on the one GPU (gloo moves the exchange through host memory).
EP_TEST_DEVICE = os.environ.get("HOTSPLIT_TEST_EP_DEVICE", "cpu")


def tiny_ep_recipe(path: Path, ep: int, **over) -> Path:
    """A very small synthetic MoE for EP tests: 2 MoE layers of 8 experts, top 2, hidden 32."""
    doc = {
        "name": "tiny-ep-test",
        "model": {"kind": "synthetic", "hidden_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 3,
                  "first_k_dense": 1, "num_experts": 8, "top_k": 2, "num_shared_experts": 1, "router": "softmax",
                  "expert_dtype": "bf16", "total_params": 1.0e5},
        "parallel": {"tp": 1, "ep": ep},
        "hardware": {"gpu": "cpu-test", "gpu_mem_gib": 0.5},
        "traffic": {"kind": "synthetic", "batch": 5, "skew": 1.2, "seed": 3},
        "run": {"steps": 6, "device": EP_TEST_DEVICE, "seed": 1},
        "hotsplit": {"hot_gib": 3072 / 2**30, "dynamic": 1, "dyn_steps": 2, "dyn_max_swaps": 1, "dyn_margin": 1.0,
                     "vram_reserve_gib": 0.0},
    }
    for key, value in over.items():
        section, name = key.split(".")
        doc[section][name] = value
    path.write_text(yaml.safe_dump(doc))
    return path


TAG = "HOTSPLIT_TEST_JOB"  # every process of a test job carries it, so none escapes the cleanup


def env_for_ranks(tag: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("HOTSPLIT_EP_ERROR_DIR", None)
    env["OMP_NUM_THREADS"] = "1"
    env[TAG] = tag or uuid.uuid4().hex
    return env


def tagged_pids(tag: str) -> list[int]:
    """Live processes started for the job `tag` (the launcher's ranks run in sessions of their
    own, so a process group would miss them)."""
    pids = []
    needle = f"{TAG}={tag}".encode()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            zombie = (p / "stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
            if not zombie and needle in (p / "environ").read_bytes().split(b"\0"):
                pids.append(int(p.name))
        except OSError:
            pass
    return pids


def kill_tagged(tag: str) -> None:
    for pid in tagged_pids(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_job(args: list[str], timeout: float = JOB_TIMEOUT_S, env: dict | None = None,
            cwd=None) -> subprocess.CompletedProcess:
    """Run a job; on a timeout, or whatever happens, kill every process of it."""
    env = env or env_for_ranks()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd or REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tagged(env[TAG])
        out, err = proc.communicate()
        raise AssertionError(f"{args} did not finish in {timeout} s:\n{err[-3000:]}") from None
    finally:
        kill_tagged(env[TAG])  # nothing of the job may outlive it
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def assert_group_gone() -> None:
    """In a rank, after it left its group: no gloo thread of the group is left. A group kept
    alive past `destroy_process_group` keeps its threads, and one that drops a collective's last
    tensor while the interpreter shuts down aborts the rank (launch.join)."""
    names = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")]
    left = [n for n in names if "gloo" in n]
    assert not left, f"the process group outlived destroy_process_group: its threads {left} are still running"


def torchrun(nproc: int, script_args: list[str], extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            *(extra or []), *script_args]
