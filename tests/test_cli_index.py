"""`atlas index ...` and `atlas evaluate-retrieval` end to end on a tiny encoder and tiny corpora:
build, swap the corpus, add, remove, search, info, encoder mismatch, retrieval metrics."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from atlas.cli import corpus_commands as cli_corpus
from atlas.cli import index_commands as cli_index
from common.modeling import encoder_source
from retriever.encoder import ContrieverEncoder
from retriever.retriever import Retriever


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
        AutoTokenizer.from_pretrained(encoder_source("minilm")),
        normalize=True,
    )
    Retriever(query_encoder=encoder, passage_maxlength=64).save_pretrained(folder)
    return folder


def write_docs(path: Path, docs: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "title": i.upper(), "text": t}) + "\n" for i, t in docs.items()))
    return path


def search_ids(capsys, index: Path, query: str, k: int) -> list[str]:
    code, out, _ = run(capsys, "index", "search", "--index", index, query, "-k", k, "--json")
    assert code == 0
    return [h["id"] for h in json.loads(out)["hits"]]


def test_build_swap_add_remove_search(tmp_path, capsys):
    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    docs_a = write_docs(tmp_path / "a.jsonl", {f"a{i}": f"alpha text number {i} about rivers" for i in range(6)})
    docs_b = write_docs(tmp_path / "b.jsonl", {f"b{i}": f"beta text number {i} about mountains" for i in range(5)})
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
    assert set(search_ids(capsys, tmp_path / "ib", "mountains", 10)) == {f"b{i}-0" for i in range(5)}

    new = write_docs(tmp_path / "new.jsonl", {"c0": "gamma text about oceans", "c1": "delta text about deserts"})
    code, out, _ = run(capsys, "index", "add", "--index", tmp_path / "ib", "--corpus", new)
    assert code == 0 and "added 2 and replaced 0 passages (c0, c1); 7 live passages" in out
    assert set(search_ids(capsys, tmp_path / "ib", "oceans", 10)) == {f"b{i}-0" for i in range(5)} | {
        "c0",
        "c1",
    }  # each record one passage under its own id

    ids = tmp_path / "ids.txt"
    ids.write_text("b1-0\nc0\n")
    code, out, _ = run(capsys, "index", "remove", "--index", tmp_path / "ib", "--ids", f"@{ids}")
    assert code == 0 and "removed 2 passages (0 already removed); 5 live passages" in out
    assert set(search_ids(capsys, tmp_path / "ib", "oceans", 10)) == {
        "b0-0",
        "b2-0",
        "b3-0",
        "b4-0",
        "c1",
    }
    code, _, err = run(capsys, "index", "remove", "--index", tmp_path / "ib", "--ids", "zzz")
    assert code == 2 and "1 id(s) are not in the index" in err and "'zzz'" in err

    code, out, _ = run(capsys, "index", "info", "--index", tmp_path / "ib", "--verify", "--json")
    info = json.loads(out)
    assert code == 0 and info["count"] == 5 and info["total"] == 7 and info["spec"] == "IVF2,Flat"
    assert info["verified"] and len(info["segments"]) == 2

    code, out, _ = run(capsys, "index", "search", "--index", tmp_path / "ia", "text about rivers", "-k", "2")
    assert code == 0 and out.startswith("query: text about rivers\n  1. [") and out.count("\n  2. [") == 1


def test_encoder_mismatch_and_evaluate_retrieval(tmp_path, capsys):
    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    other = save_tiny_retriever(tmp_path / "other", 1)
    docs = write_docs(tmp_path / "d.jsonl", {"p": "paris is the capital of france", "b": "berlin is in germany"})
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
    code, _, err = run(capsys, "index", "search", "--index", tmp_path / "i", "capital", "--encoder", other)
    assert code == 2 and "would not be comparable" in err and "--allow-encoder-mismatch" in err
    assert (
        run(
            capsys,
            "index",
            "search",
            "--index",
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
    records = [json.loads(line) for line in (tmp_path / "per_question.jsonl").read_text().splitlines()]
    assert code == 0 and metrics["n"] == 3 and len(records) == 3
    # both passages are retrieved at k=2, so the two answerable questions are found, Everest is not
    assert metrics["answer_recall@2"] == pytest.approx(2 / 3) and metrics["gold_recall@2"] == 1.0
    ranks = [r["answer_rank"] for r in records]
    assert ranks[2] is None and metrics["answer_recall@1"] == pytest.approx(sum(r == 1 for r in ranks) / 3)


def test_info_verify_catches_what_a_load_does_not_hash(tmp_path, capsys):
    """Loading checks sizes and sampled blocks (the whole of a small file); `index info --verify` reads every
    byte against the SHA-256."""
    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    docs = write_docs(tmp_path / "d.jsonl", {"p": "paris is the capital of france", "b": "berlin"})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    run(capsys, "index", "build", "--corpus", tmp_path / "c", "--encoder", encoder, "--out", tmp_path / "i")
    vectors = tmp_path / "i" / "vectors.g1.npy"
    data = bytearray(vectors.read_bytes())
    data[-1] ^= 0x01  # one bit of one float16: same size, still a valid array
    vectors.write_bytes(bytes(data))
    code, _, err = run(capsys, "index", "info", "--index", tmp_path / "i")
    assert code == 2 and "vectors.g1.npy: altered (same size, but its sampled blocks differ" in err
    # a manifest written before the sampled hashes: a load checks the size alone, --verify every byte
    manifest = json.loads((tmp_path / "i" / "manifest.json").read_text())
    for record in manifest["files"].values():
        del record["sampled_sha256"]
    (tmp_path / "i" / "manifest.json").write_text(json.dumps(manifest))
    code, out, _ = run(capsys, "index", "info", "--index", tmp_path / "i", "--json")
    assert code == 0 and json.loads(out)["verified"] is False
    code, _, err = run(capsys, "index", "info", "--index", tmp_path / "i", "--verify")
    assert code == 2 and "vectors.g1.npy: corrupted (SHA-256 differs from the manifest)" in err
    vectors.write_bytes(bytes(data[:-2]))
    code, _, err = run(capsys, "index", "search", "--index", tmp_path / "i", "capital")
    assert code == 2 and "vectors.g1.npy: truncated or altered" in err


def test_encoder_runs_on_the_available_device(tmp_path, capsys, monkeypatch):
    """build / search / evaluate-retrieval put the retriever on `compute_device` (the rank's
    device under torchrun, else cuda when available, else cpu)."""
    from atlas import index_api as api_index
    from atlas.distributed import DistributedContext

    assert api_index.compute_device() == torch.device("cpu")  # no GPU on the test machine
    context = DistributedContext(rank=1, world_size=2, local_rank=1, device=torch.device("cuda", 1))
    assert api_index.compute_device(context) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert api_index.compute_device() == torch.device("cuda", 3)
    monkeypatch.undo()

    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    moved = api_index.index_retriever(None, str(encoder), device=torch.device("meta"))
    assert {p.device.type for p in moved.parameters()} == {"meta"} and not moved.training

    seen: list[torch.device] = []
    real_load = api_index.index_retriever

    def recording_load(index_folder=None, encoder=None, *, device=None, verbose=False):
        retriever = real_load(index_folder, encoder, device=device)
        seen.append(device if device is not None else api_index.compute_device())
        assert next(retriever.parameters()).device.type == "cpu"
        return retriever

    monkeypatch.setattr(api_index, "index_retriever", recording_load)
    monkeypatch.setattr(api_index, "compute_device", lambda context=None: torch.device("cpu", 0))
    docs = write_docs(tmp_path / "d.jsonl", {"p": "paris is the capital of france"})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    assert (
        run(capsys, "index", "build", "--corpus", tmp_path / "c", "--encoder", encoder, "--out", tmp_path / "i")[0] == 0
    )
    assert run(capsys, "index", "search", "--index", tmp_path / "i", "capital")[0] == 0
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "capital of france", "answers": ["Paris"]}) + "\n")
    assert run(capsys, "evaluate-retrieval", "--index", tmp_path / "i", "--data", data)[0] == 0
    assert seen == [torch.device("cpu", 0)] * 3


def test_commands_without_encoder_embed_as_the_index_was_built(tmp_path, capsys):
    """An index built with other passage settings than the encoder folder's own (the quickstart
    builds with passage_maxlength 128) is searched, evaluated and extended without --encoder."""
    from retriever.index.build import build_index

    encoder = save_tiny_retriever(tmp_path / "enc", 0)  # stores passage_maxlength 64
    docs = write_docs(tmp_path / "d.jsonl", {"p": "paris is the capital of france", "b": "berlin is in germany"})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    retriever = Retriever.from_pretrained(encoder, passage_maxlength=32, passage_format="{text}")
    build_index(tmp_path / "c", retriever, tmp_path / "i", progress=False, encoder_source=str(encoder))
    assert search_ids(capsys, tmp_path / "i", "capital of france", 2)  # searched, no fingerprint refusal
    more = write_docs(tmp_path / "more.jsonl", {"r": "rome is the capital of italy"})
    code, out, _ = run(capsys, "index", "add", "--index", tmp_path / "i", "--corpus", more)
    assert code == 0 and "3 live passages" in out


# ------------------------------------------------- keeping a corpus current (issue 32), via atlas.cli.main
def atlas(capsys, *argv) -> tuple[int, str, str]:
    """Run `atlas ARGV...` through the console entry point: (exit code, stdout, stderr)."""
    from atlas.cli import main

    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` and its bytes: what 'nothing was written' compares."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A Flat index of six one-passage documents a0..a5 (passage ids a0-0..a5-0, titles A0..A5)."""
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index

    root = tmp_path_factory.mktemp("cli-index")
    encoder = save_tiny_retriever(root / "enc", 0)
    docs = root / "docs.jsonl"
    docs.write_text(
        "".join(
            json.dumps({"id": f"a{i}", "title": f"A{i}", "text": f"alpha text number {i} about rivers"}) + "\n"
            for i in range(6)
        )
    )
    prepare_corpus([docs], root / "corpus", progress=False)  # chunked: passage ids a{i}-0
    build_index(
        root / "corpus", Retriever.from_pretrained(encoder), root / "index", progress=False, encoder_source=str(encoder)
    )
    return root


