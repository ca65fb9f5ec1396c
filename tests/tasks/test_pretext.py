"""Pretext tasks: span corruption, prefix LM, section generation, source ids, determinism."""

from __future__ import annotations

import random
import re

import pytest

from tasks import get_task
from tasks.passage import Passage
from tasks.pretext import lm_split, span_corrupt

WORDS = [f"w{i}" for i in range(100)]


def _uncorrupt(query: str, target: str) -> list[str]:
    """Put the hidden spans back in place of the sentinels."""
    pieces = re.split(r"(<extra_id_\d+>)", target)
    spans = {pieces[i]: pieces[i + 1].split() for i in range(1, len(pieces), 2)}
    words = []
    for token in query.split():
        words += spans.get(token, [token])
    return words


def test_span_corruption_counts_and_round_trip():
    rng = random.Random(0)
    for length in (2, 7, 20, 100):
        words = WORDS[:length]
        query, target = span_corrupt(words, 0.15, 3.0, rng)
        sentinels_in_query = re.findall(r"<extra_id_\d+>", query)
        sentinels_in_target = re.findall(r"<extra_id_\d+>", target)
        assert sentinels_in_query == sentinels_in_target
        assert sentinels_in_query == [f"<extra_id_{i}>" for i in range(len(sentinels_in_query))]
        hidden = len(target.split()) - len(sentinels_in_target)
        assert hidden == min(max(round(length * 0.15), 1), length - 1)
        assert len(sentinels_in_query) == min(max(round(hidden / 3.0), 1), hidden, length - hidden)
        assert _uncorrupt(query, target) == words
    # 100 words: 15 noise words in 5 spans
    query, target = span_corrupt(WORDS, 0.15, 3.0, random.Random(1))
    assert len(re.findall("<extra_id_", query)) == 5
    with pytest.raises(ValueError, match="at least 2 words"):
        span_corrupt(["one"], 0.15, 3.0, rng)


def test_lm_split_ratio_bounds():
    rng = random.Random(0)
    cuts = set()
    for _ in range(200):
        prefix, continuation = lm_split(WORDS[:10], 0.2, 0.6, rng)
        cut = len(prefix.split())
        assert prefix.split() + continuation.split() == WORDS[:10]
        cuts.add(cut)
    assert cuts == {2, 3, 4, 5, 6}
    assert lm_split(["a", "b"], 0.5, 0.5, rng) == ("a", "b")


def test_tasks_from_a_corpus_file(tmp_path, write_jsonl):
    passages = [
        {"id": "p1", "title": "Paris", "section": "History", "text": " ".join(WORDS[:40])},
        {"id": "p2", "title": "Rome", "text": "too short"},
        {"id": "p3", "title": "Oslo", "section": "", "text": "one"},
    ]
    path = write_jsonl(tmp_path / "corpus.jsonl", passages)
    mlm = get_task("mlm").load(path)
    assert [e.source_id for e in mlm] == ["p1", "p2"]  # "one" is too short to corrupt
    assert mlm == get_task("mlm").load(path)  # seeded: the same examples every time
    assert mlm[0].query != get_task("mlm", seed=1).load(path)[0].query
    fresh_query, fresh_target = get_task("mlm").training_pair(mlm[0], random.Random(5))
    assert _uncorrupt(fresh_query, fresh_target) == WORDS[:40]

    lm = get_task("lm").load(path)
    assert lm[0].query.split() == WORDS[:20] and lm[0].target.split() == WORDS[20:40]
    section = get_task("section").load(path)
    assert len(section) == 1 and section[0].query == "Paris, History" and section[0].source_id == "p1"
    scores = get_task("lm").evaluate(lm, [lm[0].target, ""])
    assert scores["exact_match"] == 50.0 and scores["f1"] == 50.0  # percent
    assert list(scores) == ["exact_match", "f1", "rouge_l"]


def test_passage_without_text_is_an_error(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "corpus.jsonl", [{"id": "p1", "title": "x"}])
    with pytest.raises(ValueError, match=r"corpus\.jsonl:1: field 'text': missing required field"):
        get_task("mlm").load(path)


def test_the_source_passage_is_filtered_kept_or_ensured(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "p1", "title": "T", "text": " ".join(WORDS[:30])}])
    filtered, kept, ensured = (
        get_task("mlm", source_passage=mode).load(path)[0] for mode in ("filter", "keep", "ensure")
    )
    assert (filtered.source_id, filtered.evidence) == ("p1", None)
    assert (kept.source_id, kept.evidence) == (None, None)
    assert ensured.source_id is None and ensured.evidence == Passage(id="p1", title="T", text=" ".join(WORDS[:30]))
    with pytest.raises(ValueError, match="lm: source_passage must be one of filter, keep, ensure"):
        get_task("lm", source_passage="drop")
