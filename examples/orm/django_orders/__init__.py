"""Save an order with the Django ORM and, in the same transaction, tell its user and
queue its invoice (docs/how-to/orm.md; tested by tests/test_orm_examples.py).

A minimal Django app usable outside a Django project: in a project, add
``"django_orders"`` (or your own app) to ``INSTALLED_APPS`` and call
:func:`django_orders.orders.place_order` from a view; standalone, configure Django
first (it reads settings once per process)::

    from django_orders.standalone import configure
    configure("postgresql://shop@db/shop")
    from django_orders.orders import place_order      # models import after setup
    order_id = place_order(user_id, Decimal("42.00"))

Django 4.2+ picks psycopg 3 when it is installed (``switchboard`` depends on it), and
``django.db.connection.connection`` is then the ``psycopg.Connection`` that
``switchboard.api`` takes. Nothing here imports Django's models at import time: the
app registry loads ``models`` itself.
"""
