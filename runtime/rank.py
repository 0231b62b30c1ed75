"""A rank the plain launcher starts: `python -m hotsplit_runtime.rank REQUEST_FILE`, the run's
pickled `RunRequest` in the job's folder, where rank 0 sends what the job shows and its result
(distributed/channel.py) and a failure is written for the launcher's one error line."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from hotsplit_cli.core.errors import HotsplitError

from .distributed.channel import RankChannel
from .distributed.job import run_in_group
from .distributed.launch import ReportedElsewhere, report_rank_error


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    request = pickle.loads(path.read_bytes())
    rank = int(os.environ["RANK"])
    channel = RankChannel(path.parent, rank)
    try:
        result = run_in_group(request, channel)
    except ReportedElsewhere as exc:
        return exc.exit_code
    except HotsplitError as exc:  # refused before the rank joined: reported as after
        try:
            report_rank_error(rank, exc)
        except ReportedElsewhere as reported:
            return reported.exit_code
    channel.result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
