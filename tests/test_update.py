"""`copier update` over real template history (issue 6).

`template_history` (tests/conftest.py) is the template tagged `v0.0.1`, then a scripted
release `v0.0.2`: a changed first line in the worker's `main.py`, a line appended to the
user-owned handler, its test and the payload model, the worker's README moved to
`docs/README.md` with a `_migrations` step, and a comment above the `WorkKind` import of the
namespace's `work_item.py`.

The session renders one base host: worker A (`shipment-notifier`, creates the namespace)
and worker B (`invoice-mailer`, a container, another lane), both at `v0.0.1`, each
committed. Every test works on a `copytree` of it and updates through the host helper the
patcher installs (`scripts/workers.py`, the Makefile targets), as a user would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import copier
import pytest
import yaml
from conftest import (
    REFERENCE_HOST,
    RELEASE_KINDS,
    RELEASE_LINE,
    RELEASE_PROTECTED,
    REPO,
    VENV_BIN,
    cli,
    commit_all,
    copy_host,
    copy_template,
    git,
    host_gate,
    load_extension,
    one_line,
    tree_state,
    uv_sync,
)
from copier.errors import UserMessageError

patcher = load_extension("patcher")
lifecycle = load_extension("lifecycle")

A, B = "shipment-notifier", "invoice-mailer"
A_ANSWERS = {"worker_name": A, "work_kind": "NOTIFY_SHIPMENT"}
B_ANSWERS = {"worker_name": B, "work_kind": "SEND_INVOICE", "container": True, "lane": "bulk"}
WORK = "om/src/acme/om/work"
KINDS = f"{WORK}/types/kinds.py"
WORK_ITEM = f"{WORK}/types/work_item.py"


def pkg(name: str) -> str:
    return f"workers/{name}/src/acme/workers/{name.replace('-', '_')}"


def answers_path(name: str) -> str:
    return f"workers/{name}/.copier-answers.yml"


MARKERS = ("<<<<<<< before updating", ">>>>>>> after updating")


@dataclass(frozen=True)
class Base:
    """The session's base host and the commits it was built in."""

    path: Path
    host_commit: str
    a_commit: str


@pytest.fixture(scope="session")
def base(template_history: Path, tmp_path_factory: pytest.TempPathFactory) -> Base:
    """Reference host + A (namespace owner) + B, both copied at v0.0.1, each committed."""
    host = copy_host(tmp_path_factory.mktemp("update-base") / "host")
    host_commit = git(host, "rev-parse", "HEAD").strip()
    copy_template(template_history, host, "v0.0.1", **A_ANSWERS)
    commit_all(host, f"add {A}")
    a_commit = git(host, "rev-parse", "HEAD").strip()
    copy_template(template_history, host, "v0.0.1", **B_ANSWERS)
    commit_all(host, f"add {B}")
    return Base(host, host_commit, a_commit)


@pytest.fixture
def host(base: Base, tmp_path: Path) -> Path:
    """A private copy of the base host (git history included)."""
    dst = tmp_path / "host"
    shutil.copytree(base.path, dst, symlinks=True)
    return dst


def helper_env() -> dict[str, str]:
    env = {**os.environ, "COPIER": str(VENV_BIN / "copier")}
    env.pop("GITHUB_ACTIONS", None)
    return env


