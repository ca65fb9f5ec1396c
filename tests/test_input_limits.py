"""Bad input meets one clear line, the same in every front end: the shared limits (common/limits.py) in the Python
API, the command line and the server; a UTF-8 byte-order mark read as text files from Windows tools carry it;
arguments that are not UTF-8 named by byte position."""

from __future__ import annotations

import json
import shutil

import pytest

from atlas.cli import main
from common.limits import MAX_PASSAGE_CHARS, MAX_QUESTION_CHARS


def test_a_byte_order_mark_is_read_as_the_encodings_mark(tmp_path, capsys):
    from retriever.corpus import Corpus
    from tasks.base import get_task

    docs, questions = tmp_path / "docs.jsonl", tmp_path / "q.jsonl"
    docs.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "title": "T", "text": "some text"}).encode() + b"\n")
    questions.write_bytes(b"\xef\xbb\xbf" + json.dumps({"question": "what?", "answers": ["x"]}).encode() + b"\n")
    assert main(["corpus", "prepare", str(docs), "--out", str(tmp_path / "c")]) == 0
    assert Corpus.load(tmp_path / "c")[0]["doc_id"] == "a"
    assert [e.answers for e in get_task("qa").load(questions)] == [["x"]]
    tsv = tmp_path / "docs.tsv"
    tsv.write_bytes(b"\xef\xbb\xbfid\ttext\ttitle\nb\tother text\tU\n")
    assert main(["corpus", "prepare", str(tsv), "--out", str(tmp_path / "t")]) == 0
    assert Corpus.load(tmp_path / "t")[0]["doc_id"] == "b"  # the header row was recognised through the mark


def test_an_argument_that_is_not_utf8_is_named_by_byte_position(capsys):
    question = b"Who founded \xff Velmora?".decode("utf-8", "surrogateescape")  # as Python hands such bytes over
    assert main(["ask", "atlas-reader", "--index", "nowhere", question]) == 2
    assert capsys.readouterr().err == "atlas: error: argument 5 is not UTF-8: byte 0xFF at byte position 12\n"


def test_a_question_over_the_limit_is_refused_by_python_the_cli_and_the_server(tiny_world, tmp_path, capsys):
    import atlas
    from atlas.serve.schemas import AskRequest

    long = "why " * (MAX_QUESTION_CHARS // 4 + 1)
    encoder = f"retriever.model={tiny_world['encoder']}"
    model = atlas.Atlas.from_pretrained("t5-tiny", index=tiny_world["index"], overrides=[encoder])
    message = f"has {len(long):,} characters; the limit is {MAX_QUESTION_CHARS:,}"
    with pytest.raises(ValueError, match=message):
        model.answer(long)
    with pytest.raises(ValueError, match="question 1 " + message):
        model.answer(["short?", long])
    with pytest.raises(ValueError, match="k must be an integer from 1 to 20"):
        model.answer("short?", k=21)
    assert main(["ask", "t5-tiny", "--index", str(tiny_world["index"]), long]) == 2  # checked before loading
    assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match=f"at most {MAX_QUESTION_CHARS} characters"):
        AskRequest(question=long)


def test_a_passage_over_the_limit_is_refused_unsplit_and_taken_split(tiny_world, tmp_path, capsys):
    import atlas

    index = tmp_path / "index"
    shutil.copytree(tiny_world["index"], index)
    huge = "word " * (MAX_PASSAGE_CHARS // 5 + 10)
    (tmp_path / "huge.jsonl").write_text(json.dumps({"id": "huge", "title": "", "text": huge}) + "\n")
    encoder = str(tiny_world["encoder"])
    code = main(["index", "add", "--index", str(index), "--corpus", str(tmp_path / "huge.jsonl"), "--encoder", encoder])
    err = capsys.readouterr().err
    assert code == 2 and "huge.jsonl:1: field 'text' has " in err and "split it (chunk_words, --chunk-words)" in err
    opened = atlas.Index.load(index, encoder=encoder)
    with pytest.raises(ValueError, match=f"the limit is {MAX_PASSAGE_CHARS:,} for one passage"):
        opened.add([{"id": "huge", "text": huge}])
    stats = opened.add([{"id": "huge", "text": huge}], chunk_words=100)
    assert stats.added == len(huge.split()) // 100 + 1 and len(opened) == 5 + stats.added
