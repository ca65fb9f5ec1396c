"""Embedding precision: bfloat16 embeddings of real text against float32's, what `auto` resolves to, bad values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import retriever.index.exact_search as search_module
from common.modeling import encoder_source
from retriever.embedding_precision import BF16_MIN_SPEEDUP, EMBEDDING_PRECISIONS, resolve_embedding_precision
from retriever.encoder import ContrieverEncoder
from retriever.index.settings import IndexSettings
from retriever.retriever import Retriever

NQ824 = Path(__file__).resolve().parents[3] / "shared" / "data" / "nq824" / "documents.jsonl"


@pytest.fixture(scope="module")
def minilm() -> ContrieverEncoder:
    return ContrieverEncoder.from_pretrained(encoder_source("minilm"))


def real_passages(n: int) -> list[str]:
    if not NQ824.is_file():
        pytest.skip(f"{NQ824} not found (the shared data)")
    with NQ824.open() as lines:
        return [json.loads(line)["text"] for _, line in zip(range(n), lines)]


def test_bf16_embeddings_of_real_text_match_fp32(minilm):
    texts = real_passages(24)  # nq824 paragraphs, many cut at MiniLM's 256 tokens
    full = minilm.embed_texts(texts, batch_size=16, precision="fp32")
    half = minilm.embed_texts(texts, batch_size=16, precision="bf16")
    assert half.dtype == np.float32 and half.shape == full.shape == (24, 384)
    cosine = (full * half).sum(1) / np.linalg.norm(full, axis=1) / np.linalg.norm(half, axis=1)
    assert cosine.min() >= 0.999
    assert np.abs(full - half).max() > 1e-5  # the bf16 pass did run in bfloat16 (fp32 repeats give 0)
    # the top passage of each of a few questions is the same at both precisions
    questions = ["what is the therefore sign", "who sang the song", "when was the war"]
    queries = minilm.embed_texts(questions, precision="fp32")
    assert (np.argmax(queries @ full.T, 1) == np.argmax(queries @ half.T, 1)).all()


def test_auto_resolves_by_the_bf16_probe(monkeypatch):
    """`auto` on a CPU is bf16 exactly where exact search's probe measures bfloat16 ≥ BF16_MIN_SPEEDUP× float32
    (0.0 where the CPU has neither AVX512-BF16 nor AMX); fp32 and bf16 are taken as given."""
    for speedup, expected in (
        (0.0, "fp32"),
        (BF16_MIN_SPEEDUP - 0.01, "fp32"),
        (BF16_MIN_SPEEDUP, "bf16"),
        (2.3, "bf16"),
    ):
        monkeypatch.setattr(search_module, "native_bf16_speedup", lambda speedup=speedup: speedup)
        assert resolve_embedding_precision("auto", "cpu") == expected
        assert resolve_embedding_precision("auto", torch.device("cpu")) == expected
        assert resolve_embedding_precision("fp32", "cpu") == "fp32"
        assert resolve_embedding_precision("bf16", "cpu") == "bf16"
    assert resolve_embedding_precision("auto", "meta") == "fp32"  # neither CPU nor CUDA: no probe, float32


def test_auto_on_this_machine_is_what_the_probe_says(minilm):
    from retriever.index.exact_search import native_bf16_speedup

    native = (
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    ) and native_bf16_speedup() >= BF16_MIN_SPEEDUP
    resolved = resolve_embedding_precision("auto", "cpu")
    assert resolved == ("bf16" if native else "fp32")
    texts = real_passages(8)
    np.testing.assert_array_equal(
        minilm.embed_texts(texts, precision="auto"), minilm.embed_texts(texts, precision=resolved)
    )


def test_retriever_precision_setting_and_per_call_override(minilm):
    retriever = Retriever(query_encoder=minilm)
    assert retriever.precision == "auto"
    passages = [{"title": "", "text": text} for text in real_passages(6)]
    retriever.precision = "bf16"
    by_setting = retriever.embed_passages(passages)
    np.testing.assert_array_equal(by_setting, retriever.embed_passages(passages, precision="bf16"))
    full = retriever.embed_passages(passages, precision="fp32")
    assert np.abs(full - by_setting).max() > 1e-5
    np.testing.assert_array_equal(
        retriever.embed_queries(["who"], precision="fp32"), minilm.embed_texts(["who"], max_length=64, precision="fp32")
    )


@pytest.mark.parametrize("bad", ["int8", "fp16", "BF16", "full", ""])
def test_a_bad_precision_is_one_clear_error(minilm, bad):
    message = f"unknown embedding precision {bad!r}; valid: {', '.join(EMBEDDING_PRECISIONS)}"
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        minilm.embed_texts(["x"], precision=bad)
    with pytest.raises(ValueError, match="valid: auto, fp32, bf16"):
        Retriever(query_encoder=minilm, precision=bad)
    retriever = Retriever(query_encoder=minilm)
    with pytest.raises(ValueError, match="valid: auto, fp32, bf16"):
        retriever.precision = bad
    assert retriever.precision == "auto"  # a refused value leaves the setting as it was


@pytest.mark.parametrize(
    "argv",
    [
        ["index", "build", "--corpus", "c", "--out", "o"],
        ["index", "embed", "--corpus", "c", "--out", "v.npy"],
        ["index", "add", "--index", "i", "--corpus", "p.jsonl"],
        ["index", "update", "--index", "i", "--corpus", "p.jsonl"],
        ["quickstart"],
        ["serve", "runs/x"],
    ],
)
def test_every_embedding_command_takes_one_precision_setting(argv, capsys):
    """--precision auto|fp32|bf16 on each command that embeds; a bad value is one argparse error naming the
    valid ones (before anything loads)."""
    from atlas.cli import build_parser

    parser = build_parser()
    assert parser.parse_args([*argv, "--precision", "bf16"]).precision == "bf16"
    default = parser.parse_args(argv).precision
    assert default == ("auto" if argv[0] == "index" else None)  # None: the recipe's retriever.precision (auto)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([*argv, "--precision", "int8"])
    assert exit_.value.code == 2
    assert (
        "argument --precision: invalid choice: 'int8' (choose from 'auto', 'fp32', 'bf16')" in capsys.readouterr().err
    )


def test_the_recipe_setting_reaches_the_retriever():
    from atlas.config import RetrieverConfig, load_config
    from retriever.retriever import Retriever

    assert RetrieverConfig().precision == "auto"
    assert Retriever.from_config(RetrieverConfig(model="minilm", precision="fp32")).precision == "fp32"
    assert load_config(None, ["retriever.precision=bf16"]).retriever.precision == "bf16"
    with pytest.raises(ValueError, match="precision"):
        load_config(None, ["retriever.precision=int8"])


def test_an_index_records_the_precision_its_vectors_were_embedded_at(tmp_path, minilm):
    """MiniLM through the index engine: `precision=` reaches the encoder (bf16 vectors ≠ fp32's, cosine ≥ 0.999),
    None takes the retriever's own setting, the manifest records each, and fp32 queries search bf16 vectors."""
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.index.manifest import Manifest
    from retriever.index.passage_index import PassageIndex

    texts = real_passages(12)
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    prepare_corpus([tmp_path / "docs.jsonl"], tmp_path / "corpus", chunk_words=0, progress=False)
    retriever = Retriever(query_encoder=minilm, precision="fp32")
    built = {}
    for name, precision in (("bf16", "bf16"), ("own", None)):
        out = build_index(
            tmp_path / "corpus",
            retriever,
            tmp_path / name,
            progress=False,
            precision=precision,
            settings=IndexSettings(spec="Flat"),
        )
        built[name] = PassageIndex.load(out, retriever=retriever)
        assert Manifest.load(out).embedding_precision == ("bf16" if name == "bf16" else "fp32")
    half, full = (built[n].embeddings(range(12)) for n in ("bf16", "own"))
    assert min_cosine_rows(half, full) >= 0.999 and np.abs(half - full).max() > 1e-4
    hits = built["bf16"].search(texts[:4], 1)  # fp32 queries (the retriever's setting) over bf16 vectors
    assert [h[0].id for h in hits] == ["d0", "d1", "d2", "d3"]


def min_cosine_rows(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
