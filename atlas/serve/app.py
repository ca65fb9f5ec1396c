"""The `atlas serve` web application: JSON API under /api, the page at /, OpenAPI at /docs.

`create_app(service, ...)` takes an already loaded `AtlasService`, so that tests drive the
same app in-process (`fastapi.testclient.TestClient`) that `atlas serve` runs under uvicorn. It
adds the error handlers and three groups of routes (questions, corpus, server), each built by
its own function; request and response bodies are declared in schemas.py, micro-batching of
questions is batcher.py's.

The OpenAPI schema is the contract (tests/atlas/test_serve_contract.py checks it with a
property-based tester): request bodies declare every rule the server enforces (schemas.py),
each operation lists the error statuses it can answer and why, and a method a path does not
serve is answered 405 with an `Allow` header naming every method the path does serve (Starlette
names only those of the first route that matches the path).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi import Path as PathParameter
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import AfterValidator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from atlas.serve.batcher import MicroBatcher
from atlas.serve.schemas import (
    ID_SCHEMA,
    MAX_BODY_BYTES,
    MAX_ID_CHARS,
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
    400: "the body is not JSON",
    401: "editing needs the header `Authorization: Bearer <token>` with the server's token",
    403: "corpus editing is off (start the server with --allow-edits)",
    404: "no live passage has this id",
    409: "an added id is already live, or the edit names one passage twice (add, update and remove together)",
    413: "the body is over the size limit",
    422: "a field breaks the schema; `detail` names it",
    503: "another process is updating the index; try again",
}


def _errors(*statuses: int) -> dict:
    """The error responses an operation can answer, each with its body model and why."""
    return {status: {"model": ErrorResponse, "description": WHY[status]} for status in statuses}


QUESTION_ERRORS = _errors(400, 413, 422)
READ_ERRORS = _errors(404, 422)
EDIT_ERRORS = _errors(400, 401, 403, 404, 409, 413, 422, 503)
# the id in /api/passages/{passage_id}: the rules of a passage id in a body
PathId = Annotated[
    str, PathParameter(min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=ID_SCHEMA), AfterValidator(clean_id)
]


def allowed_methods(app: FastAPI, scope: dict) -> list[str]:
    """Every method that some route of `app` serves at the path of `scope`."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return sorted(methods)


@dataclass(frozen=True)
class ServingSettings:
    """How the app serves (reported by /api/info).

    allow_edits: the corpus-editing endpoints are on (else they answer 403). token: when set, editing
    requests need `Authorization: Bearer TOKEN`. max_batch, batch_window_ms: micro-batching of questions.
    """

    allow_edits: bool
    token: str | None
    max_batch: int
    batch_window_ms: float


def create_app(
    service: AtlasService,
    *,
    allow_edits: bool = False,
    token: str | None = None,
    max_batch: int = 32,
    batch_window_ms: float = 5.0,
) -> FastAPI:
    """The FastAPI app serving `service`.

    allow_edits: enable the corpus-editing endpoints (else they answer 403). token: when set,
    editing requests need `Authorization: Bearer TOKEN` (`atlas serve` requires one when it
    listens beyond loopback). max_batch, batch_window_ms: micro-batching of questions (a batch
    closes when full or `batch_window_ms` after its first question; `max_batch=1`: none).
    """
    settings = ServingSettings(allow_edits, token, max_batch, batch_window_ms)
    batcher: MicroBatcher[Question, dict] = MicroBatcher(
        service.answer, executor=service.model_executor, max_batch=max_batch, window_ms=batch_window_ms
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
        max_body_size=MAX_BODY_BYTES,
    )
    app.state.service = service
    add_error_handlers(app)
    # the order routes are added in is the order of the OpenAPI schema's paths
    add_question_routes(app, service, batcher)
    add_corpus_routes(app, service, editing_guard(settings))
    add_server_routes(app, service, settings)
    return app


