"""The worker runtime written once (issue 13, docs/decisions/0017), over real template history.

- A host rendered at the 0.1.0 release (commit e75b510, tagged `v0.1.0` in a clone made
  by the test) and updated to the working tree (`v0.2.0`) ends with one engine
  (`workers/runtime`) and thin workers, the user's edits in the handler, the settings and
  the container intact, and passes its own lint, type check and worker tests.
- A worker file whose code moved into the engine, edited by the user, stops the update
  with one line naming it, and nothing is written.
- A fix to the loop reaches every worker with one `copier update` of the namespace owner.

The whole-host invariant (an update from 0.1.0 equals a fresh copy) is
tests/test_fragment_update.py's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import (
    commit_all,
    copy_host,
    git,
    host_gate,
    load_extension,
    release_history,
    tree_state,
    uv_sync,
)
from copier.errors import TaskError
from test_fragment_update import copy, update

A = {"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"}
B = {"worker_name": "invoice-mailer", "work_kind": "SEND_INVOICE", "lane": "bulk"}
PKG_A = "workers/shipment-notifier/src/acme/workers/shipment_notifier"
PKG_B = "workers/invoice-mailer/src/acme/workers/invoice_mailer"
ENGINE = "workers/runtime/src/acme/workers/runtime"
MOVED = ("metrics.py",)  # a per-worker file at 0.1.0 whose code is the engine's now
MOVED_TESTS = ("test_process.py",)
HANDLER_EDIT = "\n\n# our handler: carries over untouched (the file is ours)\n"


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template repository: v0.1.0 (e75b510), then the working tree as v0.2.0."""
    return release_history(tmp_path_factory.mktemp("runtime-releases") / "worker-template")


