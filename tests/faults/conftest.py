"""Fixtures for tests/faults: network namespaces, fault proxies, a mixed cluster.

- ``netns``: a factory for NetNS (faultnet.py); every namespace and veth pair is
  deleted at teardown. Where the kernel refuses namespaces the test fails with
  the kernel's answer (not a skip: on the CI machine they must work).
- ``fault_cluster``: a factory for FaultCluster (faultkit.py): N ordinary
  replicas on loopback (the HA suite's Trio) plus replicas in namespaces that
  reach PostgreSQL only through fault proxies.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ha"))   # hakit: the shared replica kit

from faultnet import NamespaceRefused, NetNS  # noqa: E402


@pytest.fixture
def netns() -> Iterator[Callable[[], NetNS]]:
    made: list[NetNS] = []

    def make() -> NetNS:
        ns = NetNS()
        made.append(ns)
        try:
            return ns.create()
        except NamespaceRefused as exc:
            pytest.fail(f"tests/faults cannot run here: {exc}", pytrace=False)

    yield make
    for ns in made:
        ns.destroy()


@pytest.fixture
def fault_cluster(db, netns, tmp_path):  # type: ignore[no-untyped-def]
    from faultkit import FaultCluster

    made: list[FaultCluster] = []

    def make(local: int = 2, env: dict[str, str] | None = None,
             local_env: dict[str, str] | None = None) -> FaultCluster:
        fc = FaultCluster(db, tmp_path, netns, env=env)
        made.append(fc)
        fc.start_local(local, local_env)
        return fc

    yield make
    for fc in made:
        fc.close()
