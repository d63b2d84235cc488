"""`copier update` brings every template change into a host: the fragments in shared files too.

The history here is real: the template's 0.1.0 release (commit e75b510 of this repository,
tagged `v0.1.0` in a clone made by the test), then the working tree (`v0.2.0`), then two
scripted releases:

- `v0.3.0`: a fragment's text changes (the env block's and compose service's
  `POLL_INTERVAL` becomes 3) and a fragment is added (a `# <worker> metrics: <url>` line
  after the worker's `run` line in `scripts/dev.sh`, with its region in `worker_regions`);
- `v0.4.0`: that fragment is removed again (its region kept, so updates can find it).

The invariant (docs/updating.md): for a host nobody edited, copying at version N and
updating to N+1 gives, byte for byte, the host a copy at N+1 gives, over every file except
the user's own (the handler, its test, the payload model) and, from 0.1.0, the Terraform
state moves the update writes (`worker_<module>.moved.tf`, which a fresh copy does not
need). Answers fixed at the first copy (`migration_stamp`, `queue_down_revision`) are
given to the fresh copy as recorded.
"""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import copier
import pytest
import yaml
from conftest import (
    REFERENCE_HOST,
    VENV_BIN,
    commit_all,
    copy_host,
    git,
    load_extension,
    release_history,
    tree_state,
)
from copier.errors import UserMessageError

A = {"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"}
B = {
    "worker_name": "invoice-mailer",
    "work_kind": "SEND_INVOICE",
    "container": True,
    "lane": "bulk",
}
C = {"worker_name": "ledger-sweeper", "work_kind": "NOOP"}
WORKERS = [A, B, C]
USER_OWNED = ("/handler.py", "/test_handler.py", "/om/work/types/payloads/")
# What the update from before 0.2 writes and a fresh copy has no use for: each worker's
# Terraform state moves, `environments/<env>/worker_<module>.moved.tf` (copier.yml's v0.2.0
# `terraform-moves`; no state predates a fresh copy). The user's from then on.
MIGRATION_WRITTEN = ".moved.tf"
lifecycle = load_extension("lifecycle")
FIXED = ("migration_stamp", "queue_down_revision")
QDR = "queue_down_revision"  # recorded by every worker; only the namespace owner's is used

# The scripted releases: (file in the template repo, anchor, replacement).
V030 = [
    ("extensions/patcher.py", '("poll_interval", "2"),', '("poll_interval", "3"),'),
    (
        "extensions/patcher.py",
        '        Fragment("dev script", lambda s: "scripts/dev.sh", edit_dev_script),\n',
        (
            '        Fragment("dev script", lambda s: "scripts/dev.sh", edit_dev_script),\n'
            '        Fragment("dev metrics", lambda s: "scripts/dev.sh", edit_dev_metrics),\n'
        ),
    ),
    (
        "extensions/patcher.py",
        "def env_block(",
        (
            "def edit_dev_metrics(text: str, spec: Spec, limit: int) -> str:\n"
            '    """The worker\'s metrics URL, on the line after its `run` line."""\n'
            "    port = spec.metrics_port or METRICS_PORT_BASE\n"
            '    line = f"# {spec.worker_name} metrics: http://127.0.0.1:{port}/metrics\\n"\n'
            "    lines = text.splitlines(keepends=True)\n"
            "    if line in lines:\n"
            "        return text\n"
            '    runs = [i for i, l in enumerate(lines) if l.startswith(f"run {spec.worker_name} ")]\n'
            "    if runs:  # none yet while the copy checks the host\n"
            "        lines.insert(runs[0] + 1, line)\n"
            '    return "".join(lines)\n\n\n'
            "def env_block("
        ),
    ),
]
DEV_METRICS_REGION = (
    "extensions/host_workers.py",
    (
        '    """`scripts/dev.sh`: the worker\'s `run <name> ...` line."""\n'
        "    return [\n"
        '        Region("dev script", i, i + 1)\n'
        "        for i, line in enumerate(lines)\n"
        '        if re.match(rf"run {re.escape(worker)}\\s", line)\n'
        "    ]\n"
    ),
    (
        '    """`scripts/dev.sh`: the worker\'s `run <name> ...` line, and its metrics line."""\n'
        "    return [\n"
        '        Region("dev script", i, i + 1)\n'
        "        for i, line in enumerate(lines)\n"
        '        if re.match(rf"run {re.escape(worker)}\\s", line)\n'
        '    ] + [Region("dev metrics", i, i + 1) for i, line in enumerate(lines)\n'
        '         if line.startswith(f"# {worker} metrics: ")]\n'
    ),
)
V030.append(DEV_METRICS_REGION)
V040 = [  # the fragment goes; its region stays, so an update finds what to drop
    (
        "extensions/patcher.py",
        '        Fragment("dev metrics", lambda s: "scripts/dev.sh", edit_dev_metrics),\n',
        "",
    )
]


