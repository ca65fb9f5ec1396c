"""The typed manifest: what it reads (versions 1 and 2), what it refuses (one line naming the file and the field),
the files it confines to the index folder, the sampled hashes a load checks, and the precision it records."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from retriever.index import CorpusMismatchError, InvalidIndexError, PassageIndex
from retriever.index.build import build_index
from retriever.index.manifest import SAMPLE_BLOCKS, SAMPLE_BYTES, Manifest, sampled_sha256
from retriever.index.update import add_passages

N = 3000  # 3000 × 32 float16 = 192 KB of vectors: larger than the sampled blocks together


@pytest.fixture(scope="module")
def built(tmp_path_factory, make_synthetic_corpus, clustered_source) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("manifest")
    corpus = make_synthetic_corpus(root, N)
    return corpus, build_index(corpus, clustered_source(), root / "ix", progress=False)


@pytest.fixture
def index(built, tmp_path) -> Path:
    folder = tmp_path / "ix"
    shutil.copytree(built[1], folder)
    return folder


def rewrite(folder: Path, change) -> None:
    data = json.loads((folder / "manifest.json").read_text())
    change(data)
    (folder / "manifest.json").write_text(json.dumps(data))


def test_a_manifest_round_trips_and_holds_every_field_it_read(index):
    manifest = Manifest.load(index)
    assert manifest.spec == "Flat" and manifest.count == manifest.total == N and manifest.dead_rows == 0
    assert manifest.embedding_precision == "fp32" and manifest.segments[0].embedding_precision == "fp32"
    assert manifest.files["vectors"].sampled_sha256 == sampled_sha256(index / manifest.files["vectors"].name)
    on_disk = json.loads((index / "manifest.json").read_text())
    assert manifest.to_json() == on_disk
    assert Manifest.from_json(manifest.to_json(), index / "manifest.json") == manifest


def test_a_version_1_manifest_still_reads_and_searches(index, clustered_source):
    """What an index written before segment files, sampled hashes and precisions holds: it reads with their
    defaults, searches, and takes an edit (then written as version 2)."""
    expected = PassageIndex.load(index).search_vectors(np.eye(32, dtype=np.float32)[:3], 5)

    def as_version_1(data):
        data["format_version"] = 1
        data["rerank"] = data.pop("exact_rerank")
        data.pop("embedding_precision")
        for segment in data["segments"]:
            for key in ("bytes", "sampled_sha256", "embedding_precision"):
                segment.pop(key)
        for record in data["files"].values():
            record.pop("sampled_sha256")

    rewrite(index, as_version_1)
    manifest = Manifest.load(index)
    assert manifest.format_version == 1 and manifest.embedding_precision == "fp32"
    assert manifest.files["vectors"].sampled_sha256 is None and manifest.segments[0].bytes is None
    _, rows = PassageIndex.load(index).search_vectors(np.eye(32, dtype=np.float32)[:3], 5)
    np.testing.assert_array_equal(rows, expected[1])
    add_passages(index, [{"id": f"s{N}", "text": "new"}], clustered_source(), progress=False)
    assert json.loads((index / "manifest.json").read_text())["format_version"] == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(count="many"), r"manifest.json: field count must be an integer, got 'many'"),
        (lambda d: d.pop("spec"), r"manifest.json: field spec is missing"),
        (lambda d: d["segments"][0].update(offset=5), r"field segments\[0\].offset is 5, the segments before it end"),
        (lambda d: d["files"]["vectors"].update(bytes=-1), r"field files.vectors.bytes must be >= 0"),
        (lambda d: d.update(embedding_precision="fp8"), r"field embedding_precision must be one of \('fp32', 'bf16'\)"),
        (lambda d: d.update(format_version=9), r"format_version 9, this atlas reads 1 and 2"),
        (lambda d: d["files"].update(extra=d["files"]["vectors"]), r"field files has unknown roles \['extra'\]"),
    ],
)
def test_a_bad_field_is_one_error_naming_the_file_and_the_field(index, change, message):
    rewrite(index, change)
    with pytest.raises(InvalidIndexError, match=message) as error:
        PassageIndex.load(index)
    assert str(index / "manifest.json") in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["../vectors.g1.npy", "/etc/passwd", "sub/vectors.g1.npy", ".."])
def test_a_file_name_that_leaves_the_folder_is_refused(index, name):
    rewrite(index, lambda d: d["files"]["vectors"].update(name=name))
    with pytest.raises(InvalidIndexError, match=r"field files.vectors.name is .*not a file name inside the index"):
        PassageIndex.load(index)


def test_a_relative_corpus_path_that_leaves_the_folder_is_refused(index):
    rewrite(index, lambda d: d["segments"][0].update(corpus="../elsewhere"))
    with pytest.raises(InvalidIndexError, match=r"field segments\[0\].corpus is '../elsewhere'.*stay inside"):
        PassageIndex.load(index)


def test_a_symlink_that_leads_outside_the_folder_is_refused(index, tmp_path):
    vectors = index / "vectors.g1.npy"
    outside = tmp_path / "outside.npy"
    shutil.move(vectors, outside)
    os.symlink(outside, vectors)
    with pytest.raises(InvalidIndexError, match=r"vectors.g1.npy: a link to .*outside.npy, outside the index folder"):
        PassageIndex.load(index)
    vectors.unlink()
    os.symlink("../ix/" + "x", vectors)  # a link that stays inside (dangling): not refused as leaving
    with pytest.raises(InvalidIndexError, match="missing index file"):
        PassageIndex.load(index)


def test_a_vectors_file_zero_filled_past_its_header_fails_to_load_in_one_line(index):
    """The same size, a valid .npy header, zeros after it: the size check passes and numpy reads it; the sampled
    blocks do not."""
    vectors = index / "vectors.g1.npy"
    size = vectors.stat().st_size
    assert size > SAMPLE_BLOCKS * SAMPLE_BYTES
    with open(vectors, "r+b") as f:
        f.seek(128)  # np.save's header
        f.write(b"\0" * (size - 128))
    assert np.load(vectors, mmap_mode="r").shape == (N, 32)  # still a readable array of the right shape
    with pytest.raises(InvalidIndexError) as error:
        PassageIndex.load(index)
    assert str(error.value) == (
        f"{vectors}: altered (same size, but its sampled blocks differ from the manifest's: zero-filled or "
        "rewritten); restore it or rebuild the index (`atlas index info --verify` checks every byte)"
    )


def test_a_file_rewritten_with_the_same_size_fails_to_load(index, built):
    """Another index's vectors file of the same size put in place of this one's."""
    other = np.load(index / "vectors.g1.npy")[::-1].copy()
    np.save(index / "vectors.g1.npy", other)
    with pytest.raises(InvalidIndexError, match="vectors.g1.npy: altered"):
        PassageIndex.load(index)


def test_a_zero_filled_corpus_of_the_same_size_fails_to_load(built, tmp_path, clustered_source):
    corpus = tmp_path / "corpus"
    shutil.copytree(built[0], corpus)
    folder = build_index(corpus, clustered_source(), tmp_path / "ix", progress=False)
    arrow = corpus / "passages.arrow"
    arrow.write_bytes(b"\0" * arrow.stat().st_size)
    with pytest.raises(CorpusMismatchError, match=r"passages.arrow: altered \(same size, but its sampled blocks"):
        PassageIndex.load(folder)


class PrecisionSource:
    """A passage encoder that embeds at the precision asked (bfloat16: its float32 vectors rounded through
    bfloat16, as an autocast encoder's are) and records what it was asked."""

    def __init__(self, clustered_source):
        self.source = clustered_source()
        self.dim, self.asked = self.source.dim, []
        self.passage_format, self.passage_maxlength = self.source.passage_format, self.source.passage_maxlength

    def passage_fingerprint(self) -> str:
        return self.source.passage_fingerprint()

    def passage_lengths(self, passages) -> np.ndarray:
        return self.source.passage_lengths(passages)

    def parameters(self):
        return iter([torch.zeros(1)])  # on the CPU

    def embed_passages(self, passages, *, batch_size=64, progress=False, precision="fp32") -> np.ndarray:
        self.asked.append(precision)
        vectors = self.source.embed_passages(passages)
        if precision == "bf16":
            vectors = torch.from_numpy(vectors).to(torch.bfloat16).float().numpy()
        return vectors


def test_the_precision_is_passed_to_the_encoder_and_recorded_per_segment(built, tmp_path, clustered_source):
    encoder = PrecisionSource(clustered_source)
    folder = build_index(built[0], encoder, tmp_path / "ix", progress=False, precision="bf16")
    assert set(encoder.asked) == {"bf16"}
    manifest = Manifest.load(folder)
    assert manifest.embedding_precision == manifest.segments[0].embedding_precision == "bf16"
    add_passages(folder, [{"id": f"s{N}", "text": "new"}], encoder, progress=False, precision="fp32")
    assert encoder.asked[-1] == "fp32"
    assert [s.embedding_precision for s in Manifest.load(folder).segments] == ["bf16", "fp32"]
    # queries embedded in float32 search bfloat16 vectors: each passage's own vector finds it first
    queries = clustered_source().embed_passages([{"id": f"s{i}"} for i in (0, 7, N)])
    _, rows = PassageIndex.load(folder, retriever=encoder).search_vectors(queries, 1)
    assert rows[:, 0].tolist() == [0, 7, N]
    with pytest.raises(ValueError, match="unknown embedding precision 'fp16'; valid: auto, fp32, bf16"):
        build_index(built[0], encoder, tmp_path / "ix2", progress=False, precision="fp16")


def test_an_encoder_without_a_precision_records_float32(index):
    """The stand-in encoder takes no precision (nor did the encoder before issue 51): what was done is recorded."""
    assert Manifest.load(index).embedding_precision == "fp32"
