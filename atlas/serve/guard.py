"""What every request passes before it reaches a route (an ASGI middleware around the app).

In this order, each refusal a JSON body like every other error, and nothing of the body read yet:
0. The request line and headers must fit in --max-header-bytes: 431. Counted here, from the parsed
   request, because h11's own limit applies only while the header block is incomplete: a large block
   that arrives in one piece passes it (connections.py answers the other case, also 431).
1. `Host` must name this server (loopback names, --host, --allowed-host): 421. A page that reaches
   127.0.0.1 through DNS rebinding names its own host here. `host_port` parses it strictly: a name
   or a bracketed IPv6 address, then nothing or `:port` (`[::1]evil` names no host).
2. `Origin`, when a browser sends one, must be the server's own (scheme://Host) or an allowed one: 403.
   A page of another site, or of another port of this machine, may send requests but not these.
3. An edit (a route `editing(scope)` says is one): edits on (403), the bearer token (401), or, on a
   server that takes edits without a token, a loopback client (403). Before the body, so that an
   unauthenticated client can neither make the server read a large body nor learn about its JSON.
4. A body must be JSON (`Content-Type: application/json`): 415. A form or `text/plain` body is what
   a page of another origin can send without asking the browser first.
5. A body over the route's limit is refused: at once by its Content-Length, else while it is read (413).
A WebSocket handshake passes 0-2 and is then refused 403 (the server has no WebSocket endpoint), with the
same JSON body and headers (the ASGI denial-response extension; as an HTTP request where the server hands
the handshake to the app as one).
Every response also carries the security headers of `SECURITY_HEADERS` (a strict Content-Security-Policy:
the page loads only its own script and style, nothing from another site, and cannot be framed).
One line on `access_log` (client, method, path, status and why) for every 421 and 403, and for every edit
refused or failed, whether here or by the app (404, 409, 422: "refused"; 503, 500: "failed"; the line gives the
answer's `detail`), so that an operator sees who tried what; the edits that succeed are logged by the app.
"""

from __future__ import annotations

import json
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
    """The answer to a request that fails a check: its status, one readable line, extra headers, and what the
    access log says of it (default: the status and the line)."""

    status: int
    detail: str
    headers: dict[str, str] = field(default_factory=dict)
    logged: str | None = None


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


def header_bytes(scope: Scope) -> int:
    """Bytes of the request line and headers of `scope`, as sent (give or take the white space around values)."""
    target = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b"")) + 1
    line = len(scope.get("method", "GET")) + 1 + target + 1 + len("HTTP/") + len(scope.get("http_version", "1.1")) + 2
    return line + sum(len(name) + 2 + len(value) + 2 for name, value in scope["headers"]) + 2


def printable(text: str, limit: int = 300) -> str:
    """`text` cut to `limit` characters, with every character that is not printable escaped (a log line is one
    line whatever a client sent)."""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _request_line(scope: Scope) -> str:
    method = "WEBSOCKET" if scope["type"] == "websocket" else scope["method"]
    return f"{method} {printable(scope['path'])}"


def _detail_of(body: bytes) -> str:
    """The `detail` of an error body (JSON), else its text."""
    try:
        return str(json.loads(body)["detail"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace")


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
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        headers = Headers(scope=scope)
        editing = scope["type"] == "http" and self.editing(scope)
        refusal = self.refusal(scope, headers, editing)
        if refusal is not None:
            if editing or refusal.status in (403, 421):
                kind = "edit" if editing else "request"
                why = refusal.logged or f"({refusal.status}: {printable(refusal.detail)})"
                access_log.warning("%s refused: %s from %s %s", kind, _request_line(scope), client_name(scope), why)
            await self.answer(scope, receive, send_with_headers, refusal)
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

        if not editing:
            await self.app(scope, receive_with_limit, send_with_headers)
            return
        status, error_body = 0, bytearray()

        async def send_and_log_failure(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400:
                error_body.extend(message.get("body", b"")[: 8192 - len(error_body)])
                if not message.get("more_body", False):
                    access_log.warning(
                        "edit %s: %s from %s (%d: %s)",
                        "refused" if status < 500 else "failed",  # the client's to mend, or the server's
                        _request_line(scope),
                        client_name(scope),
                        status,
                        printable(_detail_of(bytes(error_body))),
                    )
            await send_with_headers(message)

        try:
            await self.app(scope, receive_with_limit, send_and_log_failure)
        except Exception as e:
            if status == 0:  # no answer started: the server's 500 follows
                access_log.warning(
                    "edit failed: %s from %s (500: %s)", _request_line(scope), client_name(scope), type(e).__name__
                )
            raise

    @staticmethod
    async def answer(scope: Scope, receive: Receive, send: Send, refusal: Refusal) -> None:
        """Send `refusal` as JSON: an HTTP response, or the denial of a WebSocket handshake where the server
        offers the ASGI extension for one (else the handshake is closed, which servers answer 403)."""
        response = JSONResponse({"detail": refusal.detail}, refusal.status, headers=refusal.headers)
        if scope["type"] == "websocket":
            await receive()  # websocket.connect: the handshake, received before any answer to it
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": 1008})
                return
        await response(scope, receive, send)  # Starlette sends a WebSocket scope's as websocket.http.response.*

    def refusal(self, scope: Scope, headers: Headers, editing: bool) -> Refusal | None:
        """The answer to the first check the request fails, or None."""
        settings = self.settings
        size = header_bytes(scope)
        if size > settings.max_header_bytes:
            return Refusal(
                431,
                f"the request line and headers are {size:,} bytes; this server takes at most "
                f"{settings.max_header_bytes:,} bytes (--max-header-bytes)",
            )
        hosts = headers.getlist("host")
        host = hosts[0] if len(hosts) == 1 else ""
        if not settings.host_allowed(host):
            named = repr(host) if len(hosts) == 1 else f"{len(hosts)} Host headers"
            return Refusal(
                421,
                f"this server does not answer to the host {printable(named, 200)}: it answers to "
                f"{', '.join(sorted({*LOOPBACK_HOSTS, *settings.allowed_hosts}))}; start it with --allowed-host NAME "
                "to answer to another name",
                logged=f"(421: Host {printable(named, 200)})",
            )
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host):
            return Refusal(
                403,
                f"requests from pages of {printable(repr(origin), 200)} are not taken (not the server's own "
                "origin); start the server with --allowed-origin ORIGIN to take them",
                logged=f"(403: Origin {printable(repr(origin), 200)})",
            )
        if scope["type"] == "websocket" or "websocket" in headers.get("upgrade", "").lower():
            # RFC 6455: a server that does not take a handshake answers it with an HTTP error, 403 for one
            return Refusal(
                403,
                "this server has no WebSocket endpoint: its API is HTTP (JSON) under /api",
                logged="(403: a WebSocket handshake)",
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
            return Refusal(
                403,
                "corpus editing is off: start the server with `atlas serve --allow-edits`",
                logged="(403: editing is off)",
            )
        if settings.token is not None:
            if bearer_token_matches(headers, settings.token):
                return None
            given = "a wrong token" if "authorization" in headers else "no token"
            return Refusal(
                401,
                "editing needs the header `Authorization: Bearer <token>` with the server's token "
                "(--token or ATLAS_TOKEN)",
                {"WWW-Authenticate": "Bearer"},
                logged=f"with {given}",
            )
        address = (scope.get("client") or ("", 0))[0]
        if not is_loopback_address(address):  # edits_without_token: this machine only
            return Refusal(
                403, "this server takes edits without a token from this machine only", logged="(not loopback)"
            )
        return None
