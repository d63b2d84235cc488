"""Output that survives formatters (issue 29, item 8; docs/updating.md, "Formatters").

- `md_table` lays a table out exactly as prettier 3 does (prettier run on the same table).
- A fresh render (two workers, one with a container) writes no markdown or YAML that
  prettier would change: the files prettier flags afterwards are the host's own.
- A host rendered at the 0.1.0 release, run through prettier (`prettier --write "**/*.md"
  "workers/*/.copier-answers.yml"`, a common pre-commit hook) and committed, updates to a
  release that adds a row to the worker README's table: no conflict, the row merged, and
  the markdown and answers files as prettier leaves them.
- The patcher adds a kind to a kinds list a formatter spaced out with blank lines, and
  writes an image matrix too long for one prettier line one entry a line; `remove-worker`
  finds its image in a matrix prettier wrapped over lines.

Prettier is the repository's own (package.json, package-lock.json; `make setup` runs
`npm ci`): without it these tests fail, naming the fix, and never skip.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    REPO,
    WORKER_TPL,
    cli,
    commit_all,
    copy_host,
    copy_template,
    git,
    load_extension,
    release_history,
    tree_state,
)

PRETTIER = REPO / "node_modules" / ".bin" / "prettier"
A = {"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"}
B = {"worker_name": "invoice-mailer", "work_kind": "SEND_INVOICE", "container": True}
HOOK_GLOBS = ("**/*.md", "workers/*/.copier-answers.yml")
ALL_GLOBS = (*HOOK_GLOBS, "**/*.yml", "**/*.yaml")
LAST_ROW = "| `deployment/docker/{{ worker_name }}.Dockerfile` | the image |"
NEW_ROW = "| `docs/runbook.md` | what to do when its alarms fire (template v0.2.0) |"


@pytest.fixture(scope="session")
def prettier() -> Path:
    if not PRETTIER.is_file():
        pytest.fail(
            f"{PRETTIER.relative_to(REPO)} is missing: run `make setup` (it runs `npm ci`; "
            "Node.js 20+ with npm is a prerequisite, README.md)",
            pytrace=False,
        )
    return PRETTIER


def run_prettier(prettier: Path, cwd: Path, *args: str) -> list[str]:
    """`prettier <args>` in `cwd`; the paths it lists (`--list-different`), sorted."""
    done = subprocess.run(
        [str(prettier), "--no-error-on-unmatched-pattern", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode in (0, 1) and not done.stderr.strip(), done.stdout + done.stderr
    return sorted(line for line in done.stdout.splitlines() if line.strip())


def test_md_table_lays_a_table_out_as_prettier_does(prettier: Path, tmp_path: Path) -> None:
    formatting = load_extension("formatting")
    table = (
        "Before.\n\n"
        "| Left | Centre | Right | Plain |\n"
        "|:---|:---:|---:|---|\n"
        "| `a \\| b` | x | 12345678 | short row |\n"
        "| 名前 | a longer centred cell | 1 |\n"
        "| e | f | g | h |\n\n"
        "After.\n"
    )
    ours = formatting.md_table(table)
    theirs = tmp_path / "table.md"
    theirs.write_text(table, encoding="utf-8")
    run_prettier(prettier, tmp_path, "--write", "table.md")
    assert ours == theirs.read_text(encoding="utf-8")
    assert formatting.md_table(ours) == ours
    unpadded = "| Where | What |\n|---|---|\n| `handler.py` | the work \\| yours |\n| x | y |\n"
    assert formatting.compact_tables(formatting.md_table(unpadded)) == unpadded


def test_a_fresh_render_writes_nothing_prettier_would_change(
    prettier: Path, make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host()
    the_hosts_own = run_prettier(prettier, host, "--list-different", *ALL_GLOBS)
    for answers in (A, B):
        render(host, **answers)
        commit_all(host, f"add {answers['worker_name']}")
    assert (host / "workers/invoice-mailer/README.md").is_file()
    flagged = run_prettier(prettier, host, "--list-different", *ALL_GLOBS)
    assert [path for path in flagged if path not in the_hosts_own] == []


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v0.1.0 (the 0.1.0 release, unpadded tables), then the working tree with one more
    row in the worker README's table, as v0.2.0."""
    repo = release_history(tmp_path_factory.mktemp("formatter-releases") / "worker-template")
    readme = repo / WORKER_TPL / "README.md.jinja"
    text = readme.read_text(encoding="utf-8")
    assert text.count(LAST_ROW) == 1
    readme.write_text(text.replace(LAST_ROW, f"{LAST_ROW}\n{NEW_ROW}"), encoding="utf-8")
    commit_all(repo, "a row in the worker README's table")
    git(repo, "tag", "-f", "v0.2.0")
    return repo


