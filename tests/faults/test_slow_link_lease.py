"""A lease holds over a slow but working link: every heartbeat answered means no lease lost.

The replica (lease 3 s: margin 0.6 s, a heartbeat every 1 s) reaches PostgreSQL
only through a fault proxy adding 300 ms each way, so every round trip takes at
least 0.6 s. Heartbeats used to be sent "interval after the last answer" and
paid the pool's idle check (a second round trip): proofs were 2.2 s apart and
each answer came 3.4 s after the previous proof was sent -- past its 2.4 s of
proven lease -- so the replica gave up runs it still owned and they ran again.
Now a heartbeat is one round trip sent interval after the previous *send*: its
answer comes about 1.6 s after the last proof, inside the margin. (The bound:
round trips up to lease - margin - interval = 1.4 s at lease 3 s.)
"""

from __future__ import annotations

import json

import pytest
from faultkit import wait_settled

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def test_a_lease_survives_600_ms_round_trips(fault_cluster) -> None:  # type: ignore[no-untyped-def]
    fc = fault_cluster(local=0)        # the slow replica is the only worker
    iso = fc.start_isolated()
    fc.pause_maintenance()
    iso.degrade(latency_ms=300)
    keys = [f"slow{i}" for i in range(3)]
    for k in keys:
        fc.sql("SELECT switchboard.enqueue('faults.work', %s, now(), NULL, 1)", (json.dumps({"k": k, "s": 6}),))
    settled = wait_settled(fc, 90)
    stats = iso.pool.stats()
    out = fc.outcome(keys)
    print(f"\nslow link: 3 jobs of 6 s over 300 ms each way (lease {fc.lease:.0f} s): {out.summary()}; "
          f"proxy delayed {stats['delayed_chunks']} chunks", flush=True)
    assert stats["delayed_chunks"] > 20          # the fault was really there
    assert settled
    assert [e.how for e in out.executions] == ["ok"] * 3, [(e.key, e.how) for e in out.executions]
    assert out.reexecuted == [] and out.lost == [] and out.doubled == []
    runs = fc.sql("SELECT args->>'k', status, attempt FROM switchboard.task_runs "
                  "WHERE handler = 'faults.work' ORDER BY 1")
    assert runs == [(k, "succeeded", 1) for k in keys], runs
