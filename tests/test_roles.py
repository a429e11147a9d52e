"""Least-privilege roles: switchboard_publisher, switchboard_reader, switchboard_operator.

Each role's whole privilege set (every function and relation of the schema) is
compared with what it is meant to hold, so a grant added anywhere else fails here;
then login roles granted each one do what they may, and are refused (42501) what
they may not. The last test is the issue's "done when": a Falcon view that saves an
order and, in the same transaction, notifies its user and enqueues the invoice job,
connected as a publisher -- written from the README alone.
"""

from __future__ import annotations

import itertools
import os

import falcon
import falcon.testing
import httpx
import psycopg
import pytest

from harness import make_user
from switchboard import api

PUBLISHER = {
    "switchboard.notify_user(uuid,text,jsonb)", "switchboard.notify_room(text,text,jsonb)",
    "switchboard.enqueue(text,jsonb,timestamp with time zone,text,integer,integer,text)",
    "switchboard.stream_open(uuid,text,jsonb,text,interval,interval)", "switchboard.stream_append(uuid,text[])",
    "switchboard.stream_renew(uuid[])", "switchboard.stream_close(uuid,text,jsonb)",
}
READER = {
    "switchboard.status()", "switchboard.metrics_snapshot()", "switchboard.event_window()",
    "switchboard.list_runs(text,text,text,timestamp with time zone,integer,bigint)",
    "switchboard.known_handlers(text)", "switchboard.partition_health()",
}
OPERATOR = READER | {
    "switchboard.retry_run(bigint)", "switchboard.cancel_run(bigint)", "switchboard.pause_handler(text)",
    "switchboard.resume_handler(text)", "switchboard.stream_stop(uuid,uuid)",
    "switchboard.retry_runs(text,text,text,timestamp with time zone,integer)",
    "switchboard.cancel_runs(text,text,text,timestamp with time zone,integer)",
}
READER_RELATIONS = {("runs", "SELECT"), ("handlers", "SELECT"), ("replicas", "SELECT"), ("partitions", "SELECT")}
_n = itertools.count()


def privileges(c: psycopg.Connection, role: str) -> tuple[set[str], set[tuple[str, str]]]:
    funcs = {r[0] for r in c.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'switchboard'::regnamespace "
        "AND has_function_privilege(%s, p.oid, 'EXECUTE')", (role,))}
    rels = {(r[0], r[1]) for r in c.execute(
        "SELECT c.relname, p FROM pg_class c CROSS JOIN unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE',"
        "'TRUNCATE','REFERENCES','TRIGGER']) p WHERE c.relnamespace = 'switchboard'::regnamespace "
        "AND c.relkind IN ('r','v','m','p','S') AND has_table_privilege(%s, c.oid, p)", (role,))}
    return funcs, rels


