"""The `atlas serve` web application: JSON API under /api, the page at /, OpenAPI at /docs.

`create_app(service, ...)` takes an already loaded `AtlasService`, so that tests drive the
same app in-process (`fastapi.testclient.TestClient`) that `atlas serve` runs under uvicorn.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from atlas.serve.batcher import MicroBatcher
from atlas.serve.schemas import (
    MAX_BODY_BYTES,
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
)
from atlas.serve.service import AtlasService, EditsRefused, PassageExists, PassageNotFound, Question

STATIC = Path(__file__).resolve().parent / "static"
ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 409, 413, 422)}


def create_app(service: AtlasService, *, allow_edits: bool = False, token: str | None = None,
               max_batch: int = 32, batch_window_ms: float = 5.0) -> FastAPI:
    """The FastAPI app serving `service`.

    allow_edits: enable the corpus-editing endpoints (else they answer 403). token: when set,
    editing requests need `Authorization: Bearer TOKEN` (`atlas serve` requires one when it
    listens beyond loopback). max_batch, batch_window_ms: micro-batching of questions (a batch
    closes when full or `batch_window_ms` after its first question; `max_batch=1`: none).
    """
    batcher: MicroBatcher[Question, dict] = MicroBatcher(
        service.answer, executor=service.model_executor, max_batch=max_batch, window_ms=batch_window_ms)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="atlas", summary="Ask a retrieval-augmented reader, see its evidence, edit its corpus.",
                  version="1", lifespan=lifespan, max_body_size=MAX_BODY_BYTES)
    app.state.service = service

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        # one readable line first ("body.question: Value error, the question is empty"), then the detail
        errors = [{"loc": [str(part) for part in e.get("loc", ())], "msg": str(e.get("msg", "")),
                   "type": str(e.get("type", ""))} for e in error.errors()]
        broken = next((e for e in error.errors() if e.get("type") == "json_invalid"), None)
        if broken is not None:  # not JSON at all: a 400, with the parser's reason and position
            reason = (broken.get("ctx") or {}).get("error", "")
            return JSONResponse(status_code=400, content={
                "detail": f"malformed JSON body: {reason} (at character {broken['loc'][-1]})", "errors": errors})
        message = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors) or "invalid request"
        return JSONResponse(status_code=422, content={"detail": message, "errors": errors})

    def editing(request: Request) -> None:
        """Dependency of every editing endpoint: edits on, and the bearer token when one is set."""
        if not allow_edits:
            raise HTTPException(403, "corpus editing is off: start the server with `atlas serve --allow-edits`")
        if token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), token.encode()):
            raise HTTPException(401, "editing needs the header `Authorization: Bearer <token>` with the "
                                     "server's token (--token or ATLAS_TOKEN)", headers={"WWW-Authenticate": "Bearer"})

    async def ask_one(question: str, k: int | None) -> dict:
        started = time.perf_counter()
        result, batch_size = await batcher.submit(Question(question, k or service.default_k))
        return {**result, "batch_size": batch_size, "latency_ms": round(1000 * (time.perf_counter() - started), 2)}

    async def edit(**changes) -> dict:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(service.edit_executor, lambda: service.edit(**changes))
        except PassageNotFound as e:
            raise HTTPException(404, e.args[0]) from None
        except PassageExists as e:
            raise HTTPException(409, str(e)) from None
        except EditsRefused as e:
            raise HTTPException(422, str(e)) from None

    @app.post("/api/ask", response_model=AskResponse, responses=ERRORS, tags=["questions"])
    async def ask(body: AskRequest) -> dict:
        """Answer one question from the top-k passages; shows the evidence and the passage attended to most."""
        return await ask_one(body.question, body.k)

    @app.post("/api/ask/batch", response_model=BatchAskResponse, responses=ERRORS, tags=["questions"])
    async def ask_batch(body: BatchAskRequest) -> dict:
        """Answer up to 64 questions (`MAX_BATCH`), micro-batched with everything else in flight."""
        return {"answers": await asyncio.gather(*(ask_one(q, body.k) for q in body.questions))}

    @app.post("/api/search", response_model=SearchResponse, responses=ERRORS, tags=["questions"])
    async def search(body: SearchRequest) -> dict:
        """Retrieval only: the top-k passages for a query, with their scores."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(service.model_executor, service.search, body.query, body.k)

    @app.get("/api/passages/{passage_id}", response_model=Passage, responses=ERRORS, tags=["corpus"])
    async def get_passage(passage_id: str) -> dict:
        """The live passage with this id."""
        try:
            return service.passage(passage_id)
        except PassageNotFound as e:
            raise HTTPException(404, e.args[0]) from None

    @app.post("/api/passages", response_model=EditResponse, responses=ERRORS, tags=["corpus"],
              dependencies=[Depends(editing)])
    async def add_passages(body: AddRequest) -> dict:
        """Add new passages: embedded and indexed at once (one atomic commit)."""
        return await edit(add=[p.model_dump() for p in body.passages])

    @app.put("/api/passages/{passage_id}", response_model=EditResponse, responses=ERRORS, tags=["corpus"],
             dependencies=[Depends(editing)])
    async def update_passage(passage_id: str, body: PassageUpdate) -> dict:
        """Replace a passage's text (and title): re-embedded and indexed at once (one atomic commit)."""
        return await edit(update=[{"id": passage_id, **body.model_dump()}])

    @app.delete("/api/passages/{passage_id}", response_model=EditResponse, responses=ERRORS, tags=["corpus"],
                dependencies=[Depends(editing)])
    async def remove_passage(passage_id: str) -> dict:
        """Remove a passage from the index."""
        return await edit(remove=[passage_id])

    @app.post("/api/edits", response_model=EditResponse, responses=ERRORS, tags=["corpus"],
              dependencies=[Depends(editing)])
    async def apply_edits(body: EditRequest) -> dict:
        """Adds, updates and removals together, as one atomic commit (all or nothing)."""
        return await edit(add=[p.model_dump() for p in body.add], update=[p.model_dump() for p in body.update],
                          remove=body.remove)

    @app.get("/api/health", response_model=Health, tags=["server"])
    async def health() -> dict:
        """Liveness, live passages and the index generation being served."""
        return {**service.health(), "edits_allowed": allow_edits}

    @app.get("/api/info", tags=["server"])
    async def info() -> dict:
        """The loaded run (reader, encoder fingerprint, index type and size) and the serving settings."""
        loop = asyncio.get_running_loop()
        description = await loop.run_in_executor(service.model_executor, service.describe)
        return {**description, "serving": {"edits_allowed": allow_edits, "token_required": token is not None,
                                           "max_batch": max_batch, "batch_window_ms": batch_window_ms,
                                           "default_k": service.default_k}}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