def add_error_handlers(app: FastAPI) -> None:
    """405 with every method the path serves; invalid bodies as one readable line (400 for non-JSON)."""

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
        # one readable line first ("body.question: Value error, the question is empty"), then the detail
        errors = [
            {
                "loc": [str(part) for part in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in error.errors()
        ]
        broken = next((e for e in error.errors() if e.get("type") == "json_invalid"), None)
        if broken is not None:  # not JSON at all: a 400, with the parser's reason and position
            reason = (broken.get("ctx") or {}).get("error", "")
            return JSONResponse(
                status_code=400,
                content={
                    "detail": f"malformed JSON body: {reason} (at character {broken['loc'][-1]})",
                    "errors": errors,
                },
            )
        message = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors) or "invalid request"
        return JSONResponse(status_code=422, content={"detail": message, "errors": errors})


def editing_guard(settings: ServingSettings) -> Callable[[Request], None]:
    """The dependency of every editing endpoint: edits on, and the bearer token when one is set."""

    def editing(request: Request) -> None:
        if not settings.allow_edits:
            raise HTTPException(403, "corpus editing is off: start the server with `atlas serve --allow-edits`")
        if settings.token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), settings.token.encode()):
            raise HTTPException(
                401,
                "editing needs the header `Authorization: Bearer <token>` with the "
                "server's token (--token or ATLAS_TOKEN)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return editing


def add_question_routes(app: FastAPI, service: AtlasService, batcher: MicroBatcher[Question, dict]) -> None:
    """/api/ask, /api/ask/batch (micro-batched on the model thread) and /api/search."""

    async def ask_one(question: str, k: int | None) -> dict:
        started = time.perf_counter()
        result, batch_size = await batcher.submit(Question(question, k or service.default_k))
        return {**result, "batch_size": batch_size, "latency_ms": round(1000 * (time.perf_counter() - started), 2)}

    @app.post("/api/ask", response_model=AskResponse, responses=QUESTION_ERRORS, tags=["questions"])
    async def ask(body: AskRequest) -> dict:
        """Answer one question from the top-k passages; shows the evidence and the passage attended to most."""
        return await ask_one(body.question, body.k)

    @app.post("/api/ask/batch", response_model=BatchAskResponse, responses=QUESTION_ERRORS, tags=["questions"])
    async def ask_batch(body: BatchAskRequest) -> dict:
        """Answer up to 64 questions (`MAX_BATCH`), micro-batched with everything else in flight."""
        return {"answers": await asyncio.gather(*(ask_one(q, body.k) for q in body.questions))}

    @app.post("/api/search", response_model=SearchResponse, responses=QUESTION_ERRORS, tags=["questions"])
    async def search(body: SearchRequest) -> dict:
        """Retrieval only: the top-k passages for a query, with their scores."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(service.model_executor, service.search, body.query, body.k)


def add_corpus_routes(app: FastAPI, service: AtlasService, editing: Callable[[Request], None]) -> None:
    """/api/passages/{id} (read, replace, remove), /api/passages (add) and /api/edits; every edit runs on the
    service's edit thread, and `editing` guards each one."""

    async def edit(**changes) -> dict:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(service.edit_executor, lambda: service.edit(**changes))
        except PassageNotFound as e:
            raise HTTPException(404, e.args[0]) from None
        except (PassageExists, EditsConflict) as e:
            raise HTTPException(409, str(e)) from None
        except EditsRefused as e:
            raise HTTPException(422, str(e)) from None
        except IndexBusy as e:
            raise HTTPException(503, str(e), headers={"Retry-After": "1"}) from None

    @app.get("/api/passages/{passage_id}", response_model=Passage, responses=READ_ERRORS, tags=["corpus"])
    async def get_passage(passage_id: PathId) -> dict:
        """The live passage with this id."""
        try:
            return service.passage(passage_id)
        except PassageNotFound as e:
            raise HTTPException(404, e.args[0]) from None

    @app.post(
        "/api/passages",
        response_model=EditResponse,
        responses=EDIT_ERRORS,
        tags=["corpus"],
        dependencies=[Depends(editing)],
    )
    async def add_passages(body: AddRequest) -> dict:
        """Add new passages: embedded and indexed at once (one atomic commit)."""
        return await edit(add=[p.model_dump() for p in body.passages])

    @app.put(
        "/api/passages/{passage_id}",
        response_model=EditResponse,
        responses=EDIT_ERRORS,
        tags=["corpus"],
        dependencies=[Depends(editing)],
    )
    async def update_passage(passage_id: PathId, body: PassageUpdate) -> dict:
        """Replace a passage's text (and title): re-embedded and indexed at once (one atomic commit)."""
        return await edit(update=[{"id": passage_id, **body.model_dump()}])

    @app.delete(
        "/api/passages/{passage_id}",
        response_model=EditResponse,
        responses=EDIT_ERRORS,
        tags=["corpus"],
        dependencies=[Depends(editing)],
    )
    async def remove_passage(passage_id: PathId) -> dict:
        """Remove a passage from the index."""
        return await edit(remove=[passage_id])

    @app.post(
        "/api/edits",
        response_model=EditResponse,
        responses=EDIT_ERRORS,
        tags=["corpus"],
        dependencies=[Depends(editing)],
    )
    async def apply_edits(body: EditRequest) -> dict:
        """Adds, updates and removals together, as one atomic commit (all or nothing)."""
        return await edit(
            add=[p.model_dump() for p in body.add], update=[p.model_dump() for p in body.update], remove=body.remove
        )


def add_server_routes(app: FastAPI, service: AtlasService, settings: ServingSettings) -> None:
    """/api/health, /api/info, the page at / and its static files."""

    @app.get("/api/health", response_model=Health, tags=["server"])
    async def health() -> dict:
        """Liveness, live passages and the index generation being served."""
        return {**service.health(), "edits_allowed": settings.allow_edits}

    @app.get("/api/info", tags=["server"])
    async def info() -> dict:
        """The loaded run (reader, encoder fingerprint, index type and size) and the serving settings."""
        loop = asyncio.get_running_loop()
        description = await loop.run_in_executor(service.model_executor, service.describe)
        return {
            **description,
            "serving": {
                "edits_allowed": settings.allow_edits,
                "token_required": settings.token is not None,
                "max_batch": settings.max_batch,
                "batch_window_ms": settings.batch_window_ms,
                "default_k": service.default_k,
            },
        }

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
