"""kNN-LM: interpolation vs hand computation, keys vs direct forward passes, search, CLI."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

from atlas.knnlm.datastore import sliding_windows
from atlas.knnlm.lm import KeyedLM, build_datastore, parse_key_spec
from atlas.knnlm.search import (
    build_knn_index,
    grid_search,
    interpolate_logprobs,
    knn_lm_logprobs,
    knn_target_logprobs,
    perplexity,
    search_neighbours,
)

VOCAB = 40


def knn_distribution(
    distances: torch.Tensor, neighbour_values: torch.Tensor, vocab_size: int, temperature: float
) -> torch.Tensor:
    """Oracle: the full p_kNN over the vocabulary, distances (..., k), values (..., k) int → probs (..., V)."""
    weights = torch.softmax(-distances.double() / temperature, dim=-1)
    probs = torch.zeros(*distances.shape[:-1], vocab_size, dtype=torch.float64)
    return probs.scatter_add_(-1, neighbour_values.long(), weights)


def interpolate_distributions(lm_probs: torch.Tensor, knn_probs: torch.Tensor, lam: float) -> torch.Tensor:
    """Oracle: λ·p_kNN + (1−λ)·p_LM for full distributions (..., V), against which the library's
    log-space per-target path is checked."""
    return lam * knn_probs + (1.0 - lam) * lm_probs


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config).eval()


def test_interpolated_distribution_matches_hand_computation_and_sums_to_one():
    distances = [1.0, 2.0, 4.0, 0.5]
    values = [2, 0, 2, 3]
    tau, lam = 2.0, 0.3
    lm = [0.1, 0.2, 0.3, 0.15, 0.25]
    weights = [math.exp(-d / tau) for d in distances]
    z = sum(weights)
    knn_hand = [0.0] * 5
    for w, v in zip(weights, values):
        knn_hand[v] += w / z
    expected = [lam * knn_hand[y] + (1 - lam) * lm[y] for y in range(5)]

    knn = knn_distribution(torch.tensor(distances), torch.tensor(values), 5, tau)
    mixed = interpolate_distributions(torch.tensor(lm, dtype=torch.float64), knn, lam)
    np.testing.assert_allclose(knn.numpy(), knn_hand, rtol=1e-12)
    np.testing.assert_allclose(mixed.numpy(), expected, rtol=1e-12)
    assert mixed.sum().item() == pytest.approx(1.0, abs=1e-12)

    # The per-target log-space path used for perplexity agrees with the full distribution.
    targets = np.arange(5)
    knn_lp = knn_target_logprobs(np.tile(distances, (5, 1)), np.tile(values, (5, 1)), targets, tau)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(knn_lp, np.log(knn_hand), rtol=1e-12)
    np.testing.assert_allclose(interpolate_logprobs(np.log(lm), knn_lp, lam), np.log(expected), rtol=1e-12)
    # λ = 0 returns the LM exactly, on both paths.
    assert torch.equal(
        interpolate_distributions(torch.tensor(lm, dtype=torch.float64), knn, 0.0),
        torch.tensor(lm, dtype=torch.float64),
    )
    assert np.array_equal(interpolate_logprobs(np.log(lm), knn_lp, 0.0), np.log(lm))


def reference_sublayers(model: GPT2LMHeadModel, window: torch.Tensor, block_index: int) -> dict[str, torch.Tensor]:
    """Recompute one block's sublayer states by calling its modules on the previous output."""
    with torch.no_grad():
        hidden = model(input_ids=window[None], output_hidden_states=True).hidden_states
        block = model.transformer.h[block_index]
        before = hidden[block_index]
        attn = block.attn(block.ln_1(before))[0]
        ffn_in = block.ln_2(before + attn)
        ffn_out = block.mlp(ffn_in)
    return {
        "attn_output": attn[0],
        "ffn_input": ffn_in[0],
        "ffn_output": ffn_out[0],
        "layer_output": (before + attn + ffn_out)[0],
    }


