"""The work routes in the host's API, over the memory container: who may do what, what is
audited, what a page of another origin or a payload's text can do (docs/security.md)."""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from work_fixtures import KIND, LANE, ProbePayload, make_item, use_probe_payload

from acme.infra.container import Infra
from acme.om.context import AppContext, AppType, OpContext, RequestContext, Role
from acme.om.root import Managers
from acme.om.storage.impl.memory import MemoryStorageRoot
from acme.om.types import EMPTY_UUID
from acme.om.work.impl.operator_commands import LANE_SUBJECT_TYPE, lane_subject_id
from acme.om.work.rules import known_lanes
from acme.om.work.types.work_item import WorkKind, WorkStatus
from acme.services.api.container import ServiceContainer
from acme.services.api.main import create_app
from acme.services.api.work.guard import MAX_BODY_BYTES, TOO_LARGE
from acme.services.api.work.routes import enqueue_router

RCTX = RequestContext.new(AppContext(type=AppType.SERVICE, version="work-api-tests@0"))
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/handler.py", line 3, in handle\n'
    "    raise TimeoutError(secret_path)\n"
    "TimeoutError: the carrier did not answer"
)


@dataclass
class World:
    """Two tenants, A and B, an admin and a member of A, a platform operator; a client."""

    client: httpx.AsyncClient
    storage: MemoryStorageRoot
    managers: Managers
    org_a: UUID
    org_b: UUID
    admin: UUID
    member: UUID
    operator: UUID

    def as_(self, user: UUID) -> dict[str, str]:
        return {"X-Acme-User": str(user)}

    async def ctx(self, user: UUID) -> OpContext:
        role = await self.managers.tenancy.member_role(RCTX, org_id=self.org_a, user_id=user)
        assert role is not None
        return await self.managers.tenancy.member_context(
            RCTX, org_id=self.org_a, user_id=user, role=role
        )

    async def dead_letter(self, org: UUID | None = None, **fields: Any) -> UUID:
        return await self.item(org, status=WorkStatus.FAILED, **fields)

    async def item(self, org: UUID | None = None, **fields: Any) -> UUID:
        item = make_item(org or self.org_a, LANE, **fields)
        await self.storage.get_work_storage().create_item(item.org_id, item)
        return item.id

    async def system_entries(self) -> list[tuple[UUID, str, Any]]:
        """The system scope's entries: (actor, action, detail) each, oldest first."""
        system = await self.managers.tenancy.member_context(
            RCTX, org_id=EMPTY_UUID, user_id=self.operator, role=Role.ADMIN
        )
        entries = await self.managers.audit.list_for(system, "system_scope", EMPTY_UUID)
        return [(e.actor_id, e.action, e.detail) for e in entries]


