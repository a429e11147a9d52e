"""How the admin chores print: timestamps, durations, one-line text, tables, JSON."""

from __future__ import annotations

import json
from typing import Any


def _when(v: Any) -> str:
    """A timestamp for a terminal: UTC, to the second; '-' for none."""
    from datetime import datetime, timezone

    if v is None:
        return "-"
    if isinstance(v, datetime):
        return v.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return str(v)


def _duration(ms: Any) -> str:
    if ms is None:
        return "-"
    ms = int(ms)
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    if ms < 3_600_000:
        return f"{ms // 60_000}m{(ms % 60_000) // 1000:02d}s"
    return f"{ms // 3_600_000}h{(ms % 3_600_000) // 60_000:02d}m"


def _one_line(text: Any, width: int) -> str:
    from ..bounded import escape

    return "-" if text is None else escape(str(text), width)


def _table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths[:-1]) + "  {}"
    print(fmt.format(*headers).rstrip())
    for r in rows:
        print(fmt.format(*r).rstrip())


def _print_json(obj: Any) -> None:
    from uuid import UUID

    def default(v: Any) -> Any:
        if isinstance(v, UUID):
            return str(v)
        if hasattr(v, "isoformat"):
            return v.isoformat()
        return str(v)

    print(json.dumps(obj, default=default, indent=2, ensure_ascii=False))

