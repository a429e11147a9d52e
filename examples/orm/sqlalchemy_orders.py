"""Save an order with the SQLAlchemy ORM and, in the same transaction, tell its user
and queue its invoice (docs/how-to/orm.md; tested by tests/test_orm_examples.py).

``switchboard.api`` takes a psycopg 3 connection, so the engine uses the
``postgresql+psycopg://`` dialect and the calls go to the driver connection *of the
session's own transaction*: the order, the event and the job are committed together
by ``session.begin()``, or (an exception inside the block) none of them is. The app
connects as a login granted ``switchboard_publisher`` plus its own tables' grants::

    engine = create_engine("postgresql+psycopg://shop@db/shop")
    with Session(engine) as session:
        order_id = place_order(session, user_id, Decimal("42.00"))

    async_engine = create_async_engine("postgresql+psycopg://shop@db/shop")
    async with AsyncSession(async_engine) as session:
        order_id = await place_order_async(session, user_id, Decimal("42.00"))
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import psycopg
from sqlalchemy import Numeric
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from switchboard import api


class Base(DeclarativeBase):
    pass


class Order(Base):
    """The app's own table (``public.orders``), nothing of Switchboard's."""

    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[uuid.UUID]
    total: Mapped[Decimal] = mapped_column(Numeric(12, 2))


def driver_connection(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection under ``session``, inside the session's transaction."""
    conn = session.connection().connection.driver_connection
    if not isinstance(conn, psycopg.Connection):
        raise TypeError(f"switchboard.api needs psycopg 3 (postgresql+psycopg://), not {type(conn)}")
    return conn


async def async_driver_connection(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The psycopg AsyncConnection under ``session``, inside the session's transaction."""
    conn = (await (await session.connection()).get_raw_connection()).driver_connection
    if not isinstance(conn, psycopg.AsyncConnection):
        raise TypeError(f"switchboard.api needs psycopg 3 (postgresql+psycopg://), not {type(conn)}")
    return conn


def check(total: Decimal) -> None:
    """The business rule that may still fail once everything is written: it stands for
    any exception before the block ends (a payment refused, a view's later check)."""
    if total <= 0:
        raise ValueError(f"an order's total must be positive, not {total}")


def place_order(session: Session, user_id: uuid.UUID | str, total: Decimal) -> int:
    """Insert the order, notify its user and enqueue ``invoice.send``: all or nothing."""
    with session.begin():
        order = Order(user_id=uuid.UUID(str(user_id)), total=total)
        session.add(order)
        session.flush()                     # the INSERT runs now: order.id is known
        order_id = order.id                 # read inside: after COMMIT it would be reloaded
        conn = driver_connection(session)   # the same transaction as the INSERT
        api.notify_user(conn, user_id, "order.saved", {"order": order_id})
        api.enqueue(conn, "invoice.send", {"order_id": order_id},
                    queueing_lock=f"invoice-{order_id}")
        check(total)                        # raises: the order, the event and the job roll back
    return order_id


async def place_order_async(session: AsyncSession, user_id: uuid.UUID | str, total: Decimal) -> int:
    """:func:`place_order` with an ``AsyncSession`` and the ``*_async`` calls."""
    async with session.begin():
        order = Order(user_id=uuid.UUID(str(user_id)), total=total)
        session.add(order)
        await session.flush()
        order_id = order.id
        conn = await async_driver_connection(session)
        await api.notify_user_async(conn, user_id, "order.saved", {"order": order_id})
        await api.enqueue_async(conn, "invoice.send", {"order_id": order_id},
                                queueing_lock=f"invoice-{order_id}")
        check(total)
    return order_id