@pytest.fixture(scope="module")
def old_host(releases: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two workers copied at v0.1.0 (the owner first), committed."""
    host = copy_host(tmp_path_factory.mktemp("runtime-v010") / "host")
    for answers in (A, B):
        copy(releases, host, "v0.1.0", **answers)
        commit_all(host, f"add {answers['worker_name']}")
    return host


@pytest.fixture
def host(old_host: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "host"
    shutil.copytree(old_host, dst, symlinks=True)
    return dst


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path.name}: {old!r} found {text.count(old)}x"
    path.write_text(text.replace(old, new), encoding="utf-8")


def _conflicts(host: Path) -> list[str]:
    marked = re.compile(r"^(<{7}|>{7}) ", re.MULTILINE)
    return [
        str(p.relative_to(host))
        for p in host.rglob("*")
        if p.is_file()
        and ".git" not in p.parts
        and p.suffix in (".py", ".toml", ".md", ".yml")
        and marked.search(p.read_text(encoding="utf-8", errors="replace"))
    ]


@pytest.mark.slow
def test_a_0_1_0_host_updated_has_one_engine_thin_workers_and_the_users_edits(
    host: Path, uv_env: dict[str, str]
) -> None:
    (host / PKG_A / "handler.py").write_text(
        (host / PKG_A / "handler.py").read_text() + HANDLER_EDIT
    )
    settings = host / PKG_A / "settings.py"
    _edit(
        settings,
        'capacity: int = Field(default=4, ge=1, description="items handled at once")',
        'capacity: int = Field(default=6, ge=1, description="items handled at once")',
    )
    _edit(
        settings,
        '    metrics_host: str = "127.0.0.1"\n',
        (
            '    metrics_host: str = "127.0.0.1"\n'
            '    smtp_host: str = Field(default="localhost", description="where mail goes")\n'
        ),
    )
    container = host / PKG_B / "container.py"
    _edit(
        container,
        "    handler = SendInvoiceHandlerImpl(audit=managers.audit)\n",
        (
            "    audit: AuditManagerInterface = managers.audit  # ours: named for the next manager\n"
            "    handler = SendInvoiceHandlerImpl(audit=audit)\n"
        ),
    )
    _edit(
        container,
        "from acme.infra.container import Infra\n",
        (
            "from acme.infra.container import Infra\nfrom acme.om.audit import AuditManagerInterface\n"
        ),
    )
    commit_all(host, "our edits")

    for name in ("shipment-notifier", "invoice-mailer"):  # the owner first
        update(host, name, "v0.2.0")
        commit_all(host, f"update {name}")

    assert (host / ENGINE / "loop.py").is_file()
    for pkg, worker in ((PKG_A, "shipment-notifier"), (PKG_B, "invoice-mailer")):
        for moved in MOVED:
            assert not (host / pkg / moved).exists(), f"{pkg}/{moved} is still there"
        for moved in MOVED_TESTS:
            assert not (host / f"workers/{worker}/tests/{moved}").exists()
        loop = (host / pkg / "loop.py").read_text()
        assert "WORKER = Worker(" in loop and "class WorkerLoop" not in loop
        assert len(loop.splitlines()) < 40
        testing = (host / pkg / "testing.py").read_text()  # thin: the user's tests import it
        assert "class GateHandler" not in testing and "return testing.new_items(WORKER" in testing
    assert _conflicts(host) == []
    assert (host / PKG_A / "handler.py").read_text().endswith(HANDLER_EDIT)
    carried = settings.read_text()
    assert 'capacity: int = Field(default=6, ge=1, description="items handled at once")' in carried
    assert 'smtp_host: str = Field(default="localhost", description="where mail goes")' in carried
    assert "from pydantic import Field" in carried
    assert "class WorkerSettings(RuntimeSettings):" in carried
    carried = container.read_text()
    assert "        audit: AuditManagerInterface = managers.audit  # ours" in carried
    assert "from acme.om.audit import AuditManagerInterface" in carried
    assert "class WorkerContainer(RuntimeContainer):" in carried
    assert tree_state(host) == ""

    synced = uv_sync(host, uv_env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    host_gate(host, uv_env, "make", "lint", "format-check", "typecheck")
    out = host_gate(
        host, uv_env, "uv", "run", "--all-packages", "pytest", "-q", "-p", "no:cacheprovider",
        "workers/shipment-notifier/tests", "workers/invoice-mailer/tests",
    )  # fmt: skip
    assert " passed" in out.splitlines()[-1] and "failed" not in out.splitlines()[-1]
    settings_now = host_gate(
        host, uv_env, "uv", "run", "--all-packages", "python", "-c",
        "from acme.workers.shipment_notifier.settings import WorkerSettings as S; "
        "s = S(); print(s.capacity, s.smtp_host, s.lease)",
    )  # fmt: skip
    assert settings_now.split() == ["6", "localhost", "30.0"]


def test_an_edited_loop_stops_the_update_naming_it_with_nothing_written(
    host: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    loop = host / PKG_A / "loop.py"
    loop.write_text(loop.read_text() + "# our tweak to the claim loop\n")
    commit_all(host, "our loop tweak")
    head = git(host, "rev-parse", "HEAD")

    with pytest.raises(TaskError):  # the migration's exit 1
        update(host, "shipment-notifier", "v0.2.0")

    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith(PKG_A)]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{PKG_A}/loop.py: you changed it since template ")
    assert "workers/runtime" in lines[0] and "Nothing was updated." in lines[0]
    assert tree_state(host) == ""
    assert git(host, "rev-parse", "HEAD") == head
    assert not (host / "workers/runtime").exists()


def test_a_settings_edit_of_what_the_engine_owns_now_stops_theupdate(
    host: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = host / PKG_A / "settings.py"
    _edit(settings, '"sweep": 1}', '"sweep": 2}')
    commit_all(host, "a reserved connection more")

    with pytest.raises(TaskError):  # the migration's exit 1
        update(host, "shipment-notifier", "v0.2.0")

    err = capfd.readouterr().err
    assert f"{PKG_A}/settings.py: settings.py: you changed `RESERVED_CONNECTIONS`" in err
    assert tree_state(host) == ""


# --- a loop fix is one update of the owner ---------------------------------------------------

ENGINE_SOURCE = "engine/workers/runtime/src/acme/workers/runtime/loop.py"
FIX = ("_ERROR_LIMIT = 2000", "_ERROR_LIMIT = 4000")


def test_a_loop_fix_reaches_every_worker_with_one_update_of_the_owner(
    tmp_path: Path, make_host: Callable[..., Path]
) -> None:
    from conftest import snapshot_template

    template = snapshot_template(tmp_path / "worker-template")  # tagged v0.0.1
    _edit(template / ENGINE_SOURCE, f"{FIX[0]} ", f"{FIX[1]} ")
    commit_all(template, "v0.0.2: a loop fix")
    git(template, "tag", "v0.0.2")
    host = make_host()
    for answers in (A, B):
        copy(template, host, "v0.0.1", **answers)
        commit_all(host, f"add {answers['worker_name']}")
    engine = host / ENGINE / "loop.py"
    assert FIX[0] in engine.read_text()

    update(host, "shipment-notifier", "v0.0.2")

    assert FIX[1] in engine.read_text()
    changed = {line[3:] for line in tree_state(host).splitlines()}
    assert f"{ENGINE}/loop.py" in changed
    assert not any(path.startswith("workers/invoice-mailer/") for path in changed), changed
    for pkg in (PKG_A, PKG_B):  # neither worker holds a loop of its own: both run the engine's
        thin = (host / pkg / "loop.py").read_text()
        assert "from acme.workers.runtime.worker import Worker" in thin
        assert "_ERROR_LIMIT" not in thin


def test_a_worker_updated_before_the_owner_waits_for_it_with_nothing_written(
    host: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The second worker's new version runs on `workers/runtime`, which only the namespace
    owner's update brings: updated first, it stops naming the owner's update (without this,
    the host's `uv sync` failed on a workspace member that does not exist)."""
    head = git(host, "rev-parse", "HEAD")

    with pytest.raises(TaskError):  # the migration's exit 1
        update(host, "invoice-mailer", "v0.2.0")

    err = capfd.readouterr().err
    assert (
        "invoice-mailer: the new version runs on the worker runtime (workers/runtime, API 1), "
        "which this host does not have yet; the worker that owns the work namespace brings it: "
        "run "
        "`make update-worker NAME=shipment-notifier` first"
    ) in err
    assert tree_state(host) == ""
    assert git(host, "rev-parse", "HEAD") == head

    update(host, "shipment-notifier", "v0.2.0")  # the owner first, then the other goes on
    commit_all(host, "the owner")
    update(host, "invoice-mailer", "v0.2.0")
    assert "WORKER = Worker(" in (host / PKG_B / "loop.py").read_text()


# --- the Terraform files across 0.2 (docs/decisions/0031) ---------------------------------------

TF = "deployment/terraform/environments/{env}/worker_shipment_notifier.tf"
TERRAFORM = "/usr/local/bin/terraform"
lifecycle = load_extension("lifecycle")


def test_terraform_edits_of_settings_and_sizes_are_carried_into_the_instance(host: Path) -> None:
    """A settings value and a size the user changed in the long 0.1.0 file land in the short
    instance (`settings`, the size line), with no conflict; the rest is the new rendering,
    and the state moves are written beside it."""
    staging, production = (host / TF.format(env=env) for env in ("staging", "production"))
    _edit(staging, 'POLL_INTERVAL           = "2"', 'POLL_INTERVAL           = "1"')
    _edit(staging, "  max_count           = 2\n", "  max_count           = 3\n")
    _edit(production, "  log_retention_days = 90\n", "  log_retention_days = 180\n")
    commit_all(host, "our Terraform edits")

    update(host, "shipment-notifier", "v0.2.0")

    text = staging.read_text()
    assert re.search(r'(?m)^    POLL_INTERVAL = "1"$', text), text
    assert re.search(r"(?m)^  max_count +\= 3$", text), text
    assert "<<<<<<<" not in text and "SHIPMENT_NOTIFIER_" not in text.split('module "worker_')[1]
    other = production.read_text()
    assert re.search(r"(?m)^  log_retention_days = 180$", other), other
    assert "POLL_INTERVAL" not in other and re.search(r"(?m)^  max_count +\= 8$", other)
    done = subprocess.run(
        [TERRAFORM, "fmt", "-check", "-diff", "-recursive", "deployment/terraform"],
        cwd=host, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (staging.parent / "worker_shipment_notifier.moved.tf").is_file()
    assert git(host, "diff", "--cached", "--name-only") == "", "the index is HEAD's again"


def test_a_terraform_edit_the_module_owns_now_stops_the_update_naming_the_file(
    host: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    staging = TF.format(env="staging")
    _edit(
        host / staging,
        "deployment_minimum_healthy_percent = 50",
        "deployment_minimum_healthy_percent = 100",
    )
    commit_all(host, "our rollout tweak")
    head = git(host, "rev-parse", "HEAD")

    with pytest.raises(TaskError):  # the migration's exit 1
        update(host, "shipment-notifier", "v0.2.0")

    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("deploy")]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{staging}: you changed it since template ")
    assert "its line `deployment_minimum_healthy_percent = 100` is the module's now" in lines[0]
    assert "Nothing was updated." in lines[0]
    assert tree_state(host) == ""
    assert git(host, "rev-parse", "HEAD") == head
    assert not (host / "deployment/terraform/modules/worker").exists()


OLD = """\
locals {
  x_environment = {
    X_LANE     = "default"
    X_CAPACITY = "4"
    X_RELEASE  = local.x_release
  }
}

module "x" {
  desired_count = 1
  max_count     = 2
}
"""
NEW = """\
module "worker_x" {
  desired_count      = 1
  max_count          = 2
  log_retention_days = 14
  settings = {
    LANE     = "default"
    CAPACITY = "10"
  }
}
"""


def test_terraform_edits_carry_values_and_refuse_the_rest() -> None:
    user = OLD.replace('"4"', '"6"').replace("= 2", "= 5")
    user = user.replace("    X_RELEASE", '    X_SMTP_HOST = "mail"\n    X_RELEASE')
    edits = lifecycle.terraform_edits(OLD, user, "X_")
    assert edits.settings == {"CAPACITY": '"6"', "SMTP_HOST": '"mail"'}
    assert edits.sizes == {"max_count": "5"}
    assert lifecycle.apply_terraform_edits(NEW, edits) == NEW.replace(
        "max_count          = 2", "max_count          = 5"
    ).replace(
        '    LANE     = "default"\n    CAPACITY = "10"\n',
        '    LANE      = "default"\n    CAPACITY  = "6"\n    SMTP_HOST = "mail"\n',
    )
    assert lifecycle.terraform_edits(OLD, OLD, "X_").empty
    refused = {
        "an expression": OLD.replace('"4"', "var.capacity"),
        "a removed setting": OLD.replace('    X_CAPACITY = "4"\n', ""),
        "another line": OLD.replace('module "x" {', 'module "x" {\n  command = []'),
    }
    for what, text in refused.items():
        with pytest.raises(ValueError):
            lifecycle.terraform_edits(OLD, text, "X_")
            pytest.fail(what)
