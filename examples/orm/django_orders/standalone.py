"""Django configured in code from a DSN, for a script or a test (no settings module)."""

from __future__ import annotations

import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

_configured: str | None = None


def configure(dsn: str) -> None:
    """Point Django's ``default`` database at ``dsn`` (a URL or ``key=value`` string) and load
    the ``django_orders`` app. Django reads its settings once per process: a second, different
    DSN is refused rather than silently ignored."""
    global _configured
    if _configured == dsn:
        return
    if settings.configured:
        raise RuntimeError("Django is already configured in this process (settings are read once)")
    params = conninfo_to_dict(dsn)
    settings.configure(
        DATABASES={"default": {
            # psycopg 3 when it is installed (Django 4.2+); switchboard.api needs psycopg 3.
            "ENGINE": "django.db.backends.postgresql",
            "NAME": params.pop("dbname", ""),
            "USER": params.pop("user", ""),
            "PASSWORD": params.pop("password", ""),
            "HOST": params.pop("host", ""),
            "PORT": params.pop("port", ""),
            "OPTIONS": params,              # the rest (sslmode, options, ...) as libpq keywords
        }},
        INSTALLED_APPS=["django_orders"],
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    _configured = dsn
