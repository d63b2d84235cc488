"""The work routes' guard: a cross-origin write is refused, a body past `MAX_BODY_BYTES`
too, and no response may be framed.

The API trusts the gateway's user header, so a page of another origin that gets a member's
browser to send a write would act as that member (cross-site request forgery): a write whose
`Origin` (or, without one, `Sec-Fetch-Site`) names another site gets 403 before any route
runs. A write's body is read here up to `MAX_BODY_BYTES` and refused with 413 past it,
declared or streamed, before any route parses it. Every response under the work paths
forbids framing (clickjacking) and MIME sniffing; the dashboard page gets a strict
Content-Security-Policy of its own (docs/security.md).
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
MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest body a work route reads (bytes): a bulk of 1,000 payloads of 4 KiB each."""
TOO_LARGE = f"body: over {MAX_BODY_BYTES} bytes; send fewer or smaller payloads a call"


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
        if scope["method"] not in SAFE_METHODS:
            if cross_origin(headers, scope["scheme"]):
                refused = PlainTextResponse("cross-origin write refused", status_code=403)
                await refused(scope, receive, _secured(send, page=False))
                return
            declared = headers.get("content-length", "")
            body = None if _over(declared) else await _body_within(receive, MAX_BODY_BYTES)
            if body is None:
                too_large = PlainTextResponse(TOO_LARGE, status_code=413)
                await too_large(scope, receive, _secured(send, page=False))
                return
            receive = _replayed(body, receive)
        page = scope["path"].startswith("/v1/work/dashboard")
        await self.app(scope, receive, _secured(send, page=page))


def _over(declared: str) -> bool:
    """Whether a `Content-Length` of `declared` is past `MAX_BODY_BYTES`."""
    return declared.isdigit() and int(declared) > MAX_BODY_BYTES


async def _body_within(receive: Receive, limit: int) -> bytes | None:
    """The request's body, read whole; None once it passes `limit` bytes (the rest unread).
    A disconnect ends it with what came before."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replayed(body: bytes, receive: Receive) -> Receive:
    """`receive` that gives `body` as the request's one message, then defers to `receive`
    (a disconnect)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


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