def test_datastore_keys_values_and_logprobs_match_a_direct_forward_pass(tmp_path):
    model = tiny_gpt2()
    ids = np.random.default_rng(0).integers(0, VOCAB, size=45)
    specs = ["ffn_input:-1", "attn_output:-1", "ffn_output:-1", "layer_output:0", "layer_output:1"]
    store = build_datastore(tmp_path / "ds", model, ids, specs, context=12, stride=5, batch_size=3, progress=False)
    np.testing.assert_array_equal(store.values, ids[1:])
    for begin, end, first in sliding_windows(len(ids), 12, 5):
        window = torch.from_numpy(ids[begin:end])
        rows = slice(first, end)
        local = slice(first - begin, end - begin)
        for block in (0, 1):
            reference = reference_sublayers(model, window, block)
            for spec in specs:
                kind, index = parse_key_spec(spec, 2)
                if index == block:
                    np.testing.assert_allclose(
                        store.keys(spec)[rows].astype(np.float32),
                        reference[kind][local].numpy(),
                        rtol=2e-3,
                        atol=2e-3,
                    )
        with torch.no_grad():
            logits = model(input_ids=window[None]).logits[0].double()
        expected = torch.log_softmax(logits, -1)[torch.arange(end - begin), torch.from_numpy(ids[begin + 1 : end + 1])]
        np.testing.assert_allclose(store.lm_logprobs[rows], expected[local].numpy(), rtol=1e-5, atol=1e-5)


def test_resumed_lm_datastore_is_byte_identical(tmp_path):
    model = tiny_gpt2()
    ids = np.random.default_rng(3).integers(0, VOCAB, size=60)
    args = {"context": 10, "stride": 4, "batch_size": 2, "progress": False}
    build_datastore(tmp_path / "whole", model, ids, ["ffn_input:-1"], **args)
    calls = {"n": 0}

    def kill_on_fourth_forward(module, inputs):
        calls["n"] += 1
        if calls["n"] == 4:  # 1 = key-width probe, then two committed batches
            raise KeyboardInterrupt("simulated kill")

    handle = model.register_forward_pre_hook(kill_on_fourth_forward)
    with pytest.raises(KeyboardInterrupt):
        build_datastore(tmp_path / "resumed", model, ids, ["ffn_input:-1"], **args)
    handle.remove()
    build_datastore(tmp_path / "resumed", model, ids, ["ffn_input:-1"], **args)
    for name in ["values.npy", "keys-ffn_input@-1.npy", "lm_logprobs.npy", "manifest.json"]:
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "resumed" / name).read_bytes(), name


