"""place_order: the order, its user's event and its invoice job, in one Django transaction."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import connection, transaction

from switchboard import api

from .models import Order


def check(total: Decimal) -> None:
    """The business rule that may still fail once everything is written: it stands for
    any exception before the block ends (a payment refused, a view's later check)."""
    if total <= 0:
        raise ValueError(f"an order's total must be positive, not {total}")


def place_order(user_id: uuid.UUID | str, total: Decimal) -> int:
    """Insert the order, notify its user and enqueue ``invoice.send``: all or nothing."""
    with transaction.atomic():
        order = Order.objects.create(user_id=user_id, total=total)
        # atomic() has connected; .connection is the psycopg Connection in its transaction.
        conn = connection.connection
        api.notify_user(conn, user_id, "order.saved", {"order": order.pk})
        api.enqueue(conn, "invoice.send", {"order_id": order.pk}, queueing_lock=f"invoice-{order.pk}")
        check(total)                        # raises: the order, the event and the job roll back
    return int(order.pk)
