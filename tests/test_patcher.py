"""The host patcher: every fragment applied, idempotent, ruff-clean, and refusing gaps.

Runs the patcher directly on fresh copies of the reference host (the files the fragments
edit are listed in docs/host-contract.md), so these tests need no render.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import (
    REFERENCE_HOST,
    RELEASE_0_1_0,
    REPO,
    VENV_BIN,
    commit_all,
    git,
    load_extension,
    tree_state,
)

patcher = load_extension("patcher")
lifecycle = load_extension("lifecycle")
HOST_WORKERS = REPO / "extensions" / "host_workers.py"

FIRST = patcher.Spec(
    worker_name="shipment-notifier",
    work_kind="NOTIFY_SHIPMENT",
    lane="default",
    host_root="acme",
    namespace_absent=True,
)
SECOND = patcher.Spec(
    worker_name="invoice-mailer",
    work_kind="SEND_INVOICE",
    lane="billing",
    host_root="acme",
    namespace_absent=False,
)

KINDS_SHAPE = '''"""Work kinds, their payload models and policies: one entry per worker (fragments)."""

from enum import StrEnum

from pydantic import BaseModel

from .payloads.notify_shipment import NotifyShipmentPayload
from .policy import KindPolicy


class WorkKind(StrEnum):
    NOTIFY_SHIPMENT = "NOTIFY_SHIPMENT"


WORK_PAYLOADS: dict[WorkKind, type[BaseModel]] = {
    WorkKind.NOTIFY_SHIPMENT: NotifyShipmentPayload,
}
WORK_POLICIES: dict[WorkKind, KindPolicy] = {
    WorkKind.NOTIFY_SHIPMENT: KindPolicy(),
}
'''


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def ruff(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "ruff"), *args], cwd=host, capture_output=True, text=True, check=False
    )


@pytest.fixture
def host(make_host: Callable[..., Path]) -> Path:
    return make_host(REFERENCE_HOST)


def test_first_worker_applies_every_changed_row(host: Path) -> None:
    assert patcher.check_host(host, FIRST) == []
    changed = patcher.apply(host, FIRST)
    assert changed == sorted(
        [
            ".env.example",
            ".github/workflows/ci.yml",
            ".github/workflows/deploy-production.yml",
            ".github/workflows/deploy-staging.yml",
            "Makefile",
            "infra/src/acme/infra/cache/__init__.py",
            "infra/src/acme/infra/topics/__init__.py",
            "om/README.md",
            "om/src/acme/om/outbox/impl/relay.py",
            "om/src/acme/om/root.py",
            "om/src/acme/om/storage/impl/memory.py",
            "om/src/acme/om/storage/impl/sql.py",
            "om/src/acme/om/storage/roles.py",
            "om/src/acme/om/storage/root.py",
            "om/src/acme/om/work/types/kinds.py",
            "om/tests/unit/test_request_stage.py",
            "pyproject.toml",
            "scripts/dev.sh",
            "scripts/workers.py",
            "services/api/src/acme/services/api/main.py",
        ]
    )
    om = host / "om/src/acme/om"
    assert (om / "work/types/kinds.py").read_text() == KINDS_SHAPE
    pyproject = (host / "pyproject.toml").read_text()
    members = ["om", "infra", "services/api", "workers/runtime", "workers/shipment-notifier"]
    assert f"members = {json.dumps(members)}" in pyproject
    assert '    "acme.om.work.storage.WorkStorageInterface.claim_next",\n]' in pyproject
    roles = (om / "storage/roles.py").read_text()
    assert (
        '    "work_items": DatabaseRole.QUEUE,\n    "work_lane_pauses": DatabaseRole.QUEUE,\n'
        '    "work_schedules": DatabaseRole.QUEUE,\n    "work_workers": DatabaseRole.QUEUE,\n}'
        in roles
    )
    assert (
        '    "work_items": TenancyScope.ORG,\n    "work_lane_pauses": TenancyScope.GLOBAL,\n'
        '    "work_schedules": TenancyScope.ORG,\n    "work_workers": TenancyScope.GLOBAL,\n}'
        in roles
    )
    root = (om / "root.py").read_text()
    assert "    work: WorkManagerInterface\n" in root
    assert root.index("work = WorkManagerImpl(") < root.index("outbox_relay = OutboxRelayImpl(")
    assert "topics=infra.topics," in root and "tenancy=tenancy," in root and "audit=audit," in root
    assert "OutboxRelayImpl(storage.get_outbox_storage(), infra.topics, work=work)" in root
    assert "        work=work,\n    )" in root
    relay = (om / "outbox/impl/relay.py").read_text()
    # The reference host's relay has a keyword of its own (`give_up_after`); `work` follows it.
    keywords = "        *,\n        give_up_after: int = RELAY_GIVE_UP_AFTER,\n"
    assert keywords + "        work: WorkManagerInterface,\n    ) -> None:" in relay
    assert "        self._work = work\n" in relay
    branch = '        if row.kind.startswith("work."):\n            await self._work.enqueue_relayed(row.org_id, row)\n            return\n        raise Invalid('
    assert branch in relay
    assert (
        "def get_work_storage(self) -> WorkStorageInterface:"
        in (om / "storage/root.py").read_text()
    )
    sql = (om / "storage/impl/sql.py").read_text()
    assert (
        'if self._funnel.dialect == "postgresql":\n            return PostgresWorkStorage(self._funnel)\n        return SqliteWorkStorage(self._funnel)'
        in sql
    )
    memory = (om / "storage/impl/memory.py").read_text()
    assert "        self._work = MemoryWorkStorage()\n" in memory
    topics = (host / "infra/src/acme/infra/topics/__init__.py").read_text()
    assert '    WORK_AVAILABLE = "work.available"\n' in topics
    assert "class WorkAvailablePayload(BaseModel):" in topics
    assert "    Topics.WORK_AVAILABLE: WorkAvailablePayload,\n}" in topics
    cache = (host / "infra/src/acme/infra/cache/__init__.py").read_text()
    assert '    WORKER_LIVENESS = "worker_liveness"\n' in cache
    stage = (host / "om/tests/unit/test_request_stage.py").read_text()
    for method in ("claim", "claim_many", "maintenance_contexts", "queue_stats"):
        assert f'    "WorkManagerInterface.{method}",\n' in stage
    assert "](src/acme/om/work/README.md)" in (host / "om/README.md").read_text()
    dev = (host / "scripts/dev.sh").read_text()
    line = "run shipment-notifier uv run --all-packages shipment-notifier serve\n"
    assert dev.index("# >>> processes") < dev.index(line) < dev.index("# <<< processes")
    env = (host / ".env.example").read_text()
    assert "# --- worker shipment-notifier ---\nSHIPMENT_NOTIFIER_LANE=default\n" in env


def test_applying_twice_changes_nothing(host: Path) -> None:
    patcher.apply(host, FIRST)
    once = snapshot(host)
    assert patcher.apply(host, FIRST) == []
    assert snapshot(host) == once


def test_second_worker_adds_its_kind_only(host: Path) -> None:
    patcher.apply(host, FIRST)
    readme = host / "om/src/acme/om/work/README.md"
    readme.write_text("# Work\n\nItems of work.\n")
    module = host / "deployment/terraform/modules/worker/main.tf"  # the first worker renders it
    module.parent.mkdir(parents=True)
    module.write_text("# the worker module\n")
    for env in ("staging", "production"):  # and each environment's shared inputs
        shared = host / f"deployment/terraform/environments/{env}/workers.tf"
        shared.write_text("locals {\n  worker_platform = {}\n}\n")
    commit_all(host, "first worker")
    assert patcher.check_host(host, SECOND) == []
    changed = patcher.apply(host, SECOND)
    assert changed == sorted(
        [
            ".env.example",
            ".github/workflows/deploy-production.yml",
            ".github/workflows/deploy-staging.yml",
            "om/src/acme/om/work/README.md",
            "om/src/acme/om/work/types/kinds.py",
            "pyproject.toml",
            "scripts/dev.sh",
        ]
    )
    kinds = (host / "om/src/acme/om/work/types/kinds.py").read_text()
    assert (
        "from .payloads.notify_shipment import NotifyShipmentPayload\nfrom .payloads.send_invoice import SendInvoicePayload\nfrom .policy import KindPolicy\n"
        in kinds
    )
    assert '    NOTIFY_SHIPMENT = "NOTIFY_SHIPMENT"\n    SEND_INVOICE = "SEND_INVOICE"\n' in kinds
    assert "    WorkKind.SEND_INVOICE: SendInvoicePayload,\n}" in kinds
    assert '    WorkKind.SEND_INVOICE: KindPolicy(lane="billing"),\n}' in kinds
    text = readme.read_text()
    assert (
        "<!-- >>> kinds -->\n- `SEND_INVOICE`, handled by the `invoice-mailer` worker\n<!-- <<< kinds -->"
        in text
    )
    assert "INVOICE_MAILER_LANE=billing" in (host / ".env.example").read_text()
    twice = snapshot(host)
    assert patcher.apply(host, SECOND) == []
    assert snapshot(host) == twice


def _violations(host: Path, files: list[str]) -> set[tuple[str, str]]:
    """(file, rule) pairs `ruff check` reports under the host's own configuration."""
    done = ruff(host, "check", "--output-format", "json", "--no-fix", *files)
    return {(v["filename"], v["code"]) for v in json.loads(done.stdout or "[]")}


