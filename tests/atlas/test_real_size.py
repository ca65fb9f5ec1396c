"""A paper recipe at its real architectures without their weights (`atlas.real_size`): the folders it writes are
what the recipe reads with the overrides it gives, at reduced width in the fast tier (the 32,128-row untied T5
with a SentencePiece tokenizer, an untied or tied BERT-base retriever, the index refreshed with it), at full size
in the slow tier."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest
import torch

from atlas.assembly import build_model
from atlas.config import load_config
from atlas.real_size import training_paragraphs, write_real_size
from atlas.training.refresh import refresh_index
from reader.t5_architectures import t5_architecture
from reader.t5_untied import UntiedT5ForConditionalGeneration
from retriever.encoder_architectures import encoder_architecture, write_random_contriever
from retriever.index import PassageIndex
from tasks.base import get_task

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
# the recipes at the top of configs/ that carry the paper's models (issue 63)
PAPER_RECIPES = [
    "nq-64shot.yaml",
    "triviaqa-64shot.yaml",
    "fever-64shot.yaml",
    *sorted(p.name for p in CONFIGS.glob("mmlu-*.yaml")),
    *sorted(p.name for p in CONFIGS.glob("kilt-*.yaml")),
    "pretrain-mlm.yaml",
]
HEAD_DIM = 4  # t5-base and BERT-base at 12 heads of 4: d_model / hidden 48
WIDTH = 48
PIECES = 1000
# what the tests read: 3 passages of 64 tokens (a retriever loss over them) from a Flat index of 5 passages
SMALL_READING = [
    "reader.n_context=3",
    "retriever.n_context=3",
    "reader.text_maxlength=64",
    "reader.dropout=0.0",
    "index.spec=Flat",
]


def recipe(name: str, *overrides: str):
    return load_config(CONFIGS / name, list(overrides), check_data=False)


def test_every_paper_recipe_names_a_known_architecture():
    assert len(PAPER_RECIPES) == 16
    for name in PAPER_RECIPES:
        config = recipe(name)
        assert t5_architecture(config.reader.model)["d_model"] == 768, name
        assert encoder_architecture(config.retriever.model)["hidden_size"] == 768, name
    with pytest.raises(ValueError, match="no published T5 architecture named 't5-mini'"):
        write_real_size(recipe("pretrain-mini.yaml"), "unused", texts=[])


@pytest.fixture(scope="module")
def folders(shared_data, tmp_path_factory):
    texts = training_paragraphs(shared_data / "wikitext-2" / "valid.txt")[:600]
    out = tmp_path_factory.mktemp("real-size")
    return write_real_size(recipe("nq-64shot.yaml"), out, texts=texts, head_dim=HEAD_DIM, pieces=PIECES), texts


def test_wikitext_is_read_as_people_write_it(shared_data):
    paragraphs = training_paragraphs(shared_data / "wikitext-2" / "valid.txt")
    assert not any(p.startswith("=") for p in paragraphs)
    text = " ".join(paragraphs[:200])
    assert "<unk>" not in text and "@" not in text
    assert "Homarus gammarus, known as the European lobster" in text and "60 cm (24 in) and a mass" in text
    assert 'blue, only becoming " lobster red " on cooking.' in text  # quotes are left as they are


def test_the_recipe_reads_the_folders_it_is_given(folders, monkeypatch):
    written, texts = folders
    config = recipe("nq-64shot.yaml", *written.overrides())
    model = build_model(config)
    t5 = model.reader.seq2seq
    assert isinstance(t5, UntiedT5ForConditionalGeneration) and t5.config.vocab_size == 32128
    assert (t5.config.d_model, t5.config.num_layers, t5.config.num_heads) == (WIDTH, 12, 12)
    assert len(model.reader_tokenizer) == PIECES + 100
    assert not model.retriever.tied and model.retriever.dim == WIDTH
    assert len(model.retriever.query_encoder.model.encoder.layer) == 12
    assert "Random weights" in (written.reader.parent / "README.md").read_text()
    # a second call reuses the trained tokenizer
    monkeypatch.setattr("atlas.real_size.train_t5_tokenizer", lambda *a, **k: pytest.fail("trained again"))
    write_real_size(
        recipe("nq-64shot.yaml"), written.reader.parent, texts=texts, head_dim=HEAD_DIM, pieces=PIECES, overwrite=True
    )


def test_a_training_step_of_the_recipe_at_reduced_width(folders, tiny_world, tmp_path):
    written, _ = folders
    config = recipe("nq-64shot.yaml", *written.overrides(), *SMALL_READING)
    model = build_model(config)
    refresh_index(model, tiny_world["corpus"], tmp_path / "index", config)  # the recipe's index, with its encoder
    examples = get_task("qa").load(tiny_world["qa"])[:2]
    model.train()
    losses = model.losses(examples, [e.answers[0] for e in examples])
    assert set(losses) == {"reader", "retriever", "total"}
    losses["total"].backward()
    assert model.reader.seq2seq.lm_head.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.retriever.query_encoder.parameters())
    assert all(p.grad is None for p in model.retriever.passage_encoder.parameters())  # untied: the index stays


def test_the_tied_recipe_refreshes_its_index_with_a_768_d_encoder(folders, tiny_world, tmp_path):
    """pretrain-mlm trains a tied retriever end to end and re-embeds the index on a schedule."""
    written, _ = folders
    encoder = write_random_contriever("contriever", tmp_path / "contriever", layers=1)
    config = recipe("pretrain-mlm.yaml", *written.overrides(), f"retriever.model={encoder}", *SMALL_READING)
    model = build_model(config)
    assert model.retriever.tied and model.retriever.dim == 768
    refresh_index(model, tiny_world["corpus"], tmp_path / "index", config)
    before = PassageIndex.load(tmp_path / "index")
    with torch.no_grad():  # a training step's change to the shared encoder
        for p in model.retriever.passage_encoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
    index = refresh_index(model, tiny_world["corpus"], tmp_path / "index", config)
    after = PassageIndex.load(tmp_path / "index")
    assert after.dim == 768 and after.manifest.encoder_fingerprint != before.manifest.encoder_fingerprint
    assert len(index.search("what is the capital of zorbland", k=2)) == 2


def test_the_tool_writes_the_folders_and_prints_the_command(shared_data, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("make_real_size", REPO / "tools" / "make_real_size.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = str(shared_data / "wikitext-2" / "valid.txt")
    recipe_path = str(CONFIGS / "kilt-nq.yaml")
    args = [recipe_path, str(tmp_path), "reader.model=google/t5-large-lm-adapt", "--text", text, "--pieces", "500"]
    assert tool.main([*args, "--head-dim", "2", "--layers", "1"]) == 0
    command = shlex.split(capsys.readouterr().out.splitlines()[-1])
    assert command[:3] == ["atlas", "train", recipe_path]
    config = recipe("kilt-nq.yaml", *command[3:])  # the printed overrides: the large architecture, these folders
    model = build_model(config)
    assert (model.reader.config.d_model, model.reader.config.num_heads, model.reader.config.d_kv) == (32, 16, 2)
    assert model.retriever.dim == 24 and len(model.reader_tokenizer) == 600  # BERT-base: 12 heads of 2


@pytest.mark.slow
def test_the_full_size_tokenizer_has_t5s_32100_tokens(shared_data, tmp_path):
    """32,000 unigram pieces need more text than WikiText-2's valid and test splits (they support ~11,000):
    SQuAD's Wikipedia paragraphs join them, as `tools/make_real_size.py` does."""
    texts = [
        *training_paragraphs(shared_data / "wikitext-2" / "valid.txt"),
        *training_paragraphs(shared_data / "wikitext-2" / "test.txt"),
        *training_paragraphs(shared_data / "squad" / "train-v1.1.json"),
    ]
    written = write_real_size(recipe("nq-64shot.yaml"), tmp_path, texts=texts, head_dim=HEAD_DIM, layers=1)
    tokenizer = build_model(recipe("nq-64shot.yaml", *written.overrides())).reader_tokenizer
    assert len(tokenizer) == 32100
    assert tokenizer.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_99>", "<pad>", "</s>"]) == [32099, 32000, 0, 1]
    tokens = tokenizer.tokenize("Who wrote the Declaration of Independence?")
    assert tokens == ["▁Who", "▁wrote", "▁the", "▁Declaration", "▁of", "▁Independence", "?"]


@pytest.mark.slow
def test_the_full_size_models_train_a_step(folders, tiny_world, tmp_path):
    """t5-base-lm-adapt and Contriever at their published sizes (248M and 2 × 109M parameters) through the recipe."""
    _, texts = folders
    written = write_real_size(recipe("nq-64shot.yaml"), tmp_path / "full", texts=texts, pieces=PIECES)
    config = recipe("nq-64shot.yaml", *written.overrides(), *SMALL_READING)
    model = build_model(config)
    assert sum(p.numel() for p in model.reader.parameters()) == 247_577_856
    assert sum(p.numel() for p in model.retriever.query_encoder.parameters()) == 108_891_648
    refresh_index(model, tiny_world["corpus"], tmp_path / "index", config)
    examples = get_task("qa").load(tiny_world["qa"])[:2]
    model.train()
    losses = model.losses(examples, [e.answers[0] for e in examples])
    losses["total"].backward()
    assert torch.isfinite(losses["total"]) and model.reader.seq2seq.lm_head.weight.grad.abs().sum() > 0