@pytest.fixture
def index(built, tmp_path) -> Path:
    """A fresh copy of the module's index, free to update."""
    import shutil

    shutil.copytree(built / "index", tmp_path / "index")
    return tmp_path / "index"


def get_json(capsys, index: Path, *ids: str) -> list[dict]:
    code, out, err = atlas(capsys, "index", "get", "--index", index, *ids, "--json")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_update_keeps_the_id_and_changes_what_get_and_search_return(index, tmp_path, capsys):
    edit = tmp_path / "edit.jsonl"
    edit.write_text(json.dumps({"id": "a1-0", "text": "volcanoes erupt on the island"}) + "\n")
    code, out, _ = atlas(capsys, "index", "update", "--index", index, "--corpus", edit)
    assert code == 0 and out == f"updated 1 passages (a1-0); 6 live passages in {index}\n"
    assert get_json(capsys, index, "a1-0", "a2-0") == [
        {"id": "a1-0", "title": "A1", "text": "volcanoes erupt on the island"},  # no title given: kept
        {"id": "a2-0", "title": "A2", "text": "alpha text number 2 about rivers"},
    ]
    code, out, _ = atlas(capsys, "index", "search", "--index", index, "volcanoes", "-k", "10", "--json")
    hits = {h["id"]: h["text"] for h in json.loads(out)["hits"]}
    assert sorted(hits) == [f"a{i}-0" for i in range(6)]  # one live version of each id
    assert hits["a1-0"] == "volcanoes erupt on the island"
    code, out, _ = atlas(capsys, "index", "info", "--index", index, "--verify", "--json")
    info = json.loads(out)
    assert (info["count"], info["total"], info["generation"], len(info["segments"])) == (6, 7, 2, 2)


