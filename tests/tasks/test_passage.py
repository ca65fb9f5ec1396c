"""The passage record (`tasks.passage.Passage`) and the optional hooks every `Task` declares."""

from __future__ import annotations

import pytest

from tasks import get_task
from tasks.base import Example, Task
from tasks.passage import PASSAGE_FIELDS, Passage


def test_a_record_is_made_from_a_dict_and_written_as_each_format_says():
    record = {
        "id": "d1-0",
        "title": "Paris",
        "text": "Paris is a city.",
        "doc_id": "d1",
        "section": "",
        "wikipedia_id": "",
        "extra": "left out",
    }
    passage = Passage.from_record(record)
    assert passage == Passage(id="d1-0", title="Paris", text="Paris is a city.", doc_id="d1")
    assert passage.section is None and passage.wikipedia_id is None  # "" (how corpora store none) → None
    assert Passage.from_record({"id": 3, "score": 1, "row": -1}) == Passage(id="3", score=1.0)  # row -1: none
    assert passage.fields() == {
        "id": "d1-0",
        "title": "Paris",
        "text": "Paris is a city.",
        "doc_id": "d1",
        "wikipedia_id": "",
        "section": "",
    }
    hit = Passage("h", title="T", text="x", score=0.5, row=2, wikipedia_id="9")
    assert hit.summary() == {"id": "h", "score": 0.5, "title": "T", "wikipedia_id": "9"}
    assert hit.search_record() == {
        "id": "h",
        "score": 0.5,
        "title": "T",
        "text": "x",
        "row": 2,
        "wikipedia_id": "9",
        "doc_id": "",
        "section": "",
    }
    assert PASSAGE_FIELDS[:5] == ("id", "title", "text", "score", "row")
    with pytest.raises(KeyError, match="needs an 'id'"):
        Passage.from_record({"text": "no id"})


def test_the_optional_hooks_have_defaults_for_a_task_without_them():
    fever = get_task("fever")  # overrides none of them
    example = Example(id="e", query="q", target=None, answers=[])
    assert fever.query("Is it so?") == "Is it so?"
    assert fever.eval_presentations(example) == [example]
    assert not fever.has_provenance
    with pytest.raises(NotImplementedError, match="writes no provenance"):
        fever.provenance([Passage("p", wikipedia_id="1")])
    assert get_task("qa").query("who?") == "question: who? answer: <extra_id_0>"
    kilt = get_task("kilt")
    assert kilt.has_provenance and Task.has_provenance is False
    assert kilt.provenance([Passage("p", title="T", wikipedia_id="1"), Passage("q")]) == [
        {"wikipedia_id": "1", "title": "T"}
    ]
    assert get_task("kilt", provenance_key="doc_id").provenance([Passage("p", doc_id="d")]) == [{"wikipedia_id": "d"}]
    with pytest.raises(ValueError, match="unknown provenance_key 'page'.*valid: id, title"):
        get_task("kilt", provenance_key="page")


def test_a_passage_prints_short_and_as_html_for_a_notebook():
    """A console shows id, title, the start of the text and the score, on one line, never the whole passage."""
    text = "Biole's capital is Varn. " * 40
    passage = Passage(id="p1", title="Biole", text=text, score=0.81234)
    shown = repr(passage)
    assert shown.startswith("Passage(id='p1', title='Biole', text=\"Biole's capital is Varn.")
    assert shown.endswith('…", score=0.812)') and len(shown) < 120 and "\n" not in shown
    assert repr(Passage(id="p2", text="short")) == "Passage(id='p2', title='', text='short')"
    page = Passage(id="p3", title="<b>", text="a < b", score=1.0)._repr_html_()
    assert "<b>&lt;b&gt;</b>" in page and "a &lt; b" in page and "score 1.000" in page
