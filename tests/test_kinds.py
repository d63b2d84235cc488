"""A kind added to an existing worker (`make add-kind`, docs/decisions/0042): copier replays
it on update, remove takes it away, and a kind another worker handles is refused.

History: the working tree tagged `v0.0.1`, then a scripted `v0.0.2` in which the kind's
own files change (the enqueuer's first line, a copier-rendered file of the kind subtree)
and its fragment does (the capacity of an added kind, 5 -> 4, in `.env.example` and in
its Terraform settings files). The invariant is the template's (docs/updating.md): copy at
N, add the kind at N, update both to N+1 gives, byte for byte, the host that a copy and an
added kind at N+1 give.

The kind's Terraform settings (one file per environment) reach the worker's module
instance through the worker file's `kind_settings`, evaluated by `terraform console`, and
the task's environment in an offline `terraform plan` (docs/decisions/0042).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import copier
import hcl2
import pytest
import yaml
from conftest import VENV_BIN, commit_all, copy_host, git, snapshot_template, tree_state
from copier.errors import UserMessageError
from test_deployment import _console, _plan
from test_formatters import PRETTIER, run_prettier
from test_fragment_update import differences

A = {"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"}
B = {"worker_name": "invoice-mailer", "work_kind": "SEND_INVOICE"}
KIND = "SEND_RECEIPT"
ENQUEUER = "kind/om/src/{{ host_root }}/om/work/enqueuers/{{ kind_snake }}.py.jinja"
CHANGED_LINE = '"""Typed enqueue helpers (changed in v0.0.2) for `{{ work_kind }}` items.'
KIND_ENQUEUER = "om/src/acme/om/work/enqueuers/send_receipt.py"
KIND_HANDLER = "workers/shipment-notifier/src/acme/workers/shipment_notifier/kinds/send_receipt.py"
KIND_ANSWERS = "workers/shipment-notifier/.copier-answers.send_receipt.yml"
KINDS_PY = "om/src/acme/om/work/types/kinds.py"
ENVIRONMENTS = ("staging", "production")
KIND_TF = "deployment/terraform/environments/{env}/kinds/shipment-notifier/send_receipt.yml"
WORKER_TF = "deployment/terraform/environments/{env}/worker_shipment_notifier.tf"
CAPACITY_VARIABLE = "SHIPMENT_NOTIFIER_KIND_CAPACITY__SEND_RECEIPT"


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree (`v0.0.1`), then the scripted `v0.0.2` (see the module docstring)."""
    repo = snapshot_template(tmp_path_factory.mktemp("kinds") / "worker-template")
    enqueuer = repo / ENQUEUER
    template = repo / enqueuer.read_text(encoding="utf-8").split('"')[1]
    text = template.read_text(encoding="utf-8")
    first = '"""Typed enqueue helpers for `{{ work_kind }}` items.'
    assert text.startswith(first)
    # the kind's own copy of the enqueuer changes; the worker's own kind keeps the old one
    enqueuer.write_text(text.replace(first, CHANGED_LINE, 1), encoding="utf-8")
    patcher = repo / "extensions" / "patcher.py"
    text = patcher.read_text(encoding="utf-8")
    assert text.count("ADDED_KIND_CAPACITY = 5\n") == 1
    patcher.write_text(text.replace("ADDED_KIND_CAPACITY = 5\n", "ADDED_KIND_CAPACITY = 4\n"))
    commit_all(repo, "v0.0.2: the added kind's enqueuer and capacity change")
    git(repo, "tag", "v0.0.2")
    return repo


def copy(template: Path, host: Path, ref: str, **answers: Any) -> None:
    copier.run_copy(
        str(template), str(host), data=answers, vcs_ref=ref, unsafe=True, defaults=True, quiet=True
    )


