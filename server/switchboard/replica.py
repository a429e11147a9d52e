"""What this replica is: its id, and whether it is draining.

One small mutable object, shared by the components that must stop taking work
the moment a shutdown begins (the scheduler, the WebSocket endpoint, the
readiness probe). It knows nothing of them.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass, field


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass
class ReplicaState:
    replica_id: str = field(default_factory=worker_name)
    draining: bool = False
    started_at: float = field(default_factory=time.time)
