"""Where an answer's words stand in the passages read: `Citation` (a passage id, its `title` or `text`, and the
character offsets `[start, end)` there) and `find_citations`.

An answer is found in a passage by normalised matching: letters compared without case or accents, any run of
white space or punctuation read as one separator, and the match starting and ending at word boundaries (so
"art" is not cited inside "start"). The offsets are the passage's own characters: `text[start:end]` is the
passage's spelling of the answer ("Stafairk" for the answer "stafairk"). Every occurrence is cited; the passages
most attended first (where the reader's attention shares are known), else in the order they were read, and in a
passage, the title before the text and earlier before later.

Where decoding was span-constrained, the reader's answer is a run of tokens of a passage it read, and the
constraint's tokenisation says exactly where: those places (`reader.span_constraint.copied_spans`, mapped to
characters with the tokenizer's offsets) are cited instead, in the same order (`find_citations(copied=...)`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from tasks.passage import Passage

Field = Literal["title", "text"]
Span = tuple[int, Field, int, int]  # a passage's position among those read, its field, [start, end) there
# What a model that must answer from its passages (`inference.require_support`) answers when none holds its answer
NO_ANSWER = "no answer in the passages"


@dataclass(frozen=True)
class Citation:
    """The answer's words in one passage read: `passage_id`, the `field` they stand in ("title" or "text"), and
    their character offsets `[start, end)` in that field; `quote` is the field's text there."""

    passage_id: str
    field: Field
    start: int
    end: int
    quote: str

    def record(self) -> dict:
        """As the predictions file and the HTTP API write it."""
        return asdict(self)


def _folded(text: str) -> tuple[str, list[int]]:
    """`text` reduced to lower-case letters and digits with one space between words, and for each character of the
    result the index in `text` of the character it came from (a separator: the first character of its run)."""
    out: list[str] = []
    origin: list[int] = []
    pending = None  # where a separator began, written once a word follows
    for index, char in enumerate(text):
        base = "".join(c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c)).casefold()
        if base and all(c.isalnum() for c in base):
            if pending is not None and out:
                out.append(" ")
                origin.append(pending)
            pending = None
            for c in base:
                out.append(c)
                origin.append(index)
        elif pending is None:
            pending = index
    return "".join(out), origin


def find_in(answer: str, text: str) -> list[tuple[int, int]]:
    """Every occurrence of `answer` in `text` under the normalised matching above, as `[start, end)` character
    offsets of `text`, in order; [] where the answer has no letter or digit."""
    needle, _ = _folded(answer)
    if not needle:
        return []
    haystack, origin = _folded(text)
    spans, at = [], haystack.find(needle)
    while at >= 0:
        end = at + len(needle)
        if (at == 0 or haystack[at - 1] == " ") and (end == len(haystack) or haystack[end] == " "):
            last = origin[end - 1]
            stop = last + 1
            while stop < len(text) and unicodedata.combining(text[stop]):  # a combining accent belongs to its letter
                stop += 1
            spans.append((origin[at], stop))
        at = haystack.find(needle, at + 1)
    return spans


def find_citations(
    answer: str,
    passages: Sequence[Passage],
    attention: Sequence[float] | None = None,
    *,
    copied: Sequence[Span] | None = None,
) -> list[Citation]:
    """Every place the passages read hold `answer` (see the module), best first: the passages by their attention
    share where given, else in the order read. [] for an empty answer or no passages (closed book).

    `copied`: where span-constrained decoding says the answer's tokens stand (`Reading.copied`: passage index,
    field, start, end); when there are any, they are the citations, in the same order, and the text is not
    searched. Those whose words the answer matches are kept where some do: `<unk>` stands for any character the
    vocabulary lacks, so "首都" and "東京" may be the same ids, and an answer the reader respelled from its
    passages ("東京") says which."""
    order = sorted(range(len(passages)), key=lambda n: -attention[n]) if attention is not None else range(len(passages))
    if copied:
        rank = {n: r for r, n in enumerate(order)}
        spans = sorted(copied, key=lambda s: (rank[s[0]], s[1] != "title", s[2]))
        cited = [Citation(passages[n].id, field, a, b, getattr(passages[n], field)[a:b]) for n, field, a, b in spans]
        agreeing = [c for c in cited if find_in(answer, c.quote) == [(0, len(c.quote))]]
        return agreeing or cited
    citations = []
    for n in order:
        passage = passages[n]
        for field in ("title", "text"):
            value = getattr(passage, field) or ""
            citations += [Citation(passage.id, field, s, e, value[s:e]) for s, e in find_in(answer, value)]
    return citations


def supported_answer(
    answer: str,
    passages: Sequence[Passage],
    attention: Sequence[float] | None,
    *,
    require_support: bool,
    copied: Sequence[Span] | None = None,
) -> tuple[str, list[Citation]]:
    """`answer` and its citations (`find_citations`); with `require_support`, NO_ANSWER (no citation) where passages
    were read and none holds the answer. A closed-book answer (no passages) is kept as it is."""
    citations = find_citations(answer, passages, attention, copied=copied)
    if require_support and passages and not citations:
        return NO_ANSWER, []
    return answer, citations
