"""Joining or launching the ranks of an expert-parallel run, and turning a failure into one line
(docs/runtime.md, "Expert parallelism" and its "Failures"). Under torchrun a process joins its
group; started plainly, torch's elastic agent runs N x `python -m hotsplit_runtime.rank
REQUEST_FILE` and stops every rank when one exits or dies. NCCL when every rank of the node has
its own GPU, else gloo, with a gloo control group for counts; every collective is bounded by
COLLECTIVE_TIMEOUT_S."""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import json
import logging
import os
import pickle
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import numpy as np
import torch
import torch.distributed as dist

# Before any group exists: torch.distributed.nn binds `group.WORLD` as a default argument when
# imported (transformers does, building a checkpoint's model); that keeps the group and its gloo
# threads past destroy_process_group, and a rank that exits with them running can abort.
import torch.distributed.nn  # noqa: F401

from hotsplit_cli.core.errors import HotsplitError, Interrupted, RuntimeFailure, StdoutClosed

from ..request import RunRequest, RunResult, Watch
from .channel import LauncherTail
from .interrupt import forward_interrupts, stop_at_next_window
from .leftovers import SHM_DIR, log_folder
from .shared_bank import remove_leftovers

COLLECTIVE_TIMEOUT_S = 120  # one collective (a step's exchange, the summary) waits at most this long
ERROR_DIR_ENV = "HOTSPLIT_EP_ERROR_DIR"  # set by the launcher: ranks write their error here
LAUNCHER_PID_ENV = "HOTSPLIT_EP_LAUNCHER_PID"  # set by the launcher: the parent its ranks die with
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STARTED_ENV = "HOTSPLIT_EP_STARTED"  # set by the launcher: when the job started (time.time()), for progress
_PROCESS_STARTED = time.time()  # a rank under another launcher counts from its own start
REQUEST_FILE = "request.pkl"  # in the job's folder: the RunRequest every rank runs


@dataclass
class Group:
    """This rank's place in the job. `node`: index of its node, `job`: the run's id."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node: int
    job: str
    backend: str
    control: object | None = None  # gloo group for counts and flags (None: the world group is gloo)

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def summed(self, counts: np.ndarray) -> np.ndarray:
        """Collective: every rank's counts summed (exact integers in float64)."""
        total = torch.from_numpy(np.asarray(counts, dtype=np.float64).copy())
        dist.all_reduce(total, group=self.control)
        return total.numpy()


