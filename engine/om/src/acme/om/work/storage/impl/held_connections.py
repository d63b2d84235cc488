"""Connections of a pool held for the queue's busiest statements (`HeldConnections`): one
round trip per call on a connection straight to the server (docs/decisions/0021, 0022)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

# A held connection unused this long (s) goes back to its pool: a process holds queue
# connections only while the queue's calls keep coming (a service enqueuing now and then
# holds none between its calls).
HELD_IDLE_S = 1.0

# The longest `statement_timeout` PostgreSQL takes (ms; a 32-bit int, about 24.8 days): a
# longer lease is given this one.
_MAX_TIMEOUT_MS = 2_147_483_647

# What a held connection's session is set to: the tenant (a UUID's own text) and the
# `statement_timeout` in ms (None: the role's own).
_Scope = tuple[str, int | None]


def _transaction_sql(scope: _Scope) -> str:
    """The simple query (one round trip) that opens a transaction under `scope`, set for
    the transaction alone."""
    tenant, timeout_ms = scope
    timeout = (
        "" if timeout_ms is None else f", set_config('statement_timeout', '{timeout_ms}', true)"
    )
    return f"BEGIN; SELECT set_config('app.org_id', '{tenant}', true){timeout}"


def _scope_sql(scope: _Scope) -> str:
    """The simple query (one round trip) that sets a session to `scope`."""
    tenant, timeout_ms = scope
    if timeout_ms is None:
        return f"RESET statement_timeout; SELECT set_config('app.org_id', '{tenant}', false)"
    return (
        f"SELECT set_config('app.org_id', '{tenant}', false),"
        f" set_config('statement_timeout', '{timeout_ms}', false)"
    )


@dataclass(eq=False)
class HeldConnection:
    """A connection `HeldConnections` holds: the pool's proxy, its asyncpg connection,
    whether it reaches the server directly, what its session is set to (`_Scope`; None
    before the first call sets it, and always through a proxy) and when it was last given
    back (the event loop's clock, s)."""

    proxy: PoolProxiedConnection
    raw: asyncpg.Connection
    direct: bool  # straight to the server: its session may carry the scope
    scope: _Scope | None = None
    idle_since: float = 0.0
    sent: bool = False  # whether the current call has sent a statement

    async def fetch(self, sql: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        """`asyncpg.Connection.fetch` (the rows as `asyncpg.Record`s); raises `Unsent`
        when the call's first statement could not be sent: asyncpg found its connection in
        another operation's state (`InternalClientError` "cannot switch to state ...",
        raised before a message is written; the server ended the connection and asyncpg
        has not yet seen the socket close), so the call may run in a funnel session."""
        first, self.sent = not self.sent, True
        try:
            return await self.raw.fetch(sql, *args, timeout=timeout_s)
        except asyncpg.InternalClientError as exc:
            if first and type(exc) is asyncpg.InternalClientError and _NOT_SENT in str(exc):
                raise Unsent(str(exc)) from exc
            raise


# How asyncpg words the `InternalClientError` of a statement it refused to send.
_NOT_SENT = "cannot switch to state"


class Unsent(Exception):
    """A call's first statement on a held connection was never sent (`HeldConnection.fetch`)."""


async def _rolled_back(raw: asyncpg.Connection) -> bool:
    """`ROLLBACK` on `raw` after the server refused a statement of its transaction; False
    when the rollback fails too (the caller then closes it)."""
    try:
        await raw.execute("ROLLBACK")
    except Exception:
        return False
    return True


class HeldConnections:
    """Up to `limit` connections of `engine`'s pool, kept checked out for the queue's busiest
    statements (the enqueue, the claim, the completions), one round trip per call.

    Straight to the server, each statement is its own transaction (autocommit) under the
    tenant (and the claim's `statement_timeout`) its connection's session is set to; through
    a pooler (`pg_backend_pid()` other than the connection's server pid) or with
    `session_scope=False`, each call is one transaction with them set for it alone. A
    connection goes back to its pool after `RESET`, when unused for `idle_s` seconds or when
    the pool has no other to hand out; one that fails is closed, one the server refused a
    statement on is kept. `statements` yields None when none is free or the one taken was
    found dropped before the caller's statement ran (docs/decisions/0021, 0022).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        limit: int,
        *,
        idle_s: float = HELD_IDLE_S,
        session_scope: bool | None = None,
    ) -> None:
        self._engine = engine
        self._session_scope = session_scope
        self._limit = limit
        self._idle_s = idle_s
        self._idle: list[HeldConnection] = []  # the most recently given back last
        self._count = 0  # checked out to be held: idle, in a call, or being checked out
        self._generation = 0  # bumped by every dispose of the engine
        self._listening = False
        self._watching = False
        self._sweep: asyncio.TimerHandle | None = None
        self._checking_in: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def statements(
        self, org_id: UUID, *, timeout_s: float | None = None
    ) -> AsyncIterator[HeldConnection | None]:
        """A held connection under the tenant `org_id` (and, given `timeout_s`, a
        `statement_timeout` of that many seconds; else the role's own): each statement the
        caller sends its own transaction, or, through a proxy, all of them one transaction
        committed when the block ends; None when no connection is free (the caller opens a
        funnel session).

        Raises what asyncpg raises from the caller's statements (a transaction is then
        rolled back), and `Unsent` when the first of them could not be sent (the
        connection is closed either way).
        """
        # A UUID's own text: nothing else reaches the SQL.
        tenant = str(org_id) if type(org_id) is UUID else str(UUID(str(org_id)))
        timeout_ms = (
            None if timeout_s is None else min(max(1, math.ceil(timeout_s * 1000)), _MAX_TIMEOUT_MS)
        )
        scope: _Scope = (tenant, timeout_ms)
        conn = await self._take(scope)
        if conn is None:
            yield None
            return
        generation = self._generation
        if conn.raw.is_closed():  # the server ended it while it sat idle
            self._drop(conn)
            yield None
            return
        opening = (
            _transaction_sql(scope)
            if not conn.direct
            else (_scope_sql(scope) if conn.scope != scope else None)
        )
        if opening is not None:
            try:
                await conn.raw.execute(opening)
                opened = True
            except Exception:
                opened = False  # dropped while it sat idle: nothing of the caller's ran yet
            except BaseException:
                self._drop(conn)
                raise
            if not opened:
                self._drop(conn)
                yield None
                return
            if conn.direct:
                conn.scope = scope
        conn.sent = False
        try:
            yield conn
            if not conn.direct:
                await conn.raw.execute("COMMIT")
        except asyncpg.PostgresError:
            # The server refused a statement (a privilege, a constraint, a timeout): the
            # connection itself may be sound, so it is kept when nothing is left open (a
            # statement that ran alone) or its transaction rolls back.
            kept = False
            try:
                kept = not conn.raw.is_closed() and (
                    not conn.raw.is_in_transaction() or await _rolled_back(conn.raw)
                )
            finally:
                if kept:
                    self._give_back(conn, generation)
                else:
                    self._drop(conn)
            raise
        except BaseException:
            self._drop(conn)
            raise
        self._give_back(conn, generation)

    def _give_back(self, conn: HeldConnection, generation: int) -> None:
        """Keep `conn` for the next call, unless the engine was disposed meanwhile (closed)
        or every connection of its pool's size is checked out, `conn` included (checked in
        at once: a session of the host may be waiting for it, or will be)."""
        if generation != self._generation:
            self._drop(conn)
            return
        if not self._pool_can_spare(taking=0):
            self._check_in(conn)  # conn, it would leave the pool no connection to hand out
            return
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        self._idle.append(conn)
        if self._sweep is None:
            self._sweep = loop.call_later(self._idle_s, self._check_in_unused)

    def _pool_can_spare(self, *, taking: int) -> bool:
        """Whether the pool would still have a connection to hand out with `taking` more
        checked out (those held included): below its size (`QueuePool.size()`, overflow
        aside). A pool without a size (`NullPool`) always can."""
        pool = self._engine.sync_engine.pool
        size, checked_out = getattr(pool, "size", None), getattr(pool, "checkedout", None)
        if not callable(size) or not callable(checked_out):
            return True
        return int(checked_out()) + taking < int(size())

    def _on_checkout(self, _dbapi: object, _record: object, _proxy: object) -> None:
        """The pool's `checkout` event: a checkout (a session of the host, say) that leaves
        the pool no connection to hand out gives back the least recently used idle conn
        connection at once, so the next session waits for its reset, not for `idle_s`."""
        if not self._idle or self._pool_can_spare(taking=0):
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # a checkout outside the event loop's thread: the sweep gives it back
        self._check_in(self._idle.pop(0))

    def _check_in_unused(self) -> None:
        """The sweep's timer: check in every connection idle for `idle_s`, and set the timer
        again for the next one while any is idle."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        cutoff = loop.time() - self._idle_s
        unused = [conn for conn in self._idle if conn.idle_since <= cutoff]
        self._idle = [conn for conn in self._idle if conn.idle_since > cutoff]
        for conn in unused:
            self._check_in(conn)
        if self._idle:
            soonest = min(conn.idle_since for conn in self._idle) + self._idle_s
            self._sweep = loop.call_at(soonest, self._check_in_unused)

    def _check_in(self, conn: HeldConnection) -> None:
        """Give `conn` back to its pool with its session's tenant and statement timeout
        reset (in a task: both await the driver); a reset or check-in that fails closes
        it."""
        self._count -= 1

        async def check_in() -> None:
            try:
                if conn.scope is not None:
                    await conn.raw.execute("RESET app.org_id; RESET statement_timeout")
                    conn.scope = None
                await greenlet_spawn(conn.proxy.close)
            except Exception:
                with contextlib.suppress(Exception):
                    conn.proxy.invalidate()
                    conn.proxy.close()

        task = asyncio.get_running_loop().create_task(check_in())
        self._checking_in.add(task)
        task.add_done_callback(self._checking_in.discard)

    async def _take(self, scope: _Scope) -> HeldConnection | None:
        for n in range(len(self._idle) - 1, -1, -1):
            if self._idle[n].scope == scope:
                return self._idle.pop(n)
        if self._idle:
            # The most recently used: under a light load the others stay unused and go
            # back to the pool.
            return self._idle.pop()
        if self._count >= self._limit or not self._pool_can_spare(taking=1):
            return None  # the caller takes a funnel session, waiting as sessions do
        if not self._listening:
            event.listen(self._engine.sync_engine, "engine_disposed", self._disposed, once=True)
            self._listening = True
        if not self._watching:  # the pool's listeners outlive a dispose: registered once
            event.listen(self._engine.sync_engine, "checkout", self._on_checkout)
            self._watching = True
        self._count += 1
        try:
            proxy = await self._engine.raw_connection()
        except Exception:
            self._count -= 1
            return None
        except BaseException:
            self._count -= 1
            raise
        raw = proxy.driver_connection
        if not isinstance(raw, asyncpg.Connection):
            self._close_taken(proxy)
            return None
        try:
            direct = self._session_scope is True or (
                self._session_scope is None
                and await raw.fetchval("SELECT pg_backend_pid()") == raw.get_server_pid()
            )
        except Exception:
            self._close_taken(proxy)  # dropped already: the caller takes a funnel session
            return None
        except BaseException:
            self._close_taken(proxy)
            raise
        return HeldConnection(proxy, raw, direct)

    def _close_taken(self, proxy: PoolProxiedConnection) -> None:
        """Close a connection checked out to be held (its pool slot is freed)."""
        self._count -= 1
        with contextlib.suppress(Exception):
            proxy.invalidate()
            proxy.close()

    def _drop(self, conn: HeldConnection) -> None:
        """Close `conn` (its pool slot is freed); safe while the caller is being cancelled:
        nothing here awaits."""
        self._close_taken(conn.proxy)

    def _disposed(self, _engine: Engine) -> None:
        """`engine_disposed`: close the idle connections (inside the dispose's greenlet,
        so each closes gracefully); a busy one is closed when its call ends."""
        self._listening = False
        self._generation += 1
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        idle, self._idle = self._idle, []
        for conn in idle:
            self._drop(conn)
