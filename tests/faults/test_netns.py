"""The namespace fixture itself: a replica whose only way to PostgreSQL is a veth pair.

Proves the plumbing the scenarios rely on: the replica in the namespace is
ready through the proxies; a DROP partition inside the namespace turns its
readiness to 503 while the test can still reach its HTTP port; the host's
own loopback Postgres is not reachable from inside at all; healing brings it
back without anyone touching the replica.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from faultkit import ReadyProbe
from hakit import wait_until

pytestmark = pytest.mark.faults


def test_namespace_sees_postgres_only_through_the_veth(fault_cluster, pg) -> None:  # type: ignore[no-untyped-def]
    fc = fault_cluster(local=0)
    iso = fc.start_isolated()
    # loopback Postgres is not reachable from inside the namespace (its own loopback)
    port = fc.pg_addr[1]
    r = subprocess.run(iso.ns.prefix() + [sys.executable, "-c",
                       f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "refused" in r.stderr.lower(), r.stderr
    assert iso.pool.stats()["connections"] >= 1 and iso.listen.stats()["connections"] >= 1

    probe = ReadyProbe(iso.server)
    probe.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    iso.partition("drop")
    assert wait_until(lambda: probe.samples and probe.samples[-1][1] == 503, 15), probe.samples[-5:]
    t_503 = probe.first(lambda c: c == 503, t0)
    assert iso.ns.dropped_packets() > 0
    t1 = time.monotonic()
    iso.heal()
    assert wait_until(lambda: probe.samples[-1][1] == 200, 30), iso.server.log()
    t_back = probe.first(lambda c: c == 200, t1)
    probe.stop()
    print(f"\nnetns replica: readiness 503 after {t_503:.2f} s of partition, 200 again {t_back:.2f} s "
          f"after the heal", flush=True)