def helper(
    host: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python3 scripts/workers.py ...` in the host, as the Makefile runs it."""
    return subprocess.run(
        [sys.executable, "scripts/workers.py", *args],
        cwd=host,
        env={**helper_env(), **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def make(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args, f"WORKERS_PY={sys.executable} scripts/workers.py"],
        cwd=host,
        env=helper_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def recorded(host: Path, name: str) -> dict[str, Any]:
    return yaml.safe_load((host / answers_path(name)).read_text())


def changed_paths(host: Path) -> set[str]:
    return {line[3:] for line in tree_state(host).splitlines()}


def files_under(root: Path, rel: str) -> dict[str, bytes]:
    """Every file below `root/rel` (or the file itself), path -> bytes."""
    top = root / rel
    if top.is_file():
        return {rel: top.read_bytes()}
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(top.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def without_commit(data: bytes) -> bytes:
    return re.sub(rb"(?m)^_commit: .*\n", b"", data)


# --- the base and the helper it installed -----------------------------------------------------


def test_patcher_installs_the_helper_once(base: Base) -> None:
    """Two copies later: one Makefile block, one CI job, the template's helper byte for byte."""
    makefile = (base.path / "Makefile").read_text()
    assert makefile.count(lifecycle.MAKE_START) == 1 and makefile.count(lifecycle.MAKE_END) == 1
    for target in lifecycle.MAKE_TARGETS:
        assert re.search(rf"(?m)^{target}:", makefile), target
    assert "\n\t@$(WORKERS_PY) update " in makefile, "recipes are tab-indented"
    ci = yaml.safe_load((base.path / ".github/workflows/ci.yml").read_text())
    assert ci["jobs"][lifecycle.CI_JOB]["steps"][-1]["run"] == "make check-update"
    assert "check" in ci["jobs"], "the host's own jobs stay"
    helper_file = base.path / "scripts/workers.py"
    assert helper_file.read_text() == (REPO / "extensions/host_workers.py").read_text()


def test_check_update_lists_workers_behind(host: Path) -> None:
    done = make(host, "check-update")
    assert done.returncode == 0, done.stderr
    assert f"{A}: v0.0.1 -> v0.0.2 (behind" in done.stdout
    assert f"{B}: v0.0.1 -> v0.0.2 (behind" in done.stdout
    assert helper(host, "check-update", env={"STRICT": "1"}).returncode == 1
    assert helper(host, "update", A).returncode == 0
    commit_all(host, "update A")
    after = helper(host, "check-update").stdout
    assert f"{A}: v0.0.2 (up to date)" in after and f"{B}: v0.0.1 -> v0.0.2" in after


# --- update cases ------------------------------------------------------------------------------


def test_untouched_worker_equals_a_fresh_copy(
    host: Path, template_history: Path, tmp_path: Path
) -> None:
    """No local edits: A after the update is byte for byte a fresh v0.0.2 copy, but `_commit`
    and the user-owned files (`_skip_if_exists`), which stay as the v0.0.1 copy made them."""
    stamp = recorded(host, A)["migration_stamp"]
    protected = (
        f"{pkg(A)}/handler.py",
        f"workers/{A}/tests/test_handler.py",
        f"{WORK}/types/payloads/notify_shipment.py",
    )
    kept = {rel: (host / rel).read_bytes() for rel in protected}
    done = make(host, "update-worker", f"NAME={A}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"worker {A}: updating from v0.0.1 to v0.0.2" in done.stdout
    fresh = copy_host(tmp_path / "fresh")
    copy_template(template_history, fresh, "v0.0.2", **A_ANSWERS, migration_stamp=stamp)
    for rel in (
        f"workers/{A}",
        f"deployment/docker/{A}.Dockerfile",
        "deployment/terraform/environments/staging/worker_shipment_notifier.tf",
        WORK,
        "om/migrations",
        "om/tests",
    ):
        ours, theirs = files_under(host, rel), files_under(fresh, rel)
        if rel == f"workers/{A}":
            key = answers_path(A)
            ours[key], theirs[key] = without_commit(ours[key]), without_commit(theirs[key])
        if rel == WORK:  # kinds.py holds B's kind in our host (a patcher fragment)
            ours.pop(KINDS), theirs.pop(KINDS)
            ours.pop(f"{WORK}/README.md"), theirs.pop(f"{WORK}/README.md")
        for key in [k for k in ours if "send_invoice" in k]:  # B's per-kind files
            ours.pop(key)
        assert ours.keys() == theirs.keys(), rel
        differ = [k for k in ours if ours[k] != theirs[k]]
        assert sorted(differ) == sorted(k for k in protected if k in ours), rel
    for rel, data in kept.items():
        assert (host / rel).read_bytes() == data, rel
        assert RELEASE_PROTECTED in (fresh / rel).read_text(), "a fresh copy has the change"
    assert recorded(host, A)["_commit"] == "v0.0.2"
    assert not (host / f"workers/{A}/README.md").exists(), "moved by the release"


def test_local_edits_survive_and_user_owned_files_are_never_touched(host: Path) -> None:
    """One update of A over two edits: a line added at the bottom of `main.py` (merged) and
    a reformatted `handler.py` (user-owned: neither it, its test nor the payload change)."""
    main = host / pkg(A) / "main.py"
    main.write_text(main.read_text() + "# local: keep me\n")
    handler = host / pkg(A) / "handler.py"
    handler.write_text(
        handler.read_text()
        .replace("payload = ", "payload = (  # mine\n    ")
        .replace("model_validate(item.payload)", "model_validate(item.payload)\n    )", 1)
    )
    commit_all(host, "local edits: main.py at the bottom, my handler")
    protected = (
        f"{pkg(A)}/handler.py",
        f"workers/{A}/tests/test_handler.py",
        f"{WORK}/types/payloads/notify_shipment.py",
    )
    before = {rel: (host / rel).read_bytes() for rel in protected}
    done = helper(host, "update", A)
    assert done.returncode == 0, done.stdout + done.stderr
    text = main.read_text()
    assert text.startswith(f'"""{RELEASE_LINE} ')
    assert text.endswith("# local: keep me\n")
    assert not any(m in text for m in MARKERS)
    for rel, data in before.items():
        assert (host / rel).read_bytes() == data, rel
        assert RELEASE_PROTECTED not in (host / rel).read_text()
        assert rel not in changed_paths(host)


def test_overlapping_edits_give_inline_markers_and_fail(host: Path) -> None:
    """Inline markers, no `.rej` even with `*.rej` gitignored, exit 2 from the helper. A
    plain `copier update` (which exits 0 on conflicts) names them in one line."""
    gitignore = host / ".gitignore"
    gitignore.write_text(gitignore.read_text() + "*.rej\n")
    main = host / pkg(A) / "main.py"
    lines = main.read_text().splitlines(keepends=True)
    lines[0] = '"""Our own first line.\n' if lines[0].strip() != '"""' else lines[0]
    main.write_text("".join(lines))
    commit_all(host, "local edit on the line the template changes")
    answers = f"workers/{A}/.copier-answers.yml"
    plain = cli(host, "update", "--trust", "--defaults", "-a", answers)
    assert plain.returncode == 0, plain.stderr
    said = [line for line in plain.stderr.splitlines() if line.startswith("worker-template:")]
    assert len(said) == 1 and f"{pkg(A)}/main.py (unmerged)" in said[0], plain.stderr
    assert "resolve the markers" in said[0]
    git(host, "reset", "-q", "--hard")
    git(host, "clean", "-qfd")
    done = make(host, "update-worker", f"NAME={A}")
    assert done.returncode != 0
    assert "conflict" in done.stderr and f"{pkg(A)}/main.py" in done.stderr
    assert "worker-template: the update left" not in done.stderr  # the helper's list only
    text = main.read_text()
    assert all(m in text for m in MARKERS)
    assert "Our own first line." in text and RELEASE_LINE in text
    assert [p for p in host.rglob("*.rej")] == []
    status = git(host, "status", "--porcelain")
    assert f"UU {pkg(A)}/main.py" in status


def count_fragments(host: Path) -> dict[str, int]:
    text = {
        rel: (host / rel).read_text()
        for rel in (
            "pyproject.toml",
            KINDS,
            "scripts/dev.sh",
            ".env.example",
            "Makefile",
            ".github/workflows/deploy-staging.yml",
            ".github/workflows/deploy-production.yml",
            ".github/workflows/ci.yml",
            "deployment/local/docker-compose.full.yml",
            f"{WORK}/README.md",
        )
    }
    return {
        "member A": text["pyproject.toml"].count(f'"workers/{A}"'),
        "member B": text["pyproject.toml"].count(f'"workers/{B}"'),
        "kind A": text[KINDS].count('NOTIFY_SHIPMENT = "NOTIFY_SHIPMENT"'),
        "kind B": text[KINDS].count('SEND_INVOICE = "SEND_INVOICE"'),
        "payload B": text[KINDS].count("WorkKind.SEND_INVOICE: SendInvoicePayload"),
        "dev A": text["scripts/dev.sh"].count(f"run {A} "),
        "env A": text[".env.example"].count(f"# --- worker {A} ---"),
        "env B": text[".env.example"].count(f"# --- worker {B} ---"),
        "make block": text["Makefile"].count(lifecycle.MAKE_START),
        "ci job": text[".github/workflows/ci.yml"].count(f"{lifecycle.CI_JOB}:"),
        "staging B": len(re.findall(rf"\b{B}\b", text[".github/workflows/deploy-staging.yml"])),
        "production A": len(
            re.findall(rf"\b{A}\b", text[".github/workflows/deploy-production.yml"])
        ),
        "compose B": text["deployment/local/docker-compose.full.yml"].count(f"  {B}:\n"),
        "readme B": text[f"{WORK}/README.md"].count(f"`{B}` worker"),
    }


def test_updates_in_turn_reach_only_their_worker_and_the_owner_hands_the_namespace_on(
    host: Path,
) -> None:
    """The life of a two-worker host, one update per step (each costs a copier run):

    - B's update never reaches A or the namespace; A (its owner) then brings the namespace
      change and leaves B alone; the owner cannot be removed while B is at another version;
    - two more updates of each (`--ref HEAD`) leave every fragment single, and A's
      migration stamp and the migration files as they were;
    - removing the owner hands the namespace (and its stamp) to B, says what finds A's items,
      and the last worker cannot be removed.
    """
    assert set(count_fragments(host).values()) == {1}
    stamp = recorded(host, A)["migration_stamp"]
    migrations = sorted(
        str(p.relative_to(host)) for p in (host / "om/migrations").rglob("*") if p.is_file()
    )
    assert any(stamp in f for f in migrations)
    a_before = files_under(host, f"workers/{A}")
    assert helper(host, "update", B).returncode == 0
    assert not [p for p in changed_paths(host) if p.startswith(f"workers/{A}")]
    assert files_under(host, f"workers/{A}") == a_before
    assert RELEASE_KINDS not in (host / WORK_ITEM).read_text(), "B does not own the namespace"
    assert recorded(host, A)["_commit"] == "v0.0.1"
    commit_all(host, "update B")
    refused = helper(host, "remove", A)
    assert refused.returncode == 1 and "same template version" in refused.stderr, refused.stderr
    b_files = files_under(host, f"workers/{B}")
    assert helper(host, "update", A).returncode == 0
    assert RELEASE_KINDS in (host / WORK_ITEM).read_text()
    assert not [p for p in changed_paths(host) if p.startswith(f"workers/{B}")]
    assert files_under(host, f"workers/{B}") == b_files
    commit_all(host, "update A")
    for name in (B, A):
        done = helper(host, "update", name, "--ref", "HEAD")
        assert done.returncode == 0, done.stdout + done.stderr
        commit_all(host, f"update {name} again")
    assert set(count_fragments(host).values()) == {1}, count_fragments(host)
    assert recorded(host, A)["migration_stamp"] == stamp
    after = sorted(
        str(p.relative_to(host)) for p in (host / "om/migrations").rglob("*") if p.is_file()
    )
    assert after == migrations
    done = helper(host, "remove", A)
    assert done.returncode == 0, done.stdout + done.stderr
    heir = recorded(host, B)
    assert heir["namespace_absent"] is True and heir["migration_stamp"] == stamp
    assert "NOTIFY_SHIPMENT" not in (host / KINDS).read_text()
    assert (  # its items are left in the database, and the helper says what finds them
        "==> items of NOTIFY_SHIPMENT still in a database stay there, stranded: the other "
        f"workers' `serve` names them; `uv run --all-packages {B} items list --any-kind`"
    ) in done.stdout
    commit_all(host, "remove A")
    single = helper(host, "remove", B)
    assert single.returncode == 1 and "last worker" in single.stderr


def test_tasks_do_nothing_in_copiers_replays(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep copier's temporary old/new copies: they hold rendered files and nothing patched."""
    import copier._main as copier_main

    kept: list[Path] = []
    real = copier_main.TemporaryDirectory

    class Keep(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            kept.append(Path(self.name))
            self._finalizer.detach()  # type: ignore[attr-defined]

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(copier_main, "TemporaryDirectory", Keep)
    monkeypatch.chdir(host)
    copier.run_update(
        str(host),
        answers_file=answers_path(A),
        unsafe=True,
        defaults=True,
        overwrite=True,
        quiet=True,
    )
    replays = [
        p for p in kept if p.name.startswith(("copier._main.old_copy.", "copier._main.new_copy."))
    ]
    assert len(replays) == 2
    try:
        for replay in replays:
            assert not (replay / "scripts").exists(), "the patcher ran in a replay"
            assert not (replay / "Makefile").exists() and not (replay / "pyproject.toml").exists()
            assert (replay / answers_path(A)).is_file()
        # the patcher and the move migration, run by hand in a replay-like folder, do nothing
        bare = host.parent / "copier._main.new_copy.x"
        shutil.copytree(host, bare, symlinks=True)
        before = files_under(bare, ".")
        assert (
            patcher.main(
                ["--operation", "update", "--answers-file", answers_path(B), "--host", str(bare)]
            )
            == 0
        )
        assert lifecycle.move(
            bare, answers_path(A), "workers/{worker_name}/README.md", "x.md", ""
        ).startswith("skipped")
        assert files_under(bare, ".") == before
    finally:
        for replay in kept:
            shutil.rmtree(replay, ignore_errors=True)


def test_deleted_worker_file_stays_deleted_and_restores(host: Path, template_history: Path) -> None:
    main = host / pkg(A) / "main.py"
    main.unlink()
    commit_all(host, "I do not want main.py")
    assert helper(host, "update", A).returncode == 0
    assert not main.exists(), "copier must not bring back a file the user deleted"
    commit_all(host, "update")
    done = make(host, "restore-worker-file", f"NAME={A}", f"FILE={pkg(A)}/main.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert main.read_text().startswith(f'"""{RELEASE_LINE} '), "rendered at the recorded v0.0.2"
    docs = (REPO / "docs/updating.md").read_text()
    assert "make restore-worker-file NAME=" in docs


def test_an_old_relative_template_path_is_resolved_from_the_host_root_or_refused(
    host: Path, template_history: Path
) -> None:
    """Issue 29, item 12: answers recorded before copies made `_src_path` absolute may hold a
    relative path; the helper reads it from the host root, where copier runs, and the update
    records it absolute. One that names no folder there is refused in one line."""
    answers = host / answers_path(A)
    text = answers.read_text()
    answers.write_text(text.replace(str(template_history), "../nowhere/worker-template"))
    commit_all(host, "a relative record that leads nowhere")
    done = helper(host, "update", A)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == (
        f"workers.py: {answers_path(A)} records the template as ../nowhere/worker-template, a "
        f"relative path that names no folder from the host root {host}; write the template's "
        "absolute path (or URL) on its `_src_path:` line, commit, and run again"
    )
    relative = os.path.relpath(template_history, host)
    answers.write_text(text.replace(str(template_history), relative))
    commit_all(host, "a relative record")
    assert f"{A}: v0.0.1 -> v0.0.2 (behind" in helper(host, "check-update").stdout
    done = helper(host, "update", A)
    assert done.returncode == 0, done.stdout + done.stderr
    assert recorded(host, A)["_src_path"] == str(template_history)


def test_restore_of_a_shared_file_puts_back_every_workers_fragments(host: Path) -> None:
    """Issue 29, item 10: `work/README.md` is rendered by the namespace owner and holds every
    worker's kind line; restored from the owner's rendering, it keeps B's line too."""
    readme = host / WORK / "README.md"
    kept = readme.read_text()
    assert "`SEND_INVOICE`, handled by the `invoice-mailer` worker" in kept
    readme.unlink()
    commit_all(host, "README gone")

    done = helper(host, "restore", B, f"{WORK}/README.md")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == (
        f"workers.py: {B} does not render {WORK}/README.md; the `work` namespace's files are "
        f"rendered by the worker that owns it: make restore-worker-file NAME={A} "
        f"FILE={WORK}/README.md"
    )
    assert not readme.exists()
    done = helper(host, "restore", B, "nope.txt")  # no worker renders it: no owner to name
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == f"workers.py: the template does not render nope.txt for {B}"

    done = helper(host, "restore", A, f"{WORK}/README.md")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"rebuilt  {WORK}/README.md: every worker's fragments put back" in done.stdout
    assert readme.read_text() == kept

    readme.write_text(kept + "my notes\n")
    done = helper(host, "restore", A, f"{WORK}/README.md", "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"overwrote {WORK}/README.md: your version was replaced" in done.stdout
    assert readme.read_text() == kept


def test_an_update_that_overwrites_an_edited_helper_or_make_block_says_so(host: Path) -> None:
    """Issue 29, item 10: scripts/workers.py and the Makefile block are the template's and
    every update rewrites them; an edit of either is named as overwritten, and an unedited
    one (the recorded version's text) is not."""
    done = helper(host, "update", A)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "overwrote" not in done.stdout + done.stderr
    commit_all(host, "update A")
    script, makefile = host / "scripts/workers.py", host / "Makefile"
    script.write_text(script.read_text() + "# my tweak\n")
    text = makefile.read_text()
    makefile.write_text(
        text.replace(lifecycle.MAKE_END, f"my-target:\n\techo hi\n{lifecycle.MAKE_END}")
    )
    commit_all(host, "my edits")

    done = helper(host, "update", B)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "overwrote scripts/workers.py: your edits were replaced" in done.stderr
    assert "overwrote Makefile: your edits in the `# >>> worker-template` block" in done.stderr
    assert "# my tweak" not in script.read_text()
    assert "my-target:" not in makefile.read_text()


def test_a_moved_file_keeps_the_users_edit(host: Path) -> None:
    """The release moves README.md to docs/README.md; the `_migrations` step carries the edit."""
    readme = host / f"workers/{A}/README.md"
    readme.write_text(readme.read_text() + "\n## Our runbook\n\nPage the on-call.\n")
    commit_all(host, "our README section")
    done = helper(host, "update", A)
    assert done.returncode == 0, done.stdout + done.stderr
    moved = host / f"workers/{A}/docs/README.md"
    assert not readme.exists()
    assert moved.read_text().endswith("## Our runbook\n\nPage the on-call.\n")
    assert moved.read_text().startswith(f"# {A}\n")
    assert (
        "moved workers/shipment-notifier/README.md -> workers/shipment-notifier/docs/README.md"
        in done.stdout
    )


def test_owner_updates_next_to_workkind_with_a_second_kind(host: Path) -> None:
    """The namespace owner crosses the change near `WorkKind` while B's kind is in the host."""
    kinds_before = (host / KINDS).read_text()
    assert 'SEND_INVOICE = "SEND_INVOICE"' in kinds_before
    done = helper(host, "update", A)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (host / WORK_ITEM).read_text()
    assert f"{RELEASE_KINDS}\nfrom .kinds import" in text
    assert not any(m in text for m in MARKERS)
    assert (host / KINDS).read_text() == kinds_before
    assert not [p for p in changed_paths(host) if p.endswith(".rej")]


# --- refs: -r HEAD copies and untagged templates ------------------------------------------------


def test_head_copy_is_updated_without_a_downgrade(template_history: Path, tmp_path: Path) -> None:
    """A copy from a commit past the newest tag: plain `copier update` refuses, the helper not."""
    template = tmp_path / "tpl"
    git(tmp_path, "clone", "-q", str(template_history), str(template))
    readme = template / "README.md"
    readme.write_text(readme.read_text() + "\nunreleased\n")
    commit_all(template, "unreleased work")
    host = copy_host(tmp_path / "host")
    copy_template(template, host, "HEAD", **A_ANSWERS)
    commit_all(host, "A from HEAD")
    assert re.fullmatch(r"v0\.0\.2-1-g[0-9a-f]+", recorded(host, A)["_commit"])
    with pytest.raises(UserMessageError, match="downgrading"):
        copier.run_update(
            str(host),
            answers_file=answers_path(A),
            unsafe=True,
            defaults=True,
            overwrite=True,
            quiet=True,
        )
    assert tree_state(host) == ""
    done = helper(host, "update", A)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "to HEAD" in done.stdout
    assert "up to date" in helper(host, "check-update").stdout


def test_untagged_template_copy_is_updatable(template_history: Path, tmp_path: Path) -> None:
    template = tmp_path / "tpl"
    git(tmp_path, "clone", "-q", str(template_history), str(template))
    for tag in ("v0.0.1", "v0.0.2"):
        git(template, "tag", "-d", tag)
    git(template, "reset", "-q", "--hard", "HEAD~1")
    host = copy_host(tmp_path / "host")
    copy_template(template, host, "HEAD", **A_ANSWERS)
    commit_all(host, "A from an untagged template")
    assert re.fullmatch(r"[0-9a-f]{7,}", recorded(host, A)["_commit"])
    git(template, "merge", "-q", "--ff-only", "origin/main")
    done = helper(host, "update", A)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (host / pkg(A) / "main.py").read_text().startswith(f'"""{RELEASE_LINE} ')


# --- update-workers -----------------------------------------------------------------------------


def test_update_workers_starts_with_the_namespace_owner(host: Path) -> None:
    """A (`shipment-notifier`, the namespace owner) goes before B (`invoice-mailer`), though
    B sorts first by name: every other worker calls the namespace's code."""
    assert recorded(host, A)["namespace_absent"] is True
    assert recorded(host, A)["metrics_port"] < recorded(host, B)["metrics_port"]
    done = make(host, "update-workers")
    assert done.returncode != 0
    assert f"stopped after {A}: copier needs a clean tree for the next worker ({B})" in (
        done.stdout
    ), done.stdout
    assert f"worker {A}: updating from v0.0.1 to v0.0.2" in done.stdout
    assert f"worker {B}: updating" not in done.stdout
    assert recorded(host, A)["_commit"] == "v0.0.2" and recorded(host, B)["_commit"] == "v0.0.1"
    git(host, "checkout", "-q", ".")
    git(host, "clean", "-qfd")
    done = make(host, "update-workers", "COMMIT=1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert tree_state(host) == ""
    log = git(host, "log", "--format=%s", "-2").splitlines()
    assert log == [f"Update worker {B} to template v0.0.2", f"Update worker {A} to template v0.0.2"]


def test_update_order_is_owner_then_copy_order_then_name(tmp_path: Path) -> None:
    """`update_order` reads only the answers: the owner, then `metrics_port`, then name."""
    host_workers = load_extension("host_workers")
    workers = {
        "alpha": "namespace_absent: false\nmetrics_port: 9103\n",
        "beta": "namespace_absent: false\nmetrics_port: 9101\n",
        "zulu-owner": "namespace_absent: true\nmetrics_port: 9102\n",
        "delta": "namespace_absent: false\n",
        "charlie": "metrics_port: 'x'\n",
        "echo": "namespace_absent: false\nmetrics_port: 9104\n",
    }
    for name, text in workers.items():
        answers = tmp_path / "workers" / name / ".copier-answers.yml"
        answers.parent.mkdir(parents=True)
        answers.write_text(f"_commit: v0.0.1\nworker_name: {name}\n{text}")
    order = host_workers.update_order(tmp_path)
    assert order == ["zulu-owner", "beta", "alpha", "echo", "charlie", "delta"]
    assert host_workers.all_workers(tmp_path)[0] == "alpha", "not by name any more"


def test_helper_refuses_a_dirty_tree_and_an_unknown_worker(host: Path) -> None:
    (host / "notes.txt").write_text("untracked\n")
    done = helper(host, "update", A)
    assert done.returncode == 1 and "notes.txt" in done.stderr
    (host / "notes.txt").unlink()
    done = helper(host, "update", "nope")
    assert done.returncode == 1 and A in done.stderr


def test_helper_without_copier_on_path_refuses_in_one_line_naming_copier(host: Path) -> None:
    """`make update-worker` where copier lives only in a virtualenv (as `make setup` puts the
    template's): one line naming COPIER, not a `FileNotFoundError` traceback."""
    done = helper(host, "update", A, env={"COPIER": "copier-not-installed"})
    assert done.returncode == 1, done.stdout + done.stderr
    refusal = (
        "workers.py: no copier command 'copier-not-installed' on PATH: install copier, or set "
        "COPIER to its path (for example COPIER=<template>/.venv/bin/copier)"
    )
    assert done.stderr.splitlines() == [refusal]
    assert "updating" not in done.stdout
    assert tree_state(host) == ""


def test_an_update_to_a_ref_the_template_lacks_is_one_line(
    host: Path, template_history: Path
) -> None:
    """`make update-worker NAME=x REF=<typo>` (the helper's `--ref`): one line naming the ref
    and the newest tags, copier never started, nothing changed (copier's own git error was
    a traceback)."""
    before = git(host, "rev-parse", "HEAD")
    for ref in ("v9.9.9", "deadbeef"):  # a tag, and a commit hash, the template lacks
        line = one_line(helper(host, "update", A, "--ref", ref))
        assert f"--ref {ref}:" in line and "v0.0.2" in line, line
        assert tree_state(host) == "" and git(host, "rev-parse", "HEAD") == before
    # What the template has still goes through: its own version (docs/updating.md) and a
    # commit of it named by hash.
    for ref in (":current:", git(template_history, "rev-parse", "--short", "v0.0.2").strip()):
        done = helper(host, "update", B, "--ref", ref)
        assert done.returncode == 0, done.stdout + done.stderr


# --- remove and rename --------------------------------------------------------------------------

FRAGMENT_FILES = (
    "pyproject.toml",
    KINDS,
    "scripts/dev.sh",
    ".env.example",
    ".github/workflows/deploy-staging.yml",
    ".github/workflows/deploy-production.yml",
    "deployment/local/docker-compose.full.yml",
    f"{WORK}/README.md",
)


def test_remove_worker_reverses_its_fragments(host: Path, base: Base) -> None:
    done = make(host, "remove-worker", f"NAME={B}")
    assert done.returncode == 0, done.stdout + done.stderr
    diff = git(host, "diff", base.a_commit, "--", *FRAGMENT_FILES)
    assert diff == "", diff
    for gone in (
        f"workers/{B}",
        f"deployment/docker/{B}.Dockerfile",
        "deployment/terraform/environments/staging/worker_invoice_mailer.tf",
        f"{WORK}/types/payloads/send_invoice.py",
    ):
        assert not (host / gone).exists(), gone
    assert (host / f"workers/{A}").is_dir()
    left = [str(p.relative_to(host)) for p in host.rglob("*send_invoice*") if ".git" not in p.parts]
    assert left == [], "every per-kind file of B goes"


def test_rename_worker_moves_answers_and_keeps_edits(host: Path) -> None:
    handler = host / pkg(B) / "handler.py"
    handler.write_text(handler.read_text() + "# our handler note\n")
    commit_all(host, "edit B's handler")
    port = re.search(
        r"(?m)^INVOICE_MAILER_METRICS_PORT=(\d+)$", (host / ".env.example").read_text()
    )
    assert port
    done = make(host, "rename-worker", f"NAME={B}", "TO=invoice-sender")
    assert done.returncode == 0, done.stdout + done.stderr
    new = "invoice-sender"
    assert not (host / f"workers/{B}").exists()
    answers = recorded(host, new)
    assert answers["worker_name"] == new and answers["_commit"] == "v0.0.1"
    moved = (host / pkg(new) / "handler.py").read_text()
    assert moved.endswith("# our handler note\n")
    stale = [  # the distribution and image name `acme-<worker>` follows the rename too
        str(p.relative_to(host))
        for p in [
            *(host / f"workers/{new}").rglob("*"),
            host / f"deployment/docker/{new}.Dockerfile",
        ]
        if p.is_file() and f"acme-{B}" in p.read_text(errors="replace")
    ]
    assert stale == []
    for env in ("staging", "production"):  # the Terraform module instance follows too
        terraform = host / f"deployment/terraform/environments/{env}/worker_invoice_sender.tf"
        assert 'module "worker_invoice_sender" {' in terraform.read_text()
        assert "worker_invoice_mailer" not in terraform.read_text()
    counts = {rel: (host / rel).read_text() for rel in FRAGMENT_FILES}
    assert all(not re.search(rf"\b{B}\b|INVOICE_MAILER_", t) for t in counts.values()), [
        r for r, t in counts.items() if re.search(rf"\b{B}\b|INVOICE_MAILER_", t)
    ]
    assert counts[".env.example"].count(f"# --- worker {new} ---") == 1
    assert f"INVOICE_SENDER_METRICS_PORT={port.group(1)}\n" in counts[".env.example"]
    assert counts["pyproject.toml"].count(f'"workers/{new}"') == 1
    assert counts[KINDS].count('SEND_INVOICE = "SEND_INVOICE"') == 1
    commit_all(host, "rename")
    done = helper(host, "update", new)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (host / pkg(new) / "handler.py").read_text().endswith("# our handler note\n")


def test_renaming_the_namespace_owner_beside_another_worker_settles_the_kinds_list(
    host: Path,
) -> None:
    """The owner renders `work/README.md`, B added its line between the kind markers:
    renaming the owner changed its own line next to B's, which copier's merge left as a
    conflict (`UU`). The patcher writes the region from the workers' answers instead."""
    new = "shipment-sender"
    done = make(host, "rename-worker", f"NAME={A}", f"TO={new}")
    assert done.returncode == 0, done.stdout + done.stderr
    readme = (host / f"{WORK}/README.md").read_text()
    kinds = readme.split("<!-- >>> kinds -->\n", 1)[1].split("<!-- <<< kinds -->", 1)[0]
    assert kinds == (
        f"- `NOTIFY_SHIPMENT`, handled by the `{new}` worker\n"
        f"- `SEND_INVOICE`, handled by the `{B}` worker\n"
    )
    state = tree_state(host)
    assert f" M {WORK}/README.md" in state.splitlines(), state
    assert not any(line.startswith("UU") for line in state.splitlines()), state
    assert "<<<<<<<" not in readme


# --- refusals before rendering ------------------------------------------------------------------


def test_a_host_without_a_makefile_is_refused(template_history: Path, tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host")
    (host / "Makefile").unlink()
    commit_all(host, "no Makefile")
    spec = patcher.Spec(
        worker_name=A,
        work_kind="NOTIFY_SHIPMENT",
        lane="default",
        host_root="acme",
        namespace_absent=True,
    )
    assert "Makefile: the file does not exist" in patcher.check_host(host, spec)
    with pytest.raises(UserMessageError, match="Makefile: the file does not exist"):
        copy_template(template_history, host, "v0.0.2", **A_ANSWERS)
    assert tree_state(host) == ""


def test_foreign_targets_and_helper_are_refused(tmp_path: Path) -> None:
    host = copy_host(tmp_path / "host")
    spec = patcher.Spec(
        worker_name=A,
        work_kind="NOTIFY_SHIPMENT",
        lane="default",
        host_root="acme",
        namespace_absent=True,
    )
    makefile = host / "Makefile"
    makefile.write_text(makefile.read_text() + "\ncheck-update:\n\techo mine\n")
    (host / "scripts/workers.py").write_text("print('mine')\n")
    ci = host / ".github/workflows/ci.yml"
    ci.write_text("name: ci\non: push\n")
    problems = patcher.check_host(host, spec)
    assert any(p.startswith("Makefile: defines check-update itself") for p in problems), problems
    assert "scripts/workers.py: exists and is not the worker template's helper" in problems
    assert ".github/workflows/ci.yml: no `jobs` mapping" in problems


def test_makefile_fragment_is_idempotent_and_refreshes_its_block() -> None:
    text = "all:\n\techo hi\n"
    once = lifecycle.edit_makefile(text)
    assert lifecycle.edit_makefile(once) == once
    stale = once.replace("check-update:  ##", "check-update:  ## old wording")
    assert lifecycle.edit_makefile(stale) == once
    ci = (REFERENCE_HOST / ".github/workflows/ci.yml").read_text()
    with_job = lifecycle.edit_ci(ci)
    assert lifecycle.edit_ci(with_job) == with_job
    assert with_job.startswith(ci.split("\njobs:")[0])


# --- acceptance: the worker's own tests after an update -----------------------------------------


@pytest.mark.slow
def test_updated_worker_passes_its_own_tests(host: Path, uv_env: dict[str, str]) -> None:
    """Issue 6's acceptance: a worker rendered at the previous tag, with a local handler
    change, updates to HEAD with no conflict, keeps the change, and its tests pass."""
    handler = host / pkg(A) / "handler.py"
    local = "\n\n\nLOCAL_CHANGE = 'kept across updates'\n"
    handler.write_text(handler.read_text().rstrip("\n") + local)
    commit_all(host, "a local change to the handler")
    done = helper(host, "update", A)
    assert done.returncode == 0, done.stdout + done.stderr
    assert handler.read_text().endswith(local)
    synced = uv_sync(host, uv_env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    host_gate(host, uv_env, "uv", "run", "--all-packages", "pytest", "-q", f"workers/{A}/tests")


@pytest.mark.parametrize(
    ("ref", "parsed"),
    [("v0.1.0", (0, 1, 0)), ("1.2", (1, 2)), ("1772851", None), ("50233e1", None), ("v1", None)],
)
def test_only_a_dotted_version_is_a_release_tag_never_an_all_digit_short_hash(
    ref: str, parsed: tuple[int, ...] | None
) -> None:
    """A worker recorded at commit `1772851` is not at "release 1772851" (check-update would
    then report it behind forever)."""
    assert load_extension("host_workers").version(ref) == parsed


def test_a_worker_at_the_commit_a_tag_names_is_not_behind_it() -> None:
    """Copied from a bare commit that a release tag later named: `check-update` says up to
    date (updating would change only `_commit`); another commit is behind."""
    helper_module = load_extension("host_workers")
    sha = "8c730dc0f1e2d3c4b5a6978877665544332211ff"
    refs = {"HEAD": sha, "refs/tags/v1.0.0": sha}
    assert helper_module.target_ref("8c730dc", refs) == "v1.0.0"
    assert not helper_module.is_behind("8c730dc", "v1.0.0", refs)
    assert not helper_module.is_behind("v1.0.0", "v1.0.0", refs)
    assert helper_module.is_behind("1234567", "v1.0.0", refs)
    assert helper_module.is_behind("v0.9.0", "v1.0.0", refs)
