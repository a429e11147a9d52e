"""The app's own table (``public.orders``), nothing of Switchboard's."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    user_id = models.UUIDField()
    total = models.DecimalField(max_digits=12, decimal_places=2)

    class Meta:
        app_label = "django_orders"
        db_table = "orders"
