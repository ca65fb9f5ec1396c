"""What every request passes before it reaches a route (an ASGI middleware around the app).

In this order, each refusal a JSON body like every other error, and nothing of the body read yet:
1. `Host` must name this server (loopback names, --host, --allowed-host): 421. A page that reaches
   127.0.0.1 through DNS rebinding names its own host here.
2. `Origin`, when a browser sends one, must be the server's own (scheme://Host) or an allowed one: 403.
   A page of another site, or of another port of this machine, may send requests but not these.
3. An edit (a route `editing(scope)` says is one): edits on (403), the bearer token (401), or, on a
   server that takes edits without a token, a loopback client (403). Before the body, so that an
   unauthenticated client can neither make the server read a large body nor learn about its JSON.
4. A body must be JSON (`Content-Type: application/json`): 415. A form or `text/plain` body is what
   a page of another origin can send without asking the browser first.
5. A body over the route's limit is refused: at once by its Content-Length, else while it is read (413).
Every response also carries the security headers of `SECURITY_HEADERS` (a strict Content-Security-Policy:
the page loads only its own script and style, nothing from another site, and cannot be framed).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atlas.serve.serve_settings import LOOPBACK_HOSTS, ServeSettings, is_loopback_address

access_log = logging.getLogger("atlas.serve.access")

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


@dataclass(frozen=True)
class Refusal:
    """The answer to a request that fails a check: its status, one readable line, extra headers."""

    status: int
    detail: str
    headers: dict[str, str] = field(default_factory=dict)


class BodyTooLarge(HTTPException):
    """A body that passed its Content-Length check (or had none) and grew past the limit while read (413).
    An HTTPException, so that FastAPI's body reading passes it on to the app's JSON error handler."""

    def __init__(self, limit: int):
        super().__init__(413, f"the body is over {limit:,} bytes, the limit of this endpoint")


def bearer_token_matches(headers: Headers, token: str | None) -> bool:
    """Whether `headers` carry `Authorization: Bearer <token>` (compared in constant time); False with no token."""
    if token is None:
        return False
    scheme, _, given = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(given.strip().encode(), token.encode())


def client_name(scope: Scope) -> str:
    """`address:port` of the client (as the connection reports it)."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "unknown"


class RequestGuard:
    """The checks of the module docstring, before `app` sees a request.

    editing(scope): whether the request is for an editing route. body_limit(editing): the most
    bytes of a body for an editing route or for any other.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: ServeSettings,
        editing: Callable[[Scope], bool],
        body_limit: Callable[[bool], int],
    ):
        self.app = app
        self.settings = settings
        self.editing = editing
        self.body_limit = body_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        headers = Headers(scope=scope)
        editing = self.editing(scope)
        refusal = self.refusal(scope, headers, editing)
        if refusal is not None:
            response = JSONResponse({"detail": refusal.detail}, refusal.status, headers=refusal.headers)
            await response(scope, receive, send_with_headers)
            return
        limit = self.body_limit(editing)
        read = 0

        async def receive_with_limit() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, receive_with_limit, send_with_headers)

    def refusal(self, scope: Scope, headers: Headers, editing: bool) -> Refusal | None:
        """The answer to the first check the request fails, or None."""
        settings = self.settings
        host = headers.get("host", "")
        if not settings.host_allowed(host):
            return Refusal(
                421,
                f"this server does not answer to the host {host!r}: it answers to "
                f"{', '.join(sorted({*LOOPBACK_HOSTS, *settings.allowed_hosts}))}; start it with --allowed-host NAME "
                "to answer to another name",
            )
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host):
            return Refusal(
                403,
                f"requests from pages of {origin!r} are not taken (not the server's own origin); start the "
                "server with --allowed-origin ORIGIN to take them",
            )
        if editing:
            refused = self._edit_refusal(scope, headers)
            if refused is not None:
                return refused
        method = scope["method"]
        has_body = "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")
        if method in BODY_METHODS and has_body:
            media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
            if media_type != "application/json" and not media_type.endswith("+json"):
                return Refusal(
                    415,
                    f"the body must be JSON (Content-Type: application/json), not {media_type or 'untyped'}",
                )
        limit = self.body_limit(editing)
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            return Refusal(400, "the Content-Length header is not a number")
        if length > limit:
            return Refusal(413, f"the body is {length:,} bytes; the limit of this endpoint is {limit:,}")
        return None

    def _origin_allowed(self, origin: str, host: str) -> bool:
        if origin in self.settings.allowed_origins:
            return True
        return origin != "null" and urlsplit(origin).netloc.lower() == host.lower()

    def _edit_refusal(self, scope: Scope, headers: Headers) -> Refusal | None:
        settings = self.settings
        if not settings.allow_edits:
            return Refusal(403, "corpus editing is off: start the server with `atlas serve --allow-edits`")
        client = client_name(scope)
        if settings.token is not None:
            if bearer_token_matches(headers, settings.token):
                return None
            given = "a wrong token" if "authorization" in headers else "no token"
            access_log.warning("edit refused: %s %s from %s with %s", scope["method"], scope["path"], client, given)
            return Refusal(
                401,
                "editing needs the header `Authorization: Bearer <token>` with the server's token "
                "(--token or ATLAS_TOKEN)",
                {"WWW-Authenticate": "Bearer"},
            )
        address = (scope.get("client") or ("", 0))[0]
        if not is_loopback_address(address):  # edits_without_token: this machine only
            access_log.warning("edit refused: %s %s from %s (not loopback)", scope["method"], scope["path"], client)
            return Refusal(403, "this server takes edits without a token from this machine only")
        return None
