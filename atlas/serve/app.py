"""The `atlas serve` web application: JSON API under /api, the page at /, the OpenAPI schema at /openapi.json.

`create_app(service, settings)` takes an already loaded `AtlasService` and a `ServeSettings`, so that
tests drive the same app in-process (`fastapi.testclient.TestClient`) that `atlas serve` runs under
uvicorn (connections.py). It adds the request guard (guard.py: header size, Host, Origin, who may
edit, JSON bodies, body sizes, security headers, the refusals' log), the error handlers and the body
parser (errors.py: small answers whatever the body, a reason and a position for every body that is
not JSON) and three groups of routes (questions, corpus, server), each built by its own function;
request and response bodies are declared in schemas.py, micro-batching of questions is batcher.py's.

The OpenAPI schema is the contract (tests/atlas/test_serve_contract.py checks it with a
property-based tester): request bodies declare every rule the server enforces that JSON Schema can
state (schemas.py), each operation lists the error statuses it can answer and why, and a method a
path does not serve is answered 405 with an `Allow` header naming every method the path does serve
(Starlette names only those of the first route that matches the path). One rule the schema cannot
state: a question request's reading cost (settings.py, a product of three fields) over the
budget is answered 413. There is no try-it page at /docs: Swagger UI loads its code from a CDN,
which the Content-Security-Policy refuses and an offline machine cannot reach.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from contextlib import asynccontextmanager
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Request
from fastapi import Path as PathParameter
from fastapi.responses import FileResponse, JSONResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from pydantic import AfterValidator
from starlette.datastructures import Headers
from starlette.routing import Match
from starlette.types import Scope

from atlas.serve.batcher import MicroBatcher, QueueFull
from atlas.serve.errors import MAX_JSON_DEPTH, JSONBodyRoute, add_error_handlers
from atlas.serve.guard import RequestGuard, access_log, bearer_token_matches, client_name
from atlas.serve.schemas import (
    ID_SCHEMA,
    MAX_EDIT_BODY_BYTES,
    MAX_ID_CHARS,
    MAX_QUESTION_BODY_BYTES,
    AddRequest,
    AskRequest,
    AskResponse,
    BatchAskRequest,
    BatchAskResponse,
    EditRequest,
    EditResponse,
    ErrorResponse,
    Health,
    Passage,
    PassageUpdate,
    SearchRequest,
    SearchResponse,
    clean_id,
)
from atlas.serve.serve_settings import ServeSettings, question_cost
from atlas.serve.service import (
    AtlasService,
    EditsConflict,
    EditsRefused,
    IndexBusy,
    PassageExists,
    PassageNotFound,
    Question,
)

STATIC = Path(__file__).resolve().parent / "static"
WHY = {
    400: f"the body is not JSON (not UTF-8, a syntax error, NaN, nested deeper than {MAX_JSON_DEPTH} levels, an "
    "integer of more digits than the parser converts); `detail` gives the reason and the position",
    401: "editing needs the header `Authorization: Bearer <token>` with the server's token",
    403: "the request comes from a page of another origin; for an edit: editing is off (start the server with "
    "--allow-edits), or a server without a token takes edits from its own machine only",
    404: "no live passage has this id",
    409: "an added id is already live, or the edit names one passage twice (add, update and remove together)",
    413: "the body is over the size limit; for questions: or their reading cost is over the budget of one request",
    415: "the body is not `application/json`",
    421: "the `Host` header names a host this server does not answer to, or no host at all (`[::1]evil`)",
    422: "a field breaks the schema; `detail` names it (the first errors, and how many more: `more_errors`)",
    431: "the request line and headers are over the server's limit (--max-header-bytes)",
    503: "the server is busy (the question queue is full, or another process is updating the index); "
    "try again after `Retry-After` seconds",
    504: "the answer was not ready within the server's deadline",
}


def _errors(*statuses: int) -> dict:
    """The error responses an operation can answer, each with its body model and why."""
    return {status: {"model": ErrorResponse, "description": WHY[status]} for status in statuses}


ANY_ERRORS = _errors(403, 421, 431)  # header size, Host and Origin: every operation
QUESTION_ERRORS = _errors(400, 403, 413, 415, 421, 422, 431, 503, 504)
READ_ERRORS = _errors(403, 404, 421, 422, 431)
EDIT_ERRORS = _errors(400, 401, 403, 404, 409, 413, 415, 421, 422, 431, 503)
# the id in /api/passages/{passage_id}: the rules of a passage id in a body; `:path` so that an id with a `/` is one
PathId = Annotated[
    str, PathParameter(min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=ID_SCHEMA), AfterValidator(clean_id)
]


def without_paths(value: Any) -> Any:
    """`value` (JSON-like) with every absolute path replaced by its last component."""
    if isinstance(value, dict):
        return {key: without_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_paths(item) for item in value]
    if isinstance(value, str) and (PurePosixPath(value).is_absolute() or PureWindowsPath(value).is_absolute()):
        return PurePosixPath(value.replace("\\", "/")).name
    return value


def create_app(service: AtlasService, settings: ServeSettings | None = None, **changes: Any) -> FastAPI:
    """The FastAPI app serving `service` under `settings` (default `ServeSettings()`), with `changes` to its
    fields (`create_app(service, allow_edits=True, token=TOKEN)`); edits need a token, or
    `edits_without_token=True` (taken from loopback clients only)."""
    settings = dataclasses.replace(settings or ServeSettings(), **changes)
    batcher: MicroBatcher[Question, dict] = MicroBatcher(
        service.answer,
        executor=service.model_executor,
        max_batch=settings.max_batch,
        window_ms=settings.batch_window_ms,
        max_queue=settings.max_queue,
        cost=lambda question: question_cost(question.question, question.k),
        max_cost=settings.max_batch_cost,
        light_cost=settings.light_request_cost,
        max_seconds=settings.max_batch_seconds,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(
        title="atlas",
        summary="Ask a retrieval-augmented reader, see its evidence, edit its corpus.",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    app.state.settings = settings
    app.router.route_class = JSONBodyRoute  # bodies parsed by errors.parse_json_body: every non-JSON one a 400
    add_error_handlers(app)
    # the order routes are added in is the order of the OpenAPI schema's paths
    add_question_routes(app, service, batcher, settings)
    edit_routes = add_corpus_routes(app, service)
    add_server_routes(app, service, settings)

    def editing(scope: Scope) -> bool:
        return any(route.matches(scope)[0] == Match.FULL for route in edit_routes)

    app.add_middleware(
        RequestGuard,
        settings=settings,
        editing=editing,
        body_limit=lambda edit: MAX_EDIT_BODY_BYTES if edit else MAX_QUESTION_BODY_BYTES,
    )
    return app


def add_question_routes(
    app: FastAPI, service: AtlasService, batcher: MicroBatcher[Question, dict], settings: ServeSettings
) -> None:
    """/api/ask, /api/ask/batch (micro-batched on the model thread) and /api/search, each within the budget,
    the queue and the deadline of `settings`."""
    searches_waiting = 0  # searches queued for the model thread (they are bounded by max_queue too)

    async def ask(questions: list[str], k: int | None) -> list[dict]:
        k = k or service.default_k
        cost = sum(question_cost(q, k) for q in questions)
        if cost > settings.max_request_cost:
            raise HTTPException(
                413,
                f"this request's reading costs {cost:,} (k={k} passages for each of {len(questions)} question(s), "
                f"times each question's length in started blocks of 200 characters); the budget of one request "
                f"is {settings.max_request_cost:,} (--max-request-cost): ask fewer questions, a smaller k, or "
                "shorter questions per request",
            )
        started = time.perf_counter()
        try:
            async with asyncio.timeout(settings.request_timeout_s):
                answered = await batcher.submit_many([Question(q, k) for q in questions])
        except QueueFull as e:
            raise HTTPException(503, str(e), headers={"Retry-After": str(e.retry_after_s)}) from None
        except TimeoutError:
            raise HTTPException(
                504,
                f"no answer within {settings.request_timeout_s:g} s (--request-timeout): the server is busy; "
                "try again, or ask fewer questions at once",
            ) from None
        latency_ms = round(1000 * (time.perf_counter() - started), 2)
        return [{**result, "batch_size": size, "latency_ms": latency_ms} for result, size in answered]

    @app.post("/api/ask", response_model=AskResponse, responses=QUESTION_ERRORS, tags=["questions"])
    async def ask_one(body: AskRequest) -> dict:
        """Answer one question from the top-k passages; shows the evidence and the passage attended to most."""
        return (await ask([body.question], body.k))[0]

    @app.post("/api/ask/batch", response_model=BatchAskResponse, responses=QUESTION_ERRORS, tags=["questions"])
    async def ask_batch(body: BatchAskRequest) -> dict:
        """Answer up to 64 questions (`MAX_BATCH`) within the reading budget of one request, micro-batched with
        everything else in flight (a batch takes one question of each waiting request in turn)."""
        return {"answers": await ask(body.questions, body.k)}

    @app.post("/api/search", response_model=SearchResponse, responses=QUESTION_ERRORS, tags=["questions"])
    async def search(body: SearchRequest) -> dict:
        """Retrieval only: the top-k passages for a query, with their scores."""
        nonlocal searches_waiting
        if searches_waiting >= settings.max_queue:
            raise HTTPException(
                503,
                f"the server is busy: {searches_waiting} searches are waiting for the model (--max-queue)",
                headers={"Retry-After": "1"},
            )
        loop = asyncio.get_running_loop()
        searches_waiting += 1
        try:
            async with asyncio.timeout(settings.request_timeout_s):
                return await loop.run_in_executor(service.model_executor, service.search, body.query, body.k)
        except TimeoutError:
            raise HTTPException(
                504, f"no result within {settings.request_timeout_s:g} s (--request-timeout): the server is busy"
            ) from None
        finally:
            searches_waiting -= 1


def add_corpus_routes(app: FastAPI, service: AtlasService) -> list[APIRoute]:
    """/api/passages/{id} (read, replace, remove), /api/passages (add) and /api/edits; every edit runs on the
    service's edit thread and is logged (client, ids, generation). → the editing routes, which the request
    guard checks (edits on, token) before their bodies are read."""

    async def edit(request: Request, **changes) -> dict:
        loop = asyncio.get_running_loop()
        try:
            done = await loop.run_in_executor(service.edit_executor, lambda: service.edit(**changes))
        except PassageNotFound as e:
            raise HTTPException(404, e.args[0]) from None
        except (PassageExists, EditsConflict) as e:
            raise HTTPException(409, str(e)) from None
        except EditsRefused as e:
            raise HTTPException(422, str(e)) from None
        except IndexBusy as e:
            raise HTTPException(503, str(e), headers={"Retry-After": "1"}) from None
        settings: ServeSettings = request.app.state.settings
        access_log.info(
            "edit by %s (%s): added %s updated %s removed %s -> generation %d",
            client_name(request.scope),
            "token" if bearer_token_matches(request.headers, settings.token) else "no token",
            json.dumps(done["added"]),
            json.dumps(done["updated"]),
            json.dumps(done["removed"]),
            done["generation"],
        )
        return done

    @app.get("/api/passages/{passage_id:path}", response_model=Passage, responses=READ_ERRORS, tags=["corpus"])
    async def get_passage(passage_id: PathId) -> dict:
        """The live passage with this id (an id may hold `/`: `/api/passages/a/b` is the passage `a/b`)."""
        try:
            return service.passage(passage_id)
        except PassageNotFound as e:
            raise HTTPException(404, e.args[0]) from None

    @app.post("/api/passages", response_model=EditResponse, responses=EDIT_ERRORS, tags=["corpus"])
    async def add_passages(request: Request, body: AddRequest) -> dict:
        """Add new passages: embedded and indexed at once (one atomic commit)."""
        return await edit(request, add=[p.model_dump() for p in body.passages])

    @app.put("/api/passages/{passage_id:path}", response_model=EditResponse, responses=EDIT_ERRORS, tags=["corpus"])
    async def update_passage(request: Request, passage_id: PathId, body: PassageUpdate) -> dict:
        """Replace a passage's text (and title): re-embedded and indexed at once (one atomic commit)."""
        return await edit(request, update=[{"id": passage_id, **body.model_dump()}])

    @app.delete("/api/passages/{passage_id:path}", response_model=EditResponse, responses=EDIT_ERRORS, tags=["corpus"])
    async def remove_passage(request: Request, passage_id: PathId) -> dict:
        """Remove a passage from the index."""
        return await edit(request, remove=[passage_id])

    @app.post("/api/edits", response_model=EditResponse, responses=EDIT_ERRORS, tags=["corpus"])
    async def apply_edits(request: Request, body: EditRequest) -> dict:
        """Adds, updates and removals together, as one atomic commit (all or nothing)."""
        return await edit(
            request,
            add=[p.model_dump() for p in body.add],
            update=[p.model_dump() for p in body.update],
            remove=body.remove,
        )

    endpoints = {add_passages, update_passage, remove_passage, apply_edits}
    return [route for route in app.router.routes if isinstance(route, APIRoute) and route.endpoint in endpoints]


