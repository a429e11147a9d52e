"""The server's own limits (issue 21): per-user tickets, the connection cap, the header cap.

docs/explanation/security.md lists them as the defence against floods by one user and slow
or many connections. Each is exercised against a real replica with small values,
and each refusal must be an RFC 9457 body like every other error -- including the
two that uvicorn answers before the app sees the request (http/protocol.py).
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from harness import auth, make_user

ENV = {
    "SWITCHBOARD_LOGIN_IP_BURST": "1000000", "SWITCHBOARD_LOGIN_IP_RATE": "1000000",
    "SWITCHBOARD_LOGIN_USER_BURST": "1000000", "SWITCHBOARD_LOGIN_USER_RATE": "1000000",
}
PW = "pw-" + "s" * 12


def login(base: str, username: str) -> dict[str, str]:
    r = httpx.post(base + "/auth/login", json={"username": username, "password": PW}, timeout=10)
    assert r.status_code == 200, r.text
    return auth(r.json()["access_token"])


def raw(port: int, data: bytes) -> tuple[int, dict[str, str], dict]:
    """Send bytes as they are; read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def assert_problem(status: int, headers: dict[str, str], body: dict, expect: int) -> None:
    assert status == expect, (status, headers, body)
    assert headers["content-type"] == "application/problem+json", headers
    assert body["status"] == expect and body["type"].startswith("https://switchboard.dev/problems/"), body
    assert body["detail"], body


def test_tickets_are_limited_per_user(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "alice", PW)
    make_user(db, "bob", PW)
    s = server_factory(env={**ENV, "SWITCHBOARD_WS_TICKET_RATE": "0.01", "SWITCHBOARD_WS_TICKET_BURST": "3"})
    alice, bob = login(s.base, "alice"), login(s.base, "bob")
    codes = [httpx.post(s.base + "/ws/ticket", headers=alice, timeout=10).status_code for _ in range(3)]
    assert codes == [201, 201, 201]
    r = httpx.post(s.base + "/ws/ticket", headers=alice, timeout=10)
    assert r.status_code == 429, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert int(r.headers["retry-after"]) >= 1
    # The bucket is alice's: bob still gets his, and alice's refusal opened nothing.
    assert httpx.post(s.base + "/ws/ticket", headers=bob, timeout=10).status_code == 201


def test_connection_cap_answers_503_problem_json_and_recovers(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    s = server_factory(env={**ENV, "SWITCHBOARD_LIMIT_CONCURRENCY": "16"})
    assert httpx.get(s.base + "/healthz/ready", timeout=10).status_code == 200
    idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(20)]
    try:
        status, headers, body = (0, {}, {})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the idle connections are registered as they are accepted
            status, headers, body = raw(s.port, b"GET /healthz/live HTTP/1.1\r\nHost: x\r\n\r\n")
            if status == 503:
                break
            time.sleep(0.1)
        assert_problem(status, headers, body, 503)
        assert headers["retry-after"] == "1"
    finally:
        for c in idle:
            c.close()
    deadline = time.monotonic() + 20
    while httpx.get(s.base + "/healthz/ready", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the replica did not recover after the connections closed"
        time.sleep(0.1)


@pytest.mark.parametrize("what", ["header over the cap", "malformed request line"])
def test_parser_refusals_are_400_problem_json(server_factory, db: str, what: str) -> None:  # type: ignore[no-untyped-def]
    s = server_factory(env={**ENV, "SWITCHBOARD_MAX_HEADER_BYTES": "4096"})
    if what == "header over the cap":
        # Still arriving (no blank line yet) and already past the cap: a slow client
        # cannot make the replica buffer it. (A complete header block in one read is
        # parsed whole; the cap bounds what is held while waiting for the rest.)
        data = b"GET /healthz/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000
    else:
        data = b"GET /healthz/live HTTP/1.1 extra\r\nHost: x\r\n\r\n"
    assert_problem(*raw(s.port, data), 400)
    assert httpx.get(s.base + "/healthz/ready", timeout=10).status_code == 200


def read_until_closed(sock: socket.socket, limit: float) -> tuple[bytes, float]:
    t0 = time.monotonic()
    sock.settimeout(limit)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out, time.monotonic() - t0


def parse(out: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_slow_headers_and_bodies_time_out_with_408(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    """A slowloris client cannot hold a connection slot for ever: a request head not
    complete within SWITCHBOARD_HEADER_TIMEOUT (first request, and the next one on a
    keep-alive connection) and a JSON body not within SWITCHBOARD_BODY_TIMEOUT are
    answered 408 problem+json and the connection closes; a connection that sends
    nothing is closed without an answer. (Generous read limits: the product promises
    the close, not its exact moment.)"""
    s = server_factory(env={**ENV, "SWITCHBOARD_HEADER_TIMEOUT": "1", "SWITCHBOARD_BODY_TIMEOUT": "1",
                            "SWITCHBOARD_KEEPALIVE_TIMEOUT": "30"})
    trickle = b"GET /healthz/live HTTP/1.1\r\nHost: x\r\nX-Slow: "
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(trickle)
        out, took = read_until_closed(sock, 30)
    assert_problem(*parse(out), 408)
    assert took < 25, took

    # Keep-alive: one complete request, then a head that never completes.
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz/live HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b"\r\n\r\n" not in first or not first.rstrip().endswith(b"}"):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        sock.sendall(trickle)
        out, _ = read_until_closed(sock, 30)
    assert_problem(*parse(out), 408)

    # Nothing at all: closed, no answer (a browser's spare connection is not an error).
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        out, _ = read_until_closed(sock, 30)
    assert out == b""

    # A body announced and trickled: 408 from the app, as problem+json.
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(b"POST /auth/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"username\":")
        out, _ = read_until_closed(sock, 30)
    status, headers, body = parse(out)
    assert_problem(status, headers, body, 408)
    assert "SWITCHBOARD_BODY_TIMEOUT" in body["detail"], body
    assert httpx.get(s.base + "/healthz/ready", timeout=10).status_code == 200
    text = httpx.get(s.base + "/metrics", timeout=10).text
    assert 'switchboard_bad_input_total{reason="too_slow",source="http"} 1.0' in text, \
        [ln for ln in text.splitlines() if "bad_input" in ln]