def join(environ=os.environ) -> Group:
    """Join the group the launcher set up (bounded by COLLECTIVE_TIMEOUT_S)."""
    rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    local_rank = int(environ["LOCAL_RANK"])
    local_world = int(environ.get("LOCAL_WORLD_SIZE", 1))
    node = int(environ.get("GROUP_RANK", rank // max(local_world, 1)))
    # Unique per job on a machine (a static rendezvous names every run "none"), the same on every rank.
    job = f"{environ.get('TORCHELASTIC_RUN_ID', 'run')}-{environ['MASTER_ADDR']}-{environ['MASTER_PORT']}"
    # NCCL when each rank of the node has its own GPU, else gloo.
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_world else "gloo"
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    if rank == 0:  # progress through the silent seconds of set-up (stderr, as a single rank's bars)
        print(f"expert parallel: {world} ranks joined ({backend}) after {seconds_since_start(environ):.1f} s; "
              "building their banks", file=sys.stderr, flush=True)
    return Group(rank, world, local_rank, local_world, node, job, backend, control)


def seconds_since_start(environ=os.environ) -> float:
    """Seconds since the job started: since the launcher did, or since this process did."""
    return time.time() - float(environ.get(STARTED_ENV, _PROCESS_STARTED))


def die_with_launcher(environ=os.environ) -> bool:
    """In a rank: SIGKILL when the launcher dies (a rank runs in a session of its own, and one waiting
    in a collective runs no Python handler). False where prctl is not there (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    expected = int(environ.get(LAUNCHER_PID_ENV, 0) or 0)
    if os.getppid() == 1 or (expected and os.getppid() != expected):  # the launcher is gone already
        os._exit(128 + int(signal.SIGKILL))
    return True


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- a rank's error, for the launcher ----------------------------------------------------------


class ReportedElsewhere(HotsplitError):
    """A rank's error, written for the launcher, which prints the job's one error line."""

    def __init__(self, exit_code: int):
        super().__init__("")
        self.exit_code = exit_code


def is_peer_loss(exc: BaseException) -> bool:
    """A collective failed because another rank went away (gloo: connection closed or reset)."""
    text = str(exc).lower()
    return isinstance(exc, dist.DistError) or any(w in text for w in (
        "connection closed", "connection reset", "broken pipe", "gloo", "timed out", "peer"))


def report_rank_error(rank: int, exc: BaseException, environ=os.environ) -> None:
    """Re-raise `exc` as the CLI would show it; under this launcher write it to the launcher's folder
    instead, under torchrun said by the rank that claims it (`_claim_report`), the others quiet."""
    folder = environ.get(ERROR_DIR_ENV)
    if isinstance(exc, StdoutClosed):  # under torchrun, rank 0's reader went away (`| head`): a quiet 141
        _claim_report("error")  # the ranks that lose their peer over it say nothing
        raise exc
    if isinstance(exc, KeyboardInterrupt):
        if folder:
            raise ReportedElsewhere(130) from None
        raise exc
    if isinstance(exc, HotsplitError):
        line, code, kind = exc.render(), exc.exit_code, "error"
    else:
        kind = "peer" if is_peer_loss(exc) else "error"
        line, code = f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", 1
    if not folder:
        if not _claim_report(kind):
            raise ReportedElsewhere(code) from None
        world = dist.get_world_size() if dist.is_initialized() else int(environ.get("WORLD_SIZE", 1))
        who = f"rank {rank} of {world}" + (" lost its peers" if kind == "peer" else "")
        if isinstance(exc, HotsplitError):
            err = RuntimeFailure(f"{who}: {exc.message}", exc.hint)
            err.exit_code = code
        else:
            err = RuntimeFailure(f"{who}: {line[len('error: '):]}", "every rank was stopped")
        _tell_torchelastic(err.render(), environ)
        raise err from None
    _write_report(folder, rank, line, kind, code)
    raise ReportedElsewhere(code) from None


def _write_report(folder: str, rank: int, line: str, kind: str, exit_code: int) -> None:
    """A rank's report for the launcher, whole or not at all (written, then renamed)."""
    tmp = Path(folder) / f".rank{rank}.json"
    tmp.write_text(json.dumps({"rank": rank, "line": line, "kind": kind, "exit_code": exit_code, "time": time.time()}))
    tmp.rename(Path(folder) / f"rank{rank}.json")


def _tell_torchelastic(line: str, environ) -> None:
    """This line in torchrun's failure report, instead of its hint to enable tracebacks
    (TORCHELASTIC_ERROR_FILE, torch's error-file format)."""
    path = environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    doc = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}
    try:
        Path(path).write_text(json.dumps(doc))
    except OSError:
        pass


REPORT_KEY = "hotsplit/error-reported"  # in the group's store: how many ranks claimed the job's error line
PEER_GRACE_S = 3.0  # a rank that only lost its peers waits this long for the rank with the cause to claim


def _claim_report(kind: str) -> bool:
    """Whether this rank says the job's error line under torchrun: the first claim counted in the
    agent's store (it outlives a dead rank), a rank that only lost its peers PEER_GRACE_S late.
    Without an answering store it says it: a repeated line is better than none."""
    if not dist.is_initialized():
        return True
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=5))
        if kind == "peer":
            time.sleep(PEER_GRACE_S)
        return store.add(REPORT_KEY, 1) == 1
    except Exception:  # noqa: BLE001 - the store went with the job: say the line
        return True


# ---- the local launcher ---------------------------------------------------------------------------