def test_t5_decoder_keys_with_teacher_forcing():
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=VOCAB,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=2,
        num_heads=2,
        decoder_start_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    model = T5ForConditionalGeneration(config).eval()
    keyed = KeyedLM(model, ["layer_output:0", "ffn_input:-1"])
    ids = torch.randint(2, VOCAB, (2, 7))
    logits, keys = keyed(ids)
    with torch.no_grad():
        reference = model(input_ids=torch.tensor([[1], [1]]), decoder_input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(logits, reference.logits)
    torch.testing.assert_close(keys["layer_output:0"], reference.decoder_hidden_states[1])
    assert keys["ffn_input:-1"].shape == (2, 7, 16)


def test_unknown_key_type_lists_valid_ones():
    with pytest.raises(
        ValueError,
        match=r"valid types: \['attn_output', 'ffn_input', 'ffn_output', 'layer_output'\]",
    ):
        parse_key_spec("mlp_in:0", 2)
    with pytest.raises(ValueError, match=r"must be in \[-2, 1\]"):
        parse_key_spec("ffn_input:2", 2)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    model = tiny_gpt2(seed=1)
    rng = np.random.default_rng(5)
    folder = tmp_path_factory.mktemp("knn")
    train = build_datastore(
        folder / "train",
        model,
        rng.integers(0, VOCAB, 400),
        ["ffn_input:-1"],
        context=16,
        stride=8,
        progress=False,
    )
    test = build_datastore(
        folder / "test",
        model,
        rng.integers(0, VOCAB, 90),
        ["ffn_input:-1"],
        context=16,
        stride=8,
        progress=False,
    )
    return train, test


def test_search_distances_equal_brute_force(stores):
    train, test = stores
    queries = np.asarray(test.keys("ffn_input:-1")[:20], dtype=np.float64)
    keys = np.asarray(train.keys("ffn_input:-1"), dtype=np.float64)
    brute = ((queries[:, None, :] - keys[None]) ** 2).sum(-1)
    dist, _ids = search_neighbours(queries, train, "ffn_input:-1", 8)
    np.testing.assert_allclose(dist, np.sort(brute, axis=1)[:, :8], rtol=1e-4, atol=1e-3)
    index = build_knn_index(train, "ffn_input:-1", "IVF4,PQ4", train_rows=399)
    approx, approx_ids = search_neighbours(queries, train, "ffn_input:-1", 8, index=index, nprobe=4, recompute=True)
    np.testing.assert_allclose(approx, np.take_along_axis(brute, approx_ids, 1), rtol=1e-5)


def test_lambda_zero_is_the_lm_and_grid_search_picks_the_minimum(stores):
    train, test = stores
    out = knn_lm_logprobs(test, train, "ffn_input:-1", k=16, settings=[(0.0, 1.0), (0.5, 10.0)])
    assert np.array_equal(out[(0.0, 1.0)], np.asarray(test.lm_logprobs, dtype=np.float64))
    tuned = grid_search(test, train, "ffn_input:-1", k=16, lambdas=[0.0, 0.2, 0.5], temperatures=[1.0, 10.0])
    assert tuned["perplexity"] == min(row[2] for row in tuned["grid"])
    assert tuned["lm_perplexity"] == pytest.approx(perplexity(test.lm_logprobs))
    assert [row[:2] for row in tuned["grid"]] == [[l, t] for l in (0.0, 0.2, 0.5) for t in (1.0, 10.0)]


def test_cli_build_tune_eval_and_dispersion(tmp_path, capsys):
    import argparse
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from atlas.cli.knnlm_commands import register

    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 2)]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model_dir = tmp_path / "lm"
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>").save_pretrained(model_dir)
    tiny_gpt2().save_pretrained(model_dir)
    rng = np.random.default_rng(7)
    for name, n_lines in [("train", 30), ("valid", 6), ("test", 6)]:
        lines = [" ".join(f"w{j}" for j in rng.integers(0, 12, size=rng.integers(3, 9))) for _ in range(n_lines)]
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))

    def run(*argv):
        args = parser.parse_args([str(a) for a in argv])
        assert args.func(args) == 0

    ds = tmp_path / "ds"
    run(
        "knnlm",
        "build",
        model_dir,
        tmp_path / "train.txt",
        ds,
        "--keys",
        "ffn_input:-1",
        "layer_output:0",
        "--context",
        16,
        "--stride",
        8,
    )
    run(
        "knnlm",
        "tune",
        model_dir,
        ds,
        tmp_path / "valid.txt",
        "--k",
        8,
        "--lambdas",
        0.0,
        0.3,
        "--temperatures",
        1,
        10,
        "--out",
        tmp_path / "tuning.json",
    )
    tuning = json.loads((tmp_path / "tuning.json").read_text())
    assert tuning["perplexity"] == min(row[2] for row in tuning["grid"])
    run(
        "knnlm",
        "eval",
        model_dir,
        ds,
        tmp_path / "test.txt",
        "--k",
        8,
        "--tuning",
        tmp_path / "tuning.json",
        "--out",
        tmp_path / "results",
    )
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    lm = np.load(tmp_path / "results" / "lm_logprobs.npy")
    knn = np.load(tmp_path / "results" / "knnlm_logprobs.npy")
    test_tokens = sum(len(line.split()) + 1 for line in (tmp_path / "test.txt").read_text().splitlines())
    assert summary["tokens"] == len(lm) == len(knn) == test_tokens - 1
    assert summary["lm_perplexity"] == pytest.approx(perplexity(lm), rel=1e-6)
    assert summary["knnlm_perplexity"] == pytest.approx(perplexity(knn), rel=1e-6)
    run(
        "dispersion",
        model_dir,
        tmp_path / "train.txt",
        "--context",
        16,
        "--out",
        tmp_path / "disp.json",
    )
    assert "recommended kNN-LM key" in capsys.readouterr().out
    assert set(json.loads((tmp_path / "disp.json").read_text())["dispersion"]) >= {
        "layer_output:0",
        "ffn_input:-1",
    }


