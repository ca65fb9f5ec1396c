"""Corpus preparation: round trips, chunking properties, lookups and every bad-input path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.io import InputError
from retriever.corpus import Corpus, chunk_text, prepare_corpus

DOCS = [
    {"id": "d1", "title": "Alpha", "text": "one two three", "section": "Intro"},
    {"id": "d2", "title": "Beta", "text": "Ünïcode  text\twith   spacing", "wikipedia_id": "42"},
    {"id": 7, "title": "", "text": "integer id"},
]


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def prepare(tmp_path: Path, *inputs, **kwargs) -> Corpus:
    out = tmp_path / "corpus"
    prepare_corpus(list(inputs), out, progress=False, **kwargs)
    return Corpus.load(out)


def test_jsonl_round_trip_is_identical(tmp_path):
    corpus = prepare(tmp_path, write_jsonl(tmp_path / "d.jsonl", DOCS), chunk_words=0)
    assert len(corpus) == 3
    for row, doc in enumerate(DOCS):
        got = corpus[row]
        assert got["id"] == str(doc["id"]) and got["doc_id"] == str(doc["id"])
        assert got["text"] == doc["text"]  # whitespace kept byte for byte
        assert got["title"] == doc["title"]
        assert got["section"] == doc.get("section", "")
        assert got["wikipedia_id"] == doc.get("wikipedia_id", "")
    assert corpus.get("7")["text"] == "integer id"
    assert list(corpus.rows_for_ids(["d2", "d1"])) == [1, 0]
    assert "d1" in corpus and "nope" not in corpus
    with pytest.raises(KeyError, match="'nope' is not in the corpus"):
        corpus.get("nope")


def test_dpr_tsv_with_header(tmp_path):
    tsv = tmp_path / "psgs.tsv"
    tsv.write_text('id\ttext\ttitle\n1\t"quoted"" text" here\tT1\n2\tplain\tT2\n', encoding="utf-8")
    corpus = prepare(tmp_path, tsv, chunk_words=0)
    assert [corpus[i]["id"] for i in range(2)] == ["1", "2"]
    assert corpus.get("1")["title"] == "T1"


def test_datasets_folder_input(tmp_path):
    import datasets

    folder = tmp_path / "ds"
    datasets.Dataset.from_list([{"id": "a", "title": "A", "text": "x y z"}]).save_to_disk(str(folder))
    corpus = prepare(tmp_path, folder, chunk_words=2)
    assert [corpus[i]["text"] for i in range(len(corpus))] == ["x y", "z"]
    assert [corpus[i]["id"] for i in range(len(corpus))] == ["a-0", "a-1"]


def test_chunking_keeps_document_fields_and_stable_ids(tmp_path):
    doc = {"id": "long", "title": "T", "section": "S", "text": " ".join(f"w{i}" for i in range(250))}
    src = write_jsonl(tmp_path / "d.jsonl", [doc])
    corpus = prepare(tmp_path, src, chunk_words=100)
    rows = [corpus[i] for i in range(len(corpus))]
    assert [r["id"] for r in rows] == ["long-0", "long-1", "long-2"]
    assert [len(r["text"].split()) for r in rows] == [100, 100, 50]
    assert all(r["doc_id"] == "long" and r["title"] == "T" and r["section"] == "S" for r in rows)
    again = tmp_path / "again"
    prepare_corpus([src], again, chunk_words=100, progress=False)
    assert Corpus.load(again).fingerprint == corpus.fingerprint


@settings(max_examples=200, deadline=None)
@given(
    n_words=st.integers(0, 400),
    chunk=st.integers(1, 60),
    overlap=st.integers(0, 59),
)
def test_chunker_loses_and_duplicates_nothing_beyond_overlap(n_words, chunk, overlap):
    stride = max(1, chunk - min(overlap, chunk - 1))
    words = [f"w{i}" for i in range(n_words)]
    pieces = chunk_text(" ".join(words), chunk, stride)
    if n_words <= chunk:
        assert pieces == [" ".join(words)]
        return
    windows = [p.split() for p in pieces]
    assert all(len(w) <= chunk for w in windows)
    # windows start every `stride` words and the last one ends at the last word
    starts = [int(w[0][1:]) for w in windows]
    assert starts == [i * stride for i in range(len(windows))]
    assert int(windows[-1][-1][1:]) == n_words - 1
    flat = [w for window in windows for w in window]
    assert set(flat) == set(words)
    # each word appears once, plus at most ceil(overlap / stride) extra times
    extra = -(-(chunk - stride) // stride)
    counts = {w: flat.count(w) for w in words}
    assert max(counts.values()) <= 1 + extra
    if stride == chunk:
        assert flat == words


def test_bad_stride_is_rejected():
    with pytest.raises(ValueError, match="stride must be in 1..chunk_words"):
        chunk_text("a b c d", 2, 5)


@pytest.mark.parametrize(
    "chunk_words, stride, message",
    [
        (100, 0, r"stride must be in 1..chunk_words \(100\), got 0 \(leave it out for no overlap"),
        (100, 101, r"stride must be in 1..chunk_words \(100\), got 101"),
        (100, -5, r"stride must be in 1..chunk_words \(100\), got -5"),
        (0, 50, r"stride 50 given without chunking \(chunk_words 0\)"),
    ],
)
def test_bad_stride_is_rejected_before_reading_anything(tmp_path, chunk_words, stride, message):
    """Checked up front, even when no document is long enough to be chunked, and even when
    the inputs do not exist: the settings are wrong whatever the data."""
    short = write_jsonl(tmp_path / "short.jsonl", [{"id": "a", "text": "three short words"}])
    for inputs in ([short], [tmp_path / "missing.jsonl"]):
        with pytest.raises(ValueError, match=message):
            prepare_corpus(inputs, tmp_path / "out", chunk_words=chunk_words, stride=stride, progress=False)
    assert not (tmp_path / "out").exists()


def test_stride_overlaps_passages_and_is_recorded(tmp_path):
    doc = {"id": "d", "text": " ".join(f"w{i}" for i in range(10))}
    corpus = prepare(tmp_path, write_jsonl(tmp_path / "d.jsonl", [doc]), chunk_words=4, stride=3)
    assert [corpus[i]["text"] for i in range(len(corpus))] == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8 w9"]
    assert corpus.manifest.stride == 3
    default = tmp_path / "default"
    prepare_corpus([tmp_path / "d.jsonl"], default, chunk_words=4, progress=False)
    assert json.loads((default / "corpus.json").read_text())["stride"] == 4  # None = no overlap


def test_cli_rejects_stride_zero_with_a_clear_message(tmp_path, capsys):
    import argparse

    from atlas.cli import corpus_commands as cli_corpus

    src = write_jsonl(tmp_path / "d.jsonl", DOCS)
    parser = argparse.ArgumentParser(prog="atlas")
    cli_corpus.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["corpus", "prepare", str(src), "--out", str(tmp_path / "o"), "--stride", "0"])
    with pytest.raises(ValueError, match="got 0"):
        args.func(args)


@pytest.mark.parametrize(
    "content, line, field, message",
    [
        (b'{"id": "a", "text": "ok"}\n{"id": "b", "text": \n', 2, None, "invalid JSON"),
        (b'{"id": "a", "text": "ok"}\n{"title": "x", "text": "t"}\n', 2, "id", "missing required field"),
        (b'{"id": "a"}\n', 1, "text", "missing required field"),
        (b'{"id": "a", "text": ["list"]}\n', 1, "text", "expected a string, got list"),
        (b'{"id": "a", "text": "t", "title": 3.5}\n', 1, "title", "expected a string, got float"),
        (b'{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', 2, "id", "duplicate id"),
        (b'{"id": "a", "text": "caf\xe9"}\n', 1, None, "invalid UTF-8"),
        (b'["not", "an", "object"]\n', 1, None, "expected a JSON object"),
        (b'{"id": "a", "text": "   "}\n', 1, "text", "empty text"),
    ],
)
def test_bad_jsonl_record_names_file_line_and_field(tmp_path, content, line, field, message):
    src = tmp_path / "bad.jsonl"
    src.write_bytes(content)
    with pytest.raises(InputError) as info:
        prepare_corpus([src], tmp_path / "out", progress=False)
    err = info.value
    assert (err.path, err.line, err.field) == (str(src), line, field)
    assert message in str(err) and f"{src}:{line}" in str(err)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.jsonl"]  # no temp folder left behind


def test_duplicate_error_names_both_places(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"id": "x", "text": "one"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"id": "y", "text": "two"}, {"id": "x", "text": "3"}])
    with pytest.raises(InputError, match=rf"{b}:2: field 'id': duplicate id \(first seen at {a}:1\)"):
        prepare_corpus([a, b], tmp_path / "out", progress=False)


def test_tsv_row_of_wrong_width(tmp_path):
    tsv = tmp_path / "p.tsv"
    tsv.write_text("1\ttext\ttitle\n2\tonly two\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"p.tsv:2: expected 3 tab-separated columns .* got 2"):
        prepare_corpus([tsv], tmp_path / "out", progress=False)


@pytest.mark.parametrize("suffix", [".jsonl", ".tsv"])
def test_empty_file(tmp_path, suffix):
    empty = tmp_path / f"empty{suffix}"
    empty.write_text("\n\n")
    with pytest.raises(InputError, match="file is empty"):
        prepare_corpus([empty], tmp_path / "out", progress=False)


@pytest.mark.parametrize("suffix", [".jsonl", ".tsv"])
def test_skip_invalid_skips_an_empty_file_with_a_warning(tmp_path, suffix, caplog):
    empty = tmp_path / f"empty{suffix}"
    empty.write_text(" \n\n")
    good = write_jsonl(tmp_path / "good.jsonl", DOCS)
    with caplog.at_level("WARNING", logger="retriever.corpus"):
        stats = prepare_corpus([empty, good], tmp_path / "out", skip_invalid=True, progress=False)
    assert stats.skipped_files == [str(empty)] and stats.documents == 3
    assert f"{empty}: skipped: the input is empty" in caplog.text
    assert Corpus.load(tmp_path / "out").manifest.stats["skipped_files"] == [str(empty)]
    # only empty inputs: still nothing to index, which is an error
    with pytest.raises(InputError, match="no valid documents in the input"):
        prepare_corpus([empty], tmp_path / "out2", skip_invalid=True, progress=False)
    # a missing file is not "empty": it is a mistake, --skip-invalid or not
    with pytest.raises(InputError, match="missing.jsonl: file not found"):
        prepare_corpus([tmp_path / "missing.jsonl", good], tmp_path / "out3", skip_invalid=True, progress=False)


def test_tsv_invalid_utf8_names_file_and_line(tmp_path):
    tsv = tmp_path / "p.tsv"
    tsv.write_bytes(b"1\tgood text\tT1\n2\tcaf\xe9 au lait\tT2\n")
    with pytest.raises(InputError) as info:
        prepare_corpus([tsv], tmp_path / "out", progress=False)
    assert (info.value.path, info.value.line) == (str(tsv), 2)
    assert f"{tsv}:2: invalid UTF-8" in str(info.value)


def test_skip_invalid_on_tsv_counts_and_keeps_the_rest(tmp_path):
    tsv = tmp_path / "p.tsv"
    tsv.write_bytes(
        b"id\ttext\ttitle\n"
        b"1\tfirst passage\tT1\n"
        b"2\tcaf\xe9\tT2\n"  # invalid UTF-8
        b"3\tonly two columns\n"
        b"\tempty id\tT4\n"
        b"5\t   \tT5\n"  # empty text
        b"1\tduplicate id\tT6\n"
        b"7\tlast passage\tT7\n"
    )
    stats = prepare_corpus([tsv], tmp_path / "out", skip_invalid=True, progress=False, chunk_words=0)
    corpus = Corpus.load(tmp_path / "out")
    assert (stats.documents, stats.passages, stats.skipped) == (2, 2, 5)
    assert [corpus[i]["id"] for i in range(len(corpus))] == ["1", "7"]
    assert corpus.get("1")["text"] == "first passage"
    reasons = "\n".join(stats.skipped_reasons)
    assert f"{tsv}:3: invalid UTF-8" in reasons and f"{tsv}:4: expected 3 tab-separated columns" in reasons


def test_skip_invalid_counts_and_keeps_the_rest(tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_bytes(
        b'{"id": "a", "text": "alpha beta"}\n'
        b"{broken\n"
        b'{"id": "b"}\n'
        b'{"id": "a", "text": "again", "title": "dup"}\n'
        b'{"id": "c", "text": "caf\xe9"}\n'
        b'{"id": "d", "text": "delta"}\n'
    )
    stats = prepare_corpus([src], tmp_path / "out", skip_invalid=True, progress=False)
    corpus = Corpus.load(tmp_path / "out")
    assert (stats.documents, stats.passages, stats.skipped) == (2, 2, 4)
    assert [corpus[i]["id"] for i in range(len(corpus))] == ["a-0", "d-0"]
    assert corpus.get("a-0")["text"] == "alpha beta"  # the first of the duplicates wins
    assert corpus.manifest.count == 2


def test_existing_output_is_not_overwritten_without_asking(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", DOCS)
    prepare_corpus([src], tmp_path / "out", progress=False)
    with pytest.raises(FileExistsError, match="--overwrite"):
        prepare_corpus([src], tmp_path / "out", progress=False)
    prepare_corpus([src], tmp_path / "out", progress=False, overwrite=True, chunk_words=1)
    assert len(Corpus.load(tmp_path / "out")) == 3 + 4 + 2  # one passage per word


def test_real_nq824_and_wikitext_chunks(shared_data, tmp_path):
    inputs = [shared_data / "nq824" / "documents.jsonl", shared_data / "wikitext2-articles.jsonl"]
    stats = prepare_corpus(inputs, tmp_path / "c", chunk_words=100, progress=False)
    corpus = Corpus.load(tmp_path / "c")
    assert stats.documents == 820 + 122 and stats.skipped == 0
    assert len(corpus) == stats.passages > stats.documents
    lengths = [len(p["text"].split()) for _, batch in corpus.iter_batches(2048) for p in batch]
    assert max(lengths) <= 100 and sum(lengths) == stats.words
