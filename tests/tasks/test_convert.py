"""Data converters (tasks/convert.py): nq824 → KILT with its gold paragraphs as provenance, KILT's
knowledge source → corpus documents, and a seeded disjoint split."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from common.io import InputError
from tasks import get_task
from tasks.convert import kilt_knowledge_documents, nq824_to_kilt, split_file
from tasks.passage import Passage

DOCS = [
    {"id": "nq-0", "title": "", "text": "The capital of Zorbland is Quimper."},
    {"id": "nq-1", "title": "", "text": "Mount Olo was first climbed by Anna Brook in 1901."},
    {"id": "nq-2", "title": "", "text": "The currency of Tarsia is the florin."},
]
TRAIN = [{"question": "what is the capital of zorbland", "answers": ["Quimper"], "gold_doc": "nq-0"}]
DEV = [
    {"question": "who first climbed mount olo", "answers": ["Anna Brook", "Brook"], "gold_doc": "nq-1"},
    {"question": "what is the currency of tarsia", "answers": ["florin", "the florin"], "gold_doc": "nq-2"},
]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def nq824(tmp_path, write_jsonl) -> Path:
    folder = tmp_path / "nq824"
    folder.mkdir()
    write_jsonl(folder / "documents.jsonl", DOCS)
    write_jsonl(folder / "train-64.jsonl", TRAIN)
    write_jsonl(folder / "dev.jsonl", DEV)
    write_jsonl(tmp_path / "distractors.jsonl", [{"id": "wt2-0", "title": "Homarus", "text": "A lobster."}])
    return folder


def test_nq824_in_kilt_format_with_its_gold_paragraphs_as_provenance(nq824, tmp_path):
    done = nq824_to_kilt(nq824, tmp_path / "kilt", distractors=[tmp_path / "distractors.jsonl"])
    assert (done.train, done.dev, done.gold_documents, done.distractor_documents) == (1, 2, 3, 1)
    olo = {
        "wikipedia_id": "nq-1",
        "title": "",
        "start_paragraph_id": 0,
        "start_character": 0,
        "end_paragraph_id": 0,
        "end_character": 50,
    }
    assert lines(tmp_path / "kilt" / "dev.jsonl")[0] == {
        "id": "nq824-dev-0",
        "input": "who first climbed mount olo",
        "output": [{"answer": "Anna Brook", "provenance": [olo]}, {"answer": "Brook", "provenance": [olo]}],
    }
    assert [r["id"] for r in lines(tmp_path / "kilt" / "train.jsonl")] == ["nq824-train-0"]
    assert lines(tmp_path / "kilt" / "knowledge.jsonl") == [
        *({**d, "wikipedia_id": d["id"]} for d in DOCS),
        {"id": "wt2-0", "title": "Homarus", "text": "A lobster.", "wikipedia_id": "wt2-0"},
    ]
    assert sorted(p.name for p in (tmp_path / "kilt").iterdir()) == ["dev.jsonl", "knowledge.jsonl", "train.jsonl"]


def test_kilt_scores_of_the_converted_questions_by_hand(nq824, tmp_path):
    """R-precision = the first distinct page retrieved is the gold one; KILT-EM counts EM only there;
    EM equals the QA task's on the same questions and predictions."""
    nq824_to_kilt(nq824, tmp_path / "kilt", distractors=[tmp_path / "distractors.jsonl"])
    kilt = get_task("kilt", kilt_task="nq")
    examples = kilt.load(tmp_path / "kilt" / "dev.jsonl")
    retrieved = [
        # the gold page's two chunks, then a distractor: R-precision 1, EM 1 → KILT-EM 1
        [
            Passage("nq-1-0", wikipedia_id="nq-1"),
            Passage("nq-1-1", wikipedia_id="nq-1"),
            Passage("wt2-0-0", wikipedia_id="wt2-0"),
        ],
        # a distractor page first, the gold second: R-precision 0, EM 1 → KILT-EM 0; recall@5 1
        [Passage("wt2-0-0", wikipedia_id="wt2-0"), Passage("nq-2-0", wikipedia_id="nq-2")],
    ]
    scores = kilt.official_scores(examples, ["Brook", "The Florin"], retrieved=retrieved)
    assert (scores["em"], scores["Rprec"], scores["KILT-em"], scores["recall@5"]) == (1.0, 0.5, 0.5, 1.0)
    qa = get_task("qa")
    questions = qa.load(nq824 / "dev.jsonl")
    assert [e.query for e in questions] == [e.query for e in examples]  # the reader reads the same input
    for predictions in (["Brook", "The Florin"], ["Anna", ""], ["anna  brook", "florins"]):
        assert kilt.evaluate(examples, predictions)["exact_match"] == qa.evaluate(questions, predictions)["exact_match"]


