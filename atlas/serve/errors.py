"""What the server answers to a body it cannot take: one JSON shape, small whatever the body.

Every error body is `{"detail": "one readable line", ...}` (`ErrorResponse`, schemas.py). Two kinds of body
need more than FastAPI gives them:

- A body that breaks the schema (422). Pydantic reports every error, and a body of many thousand unknown keys
  has as many. The answer shows the first `SHOWN_ERRORS` (each part a client wrote cut to `SHOWN_CHARS`
  characters) and counts the rest (`more_errors`), and fewer when they would not fit in `MAX_ERROR_BYTES`; and
  `schemas.Strict` reports many unknown fields of one object as one error, so that producing the answer costs a
  few errors, not one per key.
- A body that is not JSON (400). FastAPI's parser (`json.loads`) gives a reason and a position for a syntax
  error only; for a body that is not UTF-8, that nests too deep for its recursion, or that holds an integer
  longer than Python converts, FastAPI answers a generic line. `parse_json_body` (routes of `JSONBodyRoute`)
  answers those too with a reason and a position, and refuses what is not JSON although Python reads it (`NaN`,
  `Infinity`) and JSON nested deeper than `MAX_JSON_DEPTH` (no request the schema allows nests past 3).
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

SHOWN_ERRORS = 3  # validation errors an answer shows; the rest are counted
SHOWN_CHARS = 40  # of a location part (a key a client wrote); a message is cut at SHOWN_MESSAGE_CHARS
SHOWN_MESSAGE_CHARS = 300  # longer than any rule the schema states, so only echoed client text is cut
MAX_ERROR_BYTES = 4096  # an error answer's body at most
MAX_JSON_DEPTH = 32  # arrays and objects nested in each other; a request the schema allows nests 3 deep

# a JSON string (skipped whole, escapes included) or a bracket / a number / a constant Python reads but JSON has not
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_BRACKET_TOKENS = re.compile(rf"{_STRING}|[\[\]{{}}]")
_NUMBER_TOKENS = re.compile(rf"{_STRING}|(?P<integer>-?\d+)(?P<more>(?:\.\d+)?(?:[eE][-+]?\d+)?)")
_CONSTANT_TOKENS = re.compile(rf"{_STRING}|(?P<constant>NaN|-?Infinity)")


def parse_json_body(body: bytes) -> Any:
    """The JSON value of `body`, or `json.JSONDecodeError` (a reason and a character position) for anything that
    is not JSON this server reads: not UTF-8, a syntax error, nested deeper than MAX_JSON_DEPTH, an integer of
    more digits than Python converts, NaN or Infinity."""
    # RFC 8259: UTF-8; a byte order mark first may be ignored, and json.loads does
    skipped = len(codecs.BOM_UTF8) if body.startswith(codecs.BOM_UTF8) else 0
    try:
        text = body[skipped:].decode("utf-8")
    except UnicodeDecodeError as e:
        where = len(body[skipped : skipped + e.start].decode("utf-8"))  # whole characters before the first bad byte
        raise json.JSONDecodeError(
            f"not UTF-8 ({e.reason}: byte 0x{e.object[e.start]:02x} at byte {skipped + e.start})",
            body.decode("utf-8", "replace"),
            where,
        ) from None
    deep = _deeper_than_allowed(text)
    if deep is not None:
        raise json.JSONDecodeError(f"arrays and objects nested deeper than {MAX_JSON_DEPTH} levels", text, deep)
    try:
        return json.loads(text, parse_constant=_not_json)
    except json.JSONDecodeError:
        raise
    except _NotJSON as e:
        raise json.JSONDecodeError(
            f"{e.args[0]} is not JSON", text, _first(_CONSTANT_TOKENS, text, "constant")
        ) from None
    except ValueError:  # an integer longer than int() converts (sys.get_int_max_str_digits)
        limit = sys.get_int_max_str_digits()
        where = next(
            (
                m.start()
                for m in _NUMBER_TOKENS.finditer(text)
                if m["integer"] and not m["more"] and len(m["integer"].lstrip("-")) > limit
            ),
            0,
        )
        raise json.JSONDecodeError(f"an integer of more than {limit:,} digits", text, where) from None


class _NotJSON(ValueError):
    """NaN or Infinity: Python's parser reads them, JSON has no such value."""


