"""The public handler API: what a task handler sees, and how it is found.

A handler is ``async def handler(ctx: HandlerContext) -> result`` where the
result is JSON-serialisable (stored in task_runs.result). A plain ``def`` is
run in a worker thread (``as_handler``), never on the event loop. Raise
``HandlerError("message")`` to fail the run with a clean message (it is
retried while attempts remain).

Handlers are found three ways, all merged into one ``HandlerRegistry`` when a
replica starts (``load_handlers``):

* the built-ins (noop, sleep, fail, sql, notify, maintenance);
* the ``switchboard.handlers`` entry-point group of installed distributions --
  the packaging convention; the entry point's name is the handler name::

      [project.entry-points."switchboard.handlers"]
      "myapp.send_digest" = "myapp.jobs:send_digest"

* modules named in ``SWITCHBOARD_HANDLERS`` that register with the decorator::

      from switchboard.handlers import registry

      @registry.register("myapp.send_digest")
      async def send_digest(ctx): ...

A registration may carry options (handler_options.py: stored where the SQL honours
them) and an args type (jobargs.py: checked at enqueue and when the run starts)::

      @dataclass
      class InvoiceArgs:
          order_id: int
          email: str

      @registry.register("invoice.send", args=InvoiceArgs, queue="emails", priority=5,
                         max_attempts=5, retry=RetryStrategy(base=2, cap=600, jitter=0.2),
                         timeout=30)
      async def send_invoice(ctx: HandlerContext[InvoiceArgs]) -> None:
          ctx.args.order_id      # an int: the run's args, checked and built

Raise ``PermanentError`` to fail a run for good (no retry); arguments that do not
match the args type fail it that way too, naming the field.

This module is the stable surface for handler authors: ``HandlerContext``,
``HandlerError``, ``PermanentError``, ``RetryStrategy``, ``registry``. The
context lives in handler_context.py, the registry in registry.py; the server's
components are never reachable from a context.
"""

from __future__ import annotations

from .handler_context import (
    A,
    Handler,
    HandlerContext,
    HandlerError,
    PermanentError,
    _cap_deadline,
    _extend_deadline,
    failure_message,
    stored_result,
)
from .handler_options import HandlerOptions, RetryStrategy
from .registry import (
    ENTRY_POINT_GROUP,
    SYNC_THREADS,
    HandlerLoadError,
    HandlerRegistry,
    Registration,
    as_handler,
    discover_entry_points,
    load_handlers,
    registry,
)

__all__ = [
    "ENTRY_POINT_GROUP", "SYNC_THREADS", "A", "Handler", "HandlerContext", "HandlerError", "HandlerLoadError",
    "HandlerOptions", "HandlerRegistry", "PermanentError", "Registration", "RetryStrategy", "_cap_deadline",
    "_extend_deadline", "as_handler", "discover_entry_points", "failure_message", "load_handlers", "registry",
    "stored_result",
]
