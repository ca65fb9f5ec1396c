"""Request and response bodies of the `atlas serve` API (pydantic), with the server's size limits.

Every field that a client sends is bounded here, so that an oversized or empty request is
refused with a 422 naming the field before any model work starts.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

MAX_QUESTION_CHARS = 2_000
MAX_PASSAGE_CHARS = 20_000
MAX_TITLE_CHARS = 1_000
MAX_ID_CHARS = 256
MAX_BATCH = 64  # questions of one batch ask, passages of one edit
MAX_ASK_K = 20  # passages the reader reads
MAX_SEARCH_K = 100
MAX_BODY_BYTES = 4 * MAX_BATCH * MAX_PASSAGE_CHARS  # room for 64 passages of 20,000 UTF-8 characters


def _not_blank(what: str):
    def check(value: str) -> str:
        if not value.strip():
            raise ValueError(f"the {what} is empty")
        return value

    return AfterValidator(check)


def _clean_id(value: str) -> str:
    if value != value.strip() or "\n" in value:
        raise ValueError("a passage id has no leading/trailing white space and no line break")
    return value


QuestionText = Annotated[str, Field(max_length=MAX_QUESTION_CHARS), _not_blank("question")]
PassageId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS), AfterValidator(_clean_id)]
PassageText = Annotated[str, Field(max_length=MAX_PASSAGE_CHARS), _not_blank("passage text")]
Title = Annotated[str, Field(max_length=MAX_TITLE_CHARS)]
AskK = Annotated[int | None, Field(default=None, ge=1, le=MAX_ASK_K)]


class AskRequest(BaseModel):
    """One question; `k`: passages to retrieve and read (default: the run's `reader.n_context`)."""

    question: QuestionText
    k: AskK = None


class BatchAskRequest(BaseModel):
    """Up to `MAX_BATCH` questions answered together (one forward pass where they fit)."""

    questions: list[QuestionText] = Field(min_length=1, max_length=MAX_BATCH)
    k: AskK = None


class SearchRequest(BaseModel):
    """Retrieval only: the top-k passages for a query."""

    query: Annotated[str, Field(max_length=MAX_QUESTION_CHARS), _not_blank("query")]
    k: int = Field(default=5, ge=1, le=MAX_SEARCH_K)


class Passage(BaseModel):
    """A passage as the corpus holds it."""

    id: PassageId
    title: Title = ""
    text: PassageText


class PassageUpdate(BaseModel):
    """New text (and optionally a new title; default: keep it) for an existing passage."""

    title: Title | None = None
    text: PassageText


class PassageReplacement(PassageUpdate):
    """An update inside a batch edit: the id of the passage to replace, its new text (and title)."""

    id: PassageId


class AddRequest(BaseModel):
    """New passages (ids not in the index yet)."""

    passages: list[Passage] = Field(min_length=1, max_length=MAX_BATCH)


class EditRequest(BaseModel):
    """Adds, updates (replace the passage with this id) and removals, applied as one commit."""

    add: list[Passage] = Field(default_factory=list, max_length=MAX_BATCH)
    update: list[PassageReplacement] = Field(default_factory=list, max_length=MAX_BATCH)
    remove: list[PassageId] = Field(default_factory=list, max_length=MAX_BATCH)


class Evidence(BaseModel):
    """A passage the reader read, with its retrieval score and its share of the reader's
    cross-attention (attention × value norm, summed over the answer's tokens; shares sum to 1)."""

    id: str
    title: str
    text: str
    score: float
    attention: float | None = None


class AskResponse(BaseModel):
    """The answer, the passages read (best retrieval score first) and the one attended to most."""

    question: str
    answer: str
    k: int
    evidence: list[Evidence]
    attended: str | None = Field(description="id of the passage the reader attended to most")
    generation: int = Field(description="the index generation the answer was read from")
    batch_size: int = Field(description="questions in the forward pass that answered this one")
    latency_ms: float


class BatchAskResponse(BaseModel):
    """One `AskResponse` per question, in order."""

    answers: list[AskResponse]


class SearchHit(BaseModel):
    """One retrieved passage."""

    id: str
    title: str
    text: str
    score: float


class SearchResponse(BaseModel):
    """The top-k passages for a query, best first."""

    query: str
    hits: list[SearchHit]
    generation: int


class EditResponse(BaseModel):
    """What an edit changed; `generation`: the index generation it committed."""

    added: list[str]
    updated: list[str]
    removed: list[str]
    count: int = Field(description="live passages after the edit")
    generation: int


class Health(BaseModel):
    """Liveness and the state being served."""

    status: str
    passages: int
    generation: int
    uptime_s: float
    edits_allowed: bool


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body: one readable message (and, for invalid bodies, the fields at fault)."""

    detail: str
    errors: list[dict] | None = None
