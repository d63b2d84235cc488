"""Queue revisions are safe on a big table (issue 31, item 0; docs/decisions/0032).

The rule, for every queue revision from now on (docs/updating.md, "Revisions on a big
table"): an index is built and dropped `CONCURRENTLY` (the host's `run_sql_file` runs such
statements in alembic's `autocommit_block()`), after `DROP INDEX CONCURRENTLY IF EXISTS`
of the same name (a failed concurrent build leaves an INVALID index behind); every
statement that takes a lock runs under a `lock_timeout` of at most 3 s (a plain `SET`
before an autocommit block: `SET LOCAL` ends with the transaction the block commits), but
a `CONCURRENTLY` statement, which may wait longer: it blocks no reader or writer while it
waits, and it waits for every transaction older than it (docs/decisions/0052); no
statement rewrites the table. squawk runs over every file; the waivers that would let a
stall through are refused, but `require-concurrent-index-creation` in a file whose plain
index builds are on a table it creates. The revisions shipped before the rule (`FROZEN`)
keep their waivers as shipped: applied revisions never rerun.

Checked by mutation (a good revision written into a temporary copy, then broken ten ways),
and the good revision applies on PostgreSQL through a rendered host's migrate module, also
after its own concurrent build failed (a writer held the table past its `lock_timeout`).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from conftest import (
    ADMIN_URL,
    DEFAULT_ANSWERS,
    REPO,
    copy_host,
    copy_template,
    host_gate,
    load_extension,
    uv_sync,
)
from test_schema_revisions import databases, migration_env, new_database, query

__all__ = ["databases"]  # the fixture, shared with test_schema_revisions

hostfacts = load_extension("hostfacts")

TPL_SQL = REPO / "template/{% if namespace_absent %}om{% endif %}/migrations/sql/queue"
SQUAWK = REPO / ".venv/bin/squawk"
PG_VERSION = "15"  # the reference host's (deployment/local/docker-compose.yml)
STAMP = "{{ migration_stamp }}"
MAX_LOCK_TIMEOUT_S = 3.0  # issue 31: no revision shipped from now on stalls traffic longer

# The revisions shipped before the rule, frozen: each file's squawk waivers as shipped
# (`squawk-ignore-file`, `squawk-ignore`), and the findings squawk makes on it that no
# waiver names (nothing ran squawk before; the file is applied already and never reruns,
# so it stays as it is).
FROZEN: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    f"{STAMP}_{name}": (frozenset(waived), frozenset(unwaived))
    for name, waived, unwaived in [
        (
            "work_items.up.sql",
            {"prefer-robust-stmts", "require-concurrent-index-creation", "prefer-bigint-over-int"},
            (),
        ),
        ("work_items.down.sql", {"ban-drop-table", "prefer-robust-stmts"}, ()),
        (
            "work_items_claim_paths.up.sql",
            {"require-concurrent-index-creation", "prefer-robust-stmts"},
            {"require-concurrent-index-deletion"},
        ),
        (
            "work_items_claim_paths.down.sql",
            {"require-concurrent-index-creation", "prefer-robust-stmts"},
            {"require-concurrent-index-deletion", "ban-drop-function"},
        ),
        ("work_items_payload_object.up.sql", {"prefer-robust-stmts"}, ()),
        ("work_items_payload_object.down.sql", {"ban-drop-constraint", "prefer-robust-stmts"}, ()),
        ("work_items_payload_checked.up.sql", {"prefer-robust-stmts"}, ()),
        ("work_items_payload_checked.down.sql", (), ()),
        (
            "work_items_audit_owed.up.sql",
            {"require-concurrent-index-creation", "prefer-robust-stmts"},
            (),
        ),
        (
            "work_items_audit_owed.down.sql",
            {"ban-drop-column", "require-concurrent-index-deletion", "prefer-robust-stmts"},
            (),
        ),
        ("work_items_deleted.up.sql", {"require-concurrent-index-creation"}, ()),
        (
            "work_items_deleted.down.sql",
            {"require-concurrent-index-deletion", "prefer-robust-stmts"},
            (),
        ),
    ]
}

# squawk rules whose waiver would let a stall through: refused in every new revision
# (`require-concurrent-index-creation` but in a file that creates the indexed table).
STALL_RULES = frozenset(
    {
        "require-concurrent-index-creation",
        "require-concurrent-index-deletion",
        "ban-concurrent-index-creation-in-transaction",
        "require-lock-timeout",
        "require-timeout-settings",
        "changing-column-type",
        "adding-field-with-default",
        "adding-not-nullable-field",
        "adding-serial-primary-key-field",
        "constraint-missing-not-valid",
        "disallowed-unique-constraint",
        "adding-foreign-key-constraint",
    }
)

# One token of SQL text, as the host's `split_statements` reads it.
_TOKEN = re.compile(
    r"""
      (?P<comment>--[^\n]*|/\*.*?\*/)
    | (?P<quoted>'(?:[^']|'')*'|"(?:[^"]|"")*"|(?P<dollar>\$[A-Za-z_0-9]*\$).*?(?P=dollar))
    | (?P<end>;)
    | [^-/'"$;]+ | .
    """,
    re.VERBOSE | re.DOTALL,
)
_WAIVER = re.compile(r"--\s*squawk-ignore(?:-file)?\s+([a-z0-9, -]+)")
_VOLATILE = re.compile(
    r"\b(gen_random_uuid|uuid_generate_v\w+|random|clock_timestamp|timeofday|nextval)\s*\("
    r"|\b(big|small)?serial\b|\bGENERATED\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Statement:
    """One statement: its code on one line (comments dropped), the same with its string
    literals and quoted names blanked (`bare`), and the line it starts on."""

    code: str
    bare: str
    line: int

    @property
    def outside(self) -> bool:
        """Runs in the autocommit block: the host's `runs_outside_transaction`."""
        return bool(re.search(r"\bCONCURRENTLY\b", self.bare, re.IGNORECASE))

    @property
    def head(self) -> str:
        return self.code if len(self.code) <= 70 else self.code[:67] + "..."

    def match(self, pattern: str) -> re.Match[str] | None:
        return re.match(pattern, self.bare, re.IGNORECASE)


def statements(sql: str) -> list[Statement]:
    """The statements of `sql` that hold code, in order, split as the host splits them."""
    found: list[Statement] = []
    code: list[str] = []
    bare: list[str] = []
    line = start = 1

    def close() -> None:
        text = " ".join("".join(code).split())
        if text:
            found.append(Statement(text, " ".join("".join(bare).split()), start))

    for match in _TOKEN.finditer(sql):
        token = match.group(0)
        if match.group("end"):
            close()
            code, bare = [], []
        elif not match.group("comment"):
            if not "".join(code).strip() and token.strip():
                start = line + token[: len(token) - len(token.lstrip())].count("\n")
            code.append(token)
            bare.append(" ? " if match.group("quoted") else token)
        line += token.count("\n")
    close()
    return found


def waivers(sql: str) -> set[str]:
    """Every rule a `squawk-ignore-file` or `squawk-ignore` comment names."""
    return {
        rule.strip() for names in _WAIVER.findall(sql) for rule in names.split(",") if rule.strip()
    }


def _seconds(value: str) -> float:
    """A `lock_timeout` value in seconds ('2s', '2000', '500ms', '1min'); 0 means none, as
    does DEFAULT (the server's, 0 unless configured)."""
    if value.strip().upper() == "DEFAULT":
        return 0.0
    match = re.fullmatch(r"'?\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*'?", value.strip(), re.IGNORECASE)
    assert match, f"lock_timeout {value}: not a duration"
    number, unit = match.groups()
    scale = {"": 0.001, "ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
    return float(number) * scale.get(unit.lower(), 1.0)


def rule_breaches(name: str, sql: str) -> list[str]:
    """The rule's refusals of one SQL file, one line each: `<file>:<line>: <statement>:
    <what is wrong>; fix: <what to write>`."""
    frozen = name in FROZEN
    found = statements(sql)
    created = {
        m.group(1).lower()
        for s in found
        if (m := s.match(r"CREATE TABLE (?:IF NOT EXISTS )?([\w.]+)"))
    }
    refusals: list[str] = []

    def refuse(s: Statement, what: str, fix: str) -> None:
        refusals.append(f"{name}:{s.line}: {s.head}: {what}; fix: {fix}")

    lock_local = lock_session = False
    long_wait: tuple[float, int] | None = None  # a lock_timeout past the bound, and its line
    in_block = False
    dropped: set[str] = set()
    validated = False
    for s in found:
        if s.outside and not in_block:
            lock_local = False  # the block commits the transaction SET LOCAL lived in
        in_block = s.outside
        if s.match(r"RESET lock_timeout\b"):
            lock_session = False
            long_wait = None
            continue
        if m := re.match(
            r"SET (LOCAL |SESSION )?lock_timeout\s*(?:=|TO)\s*(.+)", s.code, re.IGNORECASE
        ):
            seconds = _seconds(m.group(2))
            long_wait = (seconds, s.line) if seconds > MAX_LOCK_TIMEOUT_S else None
            if (m.group(1) or "").strip().upper() == "LOCAL":
                lock_local = seconds > 0
            else:
                lock_session = seconds > 0
            continue
        if s.match(r"(SET|RESET|SHOW|SELECT)\b"):
            continue
        if long_wait is not None and not s.outside and not frozen:
            refuse(
                s,
                f"waits for its lock up to {long_wait[0]:g} s (lock_timeout, line "
                f"{long_wait[1]}), stalling traffic queued behind it; only a CONCURRENTLY "
                "statement may wait longer than 3 s",
                "SET lock_timeout = '2s' before it",
            )
        if not (lock_local or lock_session):
            refuse(
                s,
                "runs without lock_timeout"
                + (" (in the autocommit block, which no SET LOCAL reaches)" if s.outside else ""),
                "SET lock_timeout = '2s' before it (a plain SET)"
                if s.outside
                else "SET LOCAL lock_timeout = '2s' first",
            )
        index = s.match(
            r"CREATE (?:UNIQUE )?INDEX (CONCURRENTLY )?(?:IF NOT EXISTS )?(\w+)? ?ON (?:ONLY )?([\w.]+)"
        )
        if index:
            concurrently, ix, table = index.group(1), (index.group(2) or "").lower(), index.group(3)
            if not concurrently and not frozen and table.lower() not in created:
                refuse(
                    s,
                    "builds an index in a transaction (writes stop for the whole build)",
                    f"DROP INDEX CONCURRENTLY IF EXISTS {ix or '<name>'}; then CREATE INDEX "
                    "CONCURRENTLY IF NOT EXISTS with the same definition",
                )
            elif concurrently and not ix:
                refuse(s, "a concurrent build without a name", "name the index")
            elif concurrently and ix not in dropped:
                refuse(
                    s,
                    "a concurrent build without dropping first the INVALID index a failed "
                    "build leaves",
                    f"DROP INDEX CONCURRENTLY IF EXISTS {ix}; just before it",
                )
        if m := s.match(r"DROP INDEX (CONCURRENTLY )?(IF EXISTS )?([\w.]+)"):
            if not m.group(1) and not frozen:
                refuse(s, "drops an index in a transaction", "DROP INDEX CONCURRENTLY IF EXISTS")
            elif m.group(1):
                dropped.add(m.group(3).lower())
        if s.match(r"ALTER TABLE .*\bVALIDATE CONSTRAINT\b"):
            validated = True
        if s.match(r"ALTER TABLE .*\bALTER (COLUMN )?\w+ (SET DATA )?TYPE\b"):
            refuse(
                s,
                "changes a column's type (rewrites the table under ACCESS EXCLUSIVE)",
                "add a new column, backfill it in batches, switch readers, drop the old one",
            )
        if s.match(r"ALTER TABLE .*\bADD (COLUMN )?.*") and _VOLATILE.search(s.code):
            refuse(
                s,
                "adds a column with a volatile default or generated value (rewrites the table)",
                "add it without a default (or a constant one) and backfill in batches",
            )
        if s.match(r"ALTER TABLE .*\bSET NOT NULL\b") and not validated:
            refuse(
                s,
                "SET NOT NULL scans the table under ACCESS EXCLUSIVE",
                "ADD CONSTRAINT ... CHECK (<column> IS NOT NULL) NOT VALID, VALIDATE it, "
                "then SET NOT NULL in the same file after the VALIDATE",
            )
        if s.match(r"ALTER TABLE .*\bSET (LOGGED|UNLOGGED|TABLESPACE)\b"):
            refuse(s, "rewrites the table", "leave the table's storage as it is")
        if s.match(r"VACUUM\b.*\bFULL\b|VACUUM \(.*\bFULL\b|CLUSTER\b"):
            refuse(
                s,
                "rewrites the table under ACCESS EXCLUSIVE",
                "leave it to autovacuum (or pg_repack, by hand)",
            )
    return refusals


def waiver_breaches(name: str, sql: str) -> list[str]:
    """Waivers the rule refuses: a frozen file's other than as shipped; a new file's of a
    stall rule (`require-concurrent-index-creation` kept for a file that creates its table)."""
    waived = waivers(sql)
    if name in FROZEN:
        shipped = FROZEN[name][0]
        if waived != shipped:
            return [
                (
                    f"{name}: waives {sorted(waived)}, shipped with {sorted(shipped)}: a "
                    "shipped revision is frozen; fix: put the change in a new revision"
                )
            ]
        return []
    creates_table = any(s.match(r"CREATE TABLE\b") for s in statements(sql))
    refused = sorted(
        rule
        for rule in waived & STALL_RULES
        if not (rule == "require-concurrent-index-creation" and creates_table)
    )
    return [
        f"{name}: waives squawk's {rule}, which the rule keeps for revisions that stall no "
        "traffic; fix: remove the waiver and write the statement as docs/updating.md, "
        '"Revisions on a big table", says'
        for rule in refused
    ]


def squawk_findings(path: Path) -> list[str]:
    """squawk over one file, one line per finding (`<file>:<line>: <rule>: ...; fix: ...`).

    A file that runs in one transaction is read as one (`--assume-in-transaction`); one with
    an autocommit block as what it is, statements outside a transaction. A frozen file's
    unwaived findings as shipped are excluded.
    """
    sql = path.read_text(encoding="utf-8")
    args = [str(SQUAWK), f"--pg-version={PG_VERSION}", "--reporter", "json"]
    if not any(s.outside for s in statements(sql)):
        args.append("--assume-in-transaction")
    if path.name in FROZEN and FROZEN[path.name][1]:
        args.append("--exclude=" + ",".join(sorted(FROZEN[path.name][1])))
    done = subprocess.run(
        [*args, path.name], cwd=path.parent, capture_output=True, text=True, check=False
    )
    assert done.returncode in (0, 1) and done.stdout.strip(), done.stdout + done.stderr
    return [
        f"{path.name}:{finding['line'] + 1}: squawk {finding['rule_name']}: "
        f"{finding['message']}; fix: {finding.get('help') or 'see squawkhq.com/docs/rules'}"
        for finding in json.loads(done.stdout)
    ]


def refusals(path: Path) -> list[str]:
    """Everything the rule refuses in one revision SQL file."""
    sql = path.read_text(encoding="utf-8")
    return rule_breaches(path.name, sql) + waiver_breaches(path.name, sql) + squawk_findings(path)


# --- every queue revision of the template ---------------------------------------------------


def test_the_frozen_list_names_every_shipped_revision_that_exists() -> None:
    """A frozen name without its file is a typo that would exempt nothing, or a revision
    renamed (renaming an applied revision is itself the bug)."""
    assert sorted(n for n in FROZEN if not (TPL_SQL / n).is_file()) == []


@pytest.mark.parametrize("name", sorted(p.name for p in TPL_SQL.glob("*.sql")))
def test_every_queue_revision_follows_the_rule(name: str) -> None:
    found = refusals(TPL_SQL / name)
    assert found == [], "\n".join(found)


TPL_VERSIONS = TPL_SQL.parent.parent / "versions" / "queue"
# alembic's `alembic_version.version_num` is `varchar(32)`; a host's update may add the
# merge revision `<template head>_join` (extensions/queue_join.py), 5 characters more.
VERSION_NUM_CHARS = 32
STAMP_CHARS = 14


def test_every_queue_revision_id_and_its_join_fit_alembics_version_column() -> None:
    """Every id `<stamp>_<name>` fits the column, and the head's with `_join` too: a host
    with revisions of its own gets that merge revision on update. Each new revision is the
    head when it is added, so a name too long for its join fails here first; past the
    column, `make migrate` failed only once a database reached it."""
    found = {}
    for path in sorted(TPL_VERSIONS.glob("*.py.jinja")):
        text = path.read_text(encoding="utf-8")
        ids = [
            re.search(rf'^{key} = "\{{\{{ migration_stamp \}}\}}(\w*)"$', text, re.MULTILINE)
            for key in ("revision", "down_revision")
        ]
        if ids[0] is not None:
            found[ids[0].group(1)] = None if ids[1] is None else ids[1].group(1)
    assert len(found) >= 15
    too_long = [r for r in found if STAMP_CHARS + len(r) > VERSION_NUM_CHARS]
    assert too_long == [], f"revision ids longer than version_num's {VERSION_NUM_CHARS}: {too_long}"
    [head] = set(found) - set(found.values())
    assert STAMP_CHARS + len(head) + len("_join") <= VERSION_NUM_CHARS, (
        f"the head <stamp>{head} leaves its join <stamp>{head}_join past version_num's "
        f"{VERSION_NUM_CHARS} characters: name it in at most 12"
    )


# --- mutation: a good revision passes; each breach of it is refused -------------------------

PROBE = "ix_work_items_rule_probe"
GOOD_UP = f"""-- A new index on the queue, built while the queue runs: CONCURRENTLY, in run_sql_file's
-- autocommit block (docs/updating.md, "Revisions on a big table").
-- A plain SET: SET LOCAL would end with the transaction the autocommit block commits.
SET lock_timeout = '2s';
-- A concurrent build blocks no reader nor writer: it may take its time.
SET statement_timeout = '1h';
-- A failed concurrent build leaves an INVALID index of this name: drop it first.
DROP INDEX CONCURRENTLY IF EXISTS {PROBE};
CREATE INDEX CONCURRENTLY IF NOT EXISTS {PROBE}
    ON work_items (org_id, updated_at) WHERE status = 'FAILED';
RESET statement_timeout;
RESET lock_timeout;
"""
GOOD_DOWN = f"""SET lock_timeout = '2s';
SET statement_timeout = '1h';
DROP INDEX CONCURRENTLY IF EXISTS {PROBE};
RESET statement_timeout;
RESET lock_timeout;
"""
GOOD_NAME = f"{STAMP}_work_items_rule_probe"

MUTATIONS: dict[str, tuple[Callable[[str], str], str]] = {
    "a plain CREATE INDEX": (
        lambda sql: sql.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX"),
        "builds an index in a transaction",
    ),
    "a missing lock_timeout": (
        lambda sql: sql.replace("SET lock_timeout = '2s';\n", ""),
        "runs without lock_timeout",
    ),
    "a concurrent build without the INVALID drop": (
        lambda sql: sql.replace(f"DROP INDEX CONCURRENTLY IF EXISTS {PROBE};\n", ""),
        "without dropping first the INVALID index",
    ),
    "an ALTER COLUMN ... TYPE": (
        lambda sql: sql.replace(
            "RESET statement_timeout;",
            "ALTER TABLE work_items ALTER COLUMN note TYPE varchar(200);\nRESET statement_timeout;",
        ),
        "changes a column's type",
    ),
    "a SET LOCAL lock_timeout before the autocommit block": (
        lambda sql: sql.replace("\nSET lock_timeout", "\nSET LOCAL lock_timeout"),
        "which no SET LOCAL reaches",
    ),
    "a lock_timeout past the stall bound over a statement in the transaction": (
        lambda sql: sql.replace(
            "SET lock_timeout = '2s';",
            "SET LOCAL lock_timeout = '5s';\n"
            "ALTER TABLE work_items ADD COLUMN IF NOT EXISTS probe text;\n"
            "SET lock_timeout = '2s';",
        ),
        "waits for its lock up to 5 s (lock_timeout, line 4)",
    ),
    "a volatile default": (
        lambda sql: sql.replace(
            "RESET statement_timeout;",
            "ALTER TABLE work_items ADD COLUMN IF NOT EXISTS probe uuid "
            "DEFAULT gen_random_uuid();\nRESET statement_timeout;",
        ),
        "volatile default",
    ),
    "a SET NOT NULL without a validated check": (
        lambda sql: sql.replace(
            "RESET statement_timeout;",
            "ALTER TABLE work_items ALTER COLUMN note SET NOT NULL;\nRESET statement_timeout;",
        ),
        "SET NOT NULL scans the table",
    ),
    "a VACUUM FULL": (
        lambda sql: sql.replace(
            "RESET statement_timeout;", "VACUUM FULL work_items;\nRESET statement_timeout;"
        ),
        "rewrites the table",
    ),
    "a waiver of require-concurrent-index-creation without a table of its own": (
        lambda sql: "-- squawk-ignore-file require-concurrent-index-creation\n" + sql,
        "waives squawk's require-concurrent-index-creation",
    ),
}


@pytest.fixture
def revisions(tmp_path: Path) -> Path:
    """A temporary copy of the template's queue SQL with the good revision added."""
    folder = tmp_path / "queue"
    shutil.copytree(TPL_SQL, folder)
    (folder / f"{GOOD_NAME}.up.sql").write_text(GOOD_UP, encoding="utf-8")
    (folder / f"{GOOD_NAME}.down.sql").write_text(GOOD_DOWN, encoding="utf-8")
    return folder


def test_a_good_new_revision_passes(revisions: Path) -> None:
    for path in sorted(revisions.glob("*.sql")):
        assert refusals(path) == [], path.name


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_revision_that_breaks_the_rule_is_refused_in_one_line(
    revisions: Path, mutation: str
) -> None:
    mutate, expected = MUTATIONS[mutation]
    up = revisions / f"{GOOD_NAME}.up.sql"
    broken = mutate(GOOD_UP)
    assert broken != GOOD_UP, "the mutation changed nothing"
    up.write_text(broken, encoding="utf-8")
    found = refusals(up)
    ours = [line for line in found if expected in line]
    assert ours, "\n".join(found) or "nothing refused"
    for line in ours:
        assert "\n" not in line and line.startswith(up.name) and "; fix: " in line, line


def test_a_table_created_in_the_file_may_be_indexed_in_its_transaction(tmp_path: Path) -> None:
    """The waiver of `require-concurrent-index-creation` is the table-creating revision's."""
    path = tmp_path / f"{STAMP}_work_history.up.sql"
    path.write_text(
        "-- squawk-ignore-file require-concurrent-index-creation, prefer-robust-stmts\n"
        "SET LOCAL lock_timeout = '2s';\nSET LOCAL statement_timeout = '60s';\n"
        "CREATE TABLE work_history (id uuid NOT NULL, org_id uuid NOT NULL,\n"
        "    CONSTRAINT pk_work_history PRIMARY KEY (id));\n"
        "CREATE INDEX ix_work_history_org_id ON work_history (org_id);\n"
        "CREATE INDEX ix_work_items_elsewhere ON work_items (org_id);\n",
        encoding="utf-8",
    )
    found = refusals(path)
    assert [line.split(":")[1] for line in found] == ["7"], "\n".join(found)
    assert "ix_work_items_elsewhere" in found[0] and "in a transaction" in found[0]


# --- the good revision applies on PostgreSQL, also after a failed concurrent build ----------

VERSIONS = "om/migrations/versions/queue"
SQL = "om/migrations/sql/queue"
# The host's own venv (synced once), not `uv run`: each migrate process costs seconds.
MIGRATE = (".venv/bin/python", "-m", "acme.om.migrate")


@pytest.fixture(scope="module")
def host(template_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference host with the first worker rendered, synced: once for the module."""
    host = copy_host(tmp_path_factory.mktemp("revision-rule") / "host")
    copy_template(template_repo, host, "v0.0.2", **DEFAULT_ANSWERS)
    return host


def write_good_revision(host: Path) -> tuple[str, str]:
    """The good revision after the template's queue head, as a host would add it; returns
    (its id, the head it follows)."""
    head = hostfacts.queue_head(host / VERSIONS)
    assert head, "the rendered queue history has no single head"
    stamp = head.split("_", 1)[0]
    rev = "29991231000000"
    name = GOOD_NAME.replace(STAMP, rev)
    (host / VERSIONS / f"{name}.py").write_text(
        f'"""A probe index built CONCURRENTLY (tests/test_revision_rule.py)."""\n\n'
        "from acme.om.migrations_support import run_sql_file\n\n"
        f'revision = "{rev}"\ndown_revision = "{head}"\n\n\n'
        f'def upgrade() -> None:\n    run_sql_file("queue/{name}.up.sql")\n\n\n'
        f'def downgrade() -> None:\n    run_sql_file("queue/{name}.down.sql")\n',
        encoding="utf-8",
    )
    (host / SQL / f"{name}.up.sql").write_text(GOOD_UP, encoding="utf-8")
    (host / SQL / f"{name}.down.sql").write_text(GOOD_DOWN, encoding="utf-8")
    assert stamp.isdigit()
    return rev, head


# The host's own reading of every queue SQL file: for each statement, whether
# `run_sql_file` runs it outside the transaction.
HOST_READING = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from acme.om.migrations_support import runs_outside_transaction, split_statements\n"
    "print(json.dumps({p.name: [runs_outside_transaction(s) for s in split_statements("
    "p.read_text())] for p in sorted(Path(sys.argv[1]).glob('*.sql'))}))\n"
)


def probe_state(database: str) -> list[tuple[object, ...]]:
    return query(
        database,
        "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
        f"JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = '{PROBE}'",
    )


async def _migrate_while_a_writer_holds_the_table(
    host: Path, env: dict[str, str], database: str
) -> subprocess.CompletedProcess[str]:
    """`upgrade --role queue` while another session holds ROW EXCLUSIVE on `work_items`: the
    concurrent build waits for it past `lock_timeout` and fails, as on a busy table."""
    conn = await asyncpg.connect(ADMIN_URL.rsplit("/", 1)[0] + f"/{database}")
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE work_items IN ROW EXCLUSIVE MODE")
            proc = await asyncio.create_subprocess_exec(
                *MIGRATE,
                "upgrade",
                "--role",
                "queue",
                cwd=host,
                env={**env, "UV_OFFLINE": "1"},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        await conn.close()
    return subprocess.CompletedProcess(MIGRATE, proc.returncode or 0, out.decode(), err.decode())


def test_the_good_revision_applies_and_reapplies_after_a_failed_concurrent_build(
    host: Path, uv_env: dict[str, str], databases: list[str]
) -> None:
    synced = uv_sync(host, uv_env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    database = new_database(databases)
    env = migration_env(uv_env, database)
    host_gate(host, env, *MIGRATE, "upgrade")  # every role at the template's head
    rev, head = write_good_revision(host)

    failed = asyncio.run(_migrate_while_a_writer_holds_the_table(host, env, database))
    assert failed.returncode != 0, failed.stdout[-2000:]
    assert "lock timeout" in failed.stderr, failed.stderr[-2000:]
    assert query(database, "SELECT version_num FROM alembic_version_queue") == [(head,)]
    [(valid, _)] = probe_state(database)
    assert valid is False, "the failed build left no INVALID index: the case is not tested"

    host_gate(host, env, *MIGRATE, "upgrade", "--role", "queue")
    assert query(database, "SELECT version_num FROM alembic_version_queue") == [(rev,)]
    [(valid, definition)] = probe_state(database)
    assert valid is True
    assert "(org_id, updated_at) WHERE (status = 'FAILED'::text)" in str(definition)

    host_gate(host, env, *MIGRATE, "downgrade", "--role", "queue", "--to", head)
    assert probe_state(database) == []

    # what this test reads as outside the transaction is what the host's helper runs there
    read = json.loads(host_gate(host, env, MIGRATE[0], "-c", HOST_READING, str(host / SQL)))
    ours = {
        p.name: [s.outside for s in statements(p.read_text(encoding="utf-8"))]
        for p in sorted((host / SQL).glob("*.sql"))
    }
    assert read == ours
    assert any(any(flags) for flags in ours.values()), "no statement outside a transaction"