def test_model_fingerprint_follows_weights_and_config_not_the_folder(tmp_path):
    from atlas.knnlm.lm import load_lm, model_fingerprint

    model = tiny_gpt2(seed=0)
    model.save_pretrained(tmp_path / "a")
    model.save_pretrained(tmp_path / "b")
    reloaded = load_lm(tmp_path / "b")
    assert model_fingerprint(load_lm(tmp_path / "a")) == model_fingerprint(reloaded)
    assert model_fingerprint(model) == model_fingerprint(reloaded)
    assert model_fingerprint(tiny_gpt2(seed=1)) != model_fingerprint(model)  # same architecture
    nudged = tiny_gpt2(seed=0)
    with torch.no_grad():
        nudged.transformer.h[1].mlp.c_fc.bias[0] += 1e-3
    assert model_fingerprint(nudged) != model_fingerprint(model)
    other_config = tiny_gpt2(seed=0)
    other_config.config.layer_norm_epsilon = 1e-3  # same weights, different computation
    assert model_fingerprint(other_config) != model_fingerprint(model)


def test_datastore_of_another_model_is_never_resumed_or_reused(tmp_path):
    ids = np.random.default_rng(11).integers(0, VOCAB, size=60)
    args = {"context": 10, "stride": 4, "batch_size": 2, "progress": False}
    first, second = tiny_gpt2(seed=0), tiny_gpt2(seed=1)  # same architecture and sizes
    store = build_datastore(tmp_path / "done", first, ids, ["ffn_input:-1"], **args)
    meta = store.manifest.meta
    assert len(meta["model_fingerprint"]) == 64 and meta["architecture"] == "gpt2"
    with pytest.raises(ValueError, match="built with a different model"):
        build_datastore(tmp_path / "done", second, ids, ["ffn_input:-1"], **args)
    # the same model reuses the finished store
    assert build_datastore(tmp_path / "done", first, ids, ["ffn_input:-1"], **args).manifest == (store.manifest)

    # a half-built store is not resumed by another model either
    calls = {"n": 0}

    def kill_on_third_forward(module, inputs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")

    handle = first.register_forward_pre_hook(kill_on_third_forward)
    with pytest.raises(KeyboardInterrupt):
        build_datastore(tmp_path / "half", first, ids, ["ffn_input:-1"], **args)
    handle.remove()
    with pytest.raises(ValueError, match="half: datastore was built with a different model"):
        build_datastore(tmp_path / "half", second, ids, ["ffn_input:-1"], **args)

    # an edited text of the same length and opening is not taken for the old one
    edited = ids.copy()
    edited[-5] = (edited[-5] + 1) % VOCAB
    with pytest.raises(ValueError, match=r"differs in \['meta'\] \(meta.tokens_sha256: stored"):
        build_datastore(tmp_path / "done", first, edited, ["ffn_input:-1"], **args)

    # a query store of the second model cannot be searched against the first model's store
    queries = build_datastore(tmp_path / "q", second, ids, ["ffn_input:-1"], **args)
    with pytest.raises(ValueError, match="built by different producers \\(model_fingerprint"):
        knn_lm_logprobs(queries, store, "ffn_input:-1", k=4, settings=[(0.5, 1.0)])
    with pytest.raises(ValueError, match="different producers"):
        grid_search(queries, store, "ffn_input:-1", k=4, lambdas=[0.5], temperatures=[1.0])


def test_datastore_without_fingerprint_is_refused(tmp_path):
    import json

    ids = np.random.default_rng(12).integers(0, VOCAB, size=30)
    model = tiny_gpt2()
    args = {"context": 10, "stride": 4, "progress": False}
    build_datastore(tmp_path / "old", model, ids, ["ffn_input:-1"], **args)
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    del manifest["meta"]["model_fingerprint"]  # as written before fingerprints existed
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="no model fingerprint"):
        build_datastore(tmp_path / "old", model, ids, ["ffn_input:-1"], **args)


