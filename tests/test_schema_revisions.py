"""Schema changes reach existing databases (issue 11, item 3; docs/decisions/0012).

The template's queue revisions form one fixed chain (`<stamp>`, then `<stamp>_<change>`
per schema release). A host that added its own queue revision after one of them gets two
heads when an update brings the next template revision; the update's `queue_join.py` task
then writes one merge revision, `<template head>_join`, so `make migrate` (alembic
`upgrade head`) and `make migrate-check` work unchanged.

`schema_history` is the template at two releases: N, the working tree without its newest
queue revision (found by parsing the revision files, so the test keeps covering the newest
schema release), tagged `v0.0.1`; N+1, the working tree, tagged `v0.0.2`. The fast tests
render and update on files only; the slow one migrates real PostgreSQL databases with the
host's own `make migrate` and `make migrate-check`.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from conftest import (
    ADMIN_URL,
    VENV_BIN,
    commit_all,
    copy_host,
    copy_template,
    git,
    host_gate,
    load_extension,
    snapshot_template,
    tree_state,
    uv_sync,
)

hostfacts = load_extension("hostfacts")
queue_join = load_extension("queue_join")

A = "shipment-notifier"
A_ANSWERS = {"worker_name": A, "work_kind": "NOTIFY_SHIPMENT"}
B_ANSWERS = {"worker_name": "invoice-mailer", "work_kind": "SEND_INVOICE"}
ANSWERS = f"workers/{A}/.copier-answers.yml"
TPL_MIGRATIONS = "template/{% if namespace_absent %}om{% endif %}/migrations"
STAMP_TAG = "{{ migration_stamp }}"
VERSIONS = "om/migrations/versions/queue"
SQL = "om/migrations/sql/queue"
# The user's own queue revision: what alembic's `revision` command writes from the host's
# script.py.mako, then filled in as the mako's placeholders ask.
USER_REV = "20270105090000"
USER_SLUG = "work_items_kind_not_blank"
USER_CONSTRAINT = "ck_work_items_kind_not_blank"


@dataclass(frozen=True)
class SchemaHistory:
    """The template repo, and the newest queue revision N+1 adds (`{{ migration_stamp }}` in
    place of the stamp): its revision id and its version file's name stem."""

    repo: Path
    revision: str
    stem: str
    previous: str  # the revision the newest follows: N's head

    def newest(self, stamp: str) -> str:
        return self.revision.replace(STAMP_TAG, stamp)

    def head_before(self, stamp: str) -> str:
        return self.previous.replace(STAMP_TAG, stamp)

    def files(self, stamp: str) -> set[str]:
        """The host paths of the newest revision: its wrapper and its SQL."""
        stem = self.stem.replace(STAMP_TAG, stamp)
        return {f"{VERSIONS}/{stem}.py", f"{SQL}/{stem}.up.sql", f"{SQL}/{stem}.down.sql"}


def newest_template_revision(repo: Path) -> tuple[str, str, str]:
    """The template's newest queue revision (the one no other template revision follows):
    its id, its file's name stem, and the revision it follows."""
    chain: dict[str, tuple[str, str]] = {}
    for path in sorted((repo / TPL_MIGRATIONS / "versions/queue").glob("*.py.jinja")):
        text = path.read_text(encoding="utf-8")
        rev = re.search(r'(?m)^revision = "([^"]+)"$', text)
        down = re.search(r'(?m)^down_revision = "([^"]+)"$', text)
        assert rev, path
        chain[rev.group(1)] = (down.group(1) if down else "", path.name.removesuffix(".py.jinja"))
    followed = {down for down, _ in chain.values()}
    heads = [rev for rev in chain if rev not in followed]
    assert len(heads) == 1, f"the template's queue revisions are not one chain: {chain}"
    assert chain[heads[0]][0], "the template has a single queue revision: no release to test"
    return heads[0], chain[heads[0]][1], chain[heads[0]][0]


@pytest.fixture(scope="module")
def schema_history(tmp_path_factory: pytest.TempPathFactory) -> SchemaHistory:
    """N (the working tree without its newest queue revision) as `v0.0.1`, N+1 as `v0.0.2`."""
    repo = snapshot_template(tmp_path_factory.mktemp("schema") / "worker-template")
    git(repo, "tag", "-d", "v0.0.1")
    revision, stem, previous = newest_template_revision(repo)
    paths = [
        f"{TPL_MIGRATIONS}/versions/queue/{stem}.py.jinja",
        f"{TPL_MIGRATIONS}/sql/queue/{stem}.up.sql",
        f"{TPL_MIGRATIONS}/sql/queue/{stem}.down.sql",
    ]
    git(repo, "rm", "-q", *paths)
    commit_all(repo, f"release N: the queue without {revision}")
    git(repo, "tag", "v0.0.1")
    git(repo, "revert", "--no-edit", "HEAD")
    git(repo, "tag", "v0.0.2")
    return SchemaHistory(repo, revision, stem, previous)


