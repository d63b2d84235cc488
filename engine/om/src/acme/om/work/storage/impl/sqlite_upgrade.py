"""An embedded SQLite file brought to the work namespace's current tables at start.

`create_all` creates a missing table and never alters one that exists, so a file made by an
earlier release keeps that release's columns, checks and indexes. `upgrade_sqlite_file`
rebuilds each work table whose stored definition differs from `metadata`'s, by SQLite's
documented recipe ("Making Other Kinds Of Table Schema Changes", sqlite.org/lang_altertable):
a new table, the columns both share copied, the old table dropped, the new one renamed; then
it builds each index whose definition differs. One transaction, taken with the write lock
first, so two processes starting at once upgrade the file once (docs/decisions/0047).
"""

from __future__ import annotations

import importlib
import pkgutil
import sqlite3
from pathlib import Path

from sqlalchemy import Index, Table
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.schema import CreateIndex, CreateTable

import acme.om.work.storage.tables as work_tables_package

_DIALECT = sqlite.dialect()


class SqliteFileOutdated(Exception):
    """An embedded file's rows do not fit this release's tables (a row an earlier release
    allowed that a check now refuses, or a new column without a default); the file is left
    as it was, and the message names it and the fix (delete it: it holds local data only)."""


def work_tables() -> tuple[Table, ...]:
    """Every table the `work` namespace defines (`acme.om.work.storage.tables.*`)."""
    tables: list[Table] = []
    for info in pkgutil.iter_modules(work_tables_package.__path__):
        module = importlib.import_module(f"{work_tables_package.__name__}.{info.name}")
        tables.extend(value for value in vars(module).values() if isinstance(value, Table))
    return tuple(sorted(tables, key=lambda table: table.name))


def upgrade_sqlite_file(url: str) -> tuple[str, ...]:
    """Rebuild the work tables of the SQLite file at `url` whose definition differs from
    `metadata`'s, and their changed indexes; returns the names of the tables rebuilt.

    A missing file or table is left to `create_all`. Accepts `sqlite:///path` and
    `sqlite+aiosqlite:///path`. Raises `SqliteFileOutdated` when the rows do not fit.
    """
    database = make_url(url).database
    if not database or database == ":memory:" or not Path(database).is_file():
        return ()
    connection = sqlite3.connect(database, isolation_level=None, timeout=30)
    try:
        connection.execute("BEGIN IMMEDIATE")
        try:
            rebuilt = tuple(
                table.name for table in work_tables() if _upgrade_table(connection, table)
            )
        except sqlite3.IntegrityError as exc:
            connection.execute("ROLLBACK")
            raise SqliteFileOutdated(
                f"the embedded database {database} was made by an earlier release and its "
                f"rows do not fit this one ({exc}); stop every local process and delete "
                f"{database} (it holds local data only)"
            ) from exc
        connection.execute("COMMIT")
        return rebuilt
    finally:
        connection.close()


def _upgrade_table(connection: sqlite3.Connection, table: Table) -> bool:
    """Bring one table and its indexes to `metadata`'s; True when the table was rebuilt."""
    stored = _stored(connection, "table", table.name)
    if not stored:
        return False
    wanted = _ddl(CreateTable(table))
    rebuilt = _body(stored[table.name]) != _body(wanted)
    if rebuilt:
        existing = {row[1] for row in connection.execute(f'PRAGMA table_info("{table.name}")')}
        shared = ", ".join(f'"{c.name}"' for c in table.columns if c.name in existing)
        staging = f"{table.name}__upgrade"
        header = f"CREATE TABLE {table.name} ("
        connection.execute(wanted.replace(header, f"CREATE TABLE {staging} (", 1))
        connection.execute(f'INSERT INTO {staging} ({shared}) SELECT {shared} FROM "{table.name}"')
        connection.execute(f'DROP TABLE "{table.name}"')
        connection.execute(f'ALTER TABLE {staging} RENAME TO "{table.name}"')
    indexes = _stored(connection, "index", table.name)
    wanted_indexes: dict[str, Index] = {str(index.name): index for index in table.indexes}
    for name, index in wanted_indexes.items():
        create = _ddl(CreateIndex(index))
        if indexes.get(name) != create:
            connection.execute(f'DROP INDEX IF EXISTS "{name}"')
            connection.execute(create)
    for name in indexes.keys() - wanted_indexes.keys():
        connection.execute(f'DROP INDEX "{name}"')
    return rebuilt


def _stored(connection: sqlite3.Connection, kind: str, table: str) -> dict[str, str]:
    """`name -> sql` of the file's objects of `kind` on `table` (SQLite's own automatic
    indexes, which have no SQL, left out)."""
    rows = connection.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = ? AND tbl_name = ? AND sql IS NOT NULL",
        (kind, table),
    )
    return {str(name): str(sql) for name, sql in rows}


def _ddl(statement: CreateTable | CreateIndex) -> str:
    return str(statement.compile(dialect=_DIALECT)).strip()


def _body(create_table: str) -> str:
    """A `CREATE TABLE` statement from its first parenthesis: SQLite stores a renamed
    table's statement with the new name quoted, so the name is left out of the comparison."""
    return create_table[create_table.index("(") :]
