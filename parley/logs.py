"""How every Parley process logs: the ids of the work in hand on each line, personal data never.

Pure standard library, so every layer may use it:

- `log_context(turn_id=..., session_id=..., tenant_id=...)` binds ids to the running task (a
  context variable); the activity interceptor binds them around each step and the API around
  each request, so a line logged deep inside names the turn it was about.
- `Redact`, a filter on the process's handler, rewrites every record that reaches it (the
  message with its arguments, the traceback, the stack) with email addresses and payment card
  numbers replaced. Handler filters see the records of every logger, Parley's and the
  libraries' (uvicorn, httpx, SQLAlchemy, the Temporal SDK), so nothing slips past by name.
- `configure_logging(format, level)` installs one handler on the root logger with both
  filters and a formatter: `text` (a readable line, the dev default) or `json` (one object a
  line, for a log pipeline).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import NoReturn

# The ids a line may carry, in the order they are shown.
CONTEXT_KEYS = ("tenant_id", "session_id", "turn_id")

# Never mutated: each binding sets a new mapping (None: nothing bound).
_context: ContextVar[Mapping[str, str] | None] = ContextVar("parley_log_context", default=None)

# An address, also URL-encoded (`%40`), as it appears in an access log's query string. It
# starts only where a run of address characters starts (linear time on a long run).
EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+(?:@|%40)[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    re.IGNORECASE,
)
# 13 to 19 digits, spaces or dashes allowed between them; redacted when the Luhn check passes
# (ids, timestamps and amounts mostly fail it; the rare one that passes loses nothing real).
CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
EMAIL_MARK = "[email]"
CARD_MARK = "[card]"


def luhn_valid(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _card_or_digits(match: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", match.group())
    return CARD_MARK if luhn_valid(digits) else match.group()


def redact(text: str) -> str:
    """`text` with email addresses and payment card numbers replaced by markers."""
    if "@" in text or "%40" in text.upper():
        text = EMAIL.sub(EMAIL_MARK, text)
    return CARD.sub(_card_or_digits, text)


@contextmanager
def log_context(**ids: str | None) -> Iterator[None]:
    """Bind ids (those not None) to every line logged inside the block, in this task and the
    tasks it starts."""
    bound = {key: value for key, value in ids.items() if value}
    token = _context.set({**(_context.get() or {}), **bound})
    try:
        yield
    finally:
        _context.reset(token)


def bind_log_context(**ids: str | None) -> None:
    """Add ids to the running block's context (e.g. the tenant, once a request is
    authenticated); they go when the enclosing `log_context` ends."""
    bound = {key: value for key, value in ids.items() if value}
    if bound:
        _context.set({**(_context.get() or {}), **bound})


def late_binder() -> Callable[..., None]:
    """A function that adds ids to the running block's context later, from anywhere: for ids
    a lookup brings that the block does not wait for. Lines logged before then, and in blocks
    nested before then, go without them."""
    # The block's own mapping, replaced by a dict this function alone may add to.
    current = dict(_context.get() or {})
    _context.set(current)

    def bind(**ids: str | None) -> None:
        current.update({key: value for key, value in ids.items() if value})

    return bind


def current_log_context() -> Mapping[str, str]:
    return _context.get() or {}


class Redact(logging.Filter):
    """Replaces personal data in the record's message, traceback and stack, in place."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: the handler reports it, unformatted
            message = redact(str(record.msg))
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class WithContext(logging.Filter):
    """Copies the bound ids onto the record (`record.turn_id`…), unless the caller passed
    its own in `extra`."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in current_log_context().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def _ids(record: logging.LogRecord) -> dict[str, str]:
    return {key: value for key in CONTEXT_KEYS if (value := getattr(record, key, None))}


class TextFormatter(logging.Formatter):
    """`time LEVEL logger message [tenant=… session=… turn=…]`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = _ids(record)
        if not ids:
            return line
        tags = " ".join(f"{key.removesuffix('_id')}={value}" for key, value in ids.items())
        head, newline, rest = line.partition("\n")
        return f"{head} [{tags}]{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the ids, the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_ids(record),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(format: str = "text", level: str | int = "INFO") -> logging.Handler:
    """Send every logger's records to stderr through one handler that adds the ids and
    redacts personal data; replaces handlers a previous call (or `basicConfig`) installed."""
    if format not in ("text", "json"):
        raise ValueError(f"unknown log format {format!r} (text or json)")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(WithContext())
    handler.addFilter(Redact())
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # Libraries that install their own handlers would bypass the filters: route them to root.
    for name in ("uvicorn", "uvicorn.access", "uvicorn.error"):
        library = logging.getLogger(name)
        library.handlers.clear()
        library.propagate = True
    for name, quiet_below in QUIET_LIBRARIES.items():
        logging.getLogger(name).setLevel(quiet_below)
    return handler


# Libraries whose INFO lines are their own bookkeeping, not news about the work: the MCP
# SDK's lines per session (client and server) and, through `httpx2` (the HTTP client of the
# MCP and provider SDKs), a line per request (one MCP tool call makes five); alembic's
# plugin set-up. Their warnings and errors still show.
QUIET_LIBRARIES = {
    "mcp": logging.WARNING,
    "httpx2": logging.WARNING,
    "alembic.runtime.plugins": logging.WARNING,
}


def exit_unfinalized(code: int) -> NoReturn:
    """End the process with `code` once the logs and stdio are flushed, without finalizing the
    interpreter. For a process that used a Temporal client: the SDK's native runtime keeps
    threads of its own, and one that touches the GIL while the interpreter finalizes aborts
    the process (SIGABRT, "PyGILState_Release ... finalizing"; temporalio/sdk-python#300)
    after its work was done. Only for a process whose resources are closed by then."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