def test_patched_files_are_ruff_clean(host: Path) -> None:
    python = [str(p.relative_to(host)) for p in host.rglob("*.py") if ".git" not in p.parts]
    before = _violations(host, python)
    patcher.apply(host, FIRST)
    (host / "om/src/acme/om/work/README.md").write_text("# Work\n")
    patcher.apply(host, SECOND)
    files = [line[3:] for line in tree_state(host).splitlines() if line[3:].endswith(".py")]
    assert len(files) >= 10, files
    after = _violations(host, [*python, *files])
    assert after <= before, f"new ruff findings: {sorted(after - before)}"
    fmt = ruff(host, "format", "--check", "--diff", *files)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_claim_many_joins_tenantless_when_the_storage_declares_it(host: Path) -> None:
    storage = host / "om/src/acme/om/work/storage/__init__.py"
    storage.parent.mkdir(parents=True)
    storage.write_text("class WorkStorageInterface:\n    async def claim_many(self): ...\n")
    patcher.apply(host, FIRST)
    text = (host / "pyproject.toml").read_text()
    assert '"acme.om.work.storage.WorkStorageInterface.claim_many"' in text


@pytest.mark.parametrize(
    ("path", "old", "new", "expected"),
    [
        (
            "om/src/acme/om/root.py",
            "def build_managers(",
            "def build(",
            "no top-level `def build_managers(storage, infra)`",
        ),
        (
            "om/src/acme/om/root.py",
            "OutboxRelayImpl(storage",
            "Relay(storage",
            "no `<name> = OutboxRelayImpl(...)` assignment",
        ),
        (
            "om/src/acme/om/storage/roles.py",
            '    QUEUE = "queue"\n',
            "",
            "`class DatabaseRole` has no `QUEUE` member",
        ),
        (
            "om/src/acme/om/storage/impl/memory.py",
            "class MemoryStorageRoot(",
            "class MemRoot(",
            "no top-level `class MemoryStorageRoot`",
        ),
        (
            "infra/src/acme/infra/cache/__init__.py",
            "class CacheScope(",
            "class Scope(",
            "no top-level `class CacheScope`",
        ),
        (
            "om/tests/unit/test_request_stage.py",
            "REQUEST_STAGE_METHODS =",
            "METHODS =",
            "no top-level `REQUEST_STAGE_METHODS = ...`",
        ),
        (
            "pyproject.toml",
            "[tool.arch-check.options.CTX-12]",
            "[tool.arch-check.options.CTX-13]",
            "no `tenantless` array in [tool.arch-check.options.CTX-12]",
        ),
    ],
)
def test_missing_structure_is_named(
    host: Path, path: str, old: str, new: str, expected: str
) -> None:
    target = host / path
    text = target.read_text()
    assert old in text
    target.write_text(text.replace(old, new))
    problems = patcher.check_host(host, FIRST)
    assert any(p.startswith(path) and expected in p for p in problems), problems


