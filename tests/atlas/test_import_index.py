"""`atlas import atlas-index`: the reference's saved index shards (`embeddings.{i}.pt`, float16
(d, n_i); `passages.{i}.pt`, plain pickles of passage dicts) → a corpus and an index of this
project. Checked: the same top-k ids and scores as brute force over the original tensors, for
Flat and a FAISS spec; the manifest's encoder fingerprint; resuming after an interruption gives
the same files; bad or unsafe input gives one error naming the file and leaves nothing behind."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from atlas.cli import main
from atlas.importing.reference_index import import_atlas_index
from atlas.importing.safe_pickle import UnsafePickleError
from common.io import InputError
from retriever.index.settings import IndexSettings

SIZES = (5, 4, 6)  # passages per shard
DIM = 32  # the tiny encoder's (tests/conftest.py)


def write_reference_index(folder: Path, sizes=SIZES, dim: int = DIM, seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    """Shards as the reference's DistributedIndex.save_index writes them; returns the
    (N, d) float16 vectors and the passage ids, in index order."""
    generator = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    # the reference's index keeps one (d, N) float16 tensor and saves column slices of it: each
    # shard file is a strided view of the whole storage, not a contiguous (d, n_i) tensor
    embeddings = torch.randn(dim, sum(sizes), generator=generator).to(torch.float16)
    ids, start = [], 0
    for shard, n in enumerate(sizes):
        passages = [
            {
                "id": str(1000 + start + i),
                "title": f"Title {start + i}",
                "text": f"passage text {start + i}",
                "section": "History" if i % 2 else "",
            }
            for i in range(n)
        ]
        torch.save(embeddings[:, start : start + n], folder / f"embeddings.{shard}.pt")
        with open(folder / f"passages.{shard}.pt", "wb") as f:
            pickle.dump(passages, f, protocol=pickle.HIGHEST_PROTOCOL)
        ids += [p["id"] for p in passages]
        start += n
    return embeddings.T.contiguous(), ids


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture
def reference_index(tmp_path):
    vectors, ids = write_reference_index(tmp_path / "ref")
    return {"src": tmp_path / "ref", "vectors": vectors, "ids": ids}


def _outputs(tmp_path: Path) -> dict[str, Path]:
    return {"corpus_out": tmp_path / "out" / "corpus", "index_out": tmp_path / "out" / "index"}


@pytest.mark.parametrize(("spec", "nprobe"), [("Flat", 32), ("IVF2,Flat", 2)])
def test_same_top_k_ids_and_scores_as_brute_force(tmp_path, reference_index, tiny_encoder_path, spec, nprobe):
    from retriever.corpus import Corpus
    from retriever.index import EncoderMismatchError, PassageIndex
    from retriever.retriever import Retriever

    corpus, index = import_atlas_index(
        reference_index["src"],
        encoder=tiny_encoder_path,
        settings=IndexSettings(spec=spec, nprobe=nprobe, train_sample=100),
        progress=False,
        **_outputs(tmp_path),
    )
    assert [p["id"] for p in Corpus.load(corpus).rows(range(sum(SIZES)))] == reference_index["ids"]
    assert Corpus.load(corpus)[6] == {
        "id": "1006",
        "doc_id": "1006",
        "title": "Title 6",
        "section": "History",
        "text": "passage text 6",
        "wikipedia_id": "",
    }
    retriever = Retriever.from_pretrained(tiny_encoder_path)
    loaded = PassageIndex.load(index, retriever=retriever, verify=True)
    queries = torch.randn(7, DIM, generator=torch.Generator().manual_seed(1))
    k = 5
    scores, rows = loaded.search_vectors(queries.numpy(), k)
    brute = queries @ reference_index["vectors"].float().T  # (Q, N) over the original tensors
    expected_scores, expected_rows = brute.topk(k, dim=1)
    ids = np.array(reference_index["ids"])
    assert (ids[rows] == ids[expected_rows.numpy()]).all()
    np.testing.assert_allclose(scores, expected_scores.numpy(), rtol=1e-5, atol=1e-5)
    hits = loaded.search(queries.numpy(), k)
    assert [h.id for h in hits[0]] == list(ids[expected_rows[0].numpy()])

    if spec == "Flat":  # the reference's float16 vectors, bit for bit, in passage order
        stored = np.load(index / "vectors.g1.npy")
        assert stored.dtype == np.float16 and np.array_equal(stored, reference_index["vectors"].numpy())

    manifest = json.loads((index / "manifest.json").read_text())
    assert manifest["encoder_fingerprint"] == retriever.passage_fingerprint()
    assert manifest["spec"] == spec and manifest["imported"]["shards"] == 3
    # random vectors, not the tiny encoder's: the import says they disagree (a warning, not an error)
    assert manifest["imported"]["encoder_agreement"] < 0.98
    assert not (tmp_path / "out" / "index.building").exists()
    other = Retriever.from_pretrained(tiny_encoder_path, passage_maxlength=17)  # another passage encoding
    with pytest.raises(EncoderMismatchError):
        PassageIndex.load(index, retriever=other)


def test_cli_import_then_index_info_verify(tmp_path, reference_index, tiny_encoder_path, capsys):
    out = _outputs(tmp_path)
    args = [
        "import",
        "atlas-index",
        str(reference_index["src"]),
        "--corpus-out",
        str(out["corpus_out"]),
        "--index-out",
        str(out["index_out"]),
        "--encoder",
        str(tiny_encoder_path),
    ]
    assert main(args) == 0
    assert main(["index", "info", "--index", str(out["index_out"]), "--verify"]) == 0
    assert main(args) == 2  # outputs exist: refused, untouched
    assert "already exists" in capsys.readouterr().err


class Interrupted(Exception):
    pass


def test_interrupted_import_resumes_to_the_same_files(tmp_path, reference_index, tiny_encoder_path):
    def stop_after_first(shard: int) -> None:
        if shard == 0:
            raise Interrupted

    first = _outputs(tmp_path)
    with pytest.raises(Interrupted):
        import_atlas_index(
            reference_index["src"], encoder=tiny_encoder_path, progress=False, on_shard=stop_after_first, **first
        )
    work = tmp_path / "out" / "index.building"
    assert json.loads((work / "import-progress.json").read_text())["completed_shards"] == 1
    assert not first["corpus_out"].exists() and not first["index_out"].exists()
    done = []
    import_atlas_index(reference_index["src"], encoder=tiny_encoder_path, progress=False, on_shard=done.append, **first)
    assert done == [1, 2]  # shard 0 was not read again
    fresh = {"corpus_out": tmp_path / "fresh" / "corpus", "index_out": tmp_path / "fresh" / "index"}
    import_atlas_index(reference_index["src"], encoder=tiny_encoder_path, progress=False, **fresh)
    for name in ("passages.arrow", "id_hashes.npy", "id_rows.npy"):
        assert (first["corpus_out"] / name).read_bytes() == (fresh["corpus_out"] / name).read_bytes()
    assert (first["index_out"] / "vectors.g1.npy").read_bytes() == (fresh["index_out"] / "vectors.g1.npy").read_bytes()
    assert not work.exists()


def test_restart_discards_an_interrupted_import_with_its_corpus(
    tmp_path, reference_index, tiny_encoder_path, monkeypatch
):
    """Killed while building the index (the corpus already written): `restart=True` starts over
    and replaces that corpus too, instead of copying every shard and then refusing it."""

    def killed(*args, **kwargs):
        raise Interrupted

    out = _outputs(tmp_path)
    monkeypatch.setattr("atlas.importing.reference_index.build_index", killed)
    with pytest.raises(Interrupted):
        import_atlas_index(reference_index["src"], encoder=tiny_encoder_path, progress=False, **out)
    assert (out["corpus_out"] / "corpus.json").is_file() and not out["index_out"].exists()
    monkeypatch.undo()
    done = []
    import_atlas_index(
        reference_index["src"], encoder=tiny_encoder_path, progress=False, restart=True, on_shard=done.append, **out
    )
    assert done == [0, 1, 2]  # started over
    assert (out["index_out"] / "manifest.json").is_file() and not (tmp_path / "out" / "index.building").exists()


# --- bad input: one error naming the file, nothing written ------------------------------------


def _refused(tmp_path, src, encoder, error=InputError, match=""):
    before = tree(tmp_path)
    with pytest.raises(error, match=match) as caught:
        import_atlas_index(src, encoder=encoder, progress=False, **_outputs(tmp_path))
    assert tree(tmp_path) == before  # no corpus, no index, no work folder
    return caught.value


def test_missing_shard_is_named(tmp_path, reference_index, tiny_encoder_path):
    (reference_index["src"] / "passages.1.pt").unlink()
    error = _refused(tmp_path, reference_index["src"], tiny_encoder_path, match="missing shard")
    assert error.path == str(reference_index["src"] / "passages.1.pt")
    (reference_index["src"] / "embeddings.1.pt").unlink()  # a gap in the numbering
    error = _refused(tmp_path, reference_index["src"], tiny_encoder_path, match="missing shard")
    assert error.path == str(reference_index["src"] / "embeddings.1.pt")


def test_truncated_shard_is_named(tmp_path, reference_index, tiny_encoder_path):
    path = reference_index["src"] / "embeddings.2.pt"
    path.write_bytes(path.read_bytes()[:200])
    assert _refused(tmp_path, reference_index["src"], tiny_encoder_path, match="truncated").path == str(path)


def test_truncated_passages_are_named(tmp_path, reference_index, tiny_encoder_path):
    path = reference_index["src"] / "passages.2.pt"
    path.write_bytes(path.read_bytes()[:-40])
    assert _refused(tmp_path, reference_index["src"], tiny_encoder_path, match="truncated").path == str(path)


def test_corrupt_passages_are_named(tmp_path, reference_index, tiny_encoder_path):
    """A damaged passages pickle gives an InputError naming it, never a bare OverflowError."""
    path = reference_index["src"] / "passages.1.pt"
    path.write_bytes(b"\x80\x04\x95" + b"\xff" * 8 + path.read_bytes()[11:])  # a FRAME of 2**64 - 1 bytes
    assert _refused(tmp_path, reference_index["src"], tiny_encoder_path, match="truncated").path == str(path)


def test_damaged_zip_shard_is_named(tmp_path, reference_index, tiny_encoder_path):
    """A zip end record that `zipfile` itself rejects (a multi-disk ZIP64 locator): an InputError
    naming the shard, not a zipfile.BadZipFile."""
    import struct

    path = reference_index["src"] / "embeddings.1.pt"
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 1, 0, 2)  # ZIP64 locator: disk 1 of 2
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0, 0, 0, 0, 0)
    path.write_bytes(path.read_bytes()[:100] + locator + end)
    assert _refused(tmp_path, reference_index["src"], tiny_encoder_path, match="truncated").path == str(path)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_unreadable_embeddings_error_does_not_advise_unsafe_loading(tmp_path, reference_index, tiny_encoder_path):
    """torch's own message says to retry with `weights_only=False` (which runs pickled code): the
    error keeps only the reason (here a plain pickle where a torch file belongs)."""
    path = reference_index["src"] / "embeddings.1.pt"
    with open(path, "wb") as f:
        pickle.dump([[0.5] * DIM] * 4, f, protocol=pickle.HIGHEST_PROTOCOL)
    error = _refused(tmp_path, reference_index["src"], tiny_encoder_path, match="truncated or not a torch file")
    assert error.path == str(path) and "Unsupported operand" in str(error)
    assert "weights_only" not in str(error) and "False" not in str(error)


def test_wrong_shapes_are_named(tmp_path, reference_index, tiny_encoder_path):
    src = reference_index["src"]
    torch.save(torch.zeros(16, 4, dtype=torch.float16), src / "embeddings.1.pt")  # d = 16, encoder has 32
    error = _refused(tmp_path, src, tiny_encoder_path, match="embedding size 32")
    assert error.path == str(src / "embeddings.1.pt")
    torch.save(torch.zeros(DIM, 3, dtype=torch.float16), src / "embeddings.1.pt")  # 3 vectors, 4 passages
    error = _refused(tmp_path, src, tiny_encoder_path, match="4 passages, but embeddings.1.pt holds 3 vectors")
    assert error.path == str(src / "passages.1.pt")


def test_malformed_and_duplicate_passages_are_named(tmp_path, reference_index, tiny_encoder_path):
    src = reference_index["src"]
    with open(src / "passages.2.pt", "wb") as f:
        pickle.dump([{"id": str(2000 + i), "title": "t", "text": "x"} for i in range(5)] + [{"title": "no id"}], f)
    error = _refused(tmp_path, src, tiny_encoder_path, match="missing required field")
    assert (error.path, error.line, error.field) == (str(src / "passages.2.pt"), 5, "id")
    with open(src / "passages.2.pt", "wb") as f:  # shard 2's entry 3 repeats shard 0's id "1002"
        pickle.dump([{"id": str(2000 + i) if i != 3 else "1002", "title": "t", "text": "x"} for i in range(6)], f)
    error = _refused(tmp_path, src, tiny_encoder_path, match="duplicate id")
    assert (error.path, error.line) == (str(src / "passages.2.pt"), 3)


class _Payload:
    """Unpickling this would run a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("target", ["passages.1.pt", "passages.1.pt (torch zip)", "embeddings.1.pt"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, reference_index, tiny_encoder_path, target):
    src, marker = reference_index["src"], tmp_path / "PWNED"
    payload = [{"id": "x", "title": "t", "text": "x", "extra": _Payload(marker)}] * 4
    if target == "passages.1.pt":
        with open(src / target, "wb") as f:
            pickle.dump(payload, f)
    elif target.startswith("passages"):  # the pickle nested in a torch zip file
        target = "passages.1.pt"
        torch.save(payload, src / target)
    else:
        torch.save({"embeddings": _Payload(marker)}, src / target)
    error = _refused(tmp_path, src, tiny_encoder_path, error=UnsafePickleError, match="refused to unpickle")
    assert error.path == str(src / target) and "system" in str(error)
    assert not marker.exists()