@pytest.mark.slow
def test_an_update_after_prettier_merges_a_new_table_row_without_conflict(
    prettier: Path, releases: Path, tmp_path: Path
) -> None:
    host = copy_host(tmp_path / "host")
    for answers in (A, B):
        copy_template(releases, host, "v0.1.0", **answers)
        commit_all(host, f"add {answers['worker_name']}")
    run_prettier(prettier, host, "--write", *HOOK_GLOBS)
    assert "workers/shipment-notifier/README.md" in tree_state(host)  # prettier aligned it
    commit_all(host, "prettier")

    for answers in (A, B):  # the namespace owner first
        name = answers["worker_name"]
        done = cli(
            host, "update", "--trust", "--defaults", "--vcs-ref", "v0.2.0",
            "-a", f"workers/{name}/.copier-answers.yml",
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        marked = subprocess.run(
            ["git", "grep", "-l", "-E", "^(<<<<<<<|>>>>>>>) "], cwd=host, capture_output=True,
            text=True, check=False,
        )  # fmt: skip
        assert marked.stdout == "", f"conflicts after updating {name}: {marked.stdout}"
        state = tree_state(host).splitlines()
        assert not [line for line in state if line.endswith(".rej")]
        assert f" M workers/{name}/README.md" in state, state  # merged, nothing left staged
        commit_all(host, f"update {name}")

    row = re.compile(r"^\| `docs/runbook\.md` +\| what to do when its alarms fire", re.MULTILINE)
    for answers in (A, B):
        readme = (host / f"workers/{answers['worker_name']}/README.md").read_text()
        assert row.search(readme), readme
    assert run_prettier(prettier, host, "--list-different", *HOOK_GLOBS) == []


def test_the_patcher_adds_a_kind_to_a_list_a_formatter_spaced_out() -> None:
    patcher = load_extension("patcher")
    spaced = (
        "## Kinds\n\n<!-- >>> kinds -->\n\n"
        "- `NOTIFY_SHIPMENT`, handled by the `shipment-notifier` worker\n\n"
        "<!-- <<< kinds -->\n"
    )
    spec = patcher.Spec.from_answers({**B, "host_root": "acme"})
    edited = patcher.edit_work_readme(spaced, spec, 88)
    assert edited == spaced.replace(
        "worker\n\n", "worker\n- `SEND_INVOICE`, handled by the `invoice-mailer` worker\n\n"
    )
    assert patcher.edit_work_readme(edited, spec, 88) == edited


def test_an_image_list_past_prettiers_width_is_written_one_entry_a_line(
    prettier: Path, tmp_path: Path
) -> None:
    deploy = load_extension("deploy")
    workflow = tmp_path / "deploy-staging.yml"
    workflow.write_text(
        "jobs:\n  build:\n    strategy:\n      matrix:\n"
        "        image: [api, shipment-notifier, invoice-mailer, a-long-third-worker-name]\n"
        "    steps:\n"
        '      - run: docker build -f "deployment/docker/${{ matrix.image }}.Dockerfile" .\n',
        encoding="utf-8",
    )
    run_prettier(prettier, tmp_path, "--write", workflow.name)  # wraps the list
    added = deploy.add_image(
        workflow.read_text(encoding="utf-8"), "fourth-worker", workflow.name, builds=True
    )
    workflow.write_text(added, encoding="utf-8")
    assert run_prettier(prettier, tmp_path, "--list-different", workflow.name) == []
    assert "          - fourth-worker\n" in added


def test_remove_worker_finds_its_image_in_a_list_prettier_wrapped(
    prettier: Path, tmp_path: Path
) -> None:
    host_workers = load_extension("host_workers")
    workflow = tmp_path / "deploy-production.yml"
    names = ["api", "shipment-notifier", "invoice-mailer", "a-third-worker-with-a-long-name"]
    workflow.write_text(
        f"jobs:\n  deploy:\n    strategy:\n      matrix:\n        image: [{', '.join(names)}]\n",
        encoding="utf-8",
    )
    run_prettier(prettier, tmp_path, "--write", workflow.name)
    assert "invoice-mailer,\n" in workflow.read_text(encoding="utf-8")  # one entry a line
    dropped = host_workers.drop_image(workflow.read_text(encoding="utf-8"), "invoice-mailer")
    assert "invoice-mailer" not in dropped
    assert "shipment-notifier" in dropped and "a-third-worker-with-a-long-name" in dropped
    workflow.write_text(dropped, encoding="utf-8")
    assert run_prettier(prettier, tmp_path, "--list-different", workflow.name) == []


def test_this_repositorys_own_markdown_is_as_prettier_leaves_it(prettier: Path) -> None:
    """The README, the changelog and docs/ (the ADRs included) in prettier's layout, as the
    markdown the template renders is (docs/decisions/0027)."""
    patterns = ("README.md", "CHANGELOG.md", "engine/README.md", "docs/**/*.md")
    assert run_prettier(prettier, REPO, "--list-different", *patterns) == []


DASHBOARD = REPO / "engine/services/api/src/acme/services/api/work/dashboard"


def test_the_dashboards_html_js_and_css_are_as_prettier_leaves_them(prettier: Path) -> None:
    """The work dashboard's static files (docs/decisions/0045), checked where they live."""
    assert sorted(p.name for p in DASHBOARD.iterdir()) == ["app.css", "app.js", "index.html"]
    assert run_prettier(prettier, DASHBOARD, "--list-different", "*.html", "*.js", "*.css") == []
