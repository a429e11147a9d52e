"""What a handler's registration says beyond its function: the options River and
procrastinate give a job kind, stored where the SQL honours them.

::

    from switchboard.handlers import registry, RetryStrategy

    @registry.register("invoice.send", args=InvoiceArgs, queue="emails", priority=5,
                       max_attempts=5, retry=RetryStrategy(base=2, cap=600, jitter=0.2),
                       timeout=30)
    async def send_invoice(ctx): ...

- ``queue``, ``priority``, ``max_attempts``: the defaults of ``enqueue()`` for this
  handler (switchboard.handler_options, written by every replica at start), so a
  job enqueued from anywhere -- application code, psql, another handler -- lands
  in the handler's queue with its priority.
- ``retry``: the wait before retry N+1 of a failed run is
  ``min(cap, base * 2**N)`` less a random share of up to ``jitter`` of it
  (finish_run() computes it in SQL).
- ``timeout``: seconds a run may spend in the handler; after that it fails (and is
  retried by the rule above). Enforced by the replica running it.

Each replica gives each queue it serves its own number of slots:
``SWITCHBOARD_QUEUES="emails=2,reports=1"``; the default queue has
``SWITCHBOARD_SCHEDULER_CONCURRENCY``; a queue a handler names and the setting
leaves out gets 1 slot (a named queue exists to bound its concurrency), ``=0``
serves none on this replica.

This module is a foundation: it imports nothing of Switchboard's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

QUEUE_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
DEFAULT_QUEUE = "default"
NAMED_QUEUE_SLOTS = 1       # a named queue that SWITCHBOARD_QUEUES leaves out


def check_queue(name: Any) -> str:
    if not isinstance(name, str) or not QUEUE_RE.match(name):
        raise ValueError(f"invalid queue name {name!r}: lower-case letters, digits, _ . - "
                         "(up to 63 characters, starting with a letter), e.g. 'emails'")
    return name


def _number(what: str, value: Any, low: float, high: float, *, exclusive_low: bool = False) -> None:
    ok = (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
          and (value > low if exclusive_low else value >= low) and value <= high)
    if not ok:
        bound = "more than" if exclusive_low else "at least"
        raise ValueError(f"{what} must be a number {bound} {low:g} and at most {high:g}, got {value!r}")


@dataclass(frozen=True, slots=True)
class RetryStrategy:
    """Exponential backoff: retry N+1 waits ``min(cap, base * 2**N)`` seconds, less a
    random share of up to ``jitter`` (0..1) of it. The default is Switchboard's
    historical rule: 2, 4, 8 ... seconds, at most an hour, no jitter."""

    base: float = 1.0
    cap: float = 3600.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        _number("retry base", self.base, 0.0, 86400.0, exclusive_low=True)
        _number("retry cap", self.cap, 0.0, 604800.0, exclusive_low=True)
        _number("retry jitter", self.jitter, 0.0, 1.0)
        if self.cap < self.base:
            raise ValueError(f"retry cap {self.cap} is less than its base {self.base}: the cap is the longest wait")

    def delay(self, attempt: int) -> tuple[float, float]:
        """The (shortest, longest) wait before the retry that follows ``attempt``."""
        longest = min(self.cap, self.base * 2.0 ** min(max(attempt, 0), 60))
        return longest * (1.0 - self.jitter), longest


@dataclass(frozen=True, slots=True)
class HandlerOptions:
    """One handler's registration options (see the module docstring)."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    max_attempts: int = 3
    retry: RetryStrategy = RetryStrategy()
    timeout: float | None = None

    def __post_init__(self) -> None:
        check_queue(self.queue)
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) or not -100 <= self.priority <= 100:
            raise ValueError(f"priority must be a whole number from -100 to 100, got {self.priority!r}")
        if (isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int)
                or not 1 <= self.max_attempts <= 100):
            raise ValueError(f"max_attempts must be a whole number from 1 to 100, got {self.max_attempts!r}")
        if not isinstance(self.retry, RetryStrategy):
            raise TypeError(f"retry must be a RetryStrategy, got {type(self.retry).__name__}")
        if self.timeout is not None:
            _number("timeout", self.timeout, 0.0, 86400.0, exclusive_low=True)

    def as_json(self) -> dict[str, Any]:
        """What set_handler_options() stores."""
        return {"queue": self.queue, "priority": self.priority, "max_attempts": self.max_attempts,
                "backoff_base": self.retry.base, "backoff_cap": self.retry.cap,
                "backoff_jitter": self.retry.jitter, "timeout": self.timeout}


def parse_queue_slots(text: str | None) -> dict[str, int]:
    """``SWITCHBOARD_QUEUES``: ``"emails=2, reports=1"`` -> {"emails": 2, "reports": 1}.
    ValueError names the bad entry."""
    out: dict[str, int] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, count = part.partition("=")
        name = name.strip()
        if not sep or not count.strip().isdigit() or not QUEUE_RE.match(name):
            raise ValueError(f"SWITCHBOARD_QUEUES: {part!r} is not queue=slots (e.g. emails=2)")
        if name in out:
            raise ValueError(f"SWITCHBOARD_QUEUES: queue {name!r} is given twice")
        slots = int(count)
        if slots > 1000:
            raise ValueError(f"SWITCHBOARD_QUEUES: {part!r}: at most 1000 slots per queue")
        out[name] = slots
    return out


def queue_slots(default_slots: int, configured: dict[str, int], named: set[str]) -> dict[str, int]:
    """Each queue this replica serves and its slots: the default queue (``default_slots``
    unless configured), every queue a handler names (``NAMED_QUEUE_SLOTS`` unless
    configured), and every configured one. Queues with 0 slots are left out."""
    slots = {DEFAULT_QUEUE: default_slots}
    for q in named:
        slots.setdefault(q, NAMED_QUEUE_SLOTS)
    slots.update(configured)
    return {q: n for q, n in slots.items() if n > 0}
