"""Reader token embeddings started from another model's (shared vocabulary strings)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from reader.embedding_init import project_embeddings, transfer_token_embeddings
from reader.tokenizer import build_reader_tokenizer


def test_projection_keeps_the_top_principal_directions():
    rng = np.random.default_rng(0)
    source = rng.normal(size=(50, 6)) * np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.1])
    projected = project_embeddings(torch.tensor(source), 3).numpy()
    centred = source - source.mean(0)
    # independent reference: eigenvectors of the covariance, largest eigenvalues first
    _, vectors = np.linalg.eigh(centred.T @ centred)
    reference = centred @ vectors[:, ::-1][:, :3]
    np.testing.assert_allclose(np.abs(projected), np.abs(reference), atol=1e-9)  # up to each axis' sign
    assert np.allclose(project_embeddings(torch.tensor(source), 8).numpy()[:, 6:], 0.0)


def test_shared_tokens_get_the_projected_rows_and_the_others_keep_theirs():
    tokenizer = build_reader_tokenizer(None)
    t5 = T5ForConditionalGeneration(
        T5Config(vocab_size=len(tokenizer), d_model=8, d_ff=16, d_kv=4, num_heads=2, num_layers=1, num_decoder_layers=1)
    )
    before = t5.shared.weight.detach().clone()
    source_vocab = {"the": 0, "river": 1, "not-in-the-reader": 2, "<extra_id_0>": 3}
    source = torch.tensor(np.random.default_rng(1).normal(size=(4, 12)))
    assert transfer_token_embeddings(t5, tokenizer, source, source_vocab) == 3  # the, river, <extra_id_0>
    vocab = tokenizer.get_vocab()
    projected = project_embeddings(source, 8)
    scale = before.double().std() / projected[[0, 1, 3]].std()
    for token, row in (("the", 0), ("river", 1)):
        np.testing.assert_allclose(t5.shared.weight[vocab[token]].detach().double(), projected[row] * scale, atol=1e-6)
    untouched = [i for i in range(len(tokenizer)) if i not in {vocab["the"], vocab["river"], vocab["<extra_id_0>"]}]
    assert torch.equal(t5.shared.weight[untouched], before[untouched])
    with pytest.raises(ValueError, match="share no token"):
        transfer_token_embeddings(t5, tokenizer, source[:1], {"zzzz-none": 0})


def test_build_atlas_starts_a_preset_from_minilm_and_refuses_a_folder(tmp_path):
    from atlas.config import load_config
    from atlas.loading import load_model, recipe_spec

    plain = load_model(recipe_spec(load_config(None, ["reader.model=t5-tiny", "task.closed_book=true"])))
    started = load_model(
        recipe_spec(
            load_config(None, ["reader.model=t5-tiny", "task.closed_book=true", "reader.init_embeddings=minilm"])
        )
    )
    vocab = started.reader_tokenizer.get_vocab()
    the, paris, sentinel = vocab["the"], vocab["paris"], vocab["<extra_id_0>"]
    assert not torch.equal(started.reader.seq2seq.shared.weight[the], plain.reader.seq2seq.shared.weight[the])
    assert torch.equal(started.reader.seq2seq.shared.weight[sentinel], plain.reader.seq2seq.shared.weight[sentinel])
    # MiniLM's geometry survives: "paris" is nearer "london" than "the"
    e = torch.nn.functional.normalize(started.reader.seq2seq.shared.weight.detach(), dim=-1)
    assert e[paris] @ e[vocab["london"]] > e[paris] @ e[the] + 0.2
    started.reader.save_pretrained(tmp_path / "reader")
    with pytest.raises(ValueError, match="applies to a reader built from a preset"):
        load_model(
            recipe_spec(
                load_config(
                    None,
                    [
                        f"reader.model={tmp_path / 'reader'}",
                        "task.closed_book=true",
                        "reader.init_embeddings=minilm",
                        f"reader.tokenizer={tmp_path / 'reader'}",
                    ],
                )
            )
        )
