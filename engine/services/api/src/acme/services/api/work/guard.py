"""The work routes' guard: a cross-origin write is refused, no response may be framed.

The API trusts the gateway's user header, so a page of another origin that gets a member's
browser to send a write would act as that member (cross-site request forgery): a write whose
`Origin` (or, without one, `Sec-Fetch-Site`) names another site gets 403 before any route
runs. Every response under the work paths forbids framing (clickjacking) and MIME sniffing;
the dashboard page gets a strict Content-Security-Policy of its own (docs/security.md).
"""

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

WORK_PATHS = ("/v1/work", "/v1/orgs/")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
API_POLICY = "default-src 'none'; frame-ancestors 'none'"


def is_work_path(path: str) -> bool:
    """Whether `path` is one of the work router's (`/v1/work...`, `/v1/orgs/<id>/work...`)."""
    if path.startswith("/v1/work"):
        return True
    parts = path.split("/")
    return path.startswith("/v1/orgs/") and len(parts) > 4 and parts[4] == "work"


def cross_origin(headers: Headers, scheme: str) -> bool:
    """Whether a request's `Origin` names another origin than its `Host`, or, without an
    `Origin`, its `Sec-Fetch-Site` says `cross-site`."""
    origin = headers.get("origin")
    if origin is None:
        return headers.get("sec-fetch-site", "same-origin") == "cross-site"
    if origin == "null":
        return True
    parts = urlsplit(origin)
    host = headers.get("x-forwarded-host") or headers.get("host", "")
    return parts.netloc != host or parts.scheme not in {scheme, "https"}


class WorkGuard:
    """ASGI middleware over the work paths; other paths pass untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_work_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if scope["method"] not in SAFE_METHODS and cross_origin(headers, scope["scheme"]):
            refused = PlainTextResponse("cross-origin write refused", status_code=403)
            await refused(scope, receive, _secured(send, page=False))
            return
        page = scope["path"].startswith("/v1/work/dashboard")
        await self.app(scope, receive, _secured(send, page=page))


def _secured(send: Send, *, page: bool) -> Send:
    """`send` with the framing, sniffing and content policies added to the response start."""

    async def secured(message: Message) -> None:
        if message["type"] == "http.response.start":
            extra = [
                (b"content-security-policy", (PAGE_POLICY if page else API_POLICY).encode()),
                (b"x-content-type-options", b"nosniff"),
                (b"x-frame-options", b"DENY"),
                (b"referrer-policy", b"no-referrer"),
                (b"cache-control", b"no-store"),
            ]
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)

    return secured