def test_update_of_an_unknown_id_names_it_and_its_line_and_writes_nothing(index, tmp_path, capsys):
    before = files_of(index)
    edit = tmp_path / "edit.jsonl"
    edit.write_text(json.dumps({"id": "a1-0", "text": "fine"}) + "\n" + json.dumps({"id": "zz", "text": "x"}) + "\n")
    code, out, err = atlas(capsys, "index", "update", "--index", index, "--corpus", edit)
    assert code == 2 and out == ""
    assert err.endswith(
        f"atlas index update: error: {edit}:2: passage id 'zz' has no live passage in the index "
        f"{index}; add new passages with `atlas index add`\n"
    )
    assert files_of(index) == before


def test_add_of_a_live_id_refuses_and_replace_replaces(index, tmp_path, capsys):
    before = files_of(index)
    new = write_docs(tmp_path / "new.jsonl", {"n0": "gamma text about oceans", "a3-0": "delta text about deserts"})
    code, out, err = atlas(capsys, "index", "add", "--index", index, "--corpus", new)
    assert code == 2 and out == ""
    assert err.endswith(
        f"atlas index add: error: {new}:2: passage id 'a3-0' is already in the index {index}; "
        "replace it with `atlas index update` (or `atlas index add --replace`)\n"
    )
    assert files_of(index) == before
    code, out, _ = atlas(capsys, "index", "add", "--index", index, "--corpus", new, "--replace")
    assert code == 0 and out == f"added 1 and replaced 1 passages (n0, a3-0); 7 live passages in {index}\n"
    assert get_json(capsys, index, "a3-0", "n0") == [
        {"id": "a3-0", "title": "A3-0", "text": "delta text about deserts"},
        {"id": "n0", "title": "N0", "text": "gamma text about oceans"},
    ]


