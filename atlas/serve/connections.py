"""The connection layer of `atlas serve`: uvicorn over h11, with a read deadline and a connection cap.

What uvicorn (0.54) offers and what it does not, hence this file:
- `timeout_keep_alive` closes a connection idle *after* a response (`ServeSettings.keep_alive_s`),
  but nothing bounds how long a client takes to send a request: a connection that never sends, or
  sends a header line every few seconds, or a 37-byte body over a minute, is waited for. So each
  connection here has a deadline, `read_timeout_s`, from the moment it opens (or its last response
  ends) to the end of its request's body; past it the connection is closed (the route, if one is
  reading the body, sees the client disconnect).
- `limit_concurrency` answers requests beyond the cap with a text/plain 503; here a request on a
  connection beyond `max_connections` gets the server's JSON 503 (with `Retry-After`) and the
  connection is closed, so the cap holds and every error stays JSON.
- `h11_max_incomplete_event_size` bounds the request line and headers (`max_header_bytes`) only while
  they are incomplete: h11 checks its buffer when it waits for more, so a block over the limit that
  arrives whole passes (the request guard counts those, guard.py). uvicorn answers what h11 refuses with
  a plain-text 400; here that answer is JSON with the security headers, and 431 when it is the header
  limit, as the guard answers a whole block over it.
The protocol is h11's (`uvicorn.protocols.http.h11_impl.H11Protocol`), named explicitly so that
installing httptools does not silently swap in a protocol without these bounds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re

import h11
import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from atlas.serve.guard import SECURITY_HEADERS
from atlas.serve.serve_settings import ServeSettings

logger = logging.getLogger(__name__)


async def _over_the_cap(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer to a request on a connection beyond the cap: 503 JSON, then the connection closes."""
    response = JSONResponse(
        {"detail": "the server has as many connections open as it takes (--max-connections); try again"},
        503,
        headers={"Retry-After": "1", "Connection": "close"},
    )
    await response(scope, receive, send)


def guarded_protocol(settings: ServeSettings) -> type[H11Protocol]:
    """uvicorn's h11 protocol with `settings.read_timeout_s` per request and `settings.max_connections`."""

    class GuardedH11Protocol(H11Protocol):
        _read_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > settings.max_connections:
                self.app = _over_the_cap  # this connection only
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
                self._disarm()  # the whole request is in: what follows is the server's time, not the client's

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # the next request on this connection has its own deadline

        def _arm(self) -> None:
            self._disarm()
            self._read_deadline = self.loop.call_later(settings.read_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None

        def send_400_response(self, msg: str) -> None:
            # uvicorn calls this for every request h11 refuses (then the connection closes). h11 refuses a header
            # block over its limit while it waits for the block's end; what it holds of the block tells which refusal
            head = re.split(rb"\n\r?\n", self.conn.trailing_data[0], maxsplit=1)[0]
            limit = settings.max_header_bytes
            status, detail = 400, "the request is not valid HTTP/1.1"
            if len(head) > limit:
                status, detail = 431, f"the request line and headers are over {limit:,} bytes (--max-header-bytes)"
            body = json.dumps({"detail": detail}).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *SECURITY_HEADERS,
            ]
            for event in (h11.Response(status_code=status, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

        def _too_slow(self) -> None:
            self._read_deadline = None
            if not self.transport.is_closing():
                client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
                logger.warning("closed %s's connection: no whole request in %.1f s", client, settings.read_timeout_s)
                self.transport.close()

    return GuardedH11Protocol


def uvicorn_config(app: ASGIApp, settings: ServeSettings, *, host: str, port: int, **options) -> uvicorn.Config:
    """The uvicorn configuration `atlas serve` runs `app` with (options: more uvicorn settings, e.g. log_level)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(settings),
        timeout_keep_alive=settings.keep_alive_s,
        h11_max_incomplete_event_size=settings.max_header_bytes,
        **options,
    )
