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


# --- one id grammar (common/limits.py), the server's: an id the library accepts is reachable over HTTP ----------

BAD_IDS = ["../../etc/passwd", "a/./b", "a/..", ".", "x\x00y", "line\nbreak", " lead", "trail ", "", "a" * 257]
GOOD_IDS = ["a/b", "Ünïcode/名前", "a b", "x.y/..z", "..a", "a" * 256]


@pytest.mark.parametrize("bad", BAD_IDS, ids=range(len(BAD_IDS)))
def test_an_id_outside_the_grammar_is_refused_on_add_and_update_naming_it_and_the_rule(index, bad):
    generation = index.manifest.generation
    for edit in (index.add, index.update):
        with pytest.raises(ValueError, match="passage 0") as refused:
            edit([{"id": bad, "text": "Some text."}])
        message = str(refused.value)
        assert "\n" not in message and (
            "field 'id' is empty" in message or "a passage id has 1 to 256 characters" in message
        )
    with pytest.raises(ValueError, match=r"^passage 1\b.*(is empty|a passage id has 1 to 256)"):
        atlas.Index.build([{"id": "ok", "text": "t"}, {"id": bad, "text": "t"}], index.path.parent / "b")
    assert index.manifest.generation == generation  # nothing written


def test_every_id_the_library_accepts_the_server_schema_accepts_and_no_other():
    from pydantic import TypeAdapter, ValidationError

    from atlas.serve.schemas import PassageId
    from common.limits import passage_id_problem

    schema = TypeAdapter(PassageId)
    for value in BAD_IDS + GOOD_IDS:
        try:
            schema.validate_python(value)
            served = True
        except ValidationError:
            served = False
        assert served == (passage_id_problem(value) is None), value
    assert all(passage_id_problem(value) is None for value in GOOD_IDS)


def test_wrong_argument_types_are_refused_in_one_line(index):
    for call, message in [
        (lambda: index.remove(42), "Index.remove takes a passage id (str) or a list of them, not int: 42"),
        (lambda: index.remove(b"ab"), "Index.remove takes a passage id (str) or a list of them, not bytes"),
        (lambda: index.remove(["biole", 7]), "Index.remove takes a passage id (str) or a list of them; 7 is int"),
        (lambda: index.search(42), "Index.search takes a query (str) or a list of queries, not int: 42"),
        (lambda: index.get(1), "Index.get takes a passage id (str), not int: 1"),
    ]:
        with pytest.raises(TypeError) as refused:
            call()
        assert str(refused.value).startswith(message), str(refused.value)
    with pytest.raises(ValueError, match="^Index.search: the query is empty$"):
        index.search("")
    with pytest.raises(ValueError, match="^Index.search: query 1 is empty$"):
        index.search(["capital", "  "])
    assert len(index) == 3  # nothing removed


def test_a_device_this_machine_lacks_is_one_clear_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match=r"^device='cuda': this machine has no CUDA device; use device='cpu'"):
        atlas.Index.build(DOCUMENTS, tmp_path / "ix", device="cuda", progress=False)
    with pytest.raises(ValueError, match=r"^device='gpu0': not a device name torch knows"):
        atlas.Index.build(DOCUMENTS, tmp_path / "ix", device="gpu0", progress=False)
    assert not (tmp_path / "ix").exists()


def test_a_hub_encoder_not_in_the_cache_fails_in_one_line_unless_downloads_are_asked_for(tmp_path, monkeypatch):
    from atlas.index_api import check_encoder_name

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(FileNotFoundError) as refused:
        check_encoder_name("nobody-xyz/no-such-encoder")
    assert str(refused.value) == (
        "encoder 'nobody-xyz/no-such-encoder': not a folder here and not in the Hugging Face cache; nothing is "
        "downloaded unless you ask: fetch it once (`hf download nobody-xyz/no-such-encoder`), or set "
        "HF_HUB_OFFLINE=0 to let atlas download it"
    )
    revision = "0" * 40  # a repository in the cache, as huggingface_hub lays it out: taken without asking
    repo = tmp_path / "empty-cache" / "models--someone--cached"
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "snapshots" / revision / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    check_encoder_name("someone/cached")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # downloads asked for: the Hub is tried
    check_encoder_name("nobody-xyz/no-such-encoder")


def test_index_info_verify_lists_ids_outside_the_grammar(tmp_path, capsys):
    from atlas.cli import main

    docs = tmp_path / "docs.jsonl"  # a corpus file prepared as it is (an older index may hold such ids)
    docs.write_text("".join(json.dumps(d) + "\n" for d in [*DOCUMENTS, {"id": "../old", "text": "An old id."}]))
    assert main(["corpus", "prepare", str(docs), "--out", str(tmp_path / "corpus"), "--chunk-words", "0"]) == 0
    assert main(["index", "build", "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "ix")]) == 0
    index = atlas.Index.load(tmp_path / "ix")
    assert index.get("../old").text == "An old id."  # still read
    capsys.readouterr()
    assert main(["index", "info", "--index", str(tmp_path / "ix"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "1 passage id(s) outside the id grammar" in out and "'../old'" in out
    assert main(["index", "info", "--index", str(tmp_path / "ix"), "--verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ids_outside_grammar"] == ["../old"]
