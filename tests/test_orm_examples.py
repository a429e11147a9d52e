"""examples/orm: switchboard.api from Django and from SQLAlchemy, in the ORM's own transaction.

The api's docstring (and docs/how-to/orm.md) say the calls take the driver connection an ORM
holds: Django's ``django.db.connection.connection``, SQLAlchemy's
``session.connection().connection.driver_connection``. Each example is run here as an
application runs it, connected as a login that holds only ``switchboard_publisher`` and
its own table's grants: a rule that fails after the calls leaves no order, no event and
no job (so the calls ran in the ORM's transaction, not beside it), and a committed order
has exactly one event for its user and one queued ``invoice.send`` naming it (so the ORM's
COMMIT committed them).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from harness import ROOT, make_user

sys.path.insert(0, str(ROOT / "examples" / "orm"))

import sqlalchemy_orders  # noqa: E402

_n = itertools.count()


def publisher(db: str) -> str:
    """The app's login: a member of switchboard_publisher (not switchboard_app, not a
    superuser) that owns nothing and may write its own table, public.orders (the columns of
    both examples' Order models). Its URL."""
    name = f"sb_orm_{os.getpid()}_{next(_n)}"
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(f'CREATE ROLE "{name}" LOGIN IN ROLE switchboard_publisher')
        c.execute("CREATE TABLE public.orders (id bigserial PRIMARY KEY, user_id uuid NOT NULL, "
                  "total numeric(12, 2) NOT NULL)")
        c.execute(f'GRANT SELECT, INSERT ON public.orders TO "{name}"')
        c.execute(f'GRANT USAGE ON SEQUENCE public.orders_id_seq TO "{name}"')
        assert c.execute("SELECT rolsuper, pg_has_role(%s, 'switchboard_app', 'MEMBER'), "
                         "pg_has_role(%s, 'switchboard_publisher', 'MEMBER') FROM pg_roles WHERE rolname = %s",
                         (name, name, name)).fetchone() == (False, False, True)
    return db.replace("postgres@", f"{name}@", 1)


def written(db: str, uid: str) -> tuple[list[Any], list[Any], list[Any]]:
    """What another session sees: the orders, the user's events, the invoice jobs."""
    with psycopg.connect(db) as c:
        return (c.execute("SELECT id, user_id::text, total FROM public.orders").fetchall(),
                c.execute("SELECT event, payload FROM switchboard.events WHERE user_id = %s", (uid,)).fetchall(),
                c.execute("SELECT args, status FROM switchboard.task_runs WHERE handler = 'invoice.send' "
                          "AND trigger = 'enqueue'").fetchall())


def all_or_nothing(db: str, uid: str, place: Callable[[Decimal], int]) -> None:
    """A refused order leaves nothing; a placed one leaves its row, one event, one job."""
    with pytest.raises(ValueError, match="total must be positive"):
        place(Decimal("-1"))            # after the inserts and the api calls, inside the block
    assert written(db, uid) == ([], [], [])
    order = place(Decimal("42.00"))
    assert written(db, uid) == ([(order, uid, Decimal("42.00"))],
                                [("order.saved", {"order": order})],
                                [({"order_id": order}, "queued")])


def test_sqlalchemy_session(db: str) -> None:
    uid = make_user(db, "sam")
    engine = create_engine(publisher(db).replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        def place(total: Decimal) -> int:
            with Session(engine) as session:
                return sqlalchemy_orders.place_order(session, uid, total)

        all_or_nothing(db, uid, place)
    finally:
        engine.dispose()


def test_sqlalchemy_async_session(db: str) -> None:
    uid = make_user(db, "ada")
    url = publisher(db).replace("postgresql://", "postgresql+psycopg://", 1)

    async def place(total: Decimal) -> int:
        engine = create_async_engine(url)
        try:
            async with AsyncSession(engine) as session:
                return await sqlalchemy_orders.place_order_async(session, uid, total)
        finally:
            await engine.dispose()

    all_or_nothing(db, uid, lambda total: asyncio.run(place(total)))


def test_django_atomic(db: str) -> None:
    # Django reads its settings once per process: one database for this whole test.
    from django_orders.standalone import configure

    uid = make_user(db, "dja")
    configure(publisher(db))
    from django.db import connection, connections

    from django_orders.orders import place_order   # the models load once the app registry is ready

    try:
        all_or_nothing(db, uid, lambda total: place_order(uid, total))
        assert isinstance(connection.connection, psycopg.Connection)   # psycopg 3, as the api needs
    finally:
        connections.close_all()