def test_each_role_holds_exactly_its_privileges(db: str) -> None:
    with psycopg.connect(db) as c:
        assert privileges(c, "switchboard_publisher") == (PUBLISHER, set())
        assert privileges(c, "switchboard_reader") == (READER, READER_RELATIONS)
        assert privileges(c, "switchboard_operator") == (OPERATOR, READER_RELATIONS)
        for role in ("switchboard_publisher", "switchboard_reader", "switchboard_operator"):
            flags = c.execute("SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls "
                              "FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            assert flags == (False, False, False, False, False), role
        # The replicas' role keeps what it had: the new roles took nothing from it.
        assert PUBLISHER | OPERATOR <= privileges(c, "switchboard_app")[0]


def login(db: str, *roles: str) -> str:
    """A fresh login role granted ``roles``; the URL that connects as it."""
    name = f"sb_login_{os.getpid()}_{next(_n)}"
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(f'CREATE ROLE "{name}" LOGIN')
        for r in roles:
            c.execute(f'GRANT {r} TO "{name}"')
    return db.replace("postgres@", f"{name}@", 1)


def refused(url: str, sql: str, params: tuple = ()) -> str:
    with psycopg.connect(url) as c, pytest.raises(psycopg.errors.InsufficientPrivilege) as ei:
        c.execute(sql, params)
    return str(ei.value)


def test_a_publisher_publishes_in_its_own_transaction_and_can_do_nothing_else(db: str) -> None:
    uid = make_user(db, "pia")
    url = login(db, "switchboard_publisher")
    with psycopg.connect(url) as conn:
        with conn.transaction():
            eid = api.notify_user(conn, uid, "order.saved", {"order": 1})
            rid = api.enqueue(conn, "invoice.send", {"order": 1})
            sid = api.stream_open(conn, uid, "completion")
            api.stream_append(conn, sid, ["a", "b"])
            api.stream_close(conn, sid)
        api.notify_room(conn, "lobby", "news")
    with psycopg.connect(db) as c:
        assert c.execute("SELECT event FROM switchboard.events WHERE id = %s", (eid,)).fetchone() == ("order.saved",)
        assert c.execute("SELECT handler FROM switchboard.task_runs WHERE id = %s", (rid,)).fetchone() == ("invoice.send",)
    # Nothing else: no claim, no ticket, no reading events or users, no operating.
    for sql, params in (
            ("SELECT * FROM switchboard.claim_due_tasks('w', '1 minute', 1)", ()),
            ("SELECT switchboard.issue_ticket_v2(%s, NULL)", (uid,)),
            ("SELECT * FROM switchboard.events_since_v2(%s, 0, 0)", (uid,)),
            ("SELECT switchboard.cancel_run(%s)", (rid,)),
            ("SELECT switchboard.create_user('mallory', 'x')", ()),
            ("SELECT * FROM switchboard.stream_read(%s)", (sid,)),
            ("SELECT * FROM switchboard.status()", ()),
            ("SELECT * FROM switchboard.events", ()),
            ("SELECT * FROM switchboard.task_runs", ()),
            ("INSERT INTO switchboard.task_runs (handler) VALUES ('x')", ())):
        assert "permission denied" in refused(url, sql, params), sql


def test_a_reader_sees_and_an_operator_acts(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        rid = c.execute("SELECT id FROM switchboard.enqueue('mail.send', '{}', now() + interval '1 hour')").fetchone()[0]
    reader, operator = login(db, "switchboard_reader"), login(db, "switchboard_operator")
    for url in (reader, operator):
        with psycopg.connect(url) as c:
            assert c.execute("SELECT status FROM switchboard.runs WHERE id = %s", (rid,)).fetchone() == ("queued",)
            assert dict(c.execute("SELECT item, value FROM switchboard.status()").fetchall())
            assert c.execute("SELECT count(*) FROM switchboard.list_runs(NULL, 'mail.send', NULL, NULL, 10, NULL)"
                             ).fetchone() == (1,)
    assert "permission denied" in refused(reader, "SELECT switchboard.cancel_run(%s)", (rid,))
    assert "permission denied" in refused(reader, "SELECT switchboard.notify_room('r', 'e')")
    assert "permission denied" in refused(operator, "SELECT switchboard.enqueue('x')")
    assert "permission denied" in refused(operator, "SELECT * FROM switchboard.users")
    with psycopg.connect(operator, autocommit=True) as c:
        assert c.execute("SELECT switchboard.pause_handler('mail.send')").fetchone() == (True,)
        assert c.execute("SELECT switchboard.cancel_run(%s)", (rid,)).fetchone() == (True,)
        retried = c.execute("SELECT id FROM switchboard.retry_run(%s)", (rid,)).fetchone()
        assert retried is not None
        assert c.execute("SELECT switchboard.resume_handler('mail.send')").fetchone() == (True,)


# -- the "done when": an order view, as the README tells an app developer -------------
class Orders:
    """POST /orders {"user_id", "total"}: save the order, tell the user, queue the invoice
    -- one transaction (README "From your own Python code")."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = req.get_media()
        with psycopg.connect(self.dsn) as conn, conn.transaction():
            order_id = conn.execute("INSERT INTO shop.orders (user_id, total) VALUES (%s, %s) RETURNING id",
                                    (body["user_id"], body["total"])).fetchone()[0]
            api.notify_user(conn, body["user_id"], "order.saved", {"order": order_id})
            api.enqueue(conn, "invoice.send", {"order": order_id}, queueing_lock=f"invoice-{order_id}")
            if body["total"] < 0:
                raise falcon.HTTPUnprocessableEntity(description="a negative total")   # rolls it all back
        resp.status = falcon.HTTP_201
        resp.media = {"order": order_id}


def test_an_order_view_connected_as_a_publisher(db: str, server_factory) -> None:  # type: ignore[no-untyped-def]
    uid = make_user(db, "oda")
    url = login(db, "switchboard_publisher")
    app_role = url.split("://", 1)[1].split("@", 1)[0]
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("CREATE SCHEMA shop")
        c.execute("CREATE TABLE shop.orders (id bigserial PRIMARY KEY, user_id uuid NOT NULL, total numeric)")
        c.execute(f'GRANT USAGE ON SCHEMA shop TO "{app_role}"')
        c.execute(f'GRANT SELECT, INSERT ON shop.orders TO "{app_role}"')
        c.execute(f'GRANT USAGE ON SEQUENCE shop.orders_id_seq TO "{app_role}"')
    web = falcon.App()
    web.add_route("/orders", Orders(url))
    client = falcon.testing.TestClient(web)
    s = server_factory()
    token = httpx.post(s.base + "/auth/login", json={"username": "oda", "password": "pw-" + "s" * 12}).json()["access_token"]
    ws = s.ws(token)
    try:
        bad = client.simulate_post("/orders", json={"user_id": uid, "total": -1})
        assert bad.status_code == 422
        ok = client.simulate_post("/orders", json={"user_id": uid, "total": 42})
        assert ok.status_code == 201, ok.text
        order = ok.json["order"]
        f = ws.recv_until(lambda f: f.get("event") == "order.saved")
        assert f["payload"] == {"order": order}
    finally:
        ws.conn.close()
    with psycopg.connect(db) as c:
        # The refused order left nothing: no row, no event, no job.
        assert c.execute("SELECT count(*) FROM shop.orders").fetchone() == (1,)
        assert c.execute("SELECT count(*) FROM switchboard.events WHERE event = 'order.saved'").fetchone() == (1,)
        jobs = c.execute("SELECT args FROM switchboard.task_runs WHERE handler = 'invoice.send' "
                            "AND trigger = 'enqueue'").fetchall()   # (a replica retries it: no such handler)
        assert jobs == [({"order": order},)]
