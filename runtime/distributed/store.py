"""The job's key-value store, opened before the ranks join a group (a refusal said once,
hotsplit_cli/commands/_refusal.py): torch's agent store where torchrun's agent holds one, else
the store rank 0 hosts at MASTER_ADDR:MASTER_PORT, as `init_process_group(init_method="env://")`
opens it."""

from __future__ import annotations

import datetime

from torch.distributed import TCPStore


def uses_agent_store(environ) -> bool:
    return environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def open_job_store(environ, rank: int, timeout_s: float) -> TCPStore:
    timeout = datetime.timedelta(seconds=timeout_s)
    host, port = environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    if uses_agent_store(environ):
        return TCPStore(host, port, None, False, timeout, wait_for_workers=False)
    return TCPStore(host, port, None, rank == 0, timeout, wait_for_workers=False, multi_tenant=True)
