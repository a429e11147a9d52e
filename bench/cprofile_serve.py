#!/usr/bin/env python3
"""`switchboard serve` under cProfile with a CPU-time clock (time.process_time).

    python bench/cprofile_serve.py OUT.pstats serve --host ... --port ...

py-spy samples wall-clock time: on a loaded 2-core box a replica that writes a
query to a loopback socket is often preempted in that very call (the backend it
woke takes the core), so the send shows up as most of the "busy" samples
although it costs little CPU. Profiling on process time attributes only what
the replica itself executes (bench/profile_jobs.py --cprofile uses this). The
stats are written when the server exits (SIGTERM: uvicorn's graceful stop).
"""

from __future__ import annotations

import cProfile
import sys
import time

from switchboard import cli


def main() -> None:
    out = sys.argv[1]
    sys.argv = ["switchboard", *sys.argv[2:]]
    prof = cProfile.Profile(time.process_time)
    try:
        prof.runcall(cli.main)
    except SystemExit:
        pass
    finally:
        prof.dump_stats(out)


if __name__ == "__main__":
    main()