def test_missing_file_is_named(host: Path) -> None:
    (host / ".env.example").unlink()
    assert ".env.example: the file does not exist" in patcher.check_host(host, FIRST)


def test_cli_skips_update_replays(host: Path, tmp_path: Path) -> None:
    replay = tmp_path / "copier._main.old_copy.x"
    subprocess.run(["cp", "-r", str(host), str(replay)], check=True)
    subprocess.run(["rm", "-rf", str(replay / ".git")], check=True)
    answers = replay / "workers/shipment-notifier/.copier-answers.yml"
    answers.parent.mkdir(parents=True)
    answers.write_text(
        "worker_name: shipment-notifier\nwork_kind: NOTIFY_SHIPMENT\nhost_root: acme\nnamespace_absent: true\n"
    )
    before = snapshot(replay)
    args = [
        "--operation",
        "update",
        "--answers-file",
        str(answers.relative_to(replay)),
        "--host",
        str(replay),
    ]
    assert patcher.main(args) == 0
    assert snapshot(replay) == before


def test_cli_applies_in_the_real_host(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    answers = host / "workers/shipment-notifier/.copier-answers.yml"
    answers.parent.mkdir(parents=True)
    answers.write_text(
        "worker_name: shipment-notifier\nwork_kind: NOTIFY_SHIPMENT\nlane: default\nhost_root: acme\nnamespace_absent: true\n"
    )
    args = [
        "--operation",
        "copy",
        "--answers-file",
        "workers/shipment-notifier/.copier-answers.yml",
        "--host",
        str(host),
    ]
    new = {"om/src/acme/om/work/types/kinds.py", "scripts/workers.py"}
    assert not any((host / p).exists() for p in new)
    assert patcher.main(args) == 0
    assert (host / "om/src/acme/om/work/types/kinds.py").read_text() == KINDS_SHAPE
    # The report says which files the copy created and which it edited.
    report = dict(reversed(line.split()) for line in capsys.readouterr().out.splitlines())
    assert {path for path, verb in report.items() if verb == "created"} == new
    assert report["pyproject.toml"] == "patched"
    git(host, "add", "-A")
    once = snapshot(host)
    assert patcher.main([*args[:1], "update", *args[2:]]) == 0
    assert snapshot(host) == once


def test_request_stage_lists_every_manager_method_that_takes_a_request_context() -> None:
    """The host's `test_request_stage.py` fails on a method taking a `RequestContext` that
    its list lacks: the patcher's list follows the engine's `WorkManagerInterface`."""
    source = (REPO / "engine/om/src/acme/om/work/manager.py").read_text(encoding="utf-8")
    [interface] = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == "WorkManagerInterface"
    ]
    taking = {
        method.name
        for method in interface.body
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef)
        and len(method.args.args) > 1
        and method.args.args[1].annotation is not None
        and ast.unparse(method.args.args[1].annotation) == "RequestContext"
    }
    assert len(taking) >= 8
    assert set(patcher.REQUEST_STAGE) == taking