def _patch(repo: Path, edits: list[tuple[str, str, str]]) -> None:
    for rel, anchor, replacement in edits:
        path = repo / rel
        text = path.read_text(encoding="utf-8")
        assert text.count(anchor) == 1, f"{rel}: anchor {anchor!r} found {text.count(anchor)}x"
        path.write_text(text.replace(anchor, replacement), encoding="utf-8")


@pytest.fixture(scope="session")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template repository: v0.1.0 (e75b510), v0.2.0 (the working tree), v0.3.0, v0.4.0."""
    repo = release_history(tmp_path_factory.mktemp("releases") / "worker-template")
    _patch(repo, V030)
    commit_all(repo, "v0.3.0: POLL_INTERVAL 3, a dev metrics line per worker")
    git(repo, "tag", "v0.3.0")
    _patch(repo, V040)
    commit_all(repo, "v0.4.0: the dev metrics line goes")
    git(repo, "tag", "v0.4.0")
    return repo


def copy(template: Path, host: Path, ref: str, **answers: Any) -> None:
    copier.run_copy(
        str(template), str(host), data=answers, vcs_ref=ref, unsafe=True, defaults=True, quiet=True
    )


def update(host: Path, name: str, ref: str, **answers: Any) -> None:
    copier.run_update(
        str(host),
        answers_file=f"workers/{name}/.copier-answers.yml",
        data=answers,
        vcs_ref=ref,
        unsafe=True,
        defaults=True,
        overwrite=True,
        skip_answered=True,
        quiet=True,
    )


def recorded(host: Path, name: str) -> dict[str, Any]:
    data = yaml.safe_load((host / "workers" / name / ".copier-answers.yml").read_text())
    assert isinstance(data, dict)
    return data


def host_files(host: Path) -> dict[str, bytes]:
    """Every file of the host but git's own and the user's (see the module docstring).

    A second worker's `queue_down_revision` is the queue head when it was copied (a copy
    refuses it given otherwise); only the namespace owner's is ever read, so the others'
    are left out of the comparison.
    """
    files: dict[str, bytes] = {}
    for path in sorted(host.rglob("*")):
        rel = str(path.relative_to(host))
        if not path.is_file() or ".git" in path.relative_to(host).parts:
            continue
        if any(mark in f"/{rel}" for mark in USER_OWNED) or rel.endswith(MIGRATION_WRITTEN):
            continue
        data = path.read_bytes()
        if path.name == ".copier-answers.yml" and b"namespace_absent: false" in data:
            data = re.sub(rb"(?m)^queue_down_revision: .*\n", b"", data)
        files[rel] = data
    return files


def differences(updated: Path, fresh: Path) -> str:
    """'' when both hosts hold the same files, byte for byte; else a diff of each."""
    ours, theirs = host_files(updated), host_files(fresh)
    out: list[str] = []
    for rel in sorted(set(ours) | set(theirs)):
        if ours.get(rel) == theirs.get(rel):
            continue
        before = (ours.get(rel) or b"").decode(errors="replace").splitlines(keepends=True)
        after = (theirs.get(rel) or b"").decode(errors="replace").splitlines(keepends=True)
        out += difflib.unified_diff(before, after, f"updated/{rel}", f"fresh/{rel}")
        out.append("\n")
    return "".join(out)


def fresh_copy(template: Path, dst: Path, ref: str, like: Path, workers: list[dict[str, Any]],
               changed: dict[str, dict[str, Any]] | None = None) -> Path:  # fmt: skip
    """The host a copy at `ref` gives, worker after worker, with the answers `like` fixed
    at its first copy (and `changed` per worker name on top)."""
    host = copy_host(dst)
    for answers in workers:
        name = answers["worker_name"]
        previous = recorded(like, name)
        fixed = {key: previous[key] for key in FIXED if previous["namespace_absent"] or key != QDR}
        copy(template, host, ref, **{**answers, **fixed, **(changed or {}).get(name, {})})
        commit_all(host, f"add {name}")
    return host


def update_all(host: Path, ref: str, workers: list[dict[str, Any]]) -> None:
    """Each worker updated to `ref` and committed, the namespace owner first (copy order)."""
    for answers in workers:
        update(host, answers["worker_name"], ref)
        commit_all(host, f"update {answers['worker_name']} to {ref}")


@pytest.fixture(scope="module")
def hosts(history: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Path]]:
    """Hosts with one, two and three workers, each copied at v0.1.0 and committed."""
    made: dict[int, Path] = {}
    for count in (1, 2, 3):
        host = copy_host(tmp_path_factory.mktemp(f"v010-{count}") / "host")
        for answers in WORKERS[:count]:
            copy(history, host, "v0.1.0", **answers)
            commit_all(host, f"add {answers['worker_name']}")
        made[count] = host
    yield made


# --- the invariant -----------------------------------------------------------------------------


def test_an_update_from_the_0_1_0_release_equals_a_fresh_copy(
    history: Path, hosts: dict[int, Path], tmp_path: Path
) -> None:
    """One worker; the three-worker case is the first step of the next test."""
    host = tmp_path / "updated"
    shutil.copytree(hosts[1], host, symlinks=True)
    update_all(host, "v0.2.0", WORKERS[:1])
    fresh = fresh_copy(history, tmp_path / "fresh", "v0.2.0", host, WORKERS[:1])
    assert differences(host, fresh) == ""
    # apart from the Terraform state moves, which only the updated host has (and needs)
    modules = [str(answers["worker_name"]).replace("-", "_") for answers in WORKERS[:1]]
    moves = f"deployment/terraform/environments/*/*{MIGRATION_WRITTEN}"
    assert sorted(str(p.relative_to(host)) for p in host.glob(moves)) == sorted(
        f"deployment/terraform/environments/{env}/worker_{module}{MIGRATION_WRITTEN}"
        for env in ("production", "staging")
        for module in modules
    )
    assert not list(fresh.glob(moves))
    for answers in WORKERS[:1]:
        module = str(answers["worker_name"]).replace("-", "_")
        expected = lifecycle.terraform_moves(
            str(answers["worker_name"]), module, answers is WORKERS[0]
        )
        for env in ("production", "staging"):
            path = host / f"deployment/terraform/environments/{env}/worker_{module}.moved.tf"
            assert path.read_text(encoding="utf-8") == expected


def test_three_workers_follow_every_release_text_added_and_removed_fragments(
    history: Path, hosts: dict[int, Path], tmp_path: Path
) -> None:
    """v0.1.0 -> v0.2.0 -> v0.3.0 (a fragment's text changes, one is added) -> v0.4.0 (it
    is removed), three workers, compared with a fresh copy at every step."""
    host = tmp_path / "updated"
    shutil.copytree(hosts[3], host, symlinks=True)
    for ref in ("v0.2.0", "v0.3.0", "v0.4.0"):
        update_all(host, ref, WORKERS)
        fresh = fresh_copy(history, tmp_path / f"fresh-{ref}", ref, host, WORKERS)
        assert differences(host, fresh) == "", ref
        dev = (host / "scripts/dev.sh").read_text()
        assert ("# shipment-notifier metrics: " in dev) == (ref == "v0.3.0"), dev
        assert ("SHIPMENT_NOTIFIER_POLL_INTERVAL=3" in (host / ".env.example").read_text()) == (
            ref != "v0.2.0"
        )


def test_an_answer_changed_at_update_equals_a_fresh_copy_with_it(
    history: Path, hosts: dict[int, Path], tmp_path: Path
) -> None:
    """`-d lane=bulk` on update: `.env.example` and `kinds.py` say `bulk` as a fresh copy
    with `lane=bulk` does (the deployed worker and the callers that pass no lane agree)."""
    host = tmp_path / "updated"
    shutil.copytree(hosts[2], host, symlinks=True)
    update_all(host, "v0.2.0", WORKERS[:2])
    update(host, A["worker_name"], "v0.3.0", lane="bulk")
    commit_all(host, "lane bulk")
    update(host, B["worker_name"], "v0.3.0")
    commit_all(host, "B")
    changed = {A["worker_name"]: {"lane": "bulk"}}
    fresh = fresh_copy(history, tmp_path / "fresh", "v0.3.0", host, WORKERS[:2], changed)
    assert differences(host, fresh) == ""
    assert "SHIPMENT_NOTIFIER_LANE=bulk" in (host / ".env.example").read_text()
    kinds = (host / "om/src/acme/om/work/types/kinds.py").read_text()
    assert 'WorkKind.NOTIFY_SHIPMENT: KindPolicy(lane="bulk"),' in kinds


def test_a_changed_work_kind_is_refused_at_update_before_anything_is_written(
    history: Path, hosts: dict[int, Path], tmp_path: Path
) -> None:
    host = tmp_path / "updated"
    shutil.copytree(hosts[1], host, symlinks=True)
    with pytest.raises(UserMessageError) as refused:
        update(host, A["worker_name"], "v0.2.0", work_kind="NOTIFY_PARCEL")
    message = str(refused.value)
    assert "work_kind cannot change at update: items queued as NOTIFY_SHIPMENT" in message
    assert tree_state(host) == ""


# --- the user's edits in a region -------------------------------------------------------------


KINDS = "om/src/acme/om/work/types/kinds.py"


@pytest.fixture
def tuned(history: Path, tmp_path: Path) -> Path:
    """Two workers at v0.2.0; the user tuned A's policy and A's and B's capacity."""
    host = copy_host(tmp_path / "host")
    for answers in WORKERS[:2]:
        copy(history, host, "v0.2.0", **answers)
        commit_all(host, f"add {answers['worker_name']}")
    kinds = host / KINDS
    text = kinds.read_text()
    before = "WorkKind.NOTIFY_SHIPMENT: KindPolicy(),"
    assert before in text
    kinds.write_text(text.replace(before, "WorkKind.NOTIFY_SHIPMENT: KindPolicy(max_attempts=9),"))
    env = host / ".env.example"
    text = env.read_text()
    for prefix in ("SHIPMENT_NOTIFIER_", "INVOICE_MAILER_"):
        assert f"{prefix}CAPACITY=10\n" in text
        text = text.replace(f"{prefix}CAPACITY=10\n", f"{prefix}CAPACITY=4\n")
    env.write_text(text)
    commit_all(host, "tuned")
    return host


