"""Rendering into the reference host: every Created file, no Jinja residue, ruff-clean,
a second copy refused, the answers file, an update across tags, and (slow) the host's gate.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import copier
import pytest
import tomlkit
import yaml
from conftest import (
    FIXTURES,
    HOST_TESTS,
    REPO,
    UPDATE_MARKER,
    VENV_BIN,
    commit_all,
    host_gate,
    load_extension,
    tree_state,
    uv_sync,
)
from copier.errors import UserMessageError

E2E_PARKED = FIXTURES / "host-tests" / "test_parked_records_e2e.py"
E2E_OUTBOX = FIXTURES / "host-tests" / "test_outbox_e2e.py"

patcher = load_extension("patcher")

WORK = "om/src/acme/om/work"
WORKER = "workers/shipment-notifier"
PKG = f"{WORKER}/src/acme/workers/shipment_notifier"

# Seed 000, Created: the work namespace (first worker) and the worker.
NAMESPACE_FILES = [
    f"{WORK}/{f}"
    for f in (
        "__init__.py",
        "README.md",
        "manager.py",
        "rules.py",
        "types/__init__.py",
        "types/work_item.py",
        "types/handler.py",
        "types/kinds.py",
        "types/lanes.py",
        "impl/__init__.py",
        "impl/manager.py",
        "storage/__init__.py",
        "storage/impl/__init__.py",
        "storage/impl/postgres.py",
        "storage/impl/memory.py",
        "storage/tables/__init__.py",
        "storage/tables/work_items.py",
        "storage/tables/work_lane_pauses.py",
    )
] + [*sorted(HOST_TESTS), f"{WORK}/enqueuers/__init__.py"]
# The worker runtime (issue 13), rendered with the namespace by its owner.
RUNTIME = "workers/runtime"
RUNTIME_FILES = [f"{RUNTIME}/pyproject.toml", f"{RUNTIME}/README.md"] + [
    f"{RUNTIME}/src/acme/workers/runtime/{f}.py"
    for f in (
        "__init__",
        "settings",
        "loop",
        "metrics",
        "server",
        "cli",
        "container",
        "worker",
        "testing",
        "fixtures",
        "contract",
        "errors",
    )
]
# The engine's exhaustive tests run in the template (make engine-check, issue 30); a host
# receives none of them, only the contract and the seed's cases above.
ENGINE_ONLY_TESTS = [
    "om/tests/unit/test_work_rules.py",
    "om/tests/unit/test_work_manager_engine.py",
    "om/tests/unit/test_work_lanes_engine.py",
    "om/tests/integration/test_work_privileges_postgres.py",
    "om/tests/integration/test_work_storage_postgres_engine.py",
    f"{RUNTIME}/tests",
]
MIGRATION_PATTERNS = [
    rf"om/migrations/{path}"
    for name in (
        "work_items",
        "work_items_claim_paths",
        "work_items_payload_object",
        "work_items_payload_checked",
        "work_items_audit_owed",
        "work_items_deleted",
        "work_items_vacuum",
        "work_items_lane_pauses",
        "work_items_cancelled",
        "work_items_cancelled_checked",
        "work_items_cancelled_purge",
        "work_items_dead_letters",
        "work_items_schedules",
        "work_items_priority",
        "work_items_workers",
        "work_items_listed",
        "work_items_next_tick",
        "work_items_policies",
    )
    for path in (
        rf"sql/queue/\d{{14}}_{name}\.up\.sql",
        rf"sql/queue/\d{{14}}_{name}\.down\.sql",
        rf"versions/queue/\d{{14}}_{name}\.py",
    )
]
WORKER_FILES = [
    f"{WORKER}/pyproject.toml",
    f"{PKG}/__init__.py",
    f"{PKG}/settings.py",
    f"{PKG}/handler.py",
    f"{PKG}/container.py",
    f"{PKG}/loop.py",
    f"{PKG}/main.py",
    f"{WORKER}/tests/conftest.py",
    f"{WORKER}/tests/test_handler.py",
    f"{WORKER}/tests/test_loop.py",
    f"{WORK}/enqueuers/notify_shipment.py",
    "om/tests/unit/test_enqueue_notify_shipment.py",
    "deployment/docker/shipment-notifier.Dockerfile",
    f"{WORKER}/.copier-answers.yml",
]


@pytest.fixture
def rendered(make_host: Callable[..., Path], render: Callable[..., Any]) -> Path:
    host = make_host()
    render(host)
    return host


def test_render_creates_every_created_file(rendered: Path) -> None:
    missing = [
        f for f in NAMESPACE_FILES + RUNTIME_FILES + WORKER_FILES if not (rendered / f).is_file()
    ]
    assert missing == []
    assert [f for f in ENGINE_ONLY_TESTS if (rendered / f).exists()] == []
    files = [str(p.relative_to(rendered)) for p in rendered.rglob("*") if p.is_file()]
    for pattern in MIGRATION_PATTERNS:
        assert [f for f in files if re.fullmatch(pattern, f)], pattern


def test_answers_file_records_the_fixed_values(rendered: Path) -> None:
    answers = yaml.safe_load((rendered / WORKER / ".copier-answers.yml").read_text())
    assert answers["worker_name"] == "shipment-notifier"
    assert answers["work_kind"] == "NOTIFY_SHIPMENT"
    assert answers["host_root"] == "acme"
    assert answers["namespace_absent"] is True
    assert re.fullmatch(r"\d{14}", answers["migration_stamp"])
    assert "queue_down_revision" in answers
    assert answers["_commit"] == "v0.0.2"


def test_no_jinja_residue(rendered: Path) -> None:
    offenders = []
    for path in rendered.rglob("*"):
        if path.is_file() and ".git" not in path.parts and path.suffix != ".lock":
            text = path.read_text(encoding="utf-8", errors="replace")
            # `${{ ... }}` is GitHub Actions' own syntax in the host's workflows.
            if re.search(r"(?<!\$)\{\{|\{%", text):
                offenders.append(str(path.relative_to(rendered)))
    assert offenders == []
    names = [str(p.relative_to(rendered)) for p in rendered.rglob("*")]
    assert [n for n in names if "{" in n or "}" in n] == []


def test_rendered_python_is_ruff_clean(rendered: Path) -> None:
    assert_ruff_clean(rendered)


# The longest names the answers allow in practice: the patched `kinds.py` wraps the payload
# import as ruff does and the rendered modules keep every line within the host's 100.
LONG_ANSWERS = {
    "worker_name": "inventory-reconciliation-exporter",
    "work_kind": "RECONCILE_WAREHOUSE_INVENTORY_SNAPSHOT",
    "lane": "bulk_exports",
}


def test_long_names_render_ruff_clean(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host()
    render(host, **LONG_ANSWERS)
    kinds = (host / WORK / "types/kinds.py").read_text()
    assert (
        "from .payloads.reconcile_warehouse_inventory_snapshot import (\n"
        "    ReconcileWarehouseInventorySnapshotPayload,\n)\n"
    ) in kinds
    assert (host / WORK / "enqueuers/reconcile_warehouse_inventory_snapshot.py").is_file()
    assert_ruff_clean(host)


def assert_ruff_clean(host: Path) -> None:
    """`ruff check` and `ruff format --check` over the whole of `host`, with its own config."""
    check = subprocess.run(
        [str(VENV_BIN / "ruff"), "check", "--output-format", "concise", "."],
        cwd=host,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = subprocess.run(
        [str(VENV_BIN / "ruff"), "format", "--check", "."],
        cwd=host,
        capture_output=True,
        text=True,
        check=False,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


CLAIM_NEXT = "acme.om.work.storage.WorkStorageInterface.claim_next"


def arch_check(host: Path) -> subprocess.CompletedProcess[str]:
    """The host's own `scripts/arch_check.py` (stdlib only, so this interpreter serves)."""
    return subprocess.run(
        [str(VENV_BIN / "python"), "scripts/arch_check.py"],
        cwd=host,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_arch_check_passes_after_the_render_and_fails_without_claim_next_listed(
    rendered: Path,
) -> None:
    passed = arch_check(rendered)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    pyproject = rendered / "pyproject.toml"
    doc = tomlkit.parse(pyproject.read_text(encoding="utf-8"))
    tenantless = doc["tool"]["arch-check"]["options"]["CTX-12"]["tenantless"]  # type: ignore[index]
    assert CLAIM_NEXT in tenantless
    tenantless.remove(CLAIM_NEXT)  # type: ignore[union-attr]
    pyproject.write_text(tomlkit.dumps(doc), encoding="utf-8")

    failed = arch_check(rendered)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"{CLAIM_NEXT} takes no org_id" in failed.stderr


def _fields(path: Path, name: str) -> list[str]:
    """The fields `class <name>` in `path` declares (class variables left out)."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return [
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
        and s.target.id not in patcher.SHARED_SETTINGS | patcher.KIND_SETTINGS
    ]


def test_env_example_lists_every_setting(rendered: Path) -> None:
    """Every field of the runtime's settings, which each worker's settings inherit (and the
    worker's own defaults are a subset of), in `.env.example` under the worker's prefix."""
    engine = rendered / RUNTIME / "src/acme/workers/runtime/settings.py"
    fields = _fields(engine, "RuntimeSettings")
    assert fields == [name for name, _ in patcher.WORKER_SETTINGS]
    assert set(_fields(rendered / PKG / "settings.py", "WorkerSettings")) <= set(fields)
    env = (rendered / ".env.example").read_text()
    for name in fields:
        assert f"\nSHIPMENT_NOTIFIER_{name.upper()}=" in env


def test_second_copy_of_the_same_worker_is_refused(
    rendered: Path, render: Callable[..., Any]
) -> None:
    commit_all(rendered, "first worker")
    with pytest.raises(UserMessageError) as caught:
        render(rendered)
    assert (
        "copier update --trust --defaults -a workers/shipment-notifier/.copier-answers.yml"
        in str(caught.value)
    )
    assert tree_state(rendered) == ""


def test_second_worker_joins_the_namespace(rendered: Path, render: Callable[..., Any]) -> None:
    commit_all(rendered, "first worker")
    render(rendered, worker_name="invoice-mailer", work_kind="SEND_INVOICE")
    answers = yaml.safe_load((rendered / "workers/invoice-mailer/.copier-answers.yml").read_text())
    assert answers["namespace_absent"] is False
    kinds = (rendered / WORK / "types/kinds.py").read_text()
    assert (
        'SEND_INVOICE = "SEND_INVOICE"' in kinds and 'NOTIFY_SHIPMENT = "NOTIFY_SHIPMENT"' in kinds
    )
    changed = {line[3:] for line in tree_state(rendered).splitlines()}
    assert f"{WORK}/types/work_item.py" not in changed, "the namespace belongs to the first worker"
    with pytest.raises(UserMessageError, match="already taken"):
        commit_all(rendered, "second worker")
        render(rendered, worker_name="third", work_kind="SEND_INVOICE")


def test_update_across_tags_runs_no_check_and_patches_nothing_twice(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host()
    render(host, vcs_ref="v0.0.1")
    commit_all(host, "worker at v0.0.1")
    answers_file = f"{WORKER}/.copier-answers.yml"
    before = yaml.safe_load((host / answers_file).read_text())
    assert before["_commit"] == "v0.0.1"
    copier.run_update(
        str(host), answers_file=answers_file, unsafe=True, defaults=True, overwrite=True, quiet=True
    )
    after_text = (host / answers_file).read_text()
    after = yaml.safe_load(after_text)
    assert after["_commit"] == "v0.0.2"
    assert UPDATE_MARKER in after_text
    for key in ("migration_stamp", "host_root", "namespace_absent", "queue_down_revision"):
        assert after[key] == before[key], key
    changed = {line[3:] for line in tree_state(host).splitlines()}
    assert changed == {answers_file}, changed


@pytest.mark.slow
def test_two_workers_rendered_in_turn_pass_the_host_gate(
    make_host: Callable[..., Path], render: Callable[..., Any], uv_env: dict[str, str]
) -> None:
    """Issue 5's acceptance: two workers rendered one after the other into a fresh host
    (and a third, a maintenance worker, whose handler takes no managers); the host's
    `make check` (ruff, format, mypy, arch-check, and every test of the host and of each
    worker over memory, SQLite, PostgreSQL and Redis) passes, and copying either worker
    again is refused with nothing written. Issue 4's parked records end to end: a test
    written against the reference host's `parking` namespace joins the first worker's
    tests (a host engineer's test, not a rendered one), and so does one of the outbox's
    state and dead letters through the reference host's relay (issue 14)."""
    host = make_host()
    render(host)
    for e2e in (E2E_PARKED, E2E_OUTBOX):
        shutil.copy(e2e, host / "workers/shipment-notifier/tests" / e2e.name)
    commit_all(host, "shipment-notifier")
    render(host, worker_name="invoice-mailer", work_kind="SEND_INVOICE", container=True)
    commit_all(host, "invoice-mailer")
    render(host, worker_name="housekeeper", work_kind="NOOP")  # a maintenance worker
    commit_all(host, "housekeeper")
    synced = uv_sync(host, uv_env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    gate = host_gate(host, uv_env, "make", "check")
    for name in (
        "workers/shipment-notifier/tests",
        "workers/invoice-mailer/tests",
        "workers/housekeeper/tests",
    ):
        assert name in gate, f"{name} did not run"
    assert f"tests/{E2E_PARKED.name} ... " in gate, "the parked-records tests did not all pass"
    assert f"tests/{E2E_OUTBOX.name} . " in gate, "the outbox test did not pass"
    assert " failed" not in gate.splitlines()[-1]
    commit_all(host, "uv.lock with both workers")
    for worker, kind in (
        ("shipment-notifier", "NOTIFY_SHIPMENT"),
        ("invoice-mailer", "SEND_INVOICE"),
    ):
        with pytest.raises(UserMessageError, match="copier update"):
            render(host, worker_name=worker, work_kind=kind)
        assert tree_state(host) == "", f"copying {worker} again changed the tree"


def test_a_noop_worker_is_a_maintenance_worker_whose_handler_takes_no_managers(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host()
    render(host, worker_name="housekeeper", work_kind="NOOP")
    answers = yaml.safe_load((host / "workers/housekeeper/.copier-answers.yml").read_text())
    assert answers["maintenance"] is True
    package = host / "workers/housekeeper/src/acme/workers/housekeeper"
    handler = (package / "handler.py").read_text()
    assert "class NoopHandlerImpl(WorkHandlerInterface):" in handler
    assert "__init__" not in handler and "Manager" not in handler.split('"""', 2)[2]
    assert "handler = NoopHandlerImpl()\n" in (package / "container.py").read_text()
    commit_all(host, "housekeeper")
    render(host, worker_name="mailer", work_kind="SEND_MAIL", maintenance=False)
    mailer = host / "workers/mailer/src/acme/workers/mailer"
    assert (
        "def __init__(self, *, audit: AuditManagerInterface)" in (mailer / "handler.py").read_text()
    )


@pytest.mark.slow
def test_a_host_without_batched_audit_appends_passes_the_workers_tests(
    make_host: Callable[..., Path], render: Callable[..., Any], uv_env: dict[str, str]
) -> None:
    """The optional `append_many` of docs/host-contract.md ("Batched audit appends") gone
    from the host's audit manager, as in a host written before it: the worker's container
    hands the handlers the host's manager itself (one session per entry), and the engine's
    audit tests (engine-only: put into the host here), the worker's handler and loop tests
    pass over it (issue 10)."""
    host = make_host()
    manager = host / "om/src/acme/om/audit/impl/manager.py"
    text = manager.read_text()
    assert "    async def append_many(" in text
    manager.write_text(text.replace("    async def append_many(", "    async def _no_batches("))
    render(host)
    for name in ("conftest.py", "test_audit.py"):  # the reference host's root is the engine's
        source = REPO / "engine" / RUNTIME / "tests" / name
        (host / RUNTIME / "tests").mkdir(exist_ok=True)
        shutil.copy(source, host / RUNTIME / "tests" / name)
    commit_all(host, "shipment-notifier over a host without append_many")
    synced = uv_sync(host, uv_env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    tests = ("workers/runtime/tests/test_audit.py", "workers/shipment-notifier/tests")
    ran = host_gate(host, uv_env, "uv", "run", "--all-packages", "pytest", "-q", *tests)
    assert " passed" in ran.splitlines()[-1]
    assert " failed" not in ran.splitlines()[-1]
