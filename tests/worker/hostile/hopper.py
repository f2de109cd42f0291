"""A fork-and-exit "hopper" for the red-team suite: each process forks and exits at once, so the
live process is never where a scan of /proc saw it. It appends a line to BEAT every 20 hops, so a
test can tell whether anything of it still runs.

argv: BEAT [SECONDS]. Safety valve: every hop stops once SECONDS (default 60) have passed since
the first one, or once BEAT's folder holds a file named `stop`, so a failed test cannot leave it
running for long. Standard library only."""

from __future__ import annotations

import os
import sys
import time


def hop(beat: str, deadline: float) -> None:
    stop = os.path.join(os.path.dirname(beat), "stop")
    hops = 0
    while time.time() < deadline and not os.path.exists(stop):
        if os.fork() != 0:
            os._exit(0)  # the parent leaves; the child carries on
        hops += 1
        if hops % 20 == 0:
            try:
                with open(beat, "a") as handle:
                    handle.write(f"{os.getpid()}\n")
            except OSError:
                pass
    os._exit(0)


def main() -> None:
    beat = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    if os.fork() == 0:
        os.setsid()
        hop(beat, time.time() + seconds)


if __name__ == "__main__":
    main()