def test_request_stage_keeps_bytes_entries_bytes() -> None:
    text = 'REQUEST_STAGE_METHODS = {b"acme.om.tenancy.TenancyManagerInterface.create_org"}\n'
    once = patcher.edit_request_stage(text, FIRST, 100)
    assert 'b"acme.om.work.WorkManagerInterface.claim",' in once
    assert '    "' not in once  # no str entry among the bytes ones
    assert patcher.edit_request_stage(once, FIRST, 100) == once


def test_one_line_class_body_is_named() -> None:
    text = 'from enum import StrEnum\n\n\nclass CacheScope(StrEnum): A = "a"\n'
    with pytest.raises(
        patcher.Missing, match="`class CacheScope` has its body on the `class` line"
    ):
        patcher.edit_cache(text, FIRST, 100)


ANSWERS_OF_A = {
    "worker_name": "shipment-notifier",
    "work_kind": "NOTIFY_SHIPMENT",
    "host_root": "acme",
    "namespace_absent": True,
}


def test_an_update_that_moves_the_lane_names_a_local_env_still_on_the_old_one(
    tmp_path: Path,
) -> None:
    """`.env` is the developer's own copy of `.env.example` (never in git): the update
    changes the example, and the patcher says which line of `.env` it left behind."""
    host = tmp_path / "host"
    (host / "workers/shipment-notifier").mkdir(parents=True)
    answers = "workers/shipment-notifier/.copier-answers.yml"
    (host / answers).write_text(
        "worker_name: shipment-notifier\nwork_kind: NOTIFY_SHIPMENT\nlane: default\n"
    )
    git(host, "init", "-q", "-b", "main")
    commit_all(host, "a worker on lane default")
    (host / ".env").write_text("ACME_DATABASE_URL=\nSHIPMENT_NOTIFIER_LANE=default\n")
    moved = patcher.Spec.from_answers({**ANSWERS_OF_A, "lane": "bulk"})

    note = ".env still sets SHIPMENT_NOTIFIER_LANE=default; the worker's lane is now bulk"
    assert patcher.stale_env(host, answers, moved) == [f"{note} (see .env.example)"]
    kept = patcher.Spec.from_answers({**ANSWERS_OF_A, "lane": "default"})
    assert patcher.stale_env(host, answers, kept) == []
    (host / ".env").write_text("SHIPMENT_NOTIFIER_LANE=bulk\n")
    assert patcher.stale_env(host, answers, moved) == []


