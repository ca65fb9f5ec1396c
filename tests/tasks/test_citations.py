"""Citations against a hand-made set whose answer spans are known: each case's expected spans are written by hand
as the passage's own words (the offsets are found with str.index, not with the code under test), and every offset
slices the passage back to the answer's words."""

from __future__ import annotations

import pytest

from tasks.citations import Citation, find_citations, find_in
from tasks.passage import Passage

# (answer, title, text, expected [(field, the passage's own words cited, which occurrence of them: 0 = first)])
CASES = [
    ("Stafairk", "Biole", "Biole's capital is Stafairk.", [("text", "Stafairk", 0)]),
    ("stafairk", "Biole", "Biole's capital is Stafairk.", [("text", "Stafairk", 0)]),  # a lower-cased reader
    (
        "STAFAIRK",
        "Biole",
        "The capital is Stafairk; Stafairk lies inland.",
        [("text", "Stafairk", 0), ("text", "Stafairk", 1)],
    ),
    ("Biole", "Biole", "Biole is an island nation.", [("title", "Biole", 0), ("text", "Biole", 0)]),
    ("Anna Brook", "Olo", "Mount Olo was first climbed by Anna   Brook in 1820.", [("text", "Anna   Brook", 0)]),
    ("anna brook", "Olo", "first climbed by Anna\nBrook, a guide", [("text", "Anna\nBrook", 0)]),
    ("1820", "Belmont", "Belmont has a clock tower built in 1820.", [("text", "1820", 0)]),
    ("3,000 metres", "Olo", "Mount Olo is 3,000 metres high.", [("text", "3,000 metres", 0)]),
    ("3000 metres", "Olo", "Mount Olo is 3,000 metres high.", []),  # digits are not regrouped
    ("art", "Start", "The start of the art movement.", [("text", "art", 1)]),  # not inside "start" or "Start"
    ("the florin", "Tarsia", "The currency of Tarsia is the florin.", [("text", "the florin", 0)]),
    (
        "florin",
        "Tarsia",
        "The currency of Tarsia is the florin. A florin is gold.",
        [("text", "florin", 0), ("text", "florin", 1)],
    ),
    ("São Paulo", "Brazil", "Its largest city is São Paulo.", [("text", "São Paulo", 0)]),
    ("Sao Paulo", "Brazil", "Its largest city is São Paulo.", [("text", "São Paulo", 0)]),  # accents folded
    ("são paulo", "São Paulo", "São Paulo is large.", [("title", "São Paulo", 0), ("text", "São Paulo", 0)]),
    ("Zürich", "Zurich", "The bank moved to Zurich.", [("title", "Zurich", 0), ("text", "Zurich", 0)]),
    ("Dvořák", "Composers", "A symphony by Antonín Dvořák.", [("text", "Dvořák", 0)]),
    ("東京", "日本", "日本の首都は東京です。", []),  # no word boundary inside Japanese text
    ("東京", "日本", "首都: 東京 (Tokyo).", [("text", "東京", 0)]),
    ("Tokyo", "日本", "首都: 東京 (Tokyo).", [("text", "Tokyo", 0)]),
    ("Ostra", "Ports", "Ostra, Varn and Ostra-on-Sea.", [("text", "Ostra", 0), ("text", "Ostra", 1)]),
    ("Ostra-on-Sea", "Ports", "Ostra, Varn and Ostra-on-Sea.", [("text", "Ostra-on-Sea", 0)]),
    ("Ostra on Sea", "Ports", "Ostra, Varn and Ostra-on-Sea.", [("text", "Ostra-on-Sea", 0)]),  # punctuation as space
    ("O'Neill", "Plays", "A play by Eugene O'Neill.", [("text", "O'Neill", 0)]),
    ("o neill", "Plays", "A play by Eugene O'Neill.", [("text", "O'Neill", 0)]),
    ("Quimper", "Zorbland", "Zorbland's capital, Quimper, is old.", [("text", "Quimper", 0)]),
    ("Quimper", "Quimper", "", [("title", "Quimper", 0)]),  # in the title alone
    ("Varn", "Biole", "Biole's capital is Stafairk.", []),  # not in the passage: unsupported
    ("", "Biole", "Biole's capital is Stafairk.", []),  # an empty answer cites nothing
    ("...", "Biole", "Biole's capital is Stafairk...", []),  # no letter or digit
    (
        "Mount Olo",
        "Olo",
        "mount olo, MOUNT OLO and Mount Olo.",
        [("text", "mount olo", 0), ("text", "MOUNT OLO", 0), ("text", "Mount Olo", 0)],
    ),
    ("e", "Letters", "The letter e is common; see e.g. here.", [("text", "e", 3), ("text", "e", 6)]),
    (
        "Café",
        "Paris",
        "Le Cafe\u0301 de Flore.",
        [("text", "Cafe\u0301", 0)],
    ),  # a combining accent stays with its letter
    ("1,000", "Numbers", "It holds 1,000 or 1000 or 1.000 things.", [("text", "1,000", 0), ("text", "1.000", 0)]),
]


