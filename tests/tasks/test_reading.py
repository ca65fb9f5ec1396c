"""The reading-comprehension task: SQuAD JSON / JSON lines in, gold (+ distractor) passages, SQuAD scores."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from common.io import InputError
from tasks.base import get_task
from tasks.passage import Passage
from tasks.reading import _window

CONTEXT_A = "The Normans were the people who gave their name to Normandy, a region in France."
CONTEXT_B = "Rollo was their first ruler. He signed a treaty with the king in 911."
CONTEXT_C = "Norman architecture is known for its round arches."


def _squad(tmp_path, qas_a=None, name="squad.json"):
    document = {
        "version": "1.1",
        "data": [
            {
                "title": "The_Normans",
                "paragraphs": [
                    {
                        "context": CONTEXT_A,
                        "qas": qas_a
                        if qas_a is not None
                        else [
                            {
                                "id": "q1",
                                "question": "What region did the Normans name?",
                                "answers": [
                                    {"text": "Normandy", "answer_start": CONTEXT_A.index("Normandy")},
                                    {
                                        "text": "Normandy, a region in France",
                                        "answer_start": CONTEXT_A.index("Normandy"),
                                    },
                                ],
                            }
                        ],
                    },
                    {
                        "context": CONTEXT_B,
                        "qas": [
                            {
                                "id": "q2",
                                "question": "When was the treaty signed?",
                                "answers": [{"text": "911", "answer_start": CONTEXT_B.index("911")}],
                            }
                        ],
                    },
                    {"context": CONTEXT_C, "qas": []},
                ],
            }
        ],
    }
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_squad_json_gives_one_example_per_question_with_its_paragraph(tmp_path):
    examples = get_task("reading").load(_squad(tmp_path))
    assert [e.id for e in examples] == ["q1", "q2"]
    first = examples[0]
    assert first.query == "question: What region did the Normans name? answer: <extra_id_0>"
    assert first.target == "<extra_id_0> Normandy"
    assert first.answers == ["Normandy", "Normandy, a region in France"]
    assert first.passages == [Passage(id="q1-gold", title="The Normans", text=CONTEXT_A)]


def test_distractors_are_other_paragraphs_of_the_same_article_in_a_seeded_order(tmp_path):
    path = _squad(tmp_path)
    examples = get_task("reading", distractors=2).load(path)
    texts = [p.text for p in examples[1].passages]
    assert sorted(texts) == sorted([CONTEXT_A, CONTEXT_B, CONTEXT_C])
    again = get_task("reading", distractors=2).load(path)
    assert [p.id for p in again[1].passages] == [p.id for p in examples[1].passages]
    orders = {
        tuple(p.id.split("-")[-1] for p in get_task("reading", distractors=2, seed=s).load(path)[1].passages)
        for s in range(12)
    }
    assert len(orders) > 1  # the gold is not always in the same slot


def test_a_window_keeps_the_answer_and_at_most_max_words():
    context = " ".join(f"w{i}" for i in range(300)) + " ANSWER here " + " ".join(f"v{i}" for i in range(300))
    start = context.index("ANSWER")
    for seed in range(20):
        window = _window(context, start, start + len("ANSWER here"), 50, random.Random(seed))
        assert "ANSWER here" in window and len(window.split()) <= 50
    assert _window("short text", 0, 5, 50, random.Random(0)) == "short text"


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(
        st.tuples(
            st.sampled_from(["ab", "c", "Zorb", "é", "1\u200b2"]),
            st.sampled_from([" ", "  ", "\n", "\t", "\u3000", "\x1c", "\u2028", "\xa0"]),
        ),
        min_size=1,
        max_size=40,
    ),
    lead=st.sampled_from(["", " ", "\n "]),
    span=st.tuples(st.integers(0, 200), st.integers(1, 30)),
    max_words=st.integers(1, 12),
    seed=st.integers(0, 3),
)
def test_the_window_cut_equals_its_definition_on_any_white_space(pieces, lead, span, max_words, seed):
    context = lead + "".join(word + space for word, space in pieces)
    start = min(span[0], len(context) - 1)
    end = min(start + span[1], len(context))
    assume(context[start:end].strip())  # an answer is never white space alone (the loader refuses it)
    expected_rng, rng = random.Random(seed), random.Random(seed)
    # the window by its definition, as first written: each word's offset found one by one
    words, offsets, position = context.split(), [], 0
    for word in words:
        position = context.index(word, position)
        offsets.append(position)
        position += len(word)
    if len(words) > max_words:
        first = max([i for i, o in enumerate(offsets) if o <= start] or [0])
        last = max(i for i, o in enumerate(offsets) if o < end)
        if last - first + 1 <= max_words:
            low, high = max(0, last - max_words + 1), min(first, len(words) - max_words)
            begin = expected_rng.randint(low, high)
            expected = " ".join(words[begin : begin + max_words])
        else:
            expected = context
    else:
        expected = context
    assert _window(context, start, end, max_words, rng) == expected


@pytest.mark.parametrize(
    ("qa", "field", "message"),
    [
        ({"id": "x", "answers": [{"text": "Normans", "answer_start": 4}]}, "qas[0].question", "non-empty string"),
        (
            {"id": "x", "question": "Who?", "answers": [{"text": "Normans", "answer_start": 0}]},
            "qas[0].answers[0]",
            "not in the context at answer_start=0",
        ),
        ({"id": "x", "question": "Who?", "answers": []}, "qas[0].answers", "non-empty list"),
    ],
)
def test_bad_squad_records_name_the_file_the_record_and_the_field(tmp_path, qa, field, message):
    path = _squad(tmp_path, qas_a=[qa])
    with pytest.raises(InputError, match=message) as error:
        get_task("reading").load(path)
    assert error.value.path == str(path) and error.value.field == f"data[0].paragraphs[0].{field}"
    kept = get_task("reading").load(path, skip_invalid=True)
    assert [e.id for e in kept] == ["q2"]


def test_an_empty_context_and_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "reading.jsonl"
    path.write_text(
        json.dumps({"question": "q", "context": "Paris is big.", "answers": ["Paris"]})
        + "\n"
        + json.dumps({"question": "q", "context": "  ", "answers": ["Paris"]})
        + "\n"
    )
    with pytest.raises(InputError, match=r"reading.jsonl:2: field 'context'"):
        get_task("reading").load(path)
    assert len(get_task("reading").load(path, skip_invalid=True)) == 1


def test_scores_are_squad_official_em_and_f1_max_over_gold(tmp_path):
    task = get_task("reading")
    examples = task.load(_squad(tmp_path))
    # "the Normandy" → EM with "Normandy" (articles dropped); "911 AD" vs "911": F1 = 2·(1/2·1)/(1/2+1) = 2/3
    metrics = task.evaluate(examples, ["<extra_id_0> the Normandy", "911 AD"])
    assert metrics["exact_match"] == 50.0  # percent
    assert metrics["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2, rel=1e-15)


def test_options_are_validated():
    with pytest.raises(ValueError, match="max_words must be a non-negative integer"):
        get_task("reading", max_words=-3)
    with pytest.raises(ValueError, match="unknown option"):
        get_task("reading", windows=3)
    with pytest.raises(ValueError, match="counterfactual must be a share between 0 and 1"):
        get_task("reading", counterfactual=1.5)


def _example(example_id, answers, passages):
    from tasks.base import Example

    return Example(
        id=example_id,
        query=f"question: {example_id}? answer: <extra_id_0>",
        target=f"<extra_id_0> {answers[0]}",
        answers=answers,
        passages=[{"id": f"{example_id}-{n}", "title": "", "text": t} for n, t in enumerate(passages)],
        metadata={"question": example_id},
    )


def test_a_counterfactual_twin_swaps_the_answer_in_every_passage_and_the_target():
    from tasks.counterfactual import counterfactual_example

    example = _example(
        "when", ["1911"], ["Anna Brook climbed Mount Olo in 1911.", "In 1911 (not 19111) it snowed.", "Nothing here."]
    )
    pool = {"year": ["1911", "1848", "1911"], "name": ["Tarsia"]}
    twin = counterfactual_example(example, pool, random.Random(0), "<extra_id_0> {answer}")
    assert [p.text for p in twin.passages] == [
        "Anna Brook climbed Mount Olo in 1848.",
        "In 1848 (not 19111) it snowed.",
        "Nothing here.",
    ]
    assert (twin.target, twin.answers, twin.metadata["counterfactual_of"]) == ("<extra_id_0> 1848", ["1848"], "1911")
    assert example.answers == ["1911"] and "1911" in example.passages[0].text  # the original is left as it was
    # nothing of its kind that is new to the text, or a second gold answer left standing: no twin
    assert counterfactual_example(example, {"year": ["1911"]}, random.Random(0), "{answer}") is None
    assert counterfactual_example(example, {"name": ["Tarsia"]}, random.Random(0), "{answer}") is None
    two_gold = _example("who", ["Anna Brook", "Brook"], ["Anna Brook climbed it. Brook was 30."])
    assert counterfactual_example(two_gold, {"name": ["Tom Rigg"]}, random.Random(0), "{answer}") is None
    # a replacement sharing a word with the old answer, or already in the text, is never drawn
    shared = _example("who", ["Anna Brook"], ["Anna Brook climbed it with Tom Rigg."])
    assert counterfactual_example(shared, {"name": ["Anna Smith", "Tom Rigg"]}, random.Random(0), "{answer}") is None


def test_counterfactual_training_swaps_a_seeded_share_and_never_the_evaluation_data(tmp_path):
    examples = [_example(f"q{n}", [str(1800 + n)], [f"It happened in {1800 + n}, they say."]) for n in range(200)]
    task = get_task("reading", counterfactual=0.3, seed=4)
    trained = task.training_examples(examples)
    swapped = [t for t in trained if "counterfactual_of" in t.metadata]
    assert 40 <= len(swapped) <= 80  # about 30% of 200
    for twin in swapped:
        text = twin.passages[0].text
        assert twin.answers[0] in text and twin.metadata["counterfactual_of"] not in text
        assert twin.target == f"<extra_id_0> {twin.answers[0]}"
    assert [t.answers for t in task.training_examples(examples)] == [t.answers for t in trained]  # seeded
    assert get_task("reading").training_examples(examples) == examples  # off by default
    path = _squad(tmp_path)
    assert task.load(path) == get_task("reading", seed=4).load(path)  # loading (evaluation) is untouched


def test_a_json_lines_record_reads_its_own_distractors_first_n_in_a_seeded_order(tmp_path):
    record = {
        "id": "q1",
        "question": "Who was the first ruler?",
        "context": CONTEXT_B,
        "answers": [{"text": "Rollo", "answer_start": 0}],
        "distractors": [CONTEXT_A, {"title": "Architecture", "text": CONTEXT_C}, "never read: the third"],
    }
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (example,) = get_task("reading", distractors=2).load(path)
    by_text = {p.text: p for p in example.passages}
    assert set(by_text) == {CONTEXT_B, CONTEXT_A, CONTEXT_C}
    assert by_text[CONTEXT_C].title == "Architecture" and by_text[CONTEXT_A].title == ""
    assert [p.text for p in get_task("reading", distractors=2).load(path)[0].passages] == [
        p.text for p in example.passages
    ]
    (alone,) = get_task("reading").load(path)  # distractors: 0 reads the gold paragraph only
    assert [p.text for p in alone.passages] == [CONTEXT_B]
    (cut,) = get_task("reading", distractors=1, max_words=3).load(path)
    assert [p.text for p in cut.passages if p.id.endswith("-d0")] == ["The Normans were"]


def test_a_bad_listed_distractor_is_named_with_its_line(tmp_path):
    good = {"question": "Who?", "context": CONTEXT_B, "answers": ["Rollo"]}
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "distractors": [CONTEXT_A, {"title": "x"}]}) + "\n")
    with pytest.raises(InputError, match=r"train\.jsonl:2: field .distractors\[1\]."):
        get_task("reading", distractors=2).load(path)