def test_an_update_that_moves_the_lane_prints_the_command_that_moves_the_waiting_items(
    tmp_path: Path,
) -> None:
    """Items enqueued before `-d lane=bulk` wait on `default`: the update says so and names
    the command that moves them (a copier task cannot count them; `serve` does)."""
    host = tmp_path / "host"
    (host / "workers/shipment-notifier").mkdir(parents=True)
    answers = "workers/shipment-notifier/.copier-answers.yml"
    (host / answers).write_text("worker_name: shipment-notifier\nwork_kind: NOTIFY_SHIPMENT\n")
    git(host, "init", "-q", "-b", "main")
    commit_all(host, "a worker on the default lane (no lane recorded)")

    moved = patcher.moved_lane(
        host, answers, patcher.Spec.from_answers({**ANSWERS_OF_A, "lane": "bulk"})
    )

    command = "uv run --all-packages shipment-notifier items move --from-lane default"
    note = (
        "the lane moved from default to bulk: items enqueued before wait on default, "
        f"unclaimed; once this release runs, move them: `{command} --dry-run`, then without "
        "--dry-run (with --operator NAME on a database server)"
    )
    assert moved == [note]
    kept = patcher.Spec.from_answers({**ANSWERS_OF_A, "lane": "default"})
    assert patcher.moved_lane(host, answers, kept) == []
    assert patcher.moved_lane(tmp_path, answers, kept) == []  # nothing committed there


def test_an_update_that_changes_a_default_names_the_env_line_left_at_the_old_one(
    tmp_path: Path,
) -> None:
    """Issue 29, item 13: every default the update changed in `.env.example`, not only the
    lane, is named when `.env` still holds the old value; a value of the developer's own
    is not, and `.env` is never written."""
    host = tmp_path / "host"
    (host / "workers/shipment-notifier").mkdir(parents=True)
    answers = "workers/shipment-notifier/.copier-answers.yml"
    (host / answers).write_text(
        "worker_name: shipment-notifier\nwork_kind: NOTIFY_SHIPMENT\nlane: default\n"
    )
    (host / ".env.example").write_text(
        "SHIPMENT_NOTIFIER_CAPACITY=10\nSHIPMENT_NOTIFIER_LEASE=30\nSHIPMENT_NOTIFIER_POLL_INTERVAL=2\n"
    )
    git(host, "init", "-q", "-b", "main")
    commit_all(host, "a worker")
    env = "SHIPMENT_NOTIFIER_CAPACITY=10\nexport SHIPMENT_NOTIFIER_LEASE=45\n"
    (host / ".env").write_text(env)
    (host / ".env.example").write_text(  # as the update leaves it
        "SHIPMENT_NOTIFIER_CAPACITY=20\nSHIPMENT_NOTIFIER_LEASE=60\nSHIPMENT_NOTIFIER_POLL_INTERVAL=1\n"
    )
    spec = patcher.Spec.from_answers({**ANSWERS_OF_A, "lane": "default"})

    assert patcher.stale_env(host, answers, spec) == [
        (
            ".env still sets SHIPMENT_NOTIFIER_CAPACITY=10; .env.example now says "
            "SHIPMENT_NOTIFIER_CAPACITY=20"
        )
    ]
    assert (host / ".env").read_text() == env


