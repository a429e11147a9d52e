"""A throwaway PostgreSQL that speaks TLS with a real certificate chain.

`make_ca` and `make_server_cert` call openssl (the binary, as an operator
would) to create a CA and a server certificate signed by it, with the host
names and addresses given as subjectAltNames. `TlsPostgres` starts a
ThrowawayPostgres with `ssl=on` on that certificate and a pg_hba.conf that
refuses every connection that is not TLS (`hostnossl ... reject`), so a
connection that works is a TLS connection. Used by tests/test_postgres_tls.py
and the image tests (tests/image/test_extension_points_image.py).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg

from switchboard.pgtest import ThrowawayPostgres


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=120)


@dataclass
class Ca:
    cert: Path
    key: Path


def make_ca(directory: Path, name: str) -> Ca:
    """A self-signed CA (RSA 2048, 1 day), as `openssl req -x509` makes it."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    return Ca(cert=cert, key=key)


def make_server_cert(directory: Path, ca: Ca, dns: list[str], ips: list[str]) -> tuple[Path, Path]:
    """A server certificate signed by `ca` for the given names and addresses."""
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    ext = directory / "server.ext"
    alt = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips])
    ext.write_text(f"subjectAltName={alt}\nextendedKeyUsage=serverAuth\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\n")
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={dns[0] if dns else ips[0]}",
             "-keyout", str(key), "-out", str(csr), cwd=directory)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
             "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert), cwd=directory)
    return cert, key


class TlsPostgres:
    """PostgreSQL with ssl=on on a certificate from a fresh CA; plain connections refused."""

    def __init__(self, dns: list[str] | None = None, ips: list[str] | None = None) -> None:
        # Its own world-readable directory: the postgres OS user must reach the
        # server files (pytest's tmp_path is private to root).
        directory = Path(tempfile.mkdtemp(prefix="switchboard-pg-tls-"))
        os.chmod(directory, 0o755)
        self.dir = directory
        self.ca = make_ca(directory / "ca", "switchboard-test-ca")
        self.other_ca = make_ca(directory / "other-ca", "some-other-ca")
        cert, key = make_server_cert(directory / "ca", self.ca, dns or ["localhost"], ips or [])
        # The server reads its key as the OS user postgres runs as (an
        # unprivileged one when the suite runs as root) and refuses a key that
        # others can read.
        srv = directory / "server-files"
        srv.mkdir()
        os.chmod(srv, 0o755)
        self.server_cert, self.server_key = srv / "server.crt", srv / "server.key"
        self.server_cert.write_bytes(cert.read_bytes())
        self.server_key.write_bytes(key.read_bytes())
        os.chmod(self.server_cert, 0o644)
        os.chmod(self.server_key, 0o600)
        if os.geteuid() == 0:
            pw = pwd.getpwnam(os.environ.get("SWITCHBOARD_PG_USER", "postgres"))
            for f in (self.server_cert, self.server_key):
                os.chown(f, pw.pw_uid, pw.pw_gid)
        for f in (self.ca.cert, self.other_ca.cert):
            os.chmod(f, 0o644)
        self.pg = ThrowawayPostgres(settings={
            "ssl": "on",
            "ssl_cert_file": str(self.server_cert),
            "ssl_key_file": str(self.server_key),
        })
        self._refuse_plain_connections()

    def _refuse_plain_connections(self) -> None:
        # The superuser's own setup connections (this process) go over TLS too,
        # without verification: they only create databases and roles.
        hba = Path(self.pg._pg.base_dir) / "data" / "pg_hba.conf"  # noqa: SLF001
        rules = hba.read_text()
        hba.write_text("# tests/pg_tls_kit.py: TLS or nothing over TCP\n"
                       "hostnossl all all 0.0.0.0/0 reject\n"
                       "hostnossl all all ::/0 reject\n" + rules.replace("\nhost ", "\nhostssl "))
        with psycopg.connect(self.admin_url(), autocommit=True) as c:
            c.execute("SELECT pg_reload_conf()")

    @property
    def port(self) -> int:
        return self.pg.port

    def admin_url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}?sslmode=require"

    def stop(self) -> None:
        try:
            self.pg.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
