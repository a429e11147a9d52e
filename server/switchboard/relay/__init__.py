"""The relay: hears PostgreSQL's notifications and delivers events to this replica's
sockets. See core.py for the map of its parts."""

from .core import Relay
from .listener import abandon, bounded_wait

__all__ = ["Relay", "abandon", "bounded_wait"]
