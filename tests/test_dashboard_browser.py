"""The work dashboard in a real browser: Debian's headless Chromium driven by Selenium, over
a rendered host's own API (`acme-api serve`) and worker, on the embedded SQLite database.

Open the page, enqueue through the API and see the counts change, cancel one of those items
from the page, pause and resume the lane as a platform operator (a member sees the pause
and no buttons), replay a dead letter from the page and see it complete, then see the
worker that completed it alive on the roster; a `<script>` in its payload stays text. A missing browser fails the test, naming the install line
(`.ci/run` installs it); it never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import uv_sync
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait
from work_network import free_port

pytestmark = pytest.mark.slow

INSTALL = "apt-get install -y chromium chromium-driver (.ci/run does it)"
MARK = "<script>window.pwned = 1</script>"
SEED = f"""
import asyncio, json, sys
from uuid import uuid4
from acme.om.context import AppContext, AppType, RequestContext, Role
from acme.om.types import EMPTY_UUID
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.work.types.work_item import WorkItem, WorkKind, WorkStatus
from acme.services.api.container import ServiceContainer
from acme.services.api.settings import ApiSettings

async def main() -> None:
    container = ServiceContainer.build(ApiSettings())
    rctx = RequestContext.new(AppContext(type=AppType.SERVICE, version="seed@0"))
    org = (await container.managers.tenancy.create_org(rctx, "browser")).id
    admin, member = uuid4(), uuid4()
    tenancy = container.managers.tenancy
    await tenancy.grant_membership(rctx, org_id=org, user_id=admin, role=Role.ADMIN)
    await tenancy.grant_membership(rctx, org_id=org, user_id=member, role=Role.MEMBER)
    # The admin is a platform operator too: the lanes' buttons are theirs.
    await tenancy.grant_membership(rctx, org_id=EMPTY_UUID, user_id=admin, role=Role.ADMIN)
    item = WorkItem.new(
        org_id=org, kind=WorkKind.NOTIFY_SHIPMENT,
        payload={{"record_id": str(uuid4()), "note": {MARK!r}}},
    ).model_copy(update={{"status": WorkStatus.FAILED, "attempts": 5,
                          "last_error": "RuntimeError: the carrier did not answer"}})
    assert container.funnel is not None
    await SqlStorageRoot(container.funnel).get_work_storage().create_item(org, item)
    await container.aclose()
    print(json.dumps({{"org": str(org), "admin": str(admin), "member": str(member),
                      "dead": str(item.id)}}))

