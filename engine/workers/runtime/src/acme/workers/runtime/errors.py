"""What went wrong, as text a row and a log line can hold, and whether the database comes back.

- `failure_text`: a handler's exception as a failed attempt's `last_error`: `Type: message`
  and the innermost frames of its traceback, within a character limit;
- `transient_database_error`: whether an error says the database is unreachable for now
  (refused, starting, shutting down, failing over, out of connections), which the worker
  waits out instead of exiting;
- `escape_log_output`: every line the process logs as text, its control characters and
  lone surrogates escaped, so a message can neither forge a line nor hide in a terminal.
"""

from __future__ import annotations

import errno
import logging
import re
import traceback
from collections.abc import Iterator

from sqlalchemy.exc import DBAPIError, DisconnectionError

from acme.om.work.rules import storable_text

_FRAMES_HEADER = "Traceback (innermost last):"


def failure_text(raised: BaseException, limit: int) -> str:
    """`Type: message` of `raised`, then its traceback's innermost frames, as stored text.

    The first line is what `last_error` always held; the frames follow under
    `_FRAMES_HEADER`, as `traceback` formats them, and are dropped outermost first (with a
    line counting them) until the text fits `limit` characters; the first line alone is cut
    at `limit`. What the database cannot hold is escaped (`rules.storable_text`).
    """
    head = storable_text(f"{type(raised).__name__}: {raised}")
    if len(head) >= limit:
        return head[:limit]
    frames = [storable_text(f) for f in traceback.format_tb(raised.__traceback__)]
    for dropped in range(len(frames) + 1):
        kept = frames[dropped:]
        if not kept:
            break
        omitted = f"  ... {dropped} outer frame(s) omitted\n" if dropped else ""
        text = f"{head}\n{_FRAMES_HEADER}\n{omitted}{''.join(kept)}".rstrip("\n")
        if len(text) <= limit:
            return text
    return head


# SQLSTATEs of a database that is there but cannot serve now (PostgreSQL, Appendix A):
# class 08 (connection exception), 57P01 admin_shutdown, 57P02 crash_shutdown,
# 57P03 cannot_connect_now (starting up, or a standby not yet accepting), and
# 53300 too_many_connections.
_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ETIMEDOUT,
        errno.EPIPE,
    }
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it wraps: its cause or context, and a DBAPI wrapper's `orig`."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 8:  # a few wrappers deep at most
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for inner in (current.__cause__, current.__context__, getattr(current, "orig", None)):
            if isinstance(inner, BaseException):
                todo.append(inner)


def transient_database_error(exc: BaseException) -> bool:
    """Whether `exc`, or an error it wraps, says the database cannot be reached for now.

    True for a connection refused, reset or timed out (`ConnectionError`, an `OSError` of
    those errnos, `TimeoutError`), SQLSTATE class 08 and 57P01/57P02/57P03/53300 whether
    asyncpg raised it (`CannotConnectNowError`, ...) or SQLAlchemy wrapped it, and a
    connection SQLAlchemy invalidated. False for everything else: a missing table, a
    refused password, a bug, which waiting does not mend.
    """
    for error in _chain(exc):
        if isinstance(error, DisconnectionError):
            return True
        if isinstance(error, DBAPIError) and error.connection_invalidated:
            return True
        if isinstance(error, ConnectionError | TimeoutError):
            return True
        if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS:
            return True
        sqlstate = getattr(error, "sqlstate", None)
        if isinstance(sqlstate, str) and (
            sqlstate.startswith("08") or sqlstate in _TRANSIENT_SQLSTATES
        ):
            return True
    return False


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message` (or the type alone), at most `limit` characters;
    a `TimeoutError` without a message (asyncpg's connect timeout) says what it means."""
    message = str(exc).strip().splitlines()
    if not message and isinstance(exc, TimeoutError):
        message = ["no answer in time"]
    return f"{type(exc).__name__}: {message[0]}"[:limit] if message else type(exc).__name__


# C0 controls but newline and tab, DEL, C1 controls, and lone surrogates.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def escape_control(text: str) -> str:
    """`text` with every control character but newline and tab, and every lone surrogate,
    written as its Python escape (`\\x00`, `\\x1b`, `\\ud800`)."""
    return _UNSAFE.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


class EscapingFormatter(logging.Formatter):
    """Another formatter's line with `escape_control` applied, and, where that line spans
    several, the newlines of the message and of the exceptions' messages written `\\n`: only
    a traceback's own structure breaks a line, so no message can forge one. A JSON
    formatter's line has nothing left to escape and passes through as it was."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        line = self.inner.format(record)
        if "\n" not in line:
            return escape_control(line)
        flat = logging.makeLogRecord(
            {**record.__dict__, "msg": record.getMessage().replace("\n", "\\n"), "args": None}
        )
        if record.exc_info and record.exc_info[1] is not None and record.exc_text:
            text = record.exc_text
            for message in {str(error) for error in _chain(record.exc_info[1])}:
                text = text.replace(message, message.replace("\n", "\\n"))
            flat.exc_text = text
        return escape_control(self.inner.format(flat))


def escape_log_output(logger: logging.Logger | None = None) -> None:
    """Wrap the formatter of each handler on `logger` (default: the root logger, where
    `boot()` puts the process's handler) in an `EscapingFormatter`; idempotent. Call it
    after `boot()`: every logger the worker writes through propagates there."""
    for handler in (logger or logging.getLogger()).handlers:
        current = handler.formatter or logging.Formatter()
        if not isinstance(current, EscapingFormatter):
            handler.setFormatter(EscapingFormatter(current))