def launch_local(nproc: int, request: RunRequest, watch: Watch, started: float | None = None) -> RunResult:
    """Run `request` as `nproc` local ranks under torch's elastic agent, rank 0's events to `watch`:
    rank 0's result, or one HotsplitError. `started`: the job's start (time.time()), for progress."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # the agent's own chatter; failures are ours to say
    job, folder = f"hotsplit-{os.getpid()}-{uuid.uuid4().hex[:8]}", log_folder(os.getpid())
    ranks = dataclasses.replace(request, replay=None)  # each rank reads the trace itself, not through the file
    (Path(folder) / REQUEST_FILE).write_bytes(pickle.dumps(ranks))
    logs = DefaultLogsSpecs(log_dir=folder, redirects={r: Std.ALL for r in range(1, nproc)})
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=job, rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.1, logs_specs=logs,
                          signals_to_handle="SIGTERM,SIGHUP,SIGQUIT")  # SIGINT is forward_interrupts
    env = {ERROR_DIR_ENV: folder, LAUNCHER_PID_ENV: str(os.getpid()),
           STARTED_ENV: repr(time.time() if started is None else started)}
    try:
        # The ranks inherit the launcher's environment; patch.dict restores it after.
        with patch.dict(os.environ, env), LauncherTail(folder, watch) as tail, forward_interrupts():
            elastic_launch(config, sys.executable)("-m", "hotsplit_runtime.rank", str(Path(folder) / REQUEST_FILE))
    except ChildFailedError as exc:
        if tail.error is not None:  # the launcher's own output failed (`| head`): it stopped the ranks
            raise tail.error from None
        raise job_failure(exc.failures, folder, nproc) from None
    except (SignalException, KeyboardInterrupt):
        if tail.error is not None:  # the launcher's own output failed: it stopped the ranks
            raise tail.error from None
        raise Interrupted(f"interrupted: all {nproc} ranks were stopped", "nothing was written") from None
    finally:
        remove_leftovers(SHM_DIR, job)
        shutil.rmtree(folder, ignore_errors=True)
    if tail.error is not None:
        raise tail.error
    return tail.result


def job_failure(failures: dict, folder: str, nproc: int) -> HotsplitError:
    """The one error of a failed job: `failures` maps rank -> torch's ProcessFailure."""
    reports = {}
    for p in Path(folder).glob("rank*.json"):
        try:
            doc = json.loads(p.read_text())
            reports[int(doc["rank"])] = doc
        except (OSError, ValueError, KeyError):
            continue
    stop = "every rank was stopped"
    killed = [(r, f) for r, f in sorted(failures.items())
              if f.signal_name() not in ("<N/A>", "SIGTERM", "SIGINT") and r not in reports]
    if killed:
        r, f = killed[0]
        return RuntimeFailure(f"rank {r} of {nproc} was killed by {f.signal_name()}", stop)
    errors = sorted((d for d in reports.values() if d["kind"] == "error"), key=lambda d: d["time"])
    if errors:
        d = errors[0]
        err = RuntimeFailure(f"rank {d['rank']} of {nproc}: {d['line'][len('error: '):]}", stop)
        err.exit_code = int(d.get("exit_code", 1))
        return err
    silent = [(r, f) for r, f in sorted(failures.items()) if r not in reports and f.exitcode not in (0, None)
              and f.signal_name() in ("<N/A>",)]
    if silent:
        r, f = silent[0]
        return RuntimeFailure(f"rank {r} of {nproc} exited with code {f.exitcode}{_last_line(folder, r)}", stop)
    if reports:
        d = min(reports.values(), key=lambda d: d["time"])
        return RuntimeFailure(f"rank {d['rank']} of {nproc} lost its peers: {d['line'][len('error: '):]}", stop)
    r, f = sorted(failures.items())[0]
    return RuntimeFailure(f"rank {r} of {nproc} failed (exit code {f.exitcode})", stop)


def _last_line(folder: str, rank: int) -> str:
    """`: <last line of the rank's stderr>` from the agent's log folder, or ''."""
    for p in Path(folder).rglob("stderr.log"):
        if p.parent.name == str(rank):
            lines = [x for x in p.read_text(errors="replace").splitlines() if x.strip()]
            return f": {lines[-1].strip()[:200]}" if lines else ""
    return ""


def stop_on_signal() -> None:
    """In a rank: SIGTERM (the agent stopping the job) ends it at once, quietly; SIGINT stops the
    job at its next window (interrupt.py)."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    stop_at_next_window()
