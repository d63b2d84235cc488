"""Least privilege on the real PostgreSQL: the application role the worker connects as can
do what the queue needs (rows of `work_items`) and nothing more: no DDL on the queue's
table, no new tables, no way around row-level security, no other role, no server files.

Each statement runs as the role itself on a connection of its own (not through the funnel),
so what is refused is refused by the role's privileges, not by the code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

pytestmark = pytest.mark.integration

QUEUE_NEEDS = ("SELECT", "INSERT", "UPDATE", "DELETE")
"""What the queue does to `work_items`: claim, enqueue, complete, purge."""

REFUSED = {
    "drop the table": "DROP TABLE work_items",
    "alter a column": "ALTER TABLE work_items ALTER COLUMN note TYPE varchar(10)",
    "turn row-level security off": "ALTER TABLE work_items DISABLE ROW LEVEL SECURITY",
    "stop forcing row-level security": "ALTER TABLE work_items NO FORCE ROW LEVEL SECURITY",
    "drop the tenant policy": "DROP POLICY work_items_tenant ON work_items",
    "truncate every tenant's rows": "TRUNCATE work_items",
    "add an index": "CREATE INDEX ix_stray ON work_items (note)",
    "create a table": "CREATE TABLE stray (id integer)",
    "become the owner": "SET ROLE {owner}",
    "create a role": "CREATE ROLE stray LOGIN",
    "read a server file": "SELECT pg_read_file('/etc/hostname')",
    "run a program": "COPY (SELECT 1) TO PROGRAM 'true'",
}
"""What the role must not do, each statement refused by PostgreSQL itself."""


@pytest.fixture
async def as_app(pg_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(pg_url)
    yield engine
    await engine.dispose()


async def test_the_app_role_is_not_privileged_and_owns_nothing(as_app: AsyncEngine) -> None:
    async with as_app.connect() as conn:
        flags = (
            await conn.execute(
                text(
                    "SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb "
                    "FROM pg_roles WHERE rolname = current_user"
                )
            )
        ).one()
        owned = await conn.scalar(
            text("SELECT count(*) FROM pg_class WHERE pg_get_userbyid(relowner) = current_user")
        )

    assert tuple(flags) == (False, False, False, False)
    assert owned == 0


async def test_the_app_role_holds_on_work_items_what_the_queue_needs_and_no_more(
    as_app: AsyncEngine,
) -> None:
    async with as_app.connect() as conn:
        held = {
            privilege: await conn.scalar(
                text("SELECT has_table_privilege(current_user, 'work_items', :p)"),
                {"p": privilege},
            )
            for privilege in (*QUEUE_NEEDS, "TRUNCATE", "REFERENCES", "TRIGGER")
        }

    assert held == {
        "SELECT": True,
        "INSERT": True,
        "UPDATE": True,
        "DELETE": True,
        "TRUNCATE": False,
        "REFERENCES": False,
        "TRIGGER": False,
    }


@pytest.mark.parametrize("what", sorted(REFUSED))
async def test_the_app_role_is_refused(as_app: AsyncEngine, pg_owner_url: str, what: str) -> None:
    owner = pg_owner_url.split("://", 1)[1].split("@", 1)[0]
    statement = REFUSED[what].format(owner=owner)

    with pytest.raises(DBAPIError, match=r"permission denied|must be owner|must be superuser"):
        async with as_app.begin() as conn:
            await conn.execute(text(statement))

    async with as_app.connect() as conn:  # and the table is as the migration left it
        forced = await conn.scalar(
            text("SELECT relforcerowsecurity FROM pg_class WHERE relname = 'work_items'")
        )
    assert forced is True
