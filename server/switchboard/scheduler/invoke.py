"""One call of a handler, with what its registration asks: arguments checked against
its args type, a timeout. The outcome is (result, error, retry): error None means
success; retry False means a failure no retry can fix (PermanentError, arguments that
do not match the handler's type), which finish_run() then records without a retry.

Cancellation is not handled here: a CancelledError (shutdown, a lost lease) goes to
the caller, which alone knows which it was."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from typing import Any

from ..handler_context import HandlerContext, HandlerError, PermanentError, _cap_deadline, failure_message
from ..jobargs import ArgsError, load_args
from ..registry import Registration

LOG = logging.getLogger("switchboard.scheduler")
Outcome = tuple[Any, str | None, bool]


async def invoke(reg: Registration, ctx: HandlerContext) -> Outcome:
    if reg.args_type is not None:
        try:
            ctx.args = load_args(reg.args_type, ctx.args)
        except ArgsError as exc:
            exc.handler = ctx.handler
            return None, str(exc), False
    timeout = reg.options.timeout
    try:
        if timeout is None:
            return await reg.fn(ctx), None, True
        _cap_deadline(ctx, time.time() + timeout)
        cm = asyncio.timeout(timeout)
        try:
            async with cm:
                return await reg.fn(ctx), None, True
        except TimeoutError:
            if not cm.expired():
                raise               # the handler's own TimeoutError: an ordinary failure
            return None, f"timed out after {timeout:g} s (the handler's timeout option)", True
    except PermanentError as exc:
        return None, failure_message(exc), False
    except HandlerError as exc:
        return None, failure_message(exc), True
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        LOG.warning("run %s (%s) failed:\n%s", ctx.run_id, ctx.handler, traceback.format_exc())
        return None, failure_message(exc), True