def check_env(host: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["python3", str(HOST_WORKERS), "check-env"],
        cwd=host,
        capture_output=True,
        text=True,
        check=False,
    )


def test_check_worker_env_compares_env_with_the_examples_history(tmp_path: Path) -> None:
    """`make check-worker-env` (scripts/workers.py check-env): a `.env` line at a value an
    earlier `.env.example` held, which the current one changed, fails the check."""
    host = tmp_path / "host"
    host.mkdir()
    git(host, "init", "-q", "-b", "main")
    (host / ".env.example").write_text("A_LANE=default\nA_CAPACITY=10\n")
    commit_all(host, "example 1")
    done = check_env(host)
    assert (done.returncode, done.stdout) == (
        0,
        "check-worker-env: no .env in the host root, nothing to compare\n",
    )
    (host / ".env.example").write_text("A_LANE=default\nA_CAPACITY=20\n")
    commit_all(host, "example 2")
    (host / ".env").write_text("A_LANE=bulk\nA_CAPACITY=10\n")
    done = check_env(host)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ".env still sets A_CAPACITY=10; .env.example now says A_CAPACITY=20\n"
    (host / ".env").write_text("A_LANE=bulk\nA_CAPACITY=20\n")
    done = check_env(host)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_template_owned_file_is_named_overwritten_only_when_no_version_wrote_it(
    tmp_path: Path,
) -> None:
    """Issue 29, item 10: scripts/workers.py and the Makefile block as an older release
    wrote them (a worker recorded at that release) are not edits; the same text with a
    line added is, and the patcher names it."""
    old_helper = git(REPO, "show", f"{RELEASE_0_1_0}:extensions/host_workers.py")
    shipped = lifecycle.shipped_at(RELEASE_0_1_0)
    assert shipped is not None and shipped[0] == old_helper
    old_block = shipped[1]
    assert old_helper != lifecycle.helper_text() and old_block != lifecycle.MAKE_BLOCK
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/workers.py").write_text(old_helper)
    (tmp_path / "Makefile").write_text("all:\n\ttrue\n\n" + old_block)

    assert lifecycle.overwritten_edits(tmp_path, [RELEASE_0_1_0]) == []
    assert len(lifecycle.overwritten_edits(tmp_path, [])) == 2, "no recorded version: edits"
    (tmp_path / "scripts/workers.py").write_text(old_helper + "# mine\n")
    (tmp_path / "Makefile").write_text(
        "all:\n\ttrue\n\n" + old_block.replace("\n# <<<", "\nmine:\n\ttrue\n# <<<")
    )
    found = lifecycle.overwritten_edits(tmp_path, [RELEASE_0_1_0])
    assert [line.split(":", 1)[0] for line in found] == ["scripts/workers.py", "Makefile"]


API_MAIN = "services/api/src/acme/services/api/main.py"


def test_the_work_router_is_mounted_after_the_apps_router_once(host: Path) -> None:
    patcher.apply(host, FIRST)
    once = (host / API_MAIN).read_text()
    patcher.apply(host, FIRST)

    assert (host / API_MAIN).read_text() == once
    assert "    app.include_router(router)\n    mount_work(app)\n" in once
    assert "from acme.services.api.work import mount_work\n" in once
    assert once.count("mount_work(app)") == 1


def test_an_api_without_the_membership_lookup_gets_no_router_and_one_line(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tenancy = host / "om/src/acme/om/tenancy/manager.py"
    tenancy.write_text(tenancy.read_text().replace("def member_role(", "def role_of("))
    before = (host / API_MAIN).read_text()

    assert patcher.check_host(host, FIRST) == []
    patcher.apply(host, FIRST)

    assert (host / API_MAIN).read_text() == before
    [line] = [line for line in capsys.readouterr().err.splitlines() if "work API" in line]
    assert line.strip() == (
        "note     om/src/acme/om/tenancy/manager.py has no `member_role` (memberships): "
        "the work API is not mounted (docs/host-contract.md, The work API)"
    )