def test_the_prepared_corpus_carries_the_page_ids_the_provenance_names(nq824, tmp_path):
    from retriever.corpus import Corpus, prepare_corpus

    nq824_to_kilt(nq824, tmp_path / "kilt")
    prepare_corpus([tmp_path / "kilt" / "knowledge.jsonl"], tmp_path / "corpus", chunk_words=5, progress=False)
    corpus = Corpus.load(tmp_path / "corpus")
    pages = {corpus[row]["id"]: corpus[row]["wikipedia_id"] for row in range(len(corpus))}
    assert pages == {
        "nq-0-0": "nq-0",
        "nq-0-1": "nq-0",
        "nq-1-0": "nq-1",
        "nq-1-1": "nq-1",
        "nq-2-0": "nq-2",
        "nq-2-1": "nq-2",
    }


@pytest.mark.parametrize(
    ("file", "record", "message"),
    [
        (
            "dev.jsonl",
            {"question": "q", "answers": ["a"], "gold_doc": "nq-9"},
            "dev.jsonl:3: field 'gold_doc': 'nq-9' is not a document of documents.jsonl",
        ),
        (
            "dev.jsonl",
            {"question": "q", "answers": [], "gold_doc": "nq-0"},
            "dev.jsonl:3: field 'answers': expected a non-empty list of non-empty strings",
        ),
        (
            "train-64.jsonl",
            {"answers": ["a"], "gold_doc": "nq-0"},
            "train-64.jsonl:2: field 'question': missing or empty",
        ),
        (
            "documents.jsonl",
            {"id": "nq-0", "text": "again"},
            "documents.jsonl:4: field 'id': duplicate document id 'nq-0' (first at ",
        ),
    ],
)
def test_a_bad_nq824_record_names_file_line_and_field_and_nothing_is_written(nq824, tmp_path, file, record, message):
    with open(nq824 / file, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    with pytest.raises(InputError, match=re.escape(message)):
        nq824_to_kilt(nq824, tmp_path / "kilt")
    assert not (tmp_path / "kilt").exists() and [p.name for p in tmp_path.iterdir()] == ["nq824", "distractors.jsonl"]


def test_real_nq824_converts_and_every_question_finds_its_page(shared_data, tmp_path):
    done = nq824_to_kilt(
        shared_data / "nq824", tmp_path / "kilt", distractors=[shared_data / "wikitext2-articles.jsonl"]
    )
    assert (done.train, done.dev, done.gold_documents, done.distractor_documents) == (64, 578, 820, 122)
    pages = {d["wikipedia_id"] for d in lines(tmp_path / "kilt" / "knowledge.jsonl")}
    for split, size in (("train", 64), ("dev", 578)):
        examples = get_task("kilt", kilt_task="nq").load(tmp_path / "kilt" / f"{split}.jsonl")
        assert len(examples) == size
        gold = {p["wikipedia_id"] for e in examples for o in e.metadata["kilt"]["output"] for p in o["provenance"]}
        assert gold <= pages


def test_kilt_knowledge_source_pages_become_documents(tmp_path, write_jsonl):
    source = write_jsonl(
        tmp_path / "kilt_knowledgesource.json",
        [
            {
                "_id": "1",
                "wikipedia_id": "290",
                "wikipedia_title": "A",
                "text": [
                    "A\n",
                    "A is the first letter.\n",
                    "Section::::History.\n",
                    "BULLET::::- It came from aleph.\n",
                ],
            },
            {"_id": "2", "wikipedia_id": "303", "wikipedia_title": "Empty", "text": ["Empty\n"]},
            {"_id": "3", "wikipedia_id": "7", "wikipedia_title": "B", "text": "not a list"},
        ],
    )
    documents = kilt_knowledge_documents(source)
    assert next(documents) == {
        "id": "290",
        "title": "A",
        "wikipedia_id": "290",
        "text": "A is the first letter. It came from aleph.",
    }
    with pytest.raises(InputError, match=r"kilt_knowledgesource\.json:3: field 'text': expected a list"):
        next(documents)  # the title-only page has no text and is left out


def test_split_is_seeded_disjoint_and_complete(tmp_path, write_jsonl):
    records = [{"question": f"q{n}", "answers": ["a"]} for n in range(10)]
    source = write_jsonl(tmp_path / "all.jsonl", records)
    assert split_file(source, tmp_path / "a", train=3, seed=1, prefix="hotpotqa-") == (3, 7)
    train, dev = lines(tmp_path / "a" / "hotpotqa-train.jsonl"), lines(tmp_path / "a" / "hotpotqa-dev.jsonl")
    assert sorted([*train, *dev], key=lambda r: int(r["question"][1:])) == records
    assert dev == [r for r in records if r not in train]  # file order kept
    split_file(source, tmp_path / "b", train=3, seed=1)
    assert lines(tmp_path / "b" / "train.jsonl") == train
    with pytest.raises(
        ValueError,
        match=r"all\.jsonl: --train must be between 1 and 9 \(the file has 10 "
        r"records\), got 10",
    ):
        split_file(source, tmp_path / "c", train=10)
    assert not (tmp_path / "c").exists()
