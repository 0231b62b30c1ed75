"""`python -m hotsplit_cli` as one rank under torchrun, where rank 0 is slow on purpose: it sleeps
EP_TEST_RANK0_DELAY_S seconds before it starts, so every other rank refuses a bad value well
before rank 0 can. The job must still say rank 0's one line (a launcher that sees the first rank
exit stops the others: without waiting for rank 0, its line would never come).

argv: the CLI's arguments (`run RECIPE ...`)
"""

import os
import sys
import time

from hotsplit_cli.cli import main

if __name__ == "__main__":
    if os.environ.get("RANK") == "0":
        time.sleep(float(os.environ["EP_TEST_RANK0_DELAY_S"]))
    sys.exit(main(sys.argv[1:]))