def expected_spans(title: str, text: str, expected) -> list[tuple[str, int, int]]:
    """The hand-written words located with str.index: their n-th occurrence in the field as a substring, counted
    from 0 (the "art" of "start" counts, so the word "art" is occurrence 1)."""
    spans = []
    for field, words, nth in expected:
        value = title if field == "title" else text
        at = -1
        for _ in range(nth + 1):
            at = value.index(words, at + 1)
        spans.append((field, at, at + len(words)))
    return spans


@pytest.mark.parametrize(("answer", "title", "text", "expected"), CASES, ids=[str(n) for n in range(len(CASES))])
def test_citations_are_exact_on_the_hand_made_set(answer, title, text, expected):
    passage = Passage(id="p", title=title, text=text)
    got = find_citations(answer, [passage])
    assert [(c.field, c.start, c.end) for c in got] == expected_spans(title, text, expected)
    for citation in got:  # the offsets slice the passage back to its own spelling of the answer
        value = title if citation.field == "title" else text
        assert citation.quote == value[citation.start : citation.end]
        assert find_in(answer, citation.quote) == [(0, len(citation.quote))]


def test_the_hand_made_set_is_at_least_thirty_questions():
    assert len(CASES) >= 30


def test_the_most_attended_passage_is_cited_first_and_a_closed_book_answer_cites_nothing():
    read = [
        Passage(id="a", title="Biole", text="Stafairk is Biole's capital."),
        Passage(id="b", title="Stafairk", text="A city: Stafairk."),
    ]
    in_order = find_citations("Stafairk", read)
    assert [(c.passage_id, c.field) for c in in_order] == [("a", "text"), ("b", "title"), ("b", "text")]
    by_attention = find_citations("Stafairk", read, attention=[0.2, 0.8])
    assert [(c.passage_id, c.field) for c in by_attention] == [("b", "title"), ("b", "text"), ("a", "text")]
    assert find_citations("Stafairk", []) == []
    assert Citation("a", "text", 0, 8, "Stafairk").record() == {
        "passage_id": "a",
        "field": "text",
        "start": 0,
        "end": 8,
        "quote": "Stafairk",
    }


def test_an_unsupported_answer_abstains_only_when_support_is_required():
    from tasks.citations import NO_ANSWER, supported_answer

    read = [Passage(id="a", title="Biole", text="Biole's capital is Stafairk.")]
    assert supported_answer("Varn", read, None, require_support=False) == ("Varn", [])
    assert supported_answer("Varn", read, None, require_support=True) == (NO_ANSWER, [])
    answer, cited = supported_answer("stafairk", read, None, require_support=True)
    assert answer == "stafairk" and [c.quote for c in cited] == ["Stafairk"]
    assert supported_answer("Varn", [], None, require_support=True) == ("Varn", [])  # closed book: kept
