"""Every refusal of `copier copy`: one line, raised before any file is written.

The checks live in the context hook (extensions/context.py `preflight`), called from the
default of the first `ask: false` question. Each test asserts the message names the cause
and that the host's git tree is exactly as committed (no new, changed or deleted file).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REFERENCE_HOST, commit_all, copy_template, tree_state
from copier.errors import UserMessageError


def refused(render: Callable[..., Any], host: Path, **answers: Any) -> str:
    with pytest.raises(UserMessageError) as caught:
        render(host, **answers)
    assert tree_state(host) == "", "a refused copy must leave the tree untouched"
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ({"worker_name": "Shipment-Notifier"}, "must be kebab-case"),
        ({"worker_name": "shipment_notifier"}, "must be kebab-case"),
        ({"worker_name": "-x"}, "must be kebab-case"),
        ({"worker_name": "2-fast"}, "starting with a letter"),
        ({"work_kind": "2FA_RESET"}, "starting with a letter"),
        ({"lane": "9_lives"}, "starting with a letter"),
        ({"work_kind": "notify_shipment"}, "must be UPPER_SNAKE"),
        ({"work_kind": "NOTIFY__SHIPMENT"}, "must be UPPER_SNAKE"),
        ({"lane": "Bulk-Lane"}, "must be snake_case"),
        ({"worker_name": "match"}, "'match', a Python keyword"),
        ({"worker_name": "class"}, "'class', a Python keyword"),
        ({"work_kind": "CLASS"}, "'class', a Python keyword"),
        ({"work_kind": "TYPE"}, "'type', a Python keyword"),
        ({"work_kind": "NONE"}, "'None', a Python keyword"),
        ({"lane": "case"}, "'case', a Python keyword"),
        ({"maintenance": "maybe"}, "maintenance 'maybe' must be true or false"),
        ({"container": "sure"}, "container 'sure' must be true or false"),
    ],
)
def test_bad_answer_is_refused_before_writing(
    make_host: Callable[..., Path],
    render: Callable[..., Any],
    answers: dict[str, str],
    expected: str,
) -> None:
    host = make_host(REFERENCE_HOST)
    assert expected in refused(render, host, **answers)


def test_destination_that_is_not_a_host_names_what_is_missing(
    tmp_path: Path, render: Callable[..., Any]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserMessageError) as caught:
        render(empty)
    message = str(caught.value)
    assert "is not a host root" in message
    assert "no pyproject.toml" in message
    assert "no om/src/<root>/om/__init__.py" in message
    assert list(empty.iterdir()) == []


def test_pyproject_without_workspace_is_named(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    pyproject = host / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace("[tool.uv.workspace]", "[tool.uv.not-a-workspace]")
    )
    commit_all(host, "no workspace")
    assert "pyproject.toml has no [tool.uv.workspace] table" in refused(render, host)


def test_a_folder_inside_the_host_names_the_command(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    """Any folder inside the host but `workers/<name>` (tests/test_copy_form.py: that one
    renders the worker into the host root)."""
    host = make_host(REFERENCE_HOST)
    with pytest.raises(UserMessageError) as caught:
        render(host / "services" / "shipment-notifier")
    message = str(caught.value)
    assert f"cd {host} && copier copy --trust --defaults " in message
    assert " . -d worker_name=shipment-notifier -d work_kind=NOTIFY_SHIPMENT" in message
    assert tree_state(host) == ""
    assert not (host / "services" / "shipment-notifier").exists()


def test_a_folder_inside_the_host_is_named_before_a_missing_answer(
    make_host: Callable[..., Path], template_repo: Path
) -> None:
    """`copier copy --defaults <tpl> services/foo -d work_kind=FOO` (no worker_name): the
    wrong folder is the first thing to fix, so it is what the refusal says."""
    host = make_host(REFERENCE_HOST)
    with pytest.raises(UserMessageError) as caught:
        copy_template(template_repo, host / "services" / "foo", "v0.0.2", work_kind="FOO")
    message = str(caught.value)
    assert f"inside the host {host}, not its root" in message
    assert "-d worker_name=<name> -d work_kind=FOO" in message
    assert tree_state(host) == ""


def test_existing_worker_is_refused_with_the_update_command(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    answers = host / "workers" / "shipment-notifier" / ".copier-answers.yml"
    answers.parent.mkdir(parents=True)
    answers.write_text("worker_name: shipment-notifier\nwork_kind: NOTIFY_SHIPMENT\n")
    commit_all(host, "an existing worker")
    message = refused(render, host)
    assert (
        "copier update --trust --defaults -a workers/shipment-notifier/.copier-answers.yml"
        in message
    )


def test_kind_held_by_another_worker_is_refused(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    answers = host / "workers" / "other" / ".copier-answers.yml"
    answers.parent.mkdir(parents=True)
    answers.write_text("worker_name: other\nwork_kind: NOTIFY_SHIPMENT\n")
    commit_all(host, "another worker")
    message = refused(render, host)
    assert "work_kind 'NOTIFY_SHIPMENT' is already taken (workers/other)" in message


def test_kind_in_the_kinds_module_is_refused(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    work = host / "om/src/acme/om/work"
    (work / "types").mkdir(parents=True)
    (work / "__init__.py").write_text("")
    (work / "README.md").write_text("# Work\n")
    (work / "types/kinds.py").write_text(
        'from enum import StrEnum\n\n\nclass WorkKind(StrEnum):\n    NOTIFY_SHIPMENT = "NOTIFY_SHIPMENT"\n'
    )
    commit_all(host, "a namespace with the kind")
    assert "already taken (om/src/acme/om/work/types/kinds.py)" in refused(render, host)


@pytest.mark.parametrize(
    ("path", "old", "new", "expected"),
    [
        (
            "om/src/acme/om/root.py",
            "class Managers:",
            "class Mgrs:",
            "om/src/acme/om/root.py: no top-level `class Managers`",
        ),
        (
            "infra/src/acme/infra/topics/__init__.py",
            "class Topics(StrEnum):",
            "class Channels(StrEnum):",
            "infra/src/acme/infra/topics/__init__.py: no top-level `class Topics`",
        ),
        (
            "om/src/acme/om/outbox/impl/relay.py",
            '        raise Invalid(f"kind: no relay branch for outbox kind {row.kind!r}")\n',
            "",
            "relay.py: `OutboxRelayImpl._dispatch` does not end with a `raise`",
        ),
        (
            "scripts/dev.sh",
            "# >>> processes",
            "# processes",
            "scripts/dev.sh: no `# >>> processes`",
        ),
        (
            "om/src/acme/om/storage/roles.py",
            "TABLE_SCOPES",
            "SCOPES",
            "roles.py: no top-level `TABLE_SCOPES = {...}`",
        ),
    ],
)
def test_host_missing_a_structure_is_refused_naming_file_and_part(
    make_host: Callable[..., Path],
    render: Callable[..., Any],
    path: str,
    old: str,
    new: str,
    expected: str,
) -> None:
    host = make_host(REFERENCE_HOST)
    target = host / path
    text = target.read_text()
    assert old in text
    target.write_text(text.replace(old, new))
    commit_all(host, "break the host")
    assert expected in refused(render, host)


def test_cli_refusal_is_one_line_without_traceback(
    make_host: Callable[..., Path], template_repo: Path
) -> None:
    host = make_host(REFERENCE_HOST)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "copier",
            "copy",
            "--trust",
            "--defaults",
            "-r",
            "v0.0.2",
            "-d",
            "worker_name=Bad",
            "-d",
            "work_kind=NOTIFY_SHIPMENT",
            str(template_repo),
            ".",
        ],
        cwd=host,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "worker_name 'Bad' must be kebab-case" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert tree_state(host) == ""


def test_pytest_copie_empty_destination_is_refused(copie: Any, template_repo: Path) -> None:
    result = copie.copy(
        extra_answers={"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"},
        template_dir=template_repo,
    )
    assert result.exit_code != 0
    assert isinstance(result.exception, UserMessageError)
    assert "is not a host root" in str(result.exception)
    assert result.project_dir is None
    rendered = [p for p in copie.test_dir.rglob("*") if p.is_file()]
    assert rendered == [], "pytest-copie's empty destination must stay empty"


@pytest.mark.parametrize(
    ("worker_name", "collision"),
    [
        ("api", "deployment/docker/api.Dockerfile (another image of that name); "),
        ("api", "services/api/pyproject.toml (the distribution acme-api)"),
        ("om", "om/pyproject.toml (the distribution acme-om)"),
        ("infra", "infra/pyproject.toml (the distribution acme-infra)"),
        ("acme", "the host's package root 'acme' (its settings prefix ACME_)"),
    ],
)
def test_worker_name_of_a_host_package_or_image_is_refused(
    make_host: Callable[..., Path],
    render: Callable[..., Any],
    worker_name: str,
    collision: str,
) -> None:
    host = make_host(REFERENCE_HOST)
    message = refused(render, host, worker_name=worker_name, work_kind="NOTIFY_SHIPMENT")
    assert f"worker_name {worker_name!r} collides with what the host has: " in message
    assert collision in message
    assert message.endswith("; choose another worker_name")


def test_a_host_root_answer_cannot_skip_the_checks(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    message = refused(render, host, host_root="other", worker_name="api")
    assert (
        message
        == "host_root is discovered from the host ('acme'), not answered: drop -d host_root=other"
    )


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (
            {"namespace_absent": False},
            "namespace_absent is discovered from the host (True), not answered",
        ),
        ({"migration_stamp": "abc"}, "migration_stamp 'abc' must be a UTC stamp YYYYMMDDHHMMSS"),
        ({"metrics_port": 80}, "metrics_port 80 must be a port from 1024 to 65535"),
    ],
)
def test_fixed_answers_given_with_d_are_checked(
    make_host: Callable[..., Path],
    render: Callable[..., Any],
    answers: dict[str, Any],
    expected: str,
) -> None:
    host = make_host(REFERENCE_HOST)
    assert expected in refused(render, host, **answers)


def test_a_metrics_port_another_worker_holds_is_refused(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    render(host)
    commit_all(host, "shipment-notifier on 9100")
    message = refused(
        render, host, worker_name="invoice-mailer", work_kind="SEND_INVOICE", metrics_port=9100
    )
    assert message == (
        "metrics_port 9100 is held by another worker; leave it out (the next free one is 9101)"
    )