def add_server_routes(app: FastAPI, service: AtlasService, settings: ServeSettings) -> None:
    """/api/health, /api/info, the page at / and its static files."""

    @app.get("/api/health", response_model=Health, responses=ANY_ERRORS, tags=["server"])
    async def health() -> dict:
        """Liveness, live passages and the index generation being served."""
        return {**service.health(), "edits_allowed": settings.allow_edits}

    @app.get("/api/info", responses=ANY_ERRORS, tags=["server"])
    async def info(request: Request) -> dict:
        """The loaded run (reader, encoder fingerprint, index type and size) and the serving settings. File
        paths are shown whole to a request with the server's token, else only their last component."""
        description = service.known_description()  # the model thread hashes the encoder once per generation
        if description is None:
            description = await asyncio.get_running_loop().run_in_executor(service.model_executor, service.describe)
        if not bearer_token_matches(Headers(scope=request.scope), settings.token):
            description = without_paths(description)
        return {**description, "serving": {**settings.public(), "default_k": service.default_k}}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/docs", include_in_schema=False)
    async def no_try_it_page() -> JSONResponse:
        return JSONResponse(
            {
                "detail": "no try-it page here (Swagger UI would load its code from a CDN): the API's schema is "
                "at /openapi.json, and its reference in the documentation (docs/reference/http.md)"
            },
            404,
        )

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