def test_a_removed_passage_added_back_keeps_its_id(index, tmp_path, capsys):
    """The report of issue 32: `nq-486-0` removed and added again came back as `nq-486-0-0`."""
    assert atlas(capsys, "index", "remove", "--index", index, "--ids", "a4-0")[0] == 0
    again = tmp_path / "again.jsonl"
    again.write_text(json.dumps({"id": "a4-0", "title": "A4", "text": "alpha text number 4, revised"}) + "\n")
    code, _, err = atlas(capsys, "index", "add", "--index", index, "--corpus", again, "--chunk-words", "100")
    assert code == 2 and err.endswith(
        f"atlas index add: error: {again}:1: passage id 'a4-0' names a passage of the index {index}, but with "
        "chunk_words 100 this record would be added as 'a4-0-0'; pass --chunk-words 0 to add records as "
        "passages under their own ids (`atlas index update` replaces a live one)\n"
    )
    code, out, _ = atlas(capsys, "index", "add", "--index", index, "--corpus", again)
    assert code == 0 and out == f"added 1 and replaced 0 passages (a4-0); 6 live passages in {index}\n"
    assert get_json(capsys, index, "a4-0") == [{"id": "a4-0", "title": "A4", "text": "alpha text number 4, revised"}]
    code, out, _ = atlas(capsys, "index", "remove", "--index", index, "--ids", "a4-0")
    assert code == 0 and out == f"removed 1 passages (0 already removed); 5 live passages in {index}\n"


def test_remove_takes_ids_or_an_at_file(index, tmp_path, capsys):
    code, out, _ = atlas(capsys, "index", "remove", "--index", index, "--ids", "a0-0", "a1-0")
    assert code == 0 and out == f"removed 2 passages (0 already removed); 4 live passages in {index}\n"
    ids = tmp_path / "ids.txt"
    ids.write_text("a2-0\n\na0-0\n")
    code, out, _ = atlas(capsys, "index", "remove", "--index", index, "--ids", f"@{ids}")
    assert code == 0 and out == f"removed 1 passages (1 already removed); 3 live passages in {index}\n"
    before = files_of(index)
    code, _, err = atlas(capsys, "index", "remove", "--index", index, "--ids", ids)
    assert code == 2 and err.endswith(
        f"1 id(s) are not in the index {index}: '{ids}' ({ids} is a file: write @{ids} to read ids from it)\n"
    )
    code, _, err = atlas(capsys, "index", "remove", "--index", index, "--ids", f"@{tmp_path / 'none.txt'}")
    assert code == 2 and f"{tmp_path / 'none.txt'}: file not found" in err
    assert files_of(index) == before


def test_get_prints_passages_and_names_ids_without_one(index, tmp_path, capsys):
    code, out, _ = atlas(capsys, "index", "get", "--index", index, "a0-0")
    assert code == 0 and out == "id: a0-0\ntitle: A0\ntext: alpha text number 0 about rivers\n\n"
    ids = tmp_path / "ids.txt"
    ids.write_text("a2-0\na1-0\n")
    assert [p["id"] for p in get_json(capsys, index, "a5-0", f"@{ids}")] == ["a5-0", "a2-0", "a1-0"]
    atlas(capsys, "index", "remove", "--index", index, "--ids", "a5-0")
    code, out, err = atlas(capsys, "index", "get", "--index", index, "a0-0", "a5-0", "nope")
    assert code == 2 and out == ""
    assert err == (
        f"atlas index get: error: 2 id(s) have no live passage in the index {index}: 'a5-0' (removed), 'nope'\n"
    )


def test_index_is_named_by_option_only(built, index, tmp_path, capsys):
    by_option = atlas(capsys, "index", "search", "--index", index, "rivers", "number 3", "-k", "3", "--json")
    assert by_option[0] == 0 and len(by_option[1].splitlines()) == 2
    for argv in (["info", index], ["search", index, "rivers"]):  # the positional form of before a release
        with pytest.raises(SystemExit) as refused:
            atlas(capsys, "index", *argv)
        assert refused.value.code == 2 and "the following arguments are required: --index" in capsys.readouterr().err
    code, _, _ = atlas(
        capsys,
        "index",
        "build",
        "--corpus",
        built / "corpus",
        "--index",
        tmp_path / "rebuilt",
        "--encoder",
        built / "enc",
    )  # build writes a new index: --out, or --index
    assert code == 0 and (tmp_path / "rebuilt" / "manifest.json").is_file()


