"""ASGI entry point for servers that import an app object (gunicorn workers)."""

from .app import create_app
from .config import Config

app = create_app(Config.from_env(dev=__import__("os").environ.get("SWITCHBOARD_DEV") == "1"))
