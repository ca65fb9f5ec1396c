"""The corpus's `corpus.json` as a typed record: the file as every atlas has written it loads and is written back
byte for byte; a corrupt or mistyped field is one error naming the file and the field."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from retriever.corpus import Corpus, merge_corpora, prepare_corpus
from retriever.corpus_manifest import CORPUS_MANIFEST, CorpusManifest, InvalidCorpusError

# corpus.json as `prepare_corpus` writes it (json.dumps(record, indent=2) + newline), key for key
WRITTEN = """{
  "format_version": 1,
  "fingerprint": "5d41402abc4b2a76b9719d911017c592",
  "count": 3,
  "chunk_words": 100,
  "stride": 100,
  "sources": [
    "/data/docs.jsonl"
  ],
  "created": "2026-11-22T10:00:00Z",
  "stats": {
    "documents": 2,
    "passages": 3,
    "words": 150,
    "skipped": 0,
    "skipped_reasons": [],
    "skipped_files": []
  }
}
"""


def test_a_corpus_json_as_written_loads_and_is_written_back_byte_for_byte(tmp_path):
    (tmp_path / CORPUS_MANIFEST).write_text(WRITTEN)
    manifest = CorpusManifest.load(tmp_path)
    assert manifest.fingerprint == "5d41402abc4b2a76b9719d911017c592" and manifest.format_version == 1
    assert (manifest.count, manifest.chunk_words, manifest.stride) == (3, 100, 100)
    assert manifest.sources == ["/data/docs.jsonl"] and manifest.stats["passages"] == 3 and not manifest.merged
    manifest.save(tmp_path / "again")
    assert (tmp_path / "again" / CORPUS_MANIFEST).read_text() == WRITTEN


def test_prepared_and_merged_corpora_round_trip(tmp_path):
    docs = tmp_path / "d.jsonl"
    docs.write_text('{"id": "a", "text": "alpha beta gamma"}\n{"id": "b", "text": "delta"}\n')
    prepare_corpus([docs], tmp_path / "c", chunk_words=2, progress=False)
    merged = merge_corpora([(Corpus.load(tmp_path / "c"), np.array([0, 2]))], tmp_path / "m")
    for folder in (tmp_path / "c", tmp_path / "m"):
        written = json.loads((folder / CORPUS_MANIFEST).read_text())
        manifest = CorpusManifest.load(folder)
        assert manifest.to_json() == written and list(manifest.to_json()) == list(written)  # keys in their order
        assert CorpusManifest.from_json(manifest.to_json(), folder / CORPUS_MANIFEST) == manifest
    assert merged.manifest.merged and merged.manifest.count == 2 and merged.manifest.chunk_words == 2
    assert "merged" not in json.loads((tmp_path / "c" / CORPUS_MANIFEST).read_text())


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda d: d.update(count="3"), "field count must be an integer, got '3'"),
        (lambda d: d.update(count=-1), "field count must be >= 0, got -1"),
        (lambda d: d.pop("fingerprint"), "field fingerprint is missing"),
        (lambda d: d.update(sources=["/a", 7]), r"field sources\[1\] must be a string, got 7"),
        (lambda d: d.update(stride="none"), "field stride must be an integer, got 'none'"),
        (lambda d: d.update(stats=[]), r"field stats must be an object, got \[\]"),
        (lambda d: d.update(format_version=2), "field format_version is 2, this atlas reads 1"),
    ],
)
def test_a_bad_field_is_one_error_naming_the_file_and_the_field(tmp_path, corrupt, message):
    data = json.loads(WRITTEN)
    corrupt(data)
    (tmp_path / CORPUS_MANIFEST).write_text(json.dumps(data))
    with pytest.raises(InvalidCorpusError, match=f"^{re.escape(str(tmp_path / CORPUS_MANIFEST))}: {message}"):
        Corpus.load(tmp_path)


def test_a_corrupt_or_missing_corpus_json_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a prepared corpus"):
        Corpus.load(tmp_path)
    (tmp_path / CORPUS_MANIFEST).write_text('{"format_version": 1,')
    where = re.escape(str(tmp_path / CORPUS_MANIFEST))
    with pytest.raises(InvalidCorpusError, match=f"^{where}: corrupted corpus manifest"):
        Corpus.load(tmp_path)
    (tmp_path / CORPUS_MANIFEST).write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"corpus.json: field manifest must be an object, got \[1, 2\]"):
        Corpus.load(tmp_path)
