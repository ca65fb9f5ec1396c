"""Request and response bodies of the `atlas serve` API (pydantic), with the server's size limits.

The published OpenAPI schema is the contract: every rule the server enforces on a request is
declared here, so that it is in the schema (`/openapi.json`) and a client generated from it
cannot send what the server refuses. Lengths, ranges, non-blank strings, ids without white
space at either end or line breaks, ids unique in a remove list, and JSON Schema's types (`"k":
true` or `"k": "2"` is not an integer, `"k": 2.0` is; an unknown field is refused). An oversized or malformed
request is refused with a 422 naming the field before any model work starts.

Two rules JSON Schema cannot state as patterns every engine reads alike are spelled out: white
space is Python's (`str.isspace`, what `str.strip` removes), listed character by character, so
that a browser (ECMA-262), Python's `re` and pydantic's Rust `regex` agree on what is blank. And a
passage id named twice in one edit (across add, update and remove) cannot be declared at all
(uniqueness of one field across lists): the server answers it 409 Conflict, as a schema-valid
edit that conflicts with itself, and each operation's 409 response says so. Nor can it state a question
request's reading budget (questions x k x length, `atlas.serve.serve_settings`): over it, a 413.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from common.limits import (  # the limits and the id grammar every front end shares
    BAD_ID,
    ID_RULE,
    MAX_ASK_K,
    MAX_BATCH,
    MAX_ID_CHARS,
    MAX_PASSAGE_CHARS,
    MAX_QUESTION_CHARS,
    MAX_SEARCH_K,
    MAX_TITLE_CHARS,
    NOT_BLANK,
)

# The largest body each kind of request may have: the largest request the schema allows with every
# character spelt `\uXXXX` (6 bytes: what `json.dumps` writes by default for text beyond ASCII), plus
# 64 KiB for the JSON around the strings. An edit: 64 passages added and 64 replaced (id, title,
# text each) and 64 ids removed, about 16.5 MB; a question request: 64 questions, about 0.8 MB.
JSON_CHAR_BYTES = 6
JSON_SLACK_BYTES = 65_536
_PASSAGE_CHARS = MAX_ID_CHARS + MAX_TITLE_CHARS + MAX_PASSAGE_CHARS
MAX_EDIT_BODY_BYTES = JSON_CHAR_BYTES * (2 * MAX_BATCH * _PASSAGE_CHARS + MAX_BATCH * MAX_ID_CHARS) + JSON_SLACK_BYTES
MAX_QUESTION_BODY_BYTES = JSON_CHAR_BYTES * MAX_BATCH * MAX_QUESTION_CHARS + JSON_SLACK_BYTES


MAX_UNKNOWN_FIELD_ERRORS = 3  # unknown fields of one object reported one by one; more: one error for them all


class Strict(BaseModel):
    """A request body: JSON types as declared (no bool or string for an integer), no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _many_unknown_fields_as_one_error(cls, value: Any) -> Any:
        """More than MAX_UNKNOWN_FIELD_ERRORS unknown fields: one error naming the first few and counting them
        all, where pydantic makes one per field (and FastAPI and the error answer then handle each)."""
        if not isinstance(value, dict) or len(value) <= MAX_UNKNOWN_FIELD_ERRORS:
            return value
        unknown = [key for key in value if key not in cls.model_fields]
        if len(unknown) <= MAX_UNKNOWN_FIELD_ERRORS:
            return value
        named = ", ".join(repr(key if len(key) <= 32 else key[:31] + "…") for key in unknown[:MAX_UNKNOWN_FIELD_ERRORS])
        raise ValueError(
            f"extra inputs are not permitted: {len(unknown):,} fields not in the schema ({named}, ...); "
            f"it takes {', '.join(cls.model_fields)}"
        )


