"""The derived-image way to add handler packages, executed as docs/how-to/operations/extending.md writes it.

The Dockerfile is read from the operations doc ("A derived image", docs/how-to/operations/extending.md), its FROM
pointed at the image this run built, and built with buildah over a context holding
examples/handler_package's wheel in dist/, as the doc says. The result must run as
the same unprivileged user on a read-only root and find `example.greet` through the
package's `switchboard.handlers` entry point, the way `switchboard serve` loads
handlers (handlers.load_handlers). The init-container way is
test_extension_points_image.py; together they are both documented ways.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from harness import ROOT
from kit import RUN_FLAGS, Kit

pytestmark = [pytest.mark.slow, pytest.mark.image]

DOC = ROOT / "docs" / "how-to" / "operations" / "extending.md"
EXAMPLE = ROOT / "examples" / "handler_package"

PROBE = """
import json, os
from switchboard.handlers import HandlerRegistry, discover_entry_points
names = discover_entry_points(HandlerRegistry())
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "names": names}))
"""


def documented_dockerfile() -> str:
    text = DOC.read_text()
    at = text.index("**A derived image**")
    m = re.search(r"```dockerfile\n(.*?)```", text[at:], re.S)
    assert m, "docs/how-to/operations/extending.md: the derived-image Dockerfile block is gone"
    return m.group(1)


def test_the_documented_derived_image_serves_the_package_handlers(
    kit: Kit, image: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    dockerfile = documented_dockerfile()
    assert dockerfile.startswith("FROM registry.example.com/switchboard:"), dockerfile
    context = tmp_path_factory.mktemp("derived-image")
    src = tmp_path_factory.mktemp("handler-src") / "pkg"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("dist", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--wheel-dir", str(context / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300)
    assert list((context / "dist").glob("*.whl"))
    (context / "Dockerfile").write_text(re.sub(r"^FROM \S+", f"FROM {image}", dockerfile, count=1))
    ref = f"localhost/switchboard-with-handlers:{kit.tag}"
    kit.buildah("bud", "--isolation", "chroot", "--layers=false", "-f", str(context / "Dockerfile"),
                "-t", ref, str(context), timeout=600, what="buildah bud (the derived image of docs/how-to/operations/extending.md)")

    out = kit.podman("run", "--rm", *RUN_FLAGS, "--read-only", "--tmpfs", "/tmp", "--entrypoint", "python",
                     ref, "-c", PROBE, timeout=120, what="podman run (derived image)").stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["uid"] == 10001 and got["gid"] == 10001, got  # the doc's USER line puts it back
    assert "example.greet" in got["names"], got
    # The server itself still starts from the derived image (its entrypoint is unchanged).
    version = kit.podman("run", "--rm", *RUN_FLAGS, "--read-only", "--tmpfs", "/tmp", ref, "--version",
                         timeout=120, what="podman run --version (derived image)").stdout
    assert version.startswith("switchboard "), version