def test_a_tuned_region_keeps_the_users_edit_and_takes_the_templates(tuned: Path) -> None:
    update_all(tuned, "v0.3.0", WORKERS[:2])
    env = (tuned / ".env.example").read_text()
    for prefix in ("SHIPMENT_NOTIFIER_", "INVOICE_MAILER_"):
        assert f"{prefix}CAPACITY=4\n" in env, "the user's tuning survives"
        assert f"{prefix}POLL_INTERVAL=3\n" in env, "the template's change arrives"
    assert "WorkKind.NOTIFY_SHIPMENT: KindPolicy(max_attempts=9)," in (tuned / KINDS).read_text()
    assert "<<<<<<<" not in env


def test_an_overlapping_edit_is_a_conflict_the_helper_reports(tuned: Path) -> None:
    env = tuned / ".env.example"
    env.write_text(
        env.read_text().replace(
            "SHIPMENT_NOTIFIER_POLL_INTERVAL=2\n", "SHIPMENT_NOTIFIER_POLL_INTERVAL=1\n"
        )
    )
    commit_all(tuned, "poll faster")
    done = subprocess.run(
        [sys.executable, "scripts/workers.py", "update", A["worker_name"], "--ref", "v0.3.0"],
        cwd=tuned,
        env={"PATH": f"{VENV_BIN}:/usr/bin:/bin", "COPIER": str(VENV_BIN / "copier")},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert ".env.example" in done.stdout + done.stderr
    text = env.read_text()
    assert "<<<<<<< before updating\nSHIPMENT_NOTIFIER_POLL_INTERVAL=1\n" in text
    assert "=======\nSHIPMENT_NOTIFIER_POLL_INTERVAL=3\n>>>>>>> after updating\n" in text
    assert "SHIPMENT_NOTIFIER_CAPACITY=4\n" in text


# --- removal is the exact reverse, at the longest names ----------------------------------------


naming = load_extension("naming")
LIMIT = 100  # the reference host's [tool.ruff] line-length
LONGEST: list[dict[str, Any]] = [
    # the longest worker name and kind class the reference host takes (tests/test_refusals.py)
    {
        "worker_name": "w" + "a" * (LIMIT - naming.WORKER_MODULE_LINE - len("acme") - 1),
        "work_kind": "K" * (LIMIT - naming.KIND_CLASS_LINE),
        "container": True,
    },
    # the longest kind: its import and map entries wrap
    {"worker_name": "second", "work_kind": "_".join(["K"] * 21), "lane": "bulk"},
]


@pytest.mark.parametrize("answers", LONGEST, ids=["longest-name", "longest-kind"])
def test_removing_a_worker_puts_every_shared_file_back(
    history: Path, tmp_path: Path, answers: dict[str, Any]
) -> None:
    host = copy_host(tmp_path / "host", REFERENCE_HOST)
    copy(history, host, "v0.2.0", **A)
    commit_all(host, "A")
    before = git(host, "rev-parse", "HEAD").strip()
    copy(history, host, "v0.2.0", **answers)
    commit_all(host, "the long one")
    kinds = (host / KINDS).read_text()
    assert f"WorkKind.{answers['work_kind']}:" in kinds
    done = subprocess.run(
        [sys.executable, "scripts/workers.py", "remove", answers["worker_name"]],
        cwd=host,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    git(host, "add", "-A")
    assert git(host, "diff", "--cached", before, "--stat") == ""


# --- rename carries the regions; only the helper renames ----------------------------------------


def helper(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/workers.py", *args],
        cwd=host,
        env={"PATH": f"{VENV_BIN}:/usr/bin:/bin", "COPIER": str(VENV_BIN / "copier")},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_a_rename_keeps_the_users_edits_in_shared_files(tuned: Path) -> None:
    env = tuned / ".env.example"
    env.write_text(
        env.read_text().replace(
            "INVOICE_MAILER_OPERATOR=\n", "INVOICE_MAILER_OPERATOR=\nINVOICE_MAILER_SMTP_HOST=mx\n"
        )
    )
    compose = tuned / "deployment/local/docker-compose.full.yml"
    before_compose = compose.read_text()
    assert '      INVOICE_MAILER_CAPACITY: "10"\n' in before_compose
    compose.write_text(
        before_compose.replace('INVOICE_MAILER_CAPACITY: "10"', 'INVOICE_MAILER_CAPACITY: "6"')
    )
    commit_all(tuned, "tuned B's shared lines")
    port = re.search(r"(?m)^INVOICE_MAILER_METRICS_PORT=(\d+)$", env.read_text())
    assert port

    done = helper(tuned, "rename", "invoice-mailer", "bill-mailer")
    assert done.returncode == 0, done.stdout + done.stderr

    text = env.read_text()
    assert "INVOICE_MAILER_" not in text and "# --- worker invoice-mailer ---" not in text
    for line in (
        "BILL_MAILER_CAPACITY=4",
        "BILL_MAILER_SMTP_HOST=mx",
        f"BILL_MAILER_METRICS_PORT={port[1]}",
    ):
        assert f"{line}\n" in text, line
    assert text.count("# --- worker bill-mailer ---") == 1
    services = compose.read_text()
    assert 'BILL_MAILER_CAPACITY: "6"' in services and "invoice-mailer:" not in services


def test_a_name_changed_by_copier_update_is_refused_the_helper_renames(tuned: Path) -> None:
    with pytest.raises(UserMessageError) as refused:
        update(tuned, B["worker_name"], "v0.2.0", worker_name="bill-mailer")
    assert "worker_name cannot change at update: rename with make rename-worker" in str(
        refused.value
    )
    assert tree_state(tuned) == ""


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("shipment-notifier-completed", "reads the settings variable SHIPMENT_NOTIFIER_COMPLETED"),
        ("acme", "collides with what the host has"),
    ],
)
def test_a_rename_is_refused_where_a_copy_of_that_name_would_be(
    tuned: Path, name: str, expected: str
) -> None:
    done = helper(tuned, "rename", "invoice-mailer", name)
    assert done.returncode == 1, done.stdout + done.stderr
    assert expected in done.stdout + done.stderr
    assert tree_state(tuned) == ""