def _not_json(constant: str) -> Any:
    raise _NotJSON(constant)


def _first(tokens: re.Pattern, text: str, group: str) -> int:
    """Where the first match of `group` outside a string is in `text` (0 if none)."""
    return next((m.start() for m in tokens.finditer(text) if m[group]), 0)


def _deeper_than_allowed(text: str) -> int | None:
    """The position of the first bracket nested deeper than MAX_JSON_DEPTH, or None. Only a text holding more
    brackets than that is scanned (a question's seldom does; an edit of many passages does, in a time small beside
    embedding them), its strings read whole by the regular expression."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return None
    depth = 0
    for token in _BRACKET_TOKENS.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return token.start()
        elif bracket in "]}":
            depth -= 1
    return None


class JSONBodyRequest(Request):
    """A request whose JSON body is read by `parse_json_body`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json_body(await self.body())
        return self._json


class JSONBodyRoute(APIRoute):
    """A FastAPI route whose body is parsed by `parse_json_body`: FastAPI turns its `JSONDecodeError` into the
    `json_invalid` validation error that `add_error_handlers` answers 400 with the reason and position."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parse_strictly(request: Request) -> Response:
            return await handler(JSONBodyRequest(request.scope, request.receive))

        return parse_strictly


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown_errors(errors: list[dict], shown: int) -> list[dict]:
    """The first `shown` of pydantic's `errors` as the answer shows them: location, message, type, each cut."""
    return [
        {
            "loc": [_short(str(part), SHOWN_CHARS) for part in e.get("loc", ())],
            "msg": _short(str(e.get("msg", "")), SHOWN_MESSAGE_CHARS),
            "type": _short(str(e.get("type", "")), SHOWN_CHARS),
        }
        for e in errors[:shown]
    ]


def validation_answer(errors: list[dict], headline: Callable[[list[dict]], str]) -> dict:
    """The body answering `errors`: `detail` (`headline` of the errors shown), the errors shown, and how many
    more there are; as many errors as fit in MAX_ERROR_BYTES, at most SHOWN_ERRORS, at least one."""
    for shown in range(min(SHOWN_ERRORS, len(errors)), 0, -1):
        listed = shown_errors(errors, shown)
        more = len(errors) - shown
        detail = headline(listed) + (f"; and {more:,} more error{'s' if more > 1 else ''}" if more else "")
        content = {"detail": detail, "errors": listed, "more_errors": more}
        if len(json.dumps(content, ensure_ascii=False).encode()) <= MAX_ERROR_BYTES or shown == 1:
            return content
    return {"detail": headline([]) or "invalid request", "errors": [], "more_errors": len(errors)}


def allowed_methods(app: FastAPI, scope: dict) -> list[str]:
    """Every method that some route of `app` serves at the path of `scope`."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return sorted(methods)


def add_error_handlers(app: FastAPI) -> None:
    """405 with every method the path serves (Starlette names only those of the first route that matches); an
    invalid body as one readable line, at most MAX_ERROR_BYTES (400 for a body that is not JSON, with the
    parser's reason and position; else 422)."""

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code != 405:
            return await http_exception_handler(request, error)
        allow = ", ".join(allowed_methods(app, request.scope))  # every route's, not the first one's
        return JSONResponse(
            status_code=405,
            headers={"Allow": allow},
            content={"detail": f"{request.method} is not served at this path; it serves {allow}"},
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        errors = list(error.errors())
        broken = next((e for e in errors if e.get("type") == "json_invalid"), None)
        if broken is not None:  # not JSON at all: a 400, with the parser's reason and position
            reason = _short(str((broken.get("ctx") or {}).get("error", "")), SHOWN_MESSAGE_CHARS)
            content = validation_answer(
                [broken], lambda _: f"malformed JSON body: {reason} (at character {broken['loc'][-1]})"
            )
            return JSONResponse(status_code=400, content=content)
        # one readable line first ("body.question: Value error, the question is empty"), then the detail
        content = validation_answer(
            errors,
            lambda listed: "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in listed) or "invalid request",
        )
        return JSONResponse(status_code=422, content=content)
