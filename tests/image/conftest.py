"""Session fixtures for the image tests: one private container storage, one
debootstrap base and one image build per test session (never cached across
sessions: CI starts from a fresh machine)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kit import Kit, missing_tools  # noqa: E402

_KIT: Kit | None = None


@pytest.fixture(scope="session")
def kit() -> Iterator[Kit]:
    """Fails (never skips) with the reason when this machine cannot build or run images."""
    global _KIT
    missing = missing_tools()
    if missing:
        pytest.fail(
            f"the image tests need {', '.join(missing)} (Debian packages; scripts/test.sh "
            "installs them when run as root)", pytrace=False,
        )
    if os.geteuid() != 0:
        pytest.fail("the image tests build with buildah and run with podman as root "
                    "(as CI does); run scripts/test.sh as root", pytrace=False)
    k = Kit()
    _KIT = k
    try:
        yield k
    finally:
        k.cleanup()


@pytest.fixture(scope="session")
def image(kit: Kit) -> str:
    kit.make_base()
    kit.build()
    return kit.image_ref


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if _KIT is None or not _KIT.figures.build_s:
        return
    terminalreporter.section("switchboard image")
    for line in _KIT.figures.lines():
        terminalreporter.write_line(line)
