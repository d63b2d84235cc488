"""Who may do what on the work routes: a tenant's members read, its admins write, and
platform operators act across tenants through the audited system scope.

The member is the gateway's `X-Acme-User` header (authenticated there); the role comes from
the host's membership lookup, `TenancyManagerInterface.member_role` (docs/host-contract.md,
"The work API"). A user who is no member of the tenant gets the 404 of a tenant that does
not exist, so tenant ids cannot be probed; a member below the role a route needs gets 403.
"""

from dataclasses import dataclass
from typing import Annotated
from uuid import UUID

from fastapi import Depends, Header, HTTPException, Request, status

from acme.om.context import AppContext, AppType, OpContext, RequestContext, Role
from acme.om.errors import NotFound
from acme.om.root import Managers
from acme.om.types import EMPTY_UUID

APP = AppContext(type=AppType.SERVICE, version="api-work@1")
USER_HEADER = "x-acme-user"
_RANK = {Role.MEMBER: 0, Role.ADMIN: 1}


def managers(request: Request) -> Managers:
    """The host's managers, from its service container (`app.state.container`)."""
    found: Managers = request.app.state.container.managers
    return found


def request_context(traceparent: Annotated[str | None, Header()] = None) -> RequestContext:
    """The request stage of one API call, carrying the caller's trace context."""
    return RequestContext.new(APP, traceparent=traceparent)


ManagersDep = Annotated[Managers, Depends(managers)]
RequestContextDep = Annotated[RequestContext, Depends(request_context)]
UserDep = Annotated[
    UUID, Header(alias=USER_HEADER, description="the user, as the gateway authenticated")
]


@dataclass(frozen=True)
class Member:
    """A member acting in one tenant: the context every manager call takes, and the role
    the lookup gave (`ctx.role`)."""

    ctx: OpContext

    @property
    def is_admin(self) -> bool:
        return self.ctx.role is Role.ADMIN


async def _member(
    org_id: UUID, user: UserDep, found: ManagersDep, rctx: RequestContextDep, needs: Role
) -> Member:
    role = await found.tenancy.member_role(rctx, org_id=org_id, user_id=user)
    if role is None or role not in _RANK:
        raise NotFound(f"org_id: no live org {org_id}")
    if _RANK[role] < _RANK[needs]:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"role: {needs.value} required")
    ctx = await found.tenancy.member_context(rctx, org_id=org_id, user_id=user, role=role)
    return Member(ctx)


async def reader(
    org_id: UUID, user: UserDep, found: ManagersDep, rctx: RequestContextDep
) -> Member:
    """Any member of the tenant in the path."""
    return await _member(org_id, user, found, rctx, Role.MEMBER)


async def admin(org_id: UUID, user: UserDep, found: ManagersDep, rctx: RequestContextDep) -> Member:
    """An admin of the tenant in the path: every write needs one."""
    return await _member(org_id, user, found, rctx, Role.ADMIN)


async def operator(
    request: Request, user: UserDep, found: ManagersDep, rctx: RequestContextDep
) -> OpContext:
    """The system scope (`org_id=EMPTY_UUID`: every tenant) for a platform operator, the role
    only the lookup grants (`member_role` of the nil tenant is ADMIN); 403 for anyone else.
    Each entry is audited (`work.system_scope`, with the method and path)."""
    role = await found.tenancy.member_role(rctx, org_id=EMPTY_UUID, user_id=user)
    if role is not Role.ADMIN:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "role: platform operator required")
    ctx = await found.tenancy.member_context(rctx, org_id=EMPTY_UUID, user_id=user, role=Role.ADMIN)
    await found.audit.append(
        ctx,
        action="work.system_scope",
        subject_type="system_scope",
        subject_id=EMPTY_UUID,
        detail={"method": request.method, "path": request.url.path},
    )
    return ctx


ReaderDep = Annotated[Member, Depends(reader)]
AdminDep = Annotated[Member, Depends(admin)]
OperatorDep = Annotated[OpContext, Depends(operator)]
