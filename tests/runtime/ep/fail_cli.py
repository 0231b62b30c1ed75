"""`python -m hotsplit_cli` as one rank under torchrun, where rank EP_TEST_FAIL_RANK fails at step 3
with an error of its own (what a missing file or a full disk on one node gives): the job must say
that cause once, and no other rank may print its own line.

argv: the CLI's arguments (`run RECIPE ...`)
"""

import os
import sys

from hotsplit_runtime.engine import Engine

from hotsplit_cli.cli import main
from hotsplit_cli.core.errors import RuntimeFailure

_step = Engine.step


def _failing_step(self, routed):
    if self.step_count == 3 and os.environ["RANK"] == os.environ["EP_TEST_FAIL_RANK"]:
        raise RuntimeFailure("the expert bank's disk went away", "check the node")
    return _step(self, routed)


if __name__ == "__main__":
    Engine.step = _failing_step
    sys.exit(main(sys.argv[1:]))
