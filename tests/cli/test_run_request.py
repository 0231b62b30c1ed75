"""`hotsplit run` hands its ranks one request: the launcher gets this very command line."""

from __future__ import annotations

import pytest

from hotsplit_cli.cli import main


@pytest.fixture
def launched(monkeypatch):
    from hotsplit_runtime.distributed import launch

    for k in launch.GROUP_ENV:
        monkeypatch.delenv(k, raising=False)
    calls = []
    monkeypatch.setattr(launch, "launch_local", lambda nproc, argv, *_: calls.append((nproc, argv)))
    return calls


def test_the_ranks_are_launched_with_this_command_line(launched):
    argv = ["run", "tiny-ep4", "--steps", "3", "--json"]
    assert main(list(argv)) == 0
    assert launched == [(4, argv)]