asyncio.run(main())
"""


def _driver_paths() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        missing = "chromium" if chromium is None else "chromedriver"
        pytest.fail(f"{missing} not found: {INSTALL}")
    return chromium, driver


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = _driver_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def _start(host: Path, env: dict[str, str], log: Path, *command: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            ["uv", "run", "--all-packages", "--offline", *command],
            cwd=host,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _until(check: Callable[[], Any], what: str, within: float = 30.0) -> Any:
    """Poll `check` every 0.2 s until it returns a true value; fail naming `what`."""
    deadline = time.monotonic() + within
    while True:
        try:
            found = check()
        except (StaleElementReferenceException, httpx.HTTPError):
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {within} s")
        time.sleep(0.2)


def _count(chrome: webdriver.Chrome, status: str) -> int:
    rows = chrome.find_elements(By.CSS_SELECTOR, f'#counts tr[data-status="{status}"] .count')
    return sum(int(row.text) for row in rows)


def _click(chrome: webdriver.Chrome, selector: str) -> bool:
    """Click the first element `selector` finds; False when there is none yet. A refresh
    that replaces it meanwhile raises `StaleElementReferenceException`, which `_until`
    retries."""
    found = chrome.find_elements(By.CSS_SELECTOR, selector)
    if found:
        found[0].click()
    return bool(found)


def _answer(chrome: webdriver.Chrome, *, accept: bool) -> str:
    """Answer the confirm dialog a click opened; its question."""
    alert = WebDriverWait(chrome, 10).until(expected_conditions.alert_is_present())
    question = alert.text
    if accept:
        alert.accept()
    else:
        alert.dismiss()
    return question


def _lane_state(chrome: webdriver.Chrome, lane: str) -> str | None:
    rows = chrome.find_elements(By.CSS_SELECTOR, f'#lanes tr[data-lane="{lane}"]')
    return rows[0].get_attribute("data-state") if rows else None


def test_the_dashboard_counts_enqueues_and_replays_a_dead_letter_to_completion(
    make_host: Callable[..., Path],
    render: Callable[..., Any],
    uv_env: dict[str, str],
    browser: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    host = make_host()
    render(host)
    synced = uv_sync(host, uv_env)
    assert synced.returncode == 0, synced.stderr
    env = {**uv_env, "UV_OFFLINE": "1"}
    env = {k: v for k, v in env.items() if not k.startswith(("ACME_", "VIRTUAL_ENV"))}
    seed = subprocess.run(
        ["uv", "run", "--all-packages", "--offline", "python", "-c", SEED],
        cwd=host,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert seed.returncode == 0, seed.stderr[-3000:]
    ids = json.loads(seed.stdout.strip().splitlines()[-1])
    port = free_port()
    env_api = {**env, "ACME_API_PORT": str(port)}
    api = _start(host, env_api, tmp_path / "api.log", "acme-api", "serve")
    worker: subprocess.Popen[bytes] | None = None
    base = f"http://127.0.0.1:{port}"
    user = {"X-Acme-User": ids["admin"]}
    items = f"{base}/v1/orgs/{ids['org']}/work"
    try:
        _until(lambda: httpx.get(f"{base}/healthz").status_code == 200, "the API", 60)
        page = f"{base}/v1/work/dashboard?org={ids['org']}"
        browser.get(f"{page}&as={ids['admin']}")
        dead_row = f'#dead-letters tr[data-id="{ids["dead"]}"]'
        row = _until(
            lambda: browser.find_elements(By.CSS_SELECTOR, dead_row),
            "the dead letter on the page",
        )[0]
        assert MARK in row.text  # shown as text ...
        assert browser.execute_script("return window.pwned") is None  # ... never run

        before = _count(browser, "AVAILABLE")
        made_ids = []
        for _ in range(3):
            made = httpx.post(
                f"{items}/kinds/NOTIFY_SHIPMENT/items",
                json={"record_id": "00000000-0000-4000-8000-000000000001"},
                headers=user,
            )
            assert made.status_code in (200, 201), made.text
            made_ids.append(made.json()["id"])
        _until(lambda: _count(browser, "AVAILABLE") == before + 3, "the count going up")

        # Cancel one of them from the page: asked first, and a "no" sends nothing; a "yes"
        # takes it out of the waiting items, for good.
        cancelled_row = f'#items tr[data-id="{made_ids[0]}"]'
        cancel = f'{cancelled_row} button[data-action="cancel"]'
        _until(lambda: _click(browser, cancel), "the cancel button")
        assert made_ids[0] in _answer(browser, accept=False)
        time.sleep(0.5)
        kept = httpx.get(f"{items}/items/{made_ids[0]}", headers=user).json()
        assert kept["status"] == "AVAILABLE"
        _until(lambda: _click(browser, cancel), "the cancel button")
        _answer(browser, accept=True)
        _until(
            lambda: not browser.find_elements(By.CSS_SELECTOR, cancelled_row),
            "the cancelled item leaving the page",
        )
        _until(lambda: _count(browser, "AVAILABLE") == before + 2, "the count going down")
        cancelled = httpx.get(f"{items}/items/{made_ids[0]}", headers=user).json()
        assert cancelled["status"] == "CANCELLED"

        # A cancel another admin made while the page asked: refused in one line, which
        # stays on the page through the refreshes after it.
        raced = f'#items tr[data-id="{made_ids[1]}"] button[data-action="cancel"]'
        _until(lambda: _click(browser, raced), "the second cancel button")
        first = httpx.post(f"{items}/items/{made_ids[1]}/cancel", headers=user)
        assert first.status_code == 200, first.text
        _answer(browser, accept=True)
        status = browser.find_element(By.ID, "status")
        _until(lambda: status.text.startswith("Refused (409): status: "), "the refusal shown")
        time.sleep(5)  # two refreshes and more
        assert status.text.startswith("Refused (409): status: "), status.text

        # Pause the item's lane as an operator; a member sees the pause and no button.
        lane = cancelled["lane"]
        pause = f'#lanes tr[data-lane="{lane}"] button[data-action="pause"]'
        _until(lambda: _click(browser, pause), "the pause button")
        assert lane in _answer(browser, accept=True)
        _until(lambda: _lane_state(browser, lane) == "paused", "the lane shown paused")
        assert browser.find_element(By.ID, "workers-section").is_displayed()
        browser.get(f"{page}&as={ids['member']}")
        _until(lambda: _lane_state(browser, lane) == "paused", "the pause shown to a member")
        assert not browser.find_elements(By.CSS_SELECTOR, "#lanes button")
        assert not browser.find_element(By.ID, "workers-section").is_displayed()
        # Nor a write a member may not make: the items and the dead letter, no buttons.
        assert browser.find_elements(By.CSS_SELECTOR, f'#items tr[data-id="{made_ids[2]}"]')
        assert browser.find_elements(By.CSS_SELECTOR, dead_row)
        assert not browser.find_elements(By.CSS_SELECTOR, "#items button, #dead-letters button")
        browser.get(f"{page}&as={ids['admin']}")
        resume = f'#lanes tr[data-lane="{lane}"] button[data-action="resume"]'
        _until(lambda: _click(browser, resume), "the resume button")
        _until(lambda: _lane_state(browser, lane) == "claiming", "the lane shown resumed")

        replay = f'{dead_row} button[data-action="replay"]'
        _until(lambda: _click(browser, replay), "the replay button")
        _until(
            lambda: not browser.find_elements(By.CSS_SELECTOR, dead_row),
            "the dead letter leaving the page",
        )
        none = browser.find_elements(By.CSS_SELECTOR, "#dead-letters tr.none")
        assert [row.text for row in none] == ["No dead letters."]  # the only one replayed
        _until(lambda: _count(browser, "AVAILABLE") == before + 2, "the replayed item counted")

        env_worker = {**env, "SHIPMENT_NOTIFIER_METRICS_PORT": str(free_port())}
        worker = _start(host, env_worker, tmp_path / "worker.log", "shipment-notifier", "serve")
        done = _until(
            lambda: (
                httpx.get(f"{items}/items/{ids['dead']}", headers=user).json()["status"]
                == "COMPLETED"
            ),
            "the replayed item completing",
            90,
        )
        assert done
        _until(lambda: _count(browser, "AVAILABLE") == 0, "the counts emptying", 60)
        # The worker on the roster, read by the API: its name, lane and a recent beat.
        browser.get(f"{page}&as={ids['admin']}")
        alive = '#workers tr[data-worker="shipment-notifier"]'
        _until(lambda: browser.find_elements(By.CSS_SELECTOR, alive), "the worker shown alive")
        cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, f"{alive} td")]
        assert cells[2] == lane and cells[4].endswith(" s ago"), cells
    except (AssertionError, WebDriverException, pytest.fail.Exception):
        for log in ("api.log", "worker.log"):
            if (tmp_path / log).exists():
                print(f"--- {log}\n" + (tmp_path / log).read_text(errors="replace")[-4000:])
        raise
    finally:
        if worker is not None:
            _stop(worker)
        _stop(api)