@pytest.fixture
async def world(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    use_probe_payload(monkeypatch)
    storage = MemoryStorageRoot()
    container = ServiceContainer.for_tests(storage, Infra.memory())
    app = create_app(container=container)
    # The probe kind's enqueue routes answer first: the tests never depend on the shape the
    # host gave its real payload model.
    app.router.routes[:0] = enqueue_router({KIND: ProbePayload}).routes
    tenancy = container.managers.tenancy
    org_a = (await tenancy.create_org(RCTX, "a")).id
    org_b = (await tenancy.create_org(RCTX, "b")).id
    admin, member, operator = uuid4(), uuid4(), uuid4()
    await tenancy.grant_membership(RCTX, org_id=org_a, user_id=admin, role=Role.ADMIN)
    await tenancy.grant_membership(RCTX, org_id=org_a, user_id=member, role=Role.MEMBER)
    await tenancy.grant_membership(RCTX, org_id=EMPTY_UUID, user_id=operator, role=Role.ADMIN)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield World(client, storage, container.managers, org_a, org_b, admin, member, operator)


def enqueue_path(org: UUID) -> str:
    return f"/v1/orgs/{org}/work/kinds/{KIND.value}/items"


def probe(**fields: Any) -> dict[str, Any]:
    return {"record_id": str(uuid4()), **fields}


def mutations(org: UUID, item: UUID) -> list[tuple[str, Any]]:
    """Every write route of a tenant, with a body it accepts."""
    base = f"/v1/orgs/{org}/work"
    return [
        (enqueue_path(org), probe()),
        (f"{enqueue_path(org)}/bulk", [probe()]),
        (f"{base}/dead-letters/{item}/replay", None),
        (f"{base}/kinds/{KIND.value}/dead-letters/{item}/replay", probe()),
        (f"{base}/dead-letters/{item}/discard", None),
        (f"{base}/items/{item}/cancel", None),
        (f"{base}/dead-letters/replay", {"dry_run": True}),
        (f"{base}/dead-letters/discard", {"dry_run": True}),
    ]


def reads(org: UUID, item: UUID) -> list[str]:
    base = f"/v1/orgs/{org}/work"
    return [
        f"{base}/items",
        f"{base}/items/{item}",
        f"{base}/dead-letters",
        f"{base}/summary",
        f"{base}/activity",
        f"{base}/schedules",
    ]


OPERATOR_ROUTES = [
    ("GET", "/v1/work/summary", None),
    ("GET", "/v1/work/lanes", None),
    ("POST", f"/v1/work/lanes/{LANE}/pause", {"reason": "carrier outage"}),
    ("POST", f"/v1/work/lanes/{LANE}/resume", {}),
]


async def test_a_member_of_one_tenant_gets_404_for_everything_of_another(world: World) -> None:
    item = await world.dead_letter(world.org_b)
    who = world.as_(world.admin)

    answers = [
        (await world.client.get(path, headers=who)).status_code for path in reads(world.org_b, item)
    ]
    answers += [
        (await world.client.post(path, json=body, headers=who)).status_code
        for path, body in mutations(world.org_b, item)
    ]

    assert answers == [404] * len(answers)
    response = await world.client.get(reads(world.org_b, item)[0], headers=who)
    assert response.json()["detail"] == f"org_id: no live org {world.org_b}"


async def test_a_write_to_an_unknown_kind_names_the_kinds_to_a_member_alone(
    world: World,
) -> None:
    who = world.as_(world.admin)

    own = await world.client.post(
        f"/v1/orgs/{world.org_a}/work/kinds/NOPE/items", json=probe(), headers=who
    )
    foreign = await world.client.post(
        f"/v1/orgs/{world.org_b}/work/kinds/NOPE/items/bulk", json=[probe()], headers=who
    )

    assert own.status_code == 404
    assert own.json()["detail"].startswith("kind: 'NOPE' names no work kind; the kinds: ")
    assert KIND.value in own.json()["detail"]
    assert (foreign.status_code, foreign.json()["detail"]) == (
        404,
        f"org_id: no live org {world.org_b}",
    )


async def test_a_delay_that_is_no_finite_number_is_refused_as_such(world: World) -> None:
    who = world.as_(world.admin)
    for delay in ("nan", "inf"):
        refused = await world.client.post(
            f"{enqueue_path(world.org_a)}?delay_s={delay}", json=probe(), headers=who
        )
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["msg"] == "Input should be a finite number"


async def test_a_member_without_the_admin_role_gets_403_on_each_mutation(world: World) -> None:
    item = await world.dead_letter()
    who = world.as_(world.member)

    answers = [
        (await world.client.post(path, json=body, headers=who)).status_code
        for path, body in mutations(world.org_a, item)
    ]
    reading = [
        (await world.client.get(p, headers=who)).status_code for p in reads(world.org_a, item)
    ]

    assert answers == [403] * len(answers)
    assert reading == [200] * len(reading)


async def test_the_all_tenant_view_needs_a_platform_operator_and_is_audited(
    world: World,
) -> None:
    await world.dead_letter(world.org_a, audit_owed_token=uuid4())

    refused = await world.client.get("/v1/work/summary", headers=world.as_(world.admin))
    granted = await world.client.get("/v1/work/summary", headers=world.as_(world.operator))

    assert refused.status_code == 403
    assert granted.status_code == 200, granted.text
    system = await world.managers.tenancy.member_context(
        RCTX, org_id=EMPTY_UUID, user_id=world.operator, role=Role.ADMIN
    )
    [entry] = await world.managers.audit.list_for(system, "system_scope", EMPTY_UUID)
    assert (entry.actor_id, entry.action) == (world.operator, "work.system_scope")
    assert entry.detail == {"method": "GET", "path": "/v1/work/summary"}


async def test_each_mutation_is_audited_with_the_member_as_actor(world: World) -> None:
    who = world.as_(world.admin)
    one = (await world.client.post(enqueue_path(world.org_a), json=probe(), headers=who)).json()
    replayed, discarded = await world.dead_letter(), await world.dead_letter()
    corrected, cancelled = await world.dead_letter(), await world.item()
    base = f"/v1/orgs/{world.org_a}/work"
    for path in (
        f"{base}/dead-letters/{replayed}/replay",
        f"{base}/dead-letters/{discarded}/discard",
        f"{base}/items/{cancelled}/cancel",
    ):
        assert (await world.client.post(path, headers=who)).status_code == 200, path
    fixed = await world.client.post(
        f"{base}/kinds/{KIND.value}/dead-letters/{corrected}/replay",
        json=probe(),
        headers=who,
    )
    assert fixed.status_code == 200, fixed.text
    ctx = await world.ctx(world.admin)

    entries = [
        entry
        for subject in (UUID(one["id"]), replayed, discarded, corrected, cancelled)
        for entry in await world.managers.audit.list_for(ctx, "work_item", subject)
    ]

    assert {e.action for e in entries} >= {
        "work.enqueued",
        "work.replayed",
        "work.discarded",
        "work.cancelled",
    }
    assert {e.actor_id for e in entries} == {world.admin}


async def test_a_payload_is_typed_by_its_kind_and_refused_naming_the_field(
    world: World,
) -> None:
    response = await world.client.post(
        enqueue_path(world.org_a), json={"record_id": "not a uuid"}, headers=world.as_(world.admin)
    )

    assert response.status_code == 422
    assert [problem["loc"] for problem in response.json()["detail"]] == [["body", "record_id"]]


async def test_an_idempotency_key_returns_the_first_item(world: World) -> None:
    who = world.as_(world.admin) | {"Idempotency-Key": "order-7"}

    first = await world.client.post(enqueue_path(world.org_a), json=probe(), headers=who)
    again = await world.client.post(enqueue_path(world.org_a), json=probe(), headers=who)

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert first.json()["idempotency_key"] == "order-7"


async def test_an_enqueue_on_a_lane_no_worker_claims_its_kind_on_is_refused(
    world: World,
) -> None:
    who = world.as_(world.admin)
    await world.managers.work.beat_worker(
        RCTX, "host-4:2", worker="shipment-notifier", lane="bulk", kinds=[KIND], ttl_s=60.0
    )
    refusal = f"lane: no worker claims {KIND.value} on lane typo_lane; the lanes that do: "

    one = await world.client.post(
        enqueue_path(world.org_a), params={"lane": "typo_lane"}, json=probe(), headers=who
    )
    bulk = await world.client.post(
        f"{enqueue_path(world.org_a)}/bulk",
        params={"lane": "typo_lane"},
        json=[probe()],
        headers=who,
    )
    served = [
        await world.client.post(
            enqueue_path(world.org_a), params={"lane": lane}, json=probe(), headers=who
        )
        for lane in (LANE, "bulk")
    ]

    assert (one.status_code, one.json()["detail"]) == (422, refusal + f"bulk, {LANE}")
    assert (bulk.status_code, bulk.json()["detail"]) == (422, refusal + f"bulk, {LANE}")
    assert [(r.status_code, r.json()["lane"]) for r in served] == [(201, LANE), (201, "bulk")]
    items = await world.client.get(f"/v1/orgs/{world.org_a}/work/items", headers=who)
    assert len(items.json()["items"]) == 2


async def test_a_bulk_enqueue_inserts_each_payload_and_the_list_pages_by_cursor(
    world: World,
) -> None:
    who = world.as_(world.admin)
    bulk = await world.client.post(
        f"{enqueue_path(world.org_a)}/bulk", json=[probe() for _ in range(5)], headers=who
    )
    assert bulk.status_code == 201, bulk.text
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": 2, "status": "AVAILABLE"}
        if cursor is not None:
            params["cursor"] = cursor
        page = (
            await world.client.get(f"/v1/orgs/{world.org_a}/work/items", params=params, headers=who)
        ).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert sorted(seen) == sorted(bulk.json()["ids"])
    refused = await world.client.get(
        f"/v1/orgs/{world.org_a}/work/items", params={"cursor": "nonsense"}, headers=who
    )
    assert (refused.status_code, refused.json()["detail"]) == (
        422,
        "cursor: not a cursor this API returned",
    )


async def test_an_enqueue_takes_a_priority_in_range_and_refuses_one_out_of_it(
    world: World,
) -> None:
    who = world.as_(world.admin)
    one = await world.client.post(
        enqueue_path(world.org_a), params={"priority": 7}, json=probe(), headers=who
    )
    assert (one.status_code, one.json()["priority"]) == (201, 7), one.text
    bulk = await world.client.post(
        f"{enqueue_path(world.org_a)}/bulk", params={"priority": -3}, json=[probe()], headers=who
    )
    assert bulk.status_code == 201, bulk.text
    (item_id,) = bulk.json()["ids"]
    read = await world.client.get(f"/v1/orgs/{world.org_a}/work/items/{item_id}", headers=who)
    assert read.json()["priority"] == -3, read.text
    default = await world.client.post(enqueue_path(world.org_a), json=probe(), headers=who)
    assert default.json()["priority"] == 0
    for path in (enqueue_path(world.org_a), f"{enqueue_path(world.org_a)}/bulk"):
        body = probe() if path.endswith("items") else [probe()]
        refused = await world.client.post(path, params={"priority": 11}, json=body, headers=who)
        assert refused.status_code == 422, refused.text
        assert "priority" in refused.text
        assert "10" in refused.text


async def test_dead_letters_are_replayed_by_filter_after_a_dry_run_count(world: World) -> None:
    ids = [await world.dead_letter() for _ in range(3)]
    path = f"/v1/orgs/{world.org_a}/work/dead-letters/replay"
    who = world.as_(world.admin)

    counted = await world.client.post(path, json={"kind": KIND.value, "dry_run": True}, headers=who)
    done = await world.client.post(path, json={"kind": KIND.value}, headers=who)

    assert counted.json() == {"matched": 3, "acted": 0, "dry_run": True}
    assert done.json() == {"matched": 3, "acted": 3, "dry_run": False}
    ctx = await world.ctx(world.admin)
    assert {(await world.managers.work.get(ctx, i)).status for i in ids} == {WorkStatus.AVAILABLE}


async def test_a_cross_origin_post_is_refused_and_a_same_origin_one_passes(
    world: World,
) -> None:
    who = world.as_(world.admin)
    path = enqueue_path(world.org_a)

    foreign = await world.client.post(
        path, json=probe(), headers=who | {"Origin": "https://evil.example"}
    )
    fetched = await world.client.post(
        path, json=probe(), headers=who | {"Sec-Fetch-Site": "cross-site"}
    )
    own = await world.client.post(path, json=probe(), headers=who | {"Origin": "http://api"})

    assert (foreign.status_code, fetched.status_code, own.status_code) == (403, 403, 201)
    ctx = await world.ctx(world.admin)
    assert len(await world.managers.work.list_items(ctx)) == 1


async def test_a_body_past_the_limit_is_refused_with_413_declared_or_streamed(
    world: World,
) -> None:
    """A work route never parses a body past `MAX_BODY_BYTES` (a 422 would echo it back):
    413 in one line whether its `Content-Length` says so or it comes in chunks."""
    who = world.as_(world.admin)
    path = enqueue_path(world.org_a)
    big = probe(note="x" * MAX_BODY_BYTES)

    async def chunks() -> AsyncIterator[bytes]:
        text = json.dumps(big).encode()
        for start in range(0, len(text), 65536):
            yield text[start : start + 65536]

    declared = await world.client.post(path, json=big, headers=who)
    streamed = await world.client.post(
        path, content=chunks(), headers=who | {"Content-Type": "application/json"}
    )
    fits = await world.client.post(path, json=probe(note="x" * 1000), headers=who)

    assert (declared.status_code, declared.text) == (413, TOO_LARGE)
    assert "content-length" not in streamed.request.headers
    assert (streamed.status_code, streamed.text) == (413, TOO_LARGE)
    assert fits.status_code == 201, fits.text
    ctx = await world.ctx(world.admin)
    assert len(await world.managers.work.list_items(ctx)) == 1


async def test_responses_forbid_framing_and_the_page_has_a_strict_policy(world: World) -> None:
    api = await world.client.get(
        f"/v1/orgs/{world.org_a}/work/summary", headers=world.as_(world.member)
    )
    page = await world.client.get("/v1/work/dashboard")
    script = await world.client.get("/v1/work/dashboard/app.js")

    assert "frame-ancestors 'none'" in api.headers["content-security-policy"]
    assert api.json()["can_write"] is False  # a member: the page offers no write
    admin = await world.client.get(
        f"/v1/orgs/{world.org_a}/work/summary", headers=world.as_(world.admin)
    )
    assert admin.json()["can_write"] is True
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy
    assert "script-src 'self';" in policy
    assert "unsafe-inline" not in policy
    assert "http" not in policy
    assert page.headers["content-type"].startswith("text/html")
    assert script.headers["content-type"].startswith("text/javascript")
    assert page.headers["x-content-type-options"] == "nosniff"


async def test_payload_and_error_text_are_data_never_markup(world: World) -> None:
    """The API returns `<script>` as a JSON string, and the page sets every value as text:
    its script never writes HTML (the browser test sees it inert)."""
    who = world.as_(world.admin)
    mark = "<script>alert(1)</script>"
    made = await world.client.post(enqueue_path(world.org_a), json=probe(note=mark), headers=who)
    item = await world.client.get(
        f"/v1/orgs/{world.org_a}/work/items/{made.json()['id']}", headers=who
    )
    script = resources.files("acme.services.api.work").joinpath("dashboard", "app.js").read_text()

    assert item.headers["content-type"] == "application/json"
    assert item.json()["payload"]["note"] == mark
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script


async def test_a_member_sees_last_error_without_stack_frames_an_admin_with(
    world: World,
) -> None:
    item = await world.dead_letter(last_error=TRACEBACK)
    path = f"/v1/orgs/{world.org_a}/work/items/{item}"

    member = (await world.client.get(path, headers=world.as_(world.member))).json()
    admin = (await world.client.get(path, headers=world.as_(world.admin))).json()

    assert member["last_error"] == "TimeoutError: the carrier did not answer"
    assert admin["last_error"] == TRACEBACK


async def test_the_openapi_types_every_work_body_and_response() -> None:
    """The host's own app, as mounted (its real payload models, no probe)."""
    app = create_app(container=ServiceContainer.for_tests(MemoryStorageRoot(), Infra.memory()))
    schema = app.openapi()
    work = {p: ops for p, ops in schema["paths"].items() if "/work" in p}

    assert len(work) >= 11
    for path, operations in work.items():
        for method, operation in operations.items():
            ok = next(c for c in operation["responses"] if c.startswith("2"))
            assert operation["responses"][ok]["content"]["application/json"]["schema"], path
            if method == "post" and "{item_id}" not in path:
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                # A body that may be left out is `anyOf` its model and null.
                typed = [body, *body.get("anyOf", [])]
                assert any(b.get("$ref") or b.get("items") for b in typed), (path, body)


async def test_an_admin_cancels_a_waiting_item_once_and_is_refused_after(world: World) -> None:
    item = await world.item()
    path = f"/v1/orgs/{world.org_a}/work/items/{item}/cancel"
    who = world.as_(world.admin)

    done = await world.client.post(path, headers=who)
    again = await world.client.post(path, headers=who)
    unknown = await world.client.post(
        f"/v1/orgs/{world.org_a}/work/items/{UUID(int=9)}/cancel", headers=who
    )

    assert (done.status_code, done.json()["status"]) == (200, "CANCELLED")
    assert (again.status_code, again.json()["detail"]) == (
        409,
        "status: only an available or claimed item can be cancelled; this one is CANCELLED",
    )
    assert (unknown.status_code, unknown.json()["detail"]) == (
        404,
        f"item_id: no work item {UUID(int=9)}",
    )
    [entry] = await world.managers.audit.list_for(await world.ctx(world.admin), "work_item", item)
    assert (entry.actor_id, entry.action, entry.detail["was"]) == (
        world.admin,
        "work.cancelled",
        "AVAILABLE",
    )


async def test_a_corrected_replay_is_typed_by_the_kind_and_audited_with_both_payloads(
    world: World,
) -> None:
    item = await world.dead_letter()
    old = (await world.managers.work.get(await world.ctx(world.admin), item)).payload
    path = f"/v1/orgs/{world.org_a}/work/kinds/{KIND.value}/dead-letters/{item}/replay"
    who = world.as_(world.admin)

    refused = await world.client.post(path, json={"record_id": "not a uuid"}, headers=who)
    fixed = probe(note="right")
    replayed = await world.client.post(path, json=fixed, headers=who)
    again = await world.client.post(path, json=fixed, headers=who)

    assert refused.status_code == 422
    assert [problem["loc"] for problem in refused.json()["detail"]] == [["body", "record_id"]]
    assert replayed.status_code == 200, replayed.text
    assert (replayed.json()["status"], replayed.json()["payload"]["note"]) == ("AVAILABLE", "right")
    assert again.status_code == 409
    assert again.json()["detail"].startswith("status: only a failed item can be replayed")
    other = next(kind for kind in WorkKind if kind is not KIND)
    elsewhere = await world.client.post(
        path.replace(f"/kinds/{KIND.value}/", f"/kinds/{other.value}/"), json=fixed, headers=who
    )
    assert (elsewhere.status_code, elsewhere.json()["detail"]) == (
        422,
        f"kind: item {item} is of kind {KIND.value}; replay it at {path}",
    )
    [entry] = [
        e
        for e in await world.managers.audit.list_for(
            await world.ctx(world.admin), "work_item", item
        )
        if e.action == "work.replayed"
    ]
    assert entry.actor_id == world.admin
    assert (entry.detail["old_payload"], entry.detail["payload"]["note"]) == (old, "right")


async def test_the_operator_routes_refuse_a_tenant_admin_with_403_and_audit_nothing(
    world: World,
) -> None:
    who = world.as_(world.admin)

    answers = [
        (await world.client.request(method, path, json=body, headers=who)).status_code
        for method, path, body in OPERATOR_ROUTES
    ]

    assert answers == [403] * len(answers)
    assert await world.system_entries() == []
    assert await world.managers.work.paused_lanes(RCTX) == []


async def test_an_operator_pauses_and_resumes_a_lane_each_audited_with_the_operator(
    world: World,
) -> None:
    who = world.as_(world.operator)

    paused = await world.client.post(
        f"/v1/work/lanes/{LANE}/pause", json={"reason": "carrier outage"}, headers=who
    )
    listed = (await world.client.get("/v1/work/lanes", headers=who)).json()
    seen = (
        await world.client.get(
            f"/v1/orgs/{world.org_a}/work/summary", headers=world.as_(world.member)
        )
    ).json()
    # The body (the reason) may be left out.
    twice = await world.client.post(f"/v1/work/lanes/{LANE}/pause", headers=who)
    resumed = await world.client.post(f"/v1/work/lanes/{LANE}/resume", headers=who)
    not_paused = await world.client.post(f"/v1/work/lanes/{LANE}/resume", json={}, headers=who)

    assert paused.status_code == 200, paused.text
    assert (paused.json()["paused_by"], paused.json()["reason"]) == (
        str(world.operator),
        "carrier outage",
    )
    [lane] = [row for row in listed["lanes"] if row["lane"] == LANE]
    assert (lane["known"], lane["pause"]["paused_by"]) == (True, str(world.operator))
    assert [(p["lane"], p["reason"]) for p in seen["paused"]] == [(LANE, "carrier outage")]
    assert "paused_by" not in seen["paused"][0]  # the operator's identity stays the platform's
    assert twice.status_code == 409
    assert resumed.status_code == 200, resumed.text
    assert (not_paused.status_code, not_paused.json()["detail"]) == (
        409,
        f"lane: {LANE} is not paused; the paused lanes: none",
    )
    assert [
        (actor, action, detail["path"]) for actor, action, detail in await world.system_entries()
    ] == [
        (world.operator, "work.system_scope", path)
        for path in (
            f"/v1/work/lanes/{LANE}/pause",
            "/v1/work/lanes",
            f"/v1/work/lanes/{LANE}/pause",
            f"/v1/work/lanes/{LANE}/resume",
            f"/v1/work/lanes/{LANE}/resume",
        )
    ]
    tenant = await world.managers.tenancy.service_context(
        RCTX, org_id=world.org_a, acting_for=EMPTY_UUID, caused_by_request_id=None
    )
    lane_entries = await world.managers.audit.list_for(
        tenant, LANE_SUBJECT_TYPE, lane_subject_id(LANE)
    )
    assert [(e.action, e.detail["operator"]) for e in lane_entries] == [
        ("work.lane_paused", str(world.operator)),
        ("work.lane_resumed", str(world.operator)),
    ]


async def test_a_pause_of_an_unknown_lane_is_refused_naming_the_known_ones(world: World) -> None:
    who = world.as_(world.operator)

    refused = await world.client.post("/v1/work/lanes/no_such_lane/pause", json={}, headers=who)
    bad_reason = await world.client.post(
        f"/v1/work/lanes/{LANE}/pause", json={"reason": "two\nlines"}, headers=who
    )

    assert (refused.status_code, refused.json()["detail"]) == (
        422,
        "lane: no worker claims on lane no_such_lane; the known lanes: " + ", ".join(known_lanes()),
    )
    assert bad_reason.status_code == 422
    assert [problem["loc"] for problem in bad_reason.json()["detail"]] == [["body", "reason"]]
    assert await world.managers.work.paused_lanes(RCTX) == []


async def test_the_all_tenant_summary_names_the_workers_holding_items(world: World) -> None:
    lease = datetime.now(UTC) + timedelta(minutes=5)
    for org, worker in (
        (world.org_a, "host-1:41"),
        (world.org_b, "host-1:41"),
        (world.org_b, "host-2:7"),
    ):
        await world.item(
            org,
            status=WorkStatus.CLAIMED,
            claimed_by=worker,
            claim_token=uuid4(),
            lease_expires_at=lease,
        )

    overview = await world.client.get("/v1/work/summary", headers=world.as_(world.operator))

    assert overview.status_code == 200, overview.text
    assert overview.json()["workers_holding"] == [
        {"worker": "host-1:41", "items": 2},
        {"worker": "host-2:7", "items": 1},
    ]
    assert sum(group["count"] for group in overview.json()["lanes"]) == 3


async def test_the_all_tenant_summary_lists_the_workers_alive_idle_ones_too(world: World) -> None:
    work = world.managers.work
    for worker_id in ("host-3:9", "host-1:41"):
        await work.beat_worker(
            RCTX, worker_id, worker="shipment-notifier", lane=LANE, kinds=[KIND], ttl_s=60.0
        )
    lease = datetime.now(UTC) + timedelta(minutes=5)
    await world.item(
        world.org_a,
        status=WorkStatus.CLAIMED,
        claimed_by="host-1:41",
        claim_token=uuid4(),
        lease_expires_at=lease,
    )

    overview = await world.client.get("/v1/work/summary", headers=world.as_(world.operator))

    assert overview.status_code == 200, overview.text
    alive = overview.json()["workers_alive"]
    assert [(w["worker_id"], w["lane"], w["kinds"], w["holding"]) for w in alive] == [
        ("host-1:41", LANE, [KIND.value], 1),
        ("host-3:9", LANE, [KIND.value], 0),
    ]
    assert all(w["beat_at"] and w["started_at"] for w in alive)


async def test_a_member_reads_the_tenants_schedules_with_their_latest_and_next_tick(
    world: World,
) -> None:
    tick = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    ctx = await world.ctx(world.admin)
    await world.managers.work.enqueue_tick(
        ctx,
        "reports:nightly",
        previous=None,
        tick=tick,
        item=None,
        next_tick=tick + timedelta(days=1),
    )
    await world.managers.work.enqueue_tick(
        ctx, "reports:older", previous=None, tick=tick, item=None
    )
    other = await world.managers.tenancy.service_context(
        RCTX, org_id=world.org_b, acting_for=EMPTY_UUID, caused_by_request_id=None
    )
    await world.managers.work.enqueue_tick(
        other, "reports:hourly", previous=None, tick=tick, item=None
    )

    listed = await world.client.get(
        f"/v1/orgs/{world.org_a}/work/schedules", headers=world.as_(world.member)
    )

    assert listed.status_code == 200, listed.text
    assert listed.json() == {
        "schedules": [
            {
                "schedule": "reports:nightly",
                "latest_tick": "2026-03-01T02:00:00Z",
                "next_tick": "2026-03-02T02:00:00Z",
            },
            # a row written without a next tick (a release before it): shown as unknown
            {"schedule": "reports:older", "latest_tick": "2026-03-01T02:00:00Z", "next_tick": None},
        ]
    }
