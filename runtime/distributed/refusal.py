"""Whether a launcher started this process as a rank (its environment, no torch), and a refused
flag, knob or recipe value said once for the N ranks of a job under torchrun: rank 0 says it,
the others wait (bounded) and exit without a line. This runs before the ranks join a group, so
it opens the job's store itself (torchrun's agent store, else rank 0's at MASTER_ADDR:MASTER_PORT)."""

from __future__ import annotations

import datetime
import os
import sys
import time

REFUSAL_KEY = "hotsplit/refusal-said"  # in the job's store: rank 0 has printed the job's refusal line
REFUSAL_ACKS = "hotsplit/refusal-read"  # how many other ranks have seen it (rank 0 may host the store)
REFUSAL_WAIT_S = 60.0  # a rank waits at most this long for rank 0's line, then says its own


GROUP_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def in_group(environ=os.environ) -> bool:
    """This process was started by a launcher as one rank of a group."""
    return all(k in environ for k in GROUP_ENV)


def under_launcher(environ=os.environ) -> bool:
    """This process is one of several ranks a launcher started."""
    return int(environ.get("WORLD_SIZE", "1") or 1) > 1 and "MASTER_PORT" in environ and "RANK" in environ


def say_error(line: str, exit_code: int, environ=os.environ) -> None:
    """Print the one error line. Under a launcher every rank is the same command line, so a
    refused flag, knob or recipe value (exit 2) is refused by every rank alike: said once."""
    if exit_code == 2 and under_launcher(environ):
        say_refusal_once(line, environ)
        return
    print(line, file=sys.stderr)


def say_refusal_once(line: str, environ=os.environ) -> None:
    """Rank 0 prints `line` for the job, the others nothing; they may not exit before rank 0 has
    printed it (a launcher that sees a rank fail could stop rank 0 first), so each waits, bounded,
    for rank 0's mark in the job's store. Without an answering store a rank says the line itself."""
    rank, world = int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1))
    try:
        store = _job_store(environ, rank)
    except Exception:  # noqa: BLE001 - no store: every rank says it
        print(line, file=sys.stderr, flush=True)
        return
    prefix = f"{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    if rank == 0:
        print(line, file=sys.stderr, flush=True)
        try:
            store.set(prefix + REFUSAL_KEY, "1")
            if not _agent_store(environ):  # this process hosts the store: keep it until all have read it
                _wait_for(lambda: store.add(prefix + REFUSAL_ACKS, 0) >= world - 1, REFUSAL_WAIT_S)
        except Exception:  # noqa: BLE001 - the others then time out and say it themselves
            pass
        return
    try:
        store.wait([prefix + REFUSAL_KEY], datetime.timedelta(seconds=REFUSAL_WAIT_S))
        store.add(prefix + REFUSAL_ACKS, 1)
    except Exception:  # noqa: BLE001 - rank 0 never said it: say it here
        print(line, file=sys.stderr, flush=True)


def _agent_store(environ) -> bool:
    return environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _job_store(environ, rank: int):
    from torch.distributed import TCPStore  # torch only under a launcher

    timeout = datetime.timedelta(seconds=REFUSAL_WAIT_S)
    host, port = environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    if _agent_store(environ):
        return TCPStore(host, port, None, False, timeout, wait_for_workers=False)
    return TCPStore(host, port, None, rank == 0, timeout, wait_for_workers=False, multi_tenant=True)


def _wait_for(done, limit_s: float) -> None:
    end = time.monotonic() + limit_s
    while not done() and time.monotonic() < end:
        time.sleep(0.05)