def _json_integer(value: Any) -> Any:
    """JSON Schema's integer is a number without a fractional part, 2.0 included (pydantic's
    strict mode refuses that one); booleans and strings stay refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(low: int, high: int) -> Any:
    """An integer in low..high as JSON Schema counts integers (the bounds are declared first, so
    that the schema carries them as minimum / maximum)."""
    return Annotated[int, Field(ge=low, le=high), BeforeValidator(_json_integer)]


def _not_blank(what: str):
    def check(value: str) -> str:
        if re.search(NOT_BLANK, value) is None:  # the published pattern, read by Python's `re`
            raise ValueError(f"the {what} is empty")
        return value

    return AfterValidator(check)


def clean_id(value: str) -> str:
    """`value` when it is a valid passage id, else `ValueError` saying why."""
    if re.search(BAD_ID, value):
        raise ValueError(ID_RULE)
    return value


def _unique(values: list[str]) -> list[str]:
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"each id once; repeated: {', '.join(map(repr, repeated[:5]))}")
    return values


def _text(max_length: int, what: str) -> Any:
    """A string of 1..max_length characters, not all white space (`pattern` in the schema)."""
    return Annotated[
        str, Field(min_length=1, max_length=max_length, json_schema_extra={"pattern": NOT_BLANK}), _not_blank(what)
    ]


ID_SCHEMA: dict[str, Any] = {"not": {"pattern": BAD_ID}}
QuestionText = _text(MAX_QUESTION_CHARS, "question")
QueryText = _text(MAX_QUESTION_CHARS, "query")
PassageId = Annotated[
    str, Field(min_length=1, max_length=MAX_ID_CHARS, json_schema_extra=ID_SCHEMA), AfterValidator(clean_id)
]
PassageText = _text(MAX_PASSAGE_CHARS, "passage text")
Title = Annotated[str, Field(max_length=MAX_TITLE_CHARS)]
AskK = Annotated[integer(1, MAX_ASK_K) | None, Field(default=None)]
SearchK = integer(1, MAX_SEARCH_K)


class AskRequest(Strict):
    """One question; `k`: passages to retrieve and read (default: the run's `reader.n_context`)."""

    question: QuestionText
    k: AskK = None


class BatchAskRequest(Strict):
    """Up to `MAX_BATCH` questions answered together (one forward pass where they fit)."""

    questions: list[QuestionText] = Field(min_length=1, max_length=MAX_BATCH)
    k: AskK = None


class SearchRequest(Strict):
    """Retrieval only: the top-k passages for a query."""

    query: QueryText
    k: SearchK = 5


class Passage(Strict):
    """A passage as the corpus holds it."""

    id: PassageId
    title: Title = ""
    text: PassageText


class PassageUpdate(Strict):
    """New text (and optionally a new title; default: keep it) for an existing passage."""

    title: Title | None = None
    text: PassageText


class PassageReplacement(PassageUpdate):
    """An update inside a batch edit: the id of the passage to replace, its new text (and title)."""

    id: PassageId


class AddRequest(Strict):
    """New passages (ids not in the index yet, each once)."""

    passages: list[Passage] = Field(min_length=1, max_length=MAX_BATCH)


class EditRequest(Strict):
    """Adds, updates (replace the passage with this id) and removals, applied as one commit.

    At least one of the three lists is non-empty, and an id appears once in the whole edit."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [{"required": [key], "properties": {key: {"minItems": 1}}} for key in ("add", "update", "remove")]
        }
    )

    add: list[Passage] = Field(default_factory=list, max_length=MAX_BATCH)
    update: list[PassageReplacement] = Field(default_factory=list, max_length=MAX_BATCH)
    remove: Annotated[
        list[PassageId],
        Field(default_factory=list, max_length=MAX_BATCH, json_schema_extra={"uniqueItems": True}),
        AfterValidator(_unique),
    ]

    @model_validator(mode="after")
    def _not_empty(self) -> EditRequest:
        if not (self.add or self.update or self.remove):
            raise ValueError("the edit is empty: give passages to add or update, or ids to remove")
        return self


class SearchHit(BaseModel):
    """One retrieved passage."""

    id: str
    title: str
    text: str
    score: float


class Evidence(SearchHit):
    """A passage the reader read, with its retrieval score and its share of the reader's
    cross-attention (attention × value norm, summed over the answer's tokens; shares sum to 1)."""

    attention: float | None = None


class Citation(BaseModel):
    """Where the answer's words stand in a passage read (`tasks.citations.Citation`): `passage_id`'s `field`
    ("title" or "text") holds them at the character offsets `[start, end)`; `quote` is that field's text there.
    Offsets count Unicode code points (Python's `str` indices): JavaScript's UTF-16 string indices differ from
    them past the Basic Multilingual Plane."""

    passage_id: str
    field: Literal["title", "text"]
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    quote: str


class AskResponse(BaseModel):
    """The answer, the passages read (best retrieval score first), the one attended to most, and where the
    answer's words stand in them."""

    question: str
    answer: str
    k: int
    evidence: list[Evidence]
    attended: str | None = Field(description="id of the passage the reader attended to most")
    citations: list[Citation] = Field(
        description="every place the passages read hold the answer, the most attended passage first; "
        "empty when none does (or when the task's answers are labels, not words of a passage)"
    )
    supported: bool = Field(description="whether a passage read holds the answer (there is a citation)")
    generation: int = Field(description="the index generation the answer was read from")
    batch_size: int = Field(description="questions in the forward pass that answered this one")
    latency_ms: float


class BatchAskResponse(BaseModel):
    """One `AskResponse` per question, in order."""

    answers: list[AskResponse]


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
    dead_rows: int = Field(description="rows of removed or replaced passages still in the index files")
    segments: int = Field(description="corpus segments of the index (one per edit until a compaction)")
    compactions: int = Field(description="compactions swapped in since the server started")
    uptime_s: float
    edits_allowed: bool


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body: one readable message (and, for invalid bodies, the first fields at fault and how many
    more there are)."""

    detail: str
    errors: list[dict] | None = None
    more_errors: int | None = Field(None, description="errors of an invalid body beyond those in `errors`")
