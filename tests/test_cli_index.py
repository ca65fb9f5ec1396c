"""`atlas index ...` and `atlas evaluate-retrieval` end to end on a tiny encoder and tiny corpora:
build, swap the corpus, add, remove, search, info, encoder mismatch, retrieval metrics."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from atlas.cli import corpus as cli_corpus
from atlas.cli import index as cli_index
from retriever.encoder import ContrieverEncoder, Retriever, default_encoder_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="atlas")
    subparsers = parser.add_subparsers(dest="command")
    cli_corpus.register(subparsers)
    cli_index.register(subparsers)
    args = parser.parse_args([str(a) for a in argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def save_tiny_retriever(folder: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    encoder = ContrieverEncoder(
        BertModel(config, add_pooling_layer=False).eval(),
        AutoTokenizer.from_pretrained(default_encoder_path("minilm")),
        normalize=True,
    )
    Retriever(query_encoder=encoder, passage_maxlength=64).save_pretrained(folder)
    return folder


def write_docs(path: Path, docs: dict[str, str]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": i, "title": i.upper(), "text": t}) + "\n" for i, t in docs.items()
        )
    )
    return path


def search_ids(capsys, index: Path, query: str, k: int) -> list[str]:
    code, out, _ = run(capsys, "index", "search", index, query, "-k", k, "--json")
    assert code == 0
    return [h["id"] for h in json.loads(out)["hits"]]


def test_build_swap_add_remove_search(tmp_path, capsys):
    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    docs_a = write_docs(
        tmp_path / "a.jsonl", {f"a{i}": f"alpha text number {i} about rivers" for i in range(6)}
    )
    docs_b = write_docs(
        tmp_path / "b.jsonl", {f"b{i}": f"beta text number {i} about mountains" for i in range(5)}
    )
    for name, docs in (("ca", docs_a), ("cb", docs_b)):
        assert run(capsys, "corpus", "prepare", docs, "--out", tmp_path / name)[0] == 0

    assert (
        run(
            capsys,
            "index",
            "build",
            "--corpus",
            tmp_path / "ca",
            "--encoder",
            encoder,
            "--out",
            tmp_path / "ia",
        )[0]
        == 0
    )
    assert set(search_ids(capsys, tmp_path / "ia", "rivers", 10)) == {f"a{i}-0" for i in range(6)}
    # swap: same encoder, another corpus; no retraining, the other index untouched
    code, out, _ = run(
        capsys,
        "index",
        "build",
        "--corpus",
        tmp_path / "cb",
        "--encoder",
        encoder,
        "--out",
        tmp_path / "ib",
        "--spec",
        "IVF2,Flat",
        "--keep-embeddings",
    )
    assert code == 0 and "index built" in out
    assert set(search_ids(capsys, tmp_path / "ib", "mountains", 10)) == {
        f"b{i}-0" for i in range(5)
    }

    new = write_docs(
        tmp_path / "new.jsonl", {"c0": "gamma text about oceans", "c1": "delta text about deserts"}
    )
    code, out, _ = run(capsys, "index", "add", "--index", tmp_path / "ib", "--corpus", new)
    assert code == 0 and "added 2 passages; 7 live passages" in out
    assert set(search_ids(capsys, tmp_path / "ib", "oceans", 10)) == {
        f"b{i}-0" for i in range(5)
    } | {"c0-0", "c1-0"}

    ids = tmp_path / "ids.txt"
    ids.write_text("b1-0\nc0-0\n")
    code, out, _ = run(capsys, "index", "remove", "--index", tmp_path / "ib", "--ids", ids)
    assert code == 0 and "removed 2 passages (0 already removed); 5 live passages" in out
    assert set(search_ids(capsys, tmp_path / "ib", "oceans", 10)) == {
        "b0-0",
        "b2-0",
        "b3-0",
        "b4-0",
        "c1-0",
    }
    ids.write_text("zzz\n")
    code, _, err = run(capsys, "index", "remove", "--index", tmp_path / "ib", "--ids", ids)
    assert code == 2 and "1 id(s) are not in the index" in err and "'zzz'" in err

    code, out, _ = run(capsys, "index", "info", tmp_path / "ib", "--verify")
    info = json.loads(out)
    assert code == 0 and info["count"] == 5 and info["total"] == 7 and info["spec"] == "IVF2,Flat"
    assert info["verified"] and len(info["segments"]) == 2

    code, out, _ = run(capsys, "index", "search", tmp_path / "ia", "text about rivers", "-k", "2")
    assert (
        code == 0
        and out.startswith("query: text about rivers\n  1. [")
        and out.count("\n  2. [") == 1
    )


def test_encoder_mismatch_and_evaluate_retrieval(tmp_path, capsys):
    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    other = save_tiny_retriever(tmp_path / "other", 1)
    docs = write_docs(
        tmp_path / "d.jsonl", {"p": "paris is the capital of france", "b": "berlin is in germany"}
    )
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    run(
        capsys,
        "index",
        "build",
        "--corpus",
        tmp_path / "c",
        "--encoder",
        encoder,
        "--out",
        tmp_path / "i",
    )
    code, _, err = run(capsys, "index", "search", tmp_path / "i", "capital", "--encoder", other)
    assert code == 2 and "would not be comparable" in err and "--allow-encoder-mismatch" in err
    assert (
        run(
            capsys,
            "index",
            "search",
            tmp_path / "i",
            "capital",
            "--encoder",
            other,
            "--allow-encoder-mismatch",
        )[0]
        == 0
    )

    data = tmp_path / "q.jsonl"
    data.write_text(
        json.dumps({"question": "capital of france", "answers": ["Paris"], "gold_doc": "p"})
        + "\n"
        + json.dumps({"question": "where is berlin", "answer": ["Germany"]})
        + "\n"
        + json.dumps({"question": "tallest mountain", "answers": ["Everest"]})
        + "\n"
    )
    code, out, _ = run(
        capsys,
        "evaluate-retrieval",
        "--index",
        tmp_path / "i",
        "--data",
        data,
        "-k",
        "1",
        "2",
        "--out",
        tmp_path / "per_question.jsonl",
    )
    metrics = json.loads(out)
    records = [
        json.loads(line) for line in (tmp_path / "per_question.jsonl").read_text().splitlines()
    ]
    assert code == 0 and metrics["n"] == 3 and len(records) == 3
    # both passages are retrieved at k=2, so the two answerable questions are found, Everest is not
    assert metrics["answer_recall@2"] == pytest.approx(2 / 3) and metrics["gold_recall@2"] == 1.0
    ranks = [r["answer_rank"] for r in records]
    assert ranks[2] is None and metrics["answer_recall@1"] == pytest.approx(
        sum(r == 1 for r in ranks) / 3
    )


def test_info_verify_catches_what_a_load_does_not_hash(tmp_path, capsys):
    """Loading checks sizes only; `index info --verify` reads every byte against the SHA-256."""
    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    docs = write_docs(tmp_path / "d.jsonl", {"p": "paris is the capital of france", "b": "berlin"})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    run(capsys, "index", "build", "--corpus", tmp_path / "c", "--encoder", encoder, "--out", tmp_path / "i")
    vectors = tmp_path / "i" / "vectors.g1.npy"
    data = bytearray(vectors.read_bytes())
    data[-1] ^= 0x01  # one bit of one float16: same size, still a valid array
    vectors.write_bytes(bytes(data))
    code, out, _ = run(capsys, "index", "info", tmp_path / "i")
    assert code == 0 and json.loads(out)["verified"] is False
    code, _, err = run(capsys, "index", "info", tmp_path / "i", "--verify")
    assert code == 2 and "vectors.g1.npy: corrupted (SHA-256 differs from the manifest)" in err
    vectors.write_bytes(bytes(data[:-2]))
    code, _, err = run(capsys, "index", "search", tmp_path / "i", "capital")
    assert code == 2 and "vectors.g1.npy: truncated or altered" in err


def test_encoder_runs_on_the_available_device(tmp_path, capsys, monkeypatch):
    """build / search / evaluate-retrieval put the retriever on `compute_device` (the rank's
    device under torchrun, else cuda when available, else cpu)."""
    from atlas.distributed import DistributedContext

    assert cli_index.compute_device() == torch.device("cpu")  # no GPU on the test machine
    context = DistributedContext(rank=1, world_size=2, local_rank=1, device=torch.device("cuda", 1))
    assert cli_index.compute_device(context) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert cli_index.compute_device() == torch.device("cuda", 3)
    monkeypatch.undo()

    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    moved = cli_index._load_retriever(str(encoder), device=torch.device("meta"))
    assert {p.device.type for p in moved.parameters()} == {"meta"} and not moved.training

    seen: list[torch.device] = []
    real_load = cli_index._load_retriever

    def recording_load(encoder, index_folder=None, *, device=None):
        retriever = real_load(encoder, index_folder, device=device)
        seen.append(device if device is not None else cli_index.compute_device())
        assert next(retriever.parameters()).device.type == "cpu"
        return retriever

    monkeypatch.setattr(cli_index, "_load_retriever", recording_load)
    monkeypatch.setattr(cli_index, "compute_device", lambda context=None: torch.device("cpu", 0))
    docs = write_docs(tmp_path / "d.jsonl", {"p": "paris is the capital of france"})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    assert run(capsys, "index", "build", "--corpus", tmp_path / "c", "--encoder", encoder,
               "--out", tmp_path / "i")[0] == 0
    assert run(capsys, "index", "search", tmp_path / "i", "capital")[0] == 0
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "capital of france", "answers": ["Paris"]}) + "\n")
    assert run(capsys, "evaluate-retrieval", "--index", tmp_path / "i", "--data", data)[0] == 0
    assert seen == [torch.device("cpu", 0)] * 3


def test_commands_without_encoder_embed_as_the_index_was_built(tmp_path, capsys):
    """An index built with other passage settings than the encoder folder's own (the quickstart
    builds with passage_maxlength 128) is searched, evaluated and extended without --encoder."""
    from retriever.index_build import build_index

    encoder = save_tiny_retriever(tmp_path / "enc", 0)  # stores passage_maxlength 64
    docs = write_docs(tmp_path / "d.jsonl", {"p": "paris is the capital of france", "b": "berlin is in germany"})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    retriever = Retriever.from_pretrained(encoder, passage_maxlength=32, passage_format="{text}")
    build_index(tmp_path / "c", retriever, tmp_path / "i", progress=False, encoder_source=str(encoder))
    assert search_ids(capsys, tmp_path / "i", "capital of france", 2)  # searched, no fingerprint refusal
    more = write_docs(tmp_path / "more.jsonl", {"r": "rome is the capital of italy"})
    code, out, _ = run(capsys, "index", "add", "--index", tmp_path / "i", "--corpus", more)
    assert code == 0 and "3 live passages" in out
