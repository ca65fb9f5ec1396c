"""`Passage`: the one record of a passage read by the reader, from the index's search (or an example's
own passages) through the model, evaluation, serving and the CLI.

It lives in `tasks/`, the bottom package, because every package handles passages: tasks give them
with examples and score provenance from them, the retriever returns them from a search, the reader
reads them and atlas writes them out. Files and the HTTP API keep their own JSON shapes: records are
made from dicts where they are read (`Passage.from_record`) and written as the format says where they
are written (`summary`, `search_record`, `fields`).
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def shorten(text: str, limit: int = 60) -> str:
    """`text` on one line, cut to `limit` characters with "…" where it was longer."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


@dataclass(repr=False)
class Passage:
    """One passage as the reader reads it.

    Attributes:
        id: the passage id (a corpus row's `id`, unique in its index).
        title: the page title ("" where there is none).
        text: the passage text.
        score: the retrieval score, the inner product of the query and passage embeddings; None for a
            passage that was not retrieved (given with its example).
        row: the passage's position in the index (the row of `PassageIndex.embeddings`); None for a
            passage the index does not hold (given with its example, or an excerpt made for it).
        doc_id: the id of the document the corpus cut it from; None where the corpus keeps none.
        wikipedia_id: the Wikipedia page id (KILT provenance); None where the corpus keeps none.
        section: the section of the page it comes from; None where the corpus keeps none.
    """

    id: str
    title: str = ""
    text: str = ""
    score: float | None = None
    row: int | None = None
    doc_id: str | None = None
    wikipedia_id: str | None = None
    section: str | None = None

    def __repr__(self) -> str:
        """Short, for a console: id, title, the start of the text, the score (the whole text is `text`)."""
        score = "" if self.score is None else f", score={self.score:.3f}"
        return f"Passage(id={self.id!r}, title={self.title!r}, text={shorten(self.text)!r}{score})"

    def _repr_html_(self) -> str:
        """For a notebook: the title in bold, the start of the text, the score."""
        score = "" if self.score is None else f" <small>(score {self.score:.3f})</small>"
        title = f"<b>{html.escape(self.title or self.id)}</b>"
        return f"<div>{title}{score}: {html.escape(shorten(self.text, 200))}</div>"

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Passage:
        """A passage from a dict (a corpus row, a JSON line, an example's own passage).

        Keys that are not fields are left out; "" in an optional string field (how corpora store a
        missing value) becomes None. `id` is required: a `KeyError` names it where it is missing.
        """
        if "id" not in record:
            raise KeyError(f"a passage needs an 'id' (it has {', '.join(map(repr, record)) or 'no keys'})")
        score, row = record.get("score"), record.get("row")
        return cls(
            id=str(record["id"]),
            title=str(record.get("title") or ""),
            text=str(record.get("text") or ""),
            score=None if score is None else float(score),
            row=None if row is None or int(row) < 0 else int(row),
            **{name: _optional_str(record.get(name)) for name in ("doc_id", "wikipedia_id", "section")},
        )

    def fields(self) -> dict[str, str]:
        """The text fields a format template names (`reader.passage_format`, `retriever.passage_format`):
        id, title, text, doc_id, wikipedia_id and section, "" where a field is None."""
        return {
            "id": self.id,
            "title": self.title,
            "text": self.text,
            "doc_id": self.doc_id or "",
            "wikipedia_id": self.wikipedia_id or "",
            "section": self.section or "",
        }

    def summary(self) -> dict[str, Any]:
        """The passage as `predictions.jsonl` lists it: {id, score, title, wikipedia_id (where known)}."""
        return {
            "id": self.id,
            "score": self.score,
            "title": self.title,
            **({"wikipedia_id": self.wikipedia_id} if self.wikipedia_id else {}),
        }

    def search_record(self) -> dict[str, Any]:
        """The passage as `atlas index search --json` prints a hit: every field, "" for a missing string."""
        return {
            "id": self.id,
            "score": self.score,
            "title": self.title,
            "text": self.text,
            "row": self.row,
            "wikipedia_id": self.wikipedia_id or "",
            "doc_id": self.doc_id or "",
            "section": self.section or "",
        }


# the field names, e.g. for an option that names one (`KiltTask`'s `provenance_key`)
PASSAGE_FIELDS = tuple(f.name for f in dataclasses.fields(Passage))


def _optional_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)