def test_every_index_and_corpus_option_shows_its_default(capsys):
    from atlas.cli import build_parser

    def subcommands(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                yield from action.choices.items()

    top = dict(subcommands(build_parser()))
    leaves = [(f"{group} {name}", sub) for group in ("index", "corpus") for name, sub in subcommands(top[group])]
    leaves.append(("evaluate-retrieval", top["evaluate-retrieval"]))
    assert len(leaves) == 12  # index embed included
    for name, parser in leaves:
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.default in (None, False, argparse.SUPPRESS) or action.help == argparse.SUPPRESS:
                continue
            assert "default" in formatter._get_help_string(action), (name, action.dest)
    with pytest.raises(SystemExit):
        atlas(capsys, "index", "add", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "one passage under its own id (default: 0)" in help_text and "(default: 64)" in help_text
    assert "--ids ID [ID ...] passage ids; @FILE reads ids from FILE" in " ".join(
        top["index"]._subparsers._group_actions[0].choices["remove"].format_help().split()
    )


def test_info_shows_live_and_dead_rows_and_compact_keeps_every_search_result(index, tmp_path, capsys):
    new = write_docs(tmp_path / "new.jsonl", {"n0": "gamma text about oceans", "n1": "delta text about deserts"})
    assert atlas(capsys, "index", "add", "--index", index, "--corpus", new)[0] == 0
    edit = tmp_path / "edit.jsonl"
    edit.write_text(json.dumps({"id": "a1-0", "text": "volcanoes erupt on the island"}) + "\n")
    assert atlas(capsys, "index", "update", "--index", index, "--corpus", edit)[0] == 0
    assert atlas(capsys, "index", "remove", "--index", index, "--ids", "a2-0")[0] == 0
    info = json.loads(atlas(capsys, "index", "info", "--index", index, "--json")[1])
    assert (info["live_rows"], info["dead_rows"], info["segment_count"], info["generation"]) == (7, 2, 3, 4)
    assert info["compaction_due"] is None  # 2 dead rows: under 100, they wait
    queries = ["volcanoes", "rivers number 3", "oceans"]

    def search() -> list[list[dict]]:
        """Every hit of every query, all but its row (positions are renumbered: ids and scores stay)."""
        out = atlas(capsys, "index", "search", "--index", index, *queries, "-k", "7", "--json")[1]
        return [
            [{k: v for k, v in hit.items() if k != "row"} for hit in json.loads(line)["hits"]]
            for line in out.splitlines()
        ]

    searched = search()
    assert [len(hits) for hits in searched] == [7, 7, 7]

    code, out, _ = atlas(capsys, "index", "compact", "--index", index)
    assert code == 0 and re.fullmatch(
        r"compacted all segments: 3 → 1 segments, 9 → 7 rows \(2 dead rows "
        r"dropped\), generation 5, \d+\.\d\d s\n",
        out,
    ), out
    info = json.loads(atlas(capsys, "index", "info", "--index", index, "--verify", "--json")[1])
    assert (info["live_rows"], info["dead_rows"], info["segment_count"], info["verified"]) == (7, 0, 1, True)
    assert search() == searched
    assert get_json(capsys, index, "a1-0")[0]["text"] == "volcanoes erupt on the island"
    code, out, _ = atlas(capsys, "index", "compact", "--index", index)
    assert code == 0 and out == f"nothing to compact: {index} is one segment with no dead rows (generation 5)\n"


def test_edits_compact_the_index_by_themselves_when_it_is_due(index, tmp_path, capsys):
    from retriever.index.compact import MAX_SEGMENTS

    for n in range(MAX_SEGMENTS - 1):  # MAX_SEGMENTS segments: not due yet
        code, out, _ = atlas(
            capsys,
            "index",
            "add",
            "--index",
            index,
            "--corpus",
            write_docs(tmp_path / "new.jsonl", {f"n{n}": f"new text {n}"}),
        )
        assert code == 0 and "compacted" not in out
    last = write_docs(tmp_path / "new.jsonl", {"last": "the last one"})
    code, out, _ = atlas(capsys, "index", "add", "--index", index, "--corpus", last, "--no-compact")
    assert code == 0 and "compacted" not in out  # told not to
    assert (
        json.loads(atlas(capsys, "index", "info", "--index", index, "--json")[1])["compaction_due"]
        == f"{MAX_SEGMENTS + 1} corpus segments (more than {MAX_SEGMENTS})"
    )
    code, out, _ = atlas(capsys, "index", "remove", "--index", index, "--ids", "last")
    assert code == 0 and out.splitlines()[1].startswith(
        f"compacted the added segments: {MAX_SEGMENTS + 1} → 2 segments, "
    )
    assert out.endswith(f"({MAX_SEGMENTS + 1} corpus segments (more than {MAX_SEGMENTS}))\n")
    info = json.loads(atlas(capsys, "index", "info", "--index", index, "--verify", "--json")[1])
    assert (info["live_rows"], info["dead_rows"], info["segment_count"]) == (6 + MAX_SEGMENTS - 1, 0, 2)


def test_a_compaction_of_an_index_being_written_is_refused(index, capsys):
    import os

    from retriever.index.files import writer_lock

    before = files_of(index)
    with writer_lock(index, "add"):
        code, out, err = atlas(capsys, "index", "compact", "--index", index)
    assert code == 2 and out == ""
    assert re.fullmatch(
        re.escape(
            f"atlas index compact: error: {index} is being updated by another process (pid {os.getpid()}, add since "
        )
        + r"[0-9T:Z-]+\); an index has one writer at a "
        r"time: try again when it has finished\n",
        err,
    ), err
    assert files_of(index) == before


def test_build_overwrite_of_an_index_being_edited_waits_for_the_edit_or_is_refused(index, built, monkeypatch, capsys):
    """`build --overwrite` takes the writer lock of the index it replaces: an edit holding it keeps the old folder
    whole (the build is refused naming the edit, before any embedding), and the swap itself holds it."""
    import os

    from retriever.index import build as index_build
    from retriever.index.files import writer_lock

    monkeypatch.setattr(index_build, "REPLACE_WAIT_SECONDS", 0.3)
    before = files_of(index)
    args = ("index", "build", "--corpus", built / "corpus", "--encoder", built / "enc", "--out", index, "--overwrite")
    with writer_lock(index, "add"):
        code, out, err = atlas(capsys, *args)
    assert out == ""
    assert code == 2 and f"{index} is being updated by another process (pid {os.getpid()}, add since " in err, err
    assert files_of(index) == before and not index_build.work_dir_for(index).exists()  # nothing embedded
    held = []
    real = index_build.atomic_directory

    def swapping(out, **kwargs):  # who holds the lock while the new folder is swapped in
        held.append((Path(out) / ".writer.lock").is_file())
        return real(out, **kwargs)

    monkeypatch.setattr(index_build, "atomic_directory", swapping)
    assert atlas(capsys, *args)[0] == 0
    assert held == [True] and not (index / ".writer.lock").exists()


def test_the_help_states_the_compaction_policy_in_force(capsys):
    from retriever.index.compact import MAX_DEAD_FRACTION, MAX_SEGMENTS

    with pytest.raises(SystemExit):
        atlas(capsys, "index", "remove", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert f"more than {MAX_SEGMENTS} corpus segments or {MAX_DEAD_FRACTION:.0%} dead rows" in text
    with pytest.raises(SystemExit):
        atlas(capsys, "index", "compact", "--help")
    assert f"more than {MAX_SEGMENTS} segments or {MAX_DEAD_FRACTION:.0%} dead rows" in " ".join(
        capsys.readouterr().out.split()
    )


def test_an_index_of_vectors_embedded_elsewhere_is_the_index_built_here(tmp_path, capsys):
    """`atlas index embed` (on a GPU machine) then `atlas index build --vectors` (here): the same files as a
    build that embeds, byte for byte, and the same search results; the vectors may come as float32 shards."""
    import numpy as np

    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    docs = write_docs(tmp_path / "d.jsonl", {f"p{i}": f"passage {i} about {w}" for i, w in enumerate("abcdefgh")})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    common = ["--corpus", tmp_path / "c", "--encoder", encoder]
    assert run(capsys, "index", "build", *common, "--out", tmp_path / "built", "--passage-maxlength", "32")[0] == 0
    assert run(capsys, "index", "embed", *common, "--out", tmp_path / "v.npy", "--passage-maxlength", "32")[0] == 0
    record = json.loads((tmp_path / "v.npy.encoder.json").read_text())
    assert record["passage_maxlength"] == 32 and record["dim"] == 32
    assert (
        run(
            capsys,
            "index",
            "build",
            "--corpus",
            tmp_path / "c",
            "--vectors",
            tmp_path / "v.npy",
            "--out",
            tmp_path / "given",
        )[0]
        == 0
    )
    built, given = (json.loads((tmp_path / n / "manifest.json").read_text()) for n in ("built", "given"))
    assert given["encoder_fingerprint"] == built["encoder_fingerprint"] and given["encoder"] == built["encoder"]
    assert given["files"]["vectors"]["sha256"] == built["files"]["vectors"]["sha256"]
    searches = [
        run(capsys, "index", "search", "--index", tmp_path / n, "passage about c", "--json")[1]
        for n in ("built", "given")
    ]
    assert json.loads(searches[0])["hits"] == json.loads(searches[1])["hits"]

    # float32 shards in a folder, rows in file-name order, their record beside them
    vectors = np.load(tmp_path / "v.npy").astype(np.float32)
    (tmp_path / "shards").mkdir()
    np.save(tmp_path / "shards" / "part-00.npy", vectors[:5])
    np.save(tmp_path / "shards" / "part-01.npy", vectors[5:])
    (tmp_path / "shards" / "encoder.json").write_text(json.dumps(record))
    assert (
        run(
            capsys,
            "index",
            "build",
            "--corpus",
            tmp_path / "c",
            "--vectors",
            tmp_path / "shards",
            "--out",
            tmp_path / "sharded",
        )[0]
        == 0
    )
    sharded = json.loads((tmp_path / "sharded" / "manifest.json").read_text())
    assert sharded["files"]["vectors"]["sha256"] == built["files"]["vectors"]["sha256"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda v: v[:-1], r"7 vectors for a corpus of 8 passages"),
        (lambda v: v[:, :8], r"vectors of dimension 8, the encoder's is 32"),
        (
            lambda v: v.__setitem__((5, 3), float("nan")) or v,
            r"v\.npy: row 5 \(passage 5 of the corpus\) is not finite",
        ),
        (lambda v: v.__setitem__((2, 0), float("inf")) or v, r"row 2 \(passage 2 of the corpus\) is not finite"),
    ],
    ids=["count", "dim", "nan", "inf"],
)
def test_bad_vectors_are_refused_with_what_is_wrong_and_nothing_is_built(tmp_path, capsys, damage, message):
    import numpy as np

    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    docs = write_docs(tmp_path / "d.jsonl", {f"p{i}": f"passage {i}" for i in range(8)})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    assert (
        run(capsys, "index", "embed", "--corpus", tmp_path / "c", "--encoder", encoder, "--out", tmp_path / "v.npy")[0]
        == 0
    )
    vectors = np.load(tmp_path / "v.npy").astype(np.float32)
    np.save(tmp_path / "v.npy", damage(vectors))
    code, _, err = run(
        capsys, "index", "build", "--corpus", tmp_path / "c", "--vectors", tmp_path / "v.npy", "--out", tmp_path / "i"
    )
    assert code == 2 and re.search(message, err), err
    assert not (tmp_path / "i").exists()


def test_vectors_of_another_encoder_than_the_one_named_are_refused(tmp_path, capsys):
    first, other = save_tiny_retriever(tmp_path / "a", 0), save_tiny_retriever(tmp_path / "b", 1)
    docs = write_docs(tmp_path / "d.jsonl", {"p": "paris is the capital of france"})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    assert (
        run(capsys, "index", "embed", "--corpus", tmp_path / "c", "--encoder", first, "--out", tmp_path / "v.npy")[0]
        == 0
    )
    code, _, err = run(
        capsys,
        "index",
        "build",
        "--corpus",
        tmp_path / "c",
        "--vectors",
        tmp_path / "v.npy",
        "--encoder",
        other,
        "--out",
        tmp_path / "i",
    )
    assert code == 2 and "the vectors were made by passage encoder" in err
    (tmp_path / "v.npy.encoder.json").unlink()  # no record: the encoder named (default MiniLM) must be theirs
    build = ["index", "build", "--corpus", tmp_path / "c", "--vectors", tmp_path / "v.npy"]
    code, _, err = run(capsys, *build, "--out", tmp_path / "i")
    assert code == 2 and "vectors of dimension 32, the encoder's is 384" in err
    assert run(capsys, *build, "--encoder", first, "--out", tmp_path / "i")[0] == 0


def test_a_damaged_corpus_is_named_by_info_search_and_ask_never_a_traceback(tmp_path, capsys):
    """truncate -s 2000 CORPUS/passages.arrow: `index info` names the file (its recorded size); a same-size
    alteration is found by the sampled blocks (the whole of a small file) and by `--verify` (the corpus's
    SHA-256); search and ask fail with one line."""
    encoder = save_tiny_retriever(tmp_path / "enc", 0)
    docs = write_docs(tmp_path / "d.jsonl", {f"p{i}": f"passage number {i} about rivers " * 20 for i in range(20)})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    assert (
        run(capsys, "index", "build", "--corpus", tmp_path / "c", "--encoder", encoder, "--out", tmp_path / "i")[0] == 0
    )
    arrow = tmp_path / "c" / "passages.arrow"
    original = arrow.read_bytes()
    arrow.write_bytes(original[:-40] + bytes(40))  # a same-size alteration
    code, _, err = run(capsys, "index", "info", "--index", tmp_path / "i")
    assert code == 2 and "passages.arrow: altered (same size, but its sampled blocks differ" in err
    code, _, err = run(capsys, "index", "info", "--index", tmp_path / "i", "--verify")
    assert code == 2 and "passages.arrow: its contents are not the ones prepared" in err
    arrow.write_bytes(original[:2000])  # truncate -s 2000
    for argv in (
        ["index", "info", "--index", tmp_path / "i"],
        ["index", "search", "--index", tmp_path / "i", "rivers"],
    ):
        code, _, err = run(capsys, *argv)
        assert code == 2 and err.count("\n") == 1, err
        assert f"{arrow}: 2000 bytes where the index" in err and "truncated or altered" in err
    from atlas.cli import main

    assert main(["ask", "atlas-reader", "--index", str(tmp_path / "i"), "where are the rivers?"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "passages.arrow: 2000 bytes" in err


def test_an_index_built_as_a_recipe_embeds_is_taken_and_another_is_named(tmp_path, capsys):
    """A recipe embeds passages cut at its retriever.passage_maxlength: `index build --passage-maxlength` builds
    the index it expects; one cut at another length is refused naming the setting that differs."""
    from atlas.config import load_config
    from atlas.run_index import open_index
    from retriever.index.files import EncoderMismatchError
    from retriever.retriever import Retriever

    encoder = save_tiny_retriever(tmp_path / "enc", 0)  # stores passage_maxlength 64
    docs = write_docs(tmp_path / "d.jsonl", {"p": "paris is the capital of france"})
    run(capsys, "corpus", "prepare", docs, "--out", tmp_path / "c")
    common = ["index", "build", "--corpus", tmp_path / "c", "--encoder", encoder]
    assert run(capsys, *common, "--out", tmp_path / "i32", "--passage-maxlength", "32")[0] == 0
    assert run(capsys, *common, "--out", tmp_path / "i64")[0] == 0
    config = load_config(None, [f"retriever.model={encoder}", "retriever.passage_maxlength=32"])
    retriever = Retriever.from_config(config.retriever)
    assert open_index(tmp_path / "i32", retriever, config.index) is not None
    with pytest.raises(
        EncoderMismatchError, match=r"passage_maxlength 64 at build, 32 here.*retriever\.passage_maxlength"
    ):
        open_index(tmp_path / "i64", retriever, config.index)


def test_a_full_disk_during_an_edit_says_so_in_one_line_and_leaves_the_index_as_it_was(
    index, tmp_path, capsys, monkeypatch
):
    import errno
    import os

    from retriever.index import update as index_update

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    before = (index / "manifest.json").read_text()
    files = sorted(p.name for p in index.iterdir())
    monkeypatch.setattr(index_update, "write_float16_rows", full)  # the new segment's vectors: the disk fills up
    new = write_docs(tmp_path / "new.jsonl", {"n1": "a new passage about deserts"})
    code, _, err = atlas(capsys, "index", "add", "--index", index, "--corpus", new)
    assert code == 2 and "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith(
            "the disk is full; nothing was committed (an index is left as it was before the command): free some space "
            "and run the same command again"
        )
    )
    assert (index / "manifest.json").read_text() == before and sorted(p.name for p in index.iterdir()) == files
    monkeypatch.undo()
    assert atlas(capsys, "index", "info", "--index", index, "--verify")[0] == 0
    assert atlas(capsys, "index", "add", "--index", index, "--corpus", new)[0] == 0  # the same command, with room