def write_word_lm(folder, words, seed: int = 0):
    """A model folder: tiny GPT-2 (seeded) + a word-level tokenizer over `words`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>").save_pretrained(folder)
    tiny_gpt2(seed=seed).save_pretrained(folder)
    return folder


def test_cli_refuses_a_datastore_built_with_another_model_or_tokenizer(tmp_path):
    import argparse
    import json

    from atlas.cli.knnlm_commands import register

    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 2)]
    built_with = write_word_lm(tmp_path / "lm", words, seed=0)
    retrained = write_word_lm(tmp_path / "lm-retrained", words, seed=1)  # same architecture
    # same weights, but the word ids are shuffled: keys and values would mean other words
    shuffled = write_word_lm(tmp_path / "lm-other-vocab", words[:2] + words[2:][::-1], seed=0)
    rng = np.random.default_rng(8)
    for name, n_lines in [("train", 20), ("valid", 4)]:
        lines = [" ".join(f"w{j}" for j in rng.integers(0, 12, size=6)) for _ in range(n_lines)]
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))

    def run(*argv):
        args = parser.parse_args([str(a) for a in argv])
        return args.func(args)

    ds = tmp_path / "ds"
    assert run("knnlm", "build", built_with, tmp_path / "train.txt", ds, "--context", 16, "--stride", 8) == 0
    meta = json.loads((ds / "manifest.json").read_text())["meta"]
    assert len(meta["tokenizer_fingerprint"]) == 64
    tune = ["--k", 4, "--lambdas", 0.3, "--temperatures", 1, "--out", tmp_path / "t.json"]
    with pytest.raises(
        ValueError,
        match=r"different model \(configuration or weights\).*"
        r"model given: .*lm-retrained",
    ):
        run("knnlm", "tune", retrained, ds, tmp_path / "valid.txt", *tune)
    with pytest.raises(ValueError, match="datastore was built with a different tokenizer"):
        run("knnlm", "tune", shuffled, ds, tmp_path / "valid.txt", *tune)
    with pytest.raises(ValueError, match="different model"):
        run("knnlm", "build", retrained, tmp_path / "train.txt", ds, "--context", 16, "--stride", 8)
    assert not list(tmp_path.glob("ds-queries-*"))  # nothing was cached for the wrong models
    assert run("knnlm", "tune", built_with, ds, tmp_path / "valid.txt", *tune) == 0
    cached = tmp_path / "ds-queries-valid-ffn_input@-1"
    assert (
        json.loads((cached / "manifest.json").read_text())["meta"]["model_fingerprint"] == (meta["model_fingerprint"])
    )
    # the datastore is rebuilt with another model in place: the stale cached query store is refused
    import shutil

    shutil.rmtree(ds)
    assert run("knnlm", "build", retrained, tmp_path / "train.txt", ds, "--context", 16, "--stride", 8) == 0
    with pytest.raises(ValueError, match="ds-queries-valid-ffn_input@-1: datastore was built with a different model"):
        run("knnlm", "tune", retrained, ds, tmp_path / "valid.txt", *tune)