def recorded(host: Path, name: str = A) -> dict[str, Any]:
    return yaml.safe_load((host / f"workers/{name}/.copier-answers.yml").read_text())


def helper_update(host: Path, name: str = A, *extra: str) -> subprocess.CompletedProcess[str]:
    """`python3 scripts/workers.py update <name>` in the host, as `make update-worker` runs it."""
    env = {**os.environ, "COPIER": str(VENV_BIN / "copier")}
    env.pop("GITHUB_ACTIONS", None)
    return subprocess.run(
        [sys.executable, "scripts/workers.py", "update", name, *extra],
        cwd=host,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


USER_REVISION_SOURCE = f'''"""Work item kinds are never blank.

Revision ID: {USER_REV}
Revises: {{down}}
"""

from acme.om.migrations_support import run_sql_file

revision = "{USER_REV}"
down_revision = "{{down}}"


def upgrade() -> None:
    run_sql_file("queue/{USER_REV}_{USER_SLUG}.up.sql")


def downgrade() -> None:
    run_sql_file("queue/{USER_REV}_{USER_SLUG}.down.sql")
'''
USER_UP = f"ALTER TABLE work_items ADD CONSTRAINT {USER_CONSTRAINT} CHECK (kind <> '');\n"
USER_DOWN = f"ALTER TABLE work_items DROP CONSTRAINT {USER_CONSTRAINT};\n"


def write_user_sql(host: Path) -> None:
    (host / SQL / f"{USER_REV}_{USER_SLUG}.up.sql").write_text(USER_UP)
    (host / SQL / f"{USER_REV}_{USER_SLUG}.down.sql").write_text(USER_DOWN)


def user_paths() -> set[str]:
    return {
        f"{VERSIONS}/{USER_REV}_{USER_SLUG}.py",
        f"{SQL}/{USER_REV}_{USER_SLUG}.up.sql",
        f"{SQL}/{USER_REV}_{USER_SLUG}.down.sql",
    }


def files_under(root: Path, rel: str) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted((root / rel).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def changed_paths(host: Path) -> set[str]:
    return {line[3:] for line in tree_state(host).splitlines()}


# --- fast: files only ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def at_n(schema_history: SchemaHistory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference host with worker A (the namespace's owner) copied at N, committed."""
    host = copy_host(tmp_path_factory.mktemp("schema-n") / "host")
    copy_template(schema_history.repo, host, "v0.0.1", **A_ANSWERS)
    commit_all(host, f"add {A} at N")
    return host


@pytest.fixture
def host(at_n: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "host"
    shutil.copytree(at_n, dst, symlinks=True)
    return dst


def test_an_update_without_revisions_of_the_hosts_own_writes_no_join(
    host: Path, schema_history: SchemaHistory
) -> None:
    """N lacks the newest revision, N+1 brings it: the template's chain keeps one head."""
    stamp = recorded(host)["migration_stamp"]
    assert not any((host / p).exists() for p in schema_history.files(stamp))
    assert hostfacts.queue_head(host / VERSIONS) == schema_history.head_before(stamp)
    done = helper_update(host)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "joined" not in done.stdout
    assert all((host / p).is_file() for p in schema_history.files(stamp))
    assert changed_paths(host) == schema_history.files(stamp) | {ANSWERS}
    assert hostfacts.queue_head(host / VERSIONS) == schema_history.newest(stamp)


def test_an_update_over_a_revision_of_the_hosts_own_joins_the_two_heads(
    host: Path, schema_history: SchemaHistory, tmp_path: Path
) -> None:
    """One join, written once; the other worker's update and a second update add nothing;
    the template's files equal a fresh N+1 copy's byte for byte."""
    stamp = recorded(host)["migration_stamp"]
    newest = schema_history.newest(stamp)
    (host / VERSIONS / f"{USER_REV}_{USER_SLUG}.py").write_text(
        USER_REVISION_SOURCE.format(down=schema_history.head_before(stamp))
    )
    write_user_sql(host)
    commit_all(host, "a queue revision of our own")
    assert hostfacts.queue_head(host / VERSIONS) == USER_REV

    done = helper_update(host)
    assert done.returncode == 0, done.stdout + done.stderr
    join = f"{VERSIONS}/{newest}_join.py"
    assert f"joined   {join}" in done.stdout
    assert changed_paths(host) == schema_history.files(stamp) | {ANSWERS, join}
    graph = hostfacts.revision_graph(host / VERSIONS)
    assert graph[f"{newest}_join"] == (USER_REV, newest)
    assert hostfacts.graph_heads(graph) == [f"{newest}_join"]
    assert hostfacts.queue_head(host / VERSIONS) == f"{newest}_join"
    text = (host / join).read_text()
    assert f'revision = "{newest}_join"\n' in text
    assert f'down_revision = ("{USER_REV}", "{newest}")\n' in text
    commit_all(host, "update A to N+1")

    again = helper_update(host, A, "--ref", "HEAD")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "joined" not in again.stdout and tree_state(host) == ""

    # a second worker (not the namespace's owner) renders no revision and joins nothing
    copy_template(schema_history.repo, host, "v0.0.2", **B_ANSWERS)
    assert not [p for p in changed_paths(host) if p.startswith("om/migrations/")]

    fresh = copy_host(tmp_path / "fresh")
    copy_template(schema_history.repo, fresh, "v0.0.2", **A_ANSWERS, migration_stamp=stamp)
    ours = files_under(host, "om/migrations")
    for rel in user_paths() | {join}:
        ours.pop(rel)
    assert ours == files_under(fresh, "om/migrations")


def test_plan_joins_only_the_template_head_with_one_head_of_the_hosts(tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    versions.mkdir()
    stamp = "20260101000000"

    def revision(name: str, rev: str, down: str | tuple[str, ...] | None) -> None:
        (versions / f"{name}.py").write_text(f"revision = {rev!r}\ndown_revision = {down!r}\n")

    revision("core_like", "a1", None)
    revision(f"{stamp}_work_items", stamp, "a1")
    assert queue_join.plan(versions, stamp).join == ()
    revision(f"{stamp}_work_items_claim_paths", f"{stamp}_claim_paths", stamp)
    revision("mine", "b1", stamp)
    assert queue_join.plan(versions, stamp).join == ("b1", f"{stamp}_claim_paths")
    revision("mine_too", "b2", stamp)  # a second head of the host's own: not ours to join
    several = queue_join.plan(versions, stamp)
    assert several.join == () and several.warn and "b1, b2" in several.reason
    (versions / "mine_too.py").unlink()
    revision("after_ours", "c1", f"{stamp}_claim_paths")  # built on the template's head
    revision("joined_by_hand", "m1", ("b1", "c1"))
    assert queue_join.plan(versions, stamp).join == ()
    assert hostfacts.queue_head(versions) == "m1"


def test_the_task_acts_only_in_the_real_host_for_the_namespace_owner(tmp_path: Path) -> None:
    """Two heads (the template's and the host's) in copier's replay folder, in a folder
    that is no git work tree, and for a worker that does not own the namespace: nothing;
    for the owner in the host: the join, once."""
    stamp = "20260101000000"

    def folder(name: str, owner: bool, repo: bool) -> Path:
        root = tmp_path / name
        versions = root / VERSIONS
        versions.mkdir(parents=True)
        for file, rev, down in (
            (f"{stamp}_work_items", stamp, None),
            (f"{stamp}_work_items_claim_paths", f"{stamp}_claim_paths", stamp),
            (f"{USER_REV}_{USER_SLUG}", USER_REV, stamp),
        ):
            (versions / f"{file}.py").write_text(f"revision = {rev!r}\ndown_revision = {down!r}\n")
        answers = root / ANSWERS
        answers.parent.mkdir(parents=True)
        answers.write_text(yaml.safe_dump({"migration_stamp": stamp, "namespace_absent": owner}))
        if repo:
            git(root, "init", "-q")
        return root

    def run(root: Path) -> list[str]:
        args = ["--operation", "update", "--answers-file", ANSWERS, "--host", str(root)]
        assert queue_join.main(args) == 0
        return sorted(p.name for p in (root / VERSIONS).glob("*_join.py"))

    assert run(folder("copier._main.new_copy.x", owner=True, repo=True)) == []
    assert run(folder("bare", owner=True, repo=False)) == []
    assert run(folder("other-worker", owner=False, repo=True)) == []
    host = folder("host", owner=True, repo=True)
    assert run(host) == [f"{stamp}_claim_paths_join.py"]
    before = (host / VERSIONS / f"{stamp}_claim_paths_join.py").read_bytes()
    assert run(host) == [f"{stamp}_claim_paths_join.py"]
    assert (host / VERSIONS / f"{stamp}_claim_paths_join.py").read_bytes() == before


def test_join_source_is_ruff_formatted_for_long_revision_ids() -> None:
    long = ("x" * 60, "20260101000000_claim_paths")
    text = queue_join.join_source("20260101000000_claim_paths_join", long)
    assert 'down_revision = (\n    "' + "x" * 60 + '",\n' in text
    assert max(len(line) for line in text.splitlines()) <= queue_join.LINE_LENGTH


# --- slow: real databases, the host's own make migrate / migrate-check ----------------------


async def _admin(*statements: str) -> None:
    conn = await asyncpg.connect(ADMIN_URL)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
def databases() -> Iterator[list[str]]:
    """Append a name to get a fresh database owned by `acme_owner` (the reference host's
    roles, as its scripts/infra-up.sh makes them); every one is dropped afterwards."""
    names: list[str] = []
    yield names
    asyncio.run(_admin(*(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)' for n in names)))


def new_database(names: list[str]) -> str:
    name = f"acme_schema_{uuid.uuid4().hex[:10]}"
    names.append(name)
    # The roles come from the reference host's infra-up.sh, run by conftest at session start.
    asyncio.run(_admin(f'CREATE DATABASE "{name}" OWNER acme_owner'))
    return name


async def _query(database: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(ADMIN_URL.rsplit("/", 1)[0] + f"/{database}")
    try:
        return [tuple(row) for row in await conn.fetch(sql)]
    finally:
        await conn.close()


def query(database: str, sql: str) -> list[tuple[Any, ...]]:
    return asyncio.run(_query(database, sql))


def migration_env(uv_env: dict[str, str], database: str) -> dict[str, str]:
    url = f"postgresql+asyncpg://acme_owner@127.0.0.1:5432/{database}"
    return {**uv_env, "ACME_MIGRATION_URL": url}


HEADS = (
    "from alembic.script import ScriptDirectory\n"
    "from acme.om.migrate import alembic_config\n"
    "from acme.om.storage.roles import DatabaseRole\n"
    "config = alembic_config(DatabaseRole.QUEUE, 'postgresql://unused')\n"
    "print(' '.join(ScriptDirectory.from_config(config).get_heads()))\n"
)
# What a host engineer runs for a new queue revision: alembic's own `revision` command on
# the queue role's history (the host's alembic_config selects versions/queue/).
NEW_REVISION = (
    "from alembic import command\n"
    "from acme.om.migrate import alembic_config\n"
    "from acme.om.storage.roles import DatabaseRole\n"
    "config = alembic_config(DatabaseRole.QUEUE, 'postgresql://unused')\n"
    f"command.revision(config, message='work items kind not blank', rev_id='{USER_REV}')\n"
)


def host_fails(host: Path, env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    """Run a host command offline that must fail; returns it for its output."""
    done = subprocess.run(
        list(command),
        cwd=host,
        env={**env, "UV_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode != 0, done.stdout[-3000:]
    return done


def alembic_heads(host: Path, env: dict[str, str]) -> list[str]:
    out = host_gate(host, env, "uv", "run", "--all-packages", "python", "-c", HEADS)
    return out.split()


def queue_version(database: str) -> list[str]:
    return sorted(r[0] for r in query(database, "SELECT version_num FROM alembic_version_queue"))


def queue_schema(database: str) -> dict[str, set[str]]:
    """The queue's indexes, triggers, check constraints and storage parameters on
    `work_items`."""
    return {
        "indexes": {r[0] for r in query(database, INDEXES)},
        "triggers": {r[0] for r in query(database, TRIGGERS)},
        "checks": {r[0] for r in query(database, CHECKS)},
        "options": {r[0] for r in query(database, OPTIONS)},
    }


MIGRATION_TESTS = "om/tests/integration/test_migrations.py"
INDEXES = "SELECT indexname FROM pg_indexes WHERE tablename = 'work_items'"
TRIGGERS = (
    "SELECT tgname FROM pg_trigger WHERE tgrelid = 'work_items'::regclass AND NOT tgisinternal"
)
CHECKS = (
    "SELECT conname FROM pg_constraint WHERE conrelid = 'work_items'::regclass AND contype = 'c'"
)
OPTIONS = "SELECT unnest(reloptions) FROM pg_class WHERE oid = 'work_items'::regclass"


@pytest.mark.slow
def test_a_schema_release_reaches_a_database_behind_a_revision_of_the_hosts_own(
    host: Path,
    schema_history: SchemaHistory,
    uv_env: dict[str, str],
    databases: list[str],
    tmp_path: Path,
) -> None:
    """Issue 11, item 3: a host at N adds its own queue revision with alembic and migrates;
    the update to N+1 brings the template's newest revision and joins it with the host's;
    `make migrate` takes the existing database to one head with both schema changes, and
    `make migrate-check` passes. Without the join, the host's `make migrate` refuses (two
    heads). A fresh copy at N+1 migrates a fresh database to one head with no join."""
    stamp = recorded(host)["migration_stamp"]
    newest = schema_history.newest(stamp)
    join = f"{newest}_join"
    synced = uv_sync(host, uv_env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    database = new_database(databases)
    env = migration_env(uv_env, database)
    host_gate(host, env, "make", "migrate")
    before = schema_history.head_before(stamp)
    assert queue_version(database) == [before]

    # the host's own queue revision, made with alembic and filled in as its mako asks
    host_gate(host, env, "uv", "run", "--all-packages", "python", "-c", NEW_REVISION)
    [made] = [p for p in (host / VERSIONS).glob(f"{USER_REV}_*.py")]
    assert made.name == f"{USER_REV}_{USER_SLUG}.py"
    text = made.read_text()
    assert f"down_revision = '{before}'" in text, text
    made.write_text(text.replace("<role>/", "queue/").replace("<name>", USER_SLUG))
    write_user_sql(host)
    host_gate(host, env, "make", "format")  # alembic writes 'quotes'; the host's ruff wants "
    host_gate(host, env, "make", "migrate")
    assert queue_version(database) == [USER_REV]
    commit_all(host, "a queue revision of our own")

    done = helper_update(host)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (host / VERSIONS / f"{join}.py").is_file(), done.stdout

    # without the join the host's migrate refuses: alembic has two heads to choose from
    aside = tmp_path / f"{join}.py"
    shutil.move(host / VERSIONS / f"{join}.py", aside)
    assert sorted(alembic_heads(host, env)) == sorted([USER_REV, newest])
    refused = host_fails(host, env, "make", "migrate")
    assert "Multiple head revisions" in refused.stderr, refused.stderr[-2000:]
    behind = host_fails(host, env, "make", "migrate-check")
    assert f"queue: at ['{USER_REV}'], head is " in behind.stderr, behind.stderr[-2000:]
    shutil.move(aside, host / VERSIONS / f"{join}.py")

    assert alembic_heads(host, env) == [join]
    host_gate(host, env, "make", "migrate")
    checked = host_gate(host, env, "make", "migrate-check")
    assert "queue at head and equal to the tables" in checked, checked
    assert queue_version(database) == [join]
    schema = queue_schema(database)
    assert "ix_work_items_claim_order" in schema["indexes"], "the template's change did not land"
    assert "ix_work_items_lane_status_available_at" not in schema["indexes"]
    assert "work_items_notify" in schema["triggers"]
    assert USER_CONSTRAINT in schema["checks"], "the host's own change was lost"
    # storage parameters reach an existing table too (docs/decisions/0033)
    assert "vacuum_index_cleanup=on" in schema["options"], schema["options"]
    # the host's own migration tests: the queue role, join and all, goes down to base and up
    tested = host_gate(
        host, env, "uv", "run", "--all-packages", "pytest", "-q", MIGRATION_TESTS, "-k", "queue"
    )
    assert re.search(r"(?m)^1 passed", tested), tested[-2000:]
    # the code the template wrote passes the host's linters and strict mypy
    join_file = f"{VERSIONS}/{join}.py"
    host_gate(host, env, "uv", "run", "--all-packages", "ruff", "check", join_file)
    host_gate(host, env, "uv", "run", "--all-packages", "ruff", "format", "--check", join_file)
    host_gate(host, env, "uv", "run", "--all-packages", "mypy", "--strict", join_file)

    # a fresh copy at N+1, no revision of the host's own: one head, no join
    fresh = copy_host(tmp_path / "fresh")
    copy_template(schema_history.repo, fresh, "v0.0.2", **A_ANSWERS)
    fresh_stamp = recorded(fresh)["migration_stamp"]
    assert not list((fresh / VERSIONS).glob("*_join.py"))
    synced = uv_sync(fresh, uv_env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    fresh_db = new_database(databases)
    fresh_env = migration_env(uv_env, fresh_db)
    assert alembic_heads(fresh, fresh_env) == [schema_history.newest(fresh_stamp)]
    host_gate(fresh, fresh_env, "make", "migrate")
    host_gate(fresh, fresh_env, "make", "migrate-check")
    assert queue_version(fresh_db) == [schema_history.newest(fresh_stamp)]
    fresh_schema = queue_schema(fresh_db)
    assert fresh_schema["indexes"] == schema["indexes"]
    assert fresh_schema["options"] == schema["options"]
