"""`hotsplit run` hands its ranks one request, and a rank the plain launcher starts is the
runtime's own entry point (`python -m hotsplit_runtime.rank REQUEST_FILE`), not the CLI again."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from hotsplit_cli.cli import main
from tests.runtime.ep.harness import kill_tagged, tagged_pids


@pytest.fixture
def launched(monkeypatch):
    from hotsplit_runtime.distributed import launch, refusal

    for k in refusal.GROUP_ENV:
        monkeypatch.delenv(k, raising=False)
    calls = []
    monkeypatch.setattr(launch, "launch_local", lambda nproc, request, *_: calls.append((nproc, request)))
    return calls


def test_the_ranks_are_launched_with_this_commands_request(launched):
    assert main(["run", "tiny-ep4", "--steps", "3", "--ep-exchange", "allgather", "--json"]) == 0
    [(nproc, request)] = launched
    assert nproc == 4 and request.recipe.name == "tiny-ep4" and request.steps == 3
    assert request.knobs.ep_exchange == "allgather" and request.plan is None and request.scale is None


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def test_ps_shows_the_ranks_as_the_runtimes_rank_module():
    """During a plain EP run, every rank is `python -m hotsplit_runtime.rank <job folder>/request.pkl`."""
    from tests.cli.test_run_ep import _start_long_run

    tag = uuid.uuid4().hex
    proc = _start_long_run(tag)
    try:
        ranks = [_cmdline(p) for p in tagged_pids(tag) if p != proc.pid]
        ranks = [c for c in ranks if c]
        assert len(ranks) == 4, ranks
        for argv in ranks:
            assert argv[1:3] == ["-m", "hotsplit_runtime.rank"], argv
            assert argv[3].endswith("/request.pkl") and "hotsplit_cli" not in " ".join(argv), argv
        assert "hotsplit_cli" in " ".join(_cmdline(proc.pid))  # the launcher is the command
    finally:
        kill_tagged(tag)
        proc.wait(timeout=60)
