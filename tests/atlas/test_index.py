"""`atlas.Index` as a careless user meets it: documents given in memory, a device named, edits that name the
passage they refuse, a string given where ids are expected, an encoder that does not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import atlas
from tasks.passage import Passage

DOCUMENTS = [
    {"id": "biole", "title": "Biole", "text": "Biole is a small island nation. Its capital is Varn."},
    {"id": "ostra", "title": "Ostra", "text": "Ostra is a port city known for its lighthouse."},
    {"id": "quill", "title": "Quillmoor", "text": "Quillmoor is a moor where heather grows in summer."},
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """An index of documents given in memory (dicts and a `Passage`), built on the CPU named as its device."""
    root = tmp_path_factory.mktemp("index")
    records = [*DOCUMENTS[:2], Passage(id=DOCUMENTS[2]["id"], title=DOCUMENTS[2]["title"], text=DOCUMENTS[2]["text"])]
    index = atlas.Index.build(records, root / "ix", device="cpu", chunk_words=0, progress=False)
    assert (root / "ix-corpus" / "corpus.json").is_file()  # the documents prepared beside it
    assert len(index) == 3 and str(next(index.retriever.parameters()).device) == "cpu"
    assert index.get("quill").text == DOCUMENTS[2]["text"]
    return root / "ix"


@pytest.fixture
def index(built, tmp_path) -> atlas.Index:
    import shutil

    shutil.copytree(built, tmp_path / "ix")
    return atlas.Index.load(tmp_path / "ix")


def test_the_index_built_from_records_searches_them(index):
    assert index.search("capital of Biole", k=1)[0].id == "biole"


def test_updating_the_same_id_twice_is_one_clear_error(index):
    generation = index.manifest.generation
    with pytest.raises(ValueError, match=r"^passage 1: duplicate id 'biole' \(first seen at passage 0\)$"):
        index.update([{"id": "biole", "text": "Varn moved."}, {"id": "biole", "text": "Varn moved again."}])
    assert index.manifest.generation == generation  # nothing written


def test_an_edit_names_the_record_it_refuses(index):
    with pytest.raises(ValueError, match=r"^passage 1 \(id 'new'\): missing field 'text'$"):
        index.add([{"id": "other", "text": "fine"}, {"id": "new", "title": "T"}])
    with pytest.raises(ValueError, match=r"^passage 0: passage id 'ostra' is already in the index .*; replace it"):
        index.add([{"id": "ostra", "text": "Ostra again."}])


def test_a_string_given_to_remove_is_one_id(index):
    stats = index.remove("ostra")  # not the ids 'o', 's', 't', 'r', 'a'
    assert stats.removed == 1 and len(index) == 2
    with pytest.raises(KeyError, match="'never-there'"):
        index.remove("never-there")


def test_a_file_given_to_add_is_read_at_the_edge_and_named_by_line(index, tmp_path):
    docs = tmp_path / "more.jsonl"
    docs.write_text(json.dumps({"id": "zed", "text": "Zed is a town."}) + "\n" + json.dumps({"id": "zed2"}) + "\n")
    with pytest.raises(ValueError, match=f"{docs}:2: field 'text'"):
        index.add(docs)
    docs.write_text(json.dumps({"id": "zed", "text": "Zed is a town."}) + "\n")
    assert index.add(docs).added == 1 and index.search("Zed is a town", k=1)[0].id == "zed"


def test_an_unknown_encoder_fails_at_once_and_leaves_no_corpus_behind(tmp_path):
    out = tmp_path / "ix"
    with pytest.raises(FileNotFoundError) as error:
        atlas.Index.build(DOCUMENTS, out, encoder="no-such-encoder", progress=False)
    message = str(error.value)
    assert message.startswith("encoder 'no-such-encoder': not a name atlas knows (minilm, contriever)")
    assert "\n" not in message and "Hub id" in message
    assert not (tmp_path / "ix-corpus").exists() and not out.exists()
    index = atlas.Index.build(DOCUMENTS, out, encoder="minilm", chunk_words=0, progress=False)  # the same call, fixed
    assert len(index) == 3


def test_documents_files_are_refused_before_the_encoder_when_a_record_is_bad(tmp_path):
    with pytest.raises(ValueError, match=r"^passage 1 \(id 'b'\): field 'text' must be a string, got list$"):
        atlas.Index.build([{"id": "a", "text": "x"}, {"id": "b", "text": ["x"]}], tmp_path / "ix", progress=False)
    assert not (tmp_path / "ix-corpus").exists()
