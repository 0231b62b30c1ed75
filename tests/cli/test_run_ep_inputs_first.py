"""The EP launcher checks a plan's placement before it starts a rank (was: the error came from
every rank after 12-17 s, naming a random one): the refusal names the input, and no rank starts
(no timed assertion: the measured time is in docs/testing.md).
The trace and --steps checks are in test_run_ep_launcher.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_ranks(monkeypatch):
    """Starting the ranks fails loudly: a refusal must come before."""
    from hotsplit_runtime.distributed import launch

    def launch_local(*_):
        raise AssertionError("the ranks were started")

    monkeypatch.setattr(launch, "launch_local", launch_local)


def _refused(cli, *args):
    r = cli("run", "tiny-ep4", *args)
    assert r.code != 0 and r.out == "", r.err
    assert len(r.err.strip().splitlines()) == 1 and "rank " not in r.err.split(";")[0], r.err
    return r.err.strip()


def test_a_plan_whose_placement_is_gone_is_refused_before_the_ranks(cli, tmp_path, no_ranks):
    hist, place, plan = tmp_path / "h.json", tmp_path / "place.json", tmp_path / "p.json"
    assert cli("balance", "tiny", "--steps", "2", "-o", hist).code == 0
    assert cli("place", hist, "--recipe", "tiny-ep4", "--ranks", "4", "-o", place).code == 0
    assert cli("plan", hist, "--recipe", "tiny-ep4", "--placement", place, "-o", plan).code == 0
    place.unlink()
    err = _refused(cli, "--plan", plan)
    assert err.startswith(f"error: {plan}: its placement ") and "cannot be read" in err, err