def helper(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The host helper, as `make add-kind` and the others run it."""
    return subprocess.run(
        [sys.executable, "scripts/workers.py", *args],
        cwd=host,
        env={**os.environ, "PATH": f"{VENV_BIN}:/usr/bin:/bin", "COPIER": str(VENV_BIN / "copier")},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def add_kind(host: Path) -> None:
    done = helper(host, "add-kind", A["worker_name"], KIND)
    assert done.returncode == 0, done.stdout + done.stderr
    commit_all(host, f"add {KIND}")


def kind_settings(host: Path, env: str, scratch: Path) -> dict[str, str]:
    """The worker file's `kind_settings` as Terraform evaluates it over the environment's
    `kinds/` folder: `terraform console` in a folder holding only a copy of that folder (no
    module to install), the expression as python-hcl2 reads it from the worker file."""
    with (host / WORKER_TF.format(env=env)).open(encoding="utf-8") as handle:
        parsed = hcl2.load(handle)
    [instance] = [body for block in parsed["module"] for body in block.values()]
    expression = str(instance["kind_settings"])
    assert expression.startswith("${merge(") and expression.endswith(")}"), expression
    folder = scratch / env
    kinds = host / WORKER_TF.format(env=env).rpartition("/")[0] / "kinds"
    if kinds.is_dir():
        shutil.copytree(kinds, folder / "kinds")
    folder.mkdir(parents=True, exist_ok=True)
    value: dict[str, str] = json.loads(
        json.loads(_console(f"jsonencode({expression[2:-1]})", folder))
    )
    return value


def planned_environment(host: Path, env: str, scratch: Path) -> dict[str, str]:
    """The worker's task environment in an offline `terraform plan` of a copy of the host's
    Terraform (test_deployment's `_plan`): what reaches the task, by variable name."""
    shutil.copytree(host / "deployment" / "terraform", scratch / "terraform")
    plan = _plan(scratch / "terraform" / "environments" / env)
    [task] = [
        change["change"]["after"]
        for change in plan["resource_changes"]
        if change["type"] == "aws_ecs_task_definition"
        and "worker_shipment_notifier" in change["address"]
    ]
    [container] = json.loads(task["container_definitions"])
    return {pair["name"]: pair["value"] for pair in container["environment"]}


def test_an_added_kind_follows_the_next_release_and_remove_takes_it_away(
    history: Path, tmp_path: Path
) -> None:
    host = copy_host(tmp_path / "updated")
    copy(history, host, "v0.0.1", **A)
    commit_all(host, "add A")
    before = git(host, "rev-parse", "HEAD").strip()
    for env in ENVIRONMENTS:  # no kind added: the worker file's `kind_settings` is empty
        assert kind_settings(host, env, tmp_path / "console-before") == {}
    add_kind(host)
    kinds = (host / KINDS_PY).read_text()
    assert f'{KIND} = "{KIND}"' in kinds and f"WorkKind.{KIND}: SendReceiptPayload" in kinds
    assert (
        "SHIPMENT_NOTIFIER_KIND_CAPACITY__SEND_RECEIPT=5\n" in (host / ".env.example").read_text()
    )
    answers = yaml.safe_load((host / KIND_ANSWERS).read_text())
    assert (answers["worker_name"], answers["work_kind"], answers["added_kind"]) == (
        A["worker_name"],
        KIND,
        True,
    )
    assert (host / KIND_HANDLER).is_file()

    # its Terraform settings, one file per environment, which the worker file merges: the
    # capacity reaches the task as SHIPMENT_NOTIFIER_KIND_CAPACITY__SEND_RECEIPT
    for env in ENVIRONMENTS:
        expected = {f"KIND_CAPACITY__{KIND}": "5"}
        assert yaml.safe_load((host / KIND_TF.format(env=env)).read_text()) == expected
        assert kind_settings(host, env, tmp_path / "console-kind") == expected
    assert run_prettier(PRETTIER, host, "--list-different", "deployment/**/*.yml") == []
    planned = planned_environment(host, "staging", tmp_path / "plan")
    assert planned[CAPACITY_VARIABLE] == "5"
    assert planned["SHIPMENT_NOTIFIER_CAPACITY"] == "10"

    # remove-kind takes it away: the host as it was before the kind, byte for byte
    with_kind = git(host, "rev-parse", "HEAD").strip()
    done = helper(host, "remove-kind", A["worker_name"], KIND)
    assert done.returncode == 0, done.stdout + done.stderr
    git(host, "add", "-A")
    assert git(host, "diff", "--cached", before, "--stat") == ""
    assert not list(host.glob("deployment/terraform/environments/*/kinds")), "empty folders left"
    git(host, "reset", "-q", "--hard", with_kind)

    # update the worker and its kind to v0.0.2: the host a fresh copy with both gives
    done = helper(host, "update-all", "--commit")
    assert done.returncode == 0, done.stdout + done.stderr
    assert tree_state(host) == ""
    assert yaml.safe_load((host / KIND_ANSWERS).read_text())["_commit"] == "v0.0.2"
    assert (
        (host / KIND_ENQUEUER).read_text().startswith(CHANGED_LINE.replace("{{ work_kind }}", KIND))
    )
    fresh = copy_host(tmp_path / "fresh")
    stamp = yaml.safe_load((host / "workers/shipment-notifier/.copier-answers.yml").read_text())
    copy(history, fresh, "v0.0.2", **A, migration_stamp=stamp["migration_stamp"])
    commit_all(fresh, "add A")
    add_kind(fresh)
    assert differences(host, fresh) == ""
    assert (
        "SHIPMENT_NOTIFIER_KIND_CAPACITY__SEND_RECEIPT=4\n" in (host / ".env.example").read_text()
    )
    for env in ENVIRONMENTS:
        assert yaml.safe_load((host / KIND_TF.format(env=env)).read_text()) == {
            f"KIND_CAPACITY__{KIND}": "4"
        }

    # remove-worker takes the kinds added to it along
    done = helper(host, "remove", A["worker_name"])
    assert done.returncode != 0  # the namespace owner and last worker: refused, as before
    assert "last worker" in done.stderr


def test_a_kind_another_worker_handles_is_refused_in_one_line_before_anything_is_written(
    history: Path, tmp_path: Path
) -> None:
    host = copy_host(tmp_path / "host")
    for answers in (A, B):
        copy(history, host, "v0.0.1", **answers)
        commit_all(host, f"add {answers['worker_name']}")
    head = git(host, "rev-parse", "HEAD").strip()

    done = helper(host, "add-kind", A["worker_name"], B["work_kind"])
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        (
            "workers.py: kind SEND_INVOICE is already handled by the invoice-mailer worker; a "
            "kind has one worker (remove it there first: it is that worker's own kind: make "
            "remove-worker NAME=invoice-mailer)"
        )
    ]
    # a kind added to a worker is taken away with remove-kind
    done = helper(host, "add-kind", B["worker_name"], KIND)
    assert done.returncode == 0, done.stdout + done.stderr
    commit_all(host, f"add {KIND} to invoice-mailer")
    head = git(host, "rev-parse", "HEAD").strip()
    done = helper(host, "add-kind", A["worker_name"], KIND)
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(f"(remove it there first: make remove-kind NAME=invoice-mailer KIND={KIND})")
    )
    with pytest.raises(UserMessageError) as refused:  # copier itself, without the helper
        copy(history, host, "v0.0.1", **{**A, "work_kind": B["work_kind"], "added_kind": True})
    assert str(refused.value) == (
        "work_kind 'SEND_INVOICE' is already handled (workers/invoice-mailer); a kind has one "
        "worker: remove it there first (make remove-kind, or make remove-worker for a worker's "
        "own kind)"
    )
    assert tree_state(host) == ""
    assert git(host, "rev-parse", "HEAD").strip() == head
