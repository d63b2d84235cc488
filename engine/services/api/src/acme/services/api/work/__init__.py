"""The work queue over HTTP: the `work` namespace's routes and dashboard in the host's API.

`mount_work(app)` adds the router (`/v1/orgs/{org_id}/work/...` for a tenant's members,
`/v1/work/...` for platform operators and the dashboard page) and its guard (cross-origin
writes refused, framing forbidden). The host's `create_app` calls it (a fragment the
template writes; docs/decisions/0044).
"""

from fastapi import FastAPI

from acme.om.work.types.work_item import WORK_PAYLOADS
from acme.services.api.work.guard import WorkGuard
from acme.services.api.work.routes import enqueue_router, router

__all__ = ["mount_work"]


def mount_work(app: FastAPI) -> None:
    """Include the work routes in `app` (an enqueue route per kind of `WORK_PAYLOADS`) and
    guard their paths (`WorkGuard`)."""
    app.include_router(enqueue_router(WORK_PAYLOADS))
    app.include_router(router)
    app.add_middleware(WorkGuard)
