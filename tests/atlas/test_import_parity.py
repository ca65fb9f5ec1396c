"""Import parity: what the reference implementations computed with their files, this project computes
after `atlas import` — checked against the reference formulas written out in float64
(tests/atlas/reference_math.py), to 1e-5 relative.

- An Atlas checkpoint (`model.pth.tar`: untied lm-adapt reader, untied Contriever, a T5
  SentencePiece-style tokenizer, `generation_max_length` 8): retriever embeddings (the reference's
  second-moment layer norm), reader token ids of the prompts the reference builds (transformers 4
  segmentation), reader logits, and the generations of the imported run (7 new tokens).
- A FiD reader saved by transformers 3 (the cross-attention bias table of the first decoder block):
  logits, the training loss and its gradient, greedy decoding packed and unpacked, beam search (folded
  and packed, step by step against the formula, and against transformers' own beam search), and the
  adist gold scores.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import transformers
from transformers import T5Config, T5ForConditionalGeneration, T5Tokenizer
from transformers.modeling_outputs import BaseModelOutput

from atlas.cli import main
from atlas.importing.reference_checkpoint import import_atlas_checkpoint
from tests.atlas import reference_math as ref
from tests.atlas.test_import_checkpoint import (
    bert_pair,
    reference_options,
    tiny_t5,
    write_atlas_checkpoint,
)

RTOL = 1e-5
WORDS = [
    "question",
    "answer",
    "title",
    "context",
    "who",
    "what",
    "where",
    "is",
    "the",
    "capital",
    "of",
    "zorbland",
    "quimper",
    "river",
    "in",
    "tarsia",
    "fenwick",
    "mount",
    "olo",
    "climbed",
    "first",
]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789:?.,'-")
N_SENTINELS = 10


# transformers 4's `clean_up_tokenization`, which its decode applied (`clean_up_tokenization_spaces=True` by default)
V4_CLEAN_UP = [
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
]


def v4_clean_up(text: str) -> str:
    for old, new in V4_CLEAN_UP:
        text = text.replace(old, new)
    return text


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got − want| / max |want| (float64)."""
    got, want = got.to(torch.float64), want.to(torch.float64)
    return float((got - want).abs().max() / want.abs().max())


@pytest.fixture(scope="module")
def t5_tokenizer_dir(tmp_path_factory) -> Path:
    """A T5 SentencePiece-layout tokenizer (Unigram: `<pad>` 0, `</s>` 1, `<unk>` 2, `▁` 3, pieces, the
    sentinels last in reverse) over a small vocabulary, saved as transformers 5 saves a T5 tokenizer."""
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -5.0)]
    vocab += [("▁" + w, -2.0 - 0.01 * i) for i, w in enumerate(WORDS)]
    vocab += [("▁" + c, -6.0 - 0.001 * i) for i, c in enumerate(CHARS)]
    vocab += [(c, -8.0 - 0.001 * i) for i, c in enumerate(CHARS)]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(N_SENTINELS - 1, -1, -1)]
    folder = tmp_path_factory.mktemp("t5-tokenizer")
    T5Tokenizer(vocab=vocab, extra_ids=N_SENTINELS).save_pretrained(str(folder))
    return folder


def reference_vocabulary(folder: Path) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """(unigram pieces → score, special tokens → id, pieces → id) of a saved tokenizer.json."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    ids = {piece: i for i, (piece, _score) in enumerate(spec["model"]["vocab"])}
    specials = {t["content"]: t["id"] for t in spec["added_tokens"] if t["special"]}
    pieces = {piece: score for piece, score in spec["model"]["vocab"] if piece not in specials}
    return pieces, specials, ids


QUESTIONS = ["who is the capital of zorbland", "what river is in tarsia"]
PASSAGES = [
    [
        {"title": "zorbland", "text": "the capital of zorbland is quimper"},
        {"title": "olo", "text": "who climbed mount olo first"},
    ],
    [
        {"title": "fenwick", "text": "fenwick is a river in tarsia"},
        {"title": "tarsia", "text": "the capital of tarsia"},
    ],
]


def reference_prompts() -> list[str]:
    """The reader inputs the reference builds: its QA task's query (`qa_prompt_format`), alone
    (closed book: encoder_format "{query}"), with each passage (`encoder_format`), and with the empty
    passage its QA task puts in when an example has none."""
    prompts = []
    for question, passages in zip(QUESTIONS, PASSAGES):
        query = f"question: {question} answer: <extra_id_0>"
        prompts.append(query)
        prompts += [f"{query} title: {p['title']} context: {p['text']}" for p in passages]
        prompts.append(f"{query} title:  context: ")
    return prompts


# --- an Atlas checkpoint ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imported_atlas(tmp_path_factory, t5_tokenizer_dir, tiny_encoder_path) -> dict:
    """A reference Atlas run (untied lm-adapt reader, query-side-trained Contriever, generation_max_length 8),
    imported."""
    root = tmp_path_factory.mktemp("atlas-parity")
    tokenizer = T5Tokenizer.from_pretrained(str(t5_tokenizer_dir))
    t5 = tiny_t5(len(tokenizer), gated=True, tied=False, seed=5)
    query, passage = bert_pair(tiny_encoder_path, untied=True)
    with torch.no_grad():  # layer-norm biases, as a trained BERT has: hidden states with a mean of their own
        for bert in (query, passage):
            for name, parameter in bert.named_parameters():
                if "LayerNorm.bias" in name:
                    parameter.add_(0.5)
    opt = reference_options(generation_max_length=8, query_side_retriever_training=True, n_context=2)
    src = write_atlas_checkpoint(root / "ref", t5, query, passage, module=True, opt=opt)
    folder = import_atlas_checkpoint(
        src, root / "run", reader_tokenizer=str(t5_tokenizer_dir), retriever_tokenizer=str(tiny_encoder_path)
    )
    return {
        "folder": folder,
        "t5": t5.state_dict(),
        "query": query.state_dict(),
        "passage": passage.state_dict(),
        "eps": query.config.layer_norm_eps,
        "heads": query.config.num_attention_heads,
    }


def test_every_conversion_is_recorded(imported_atlas):
    from atlas.loading import checkpoint_config

    folder = imported_atlas["folder"]
    record = json.loads((folder / "import.json").read_text())
    conversions = {c["what"]: c for c in record["conversions"]}
    assert set(conversions) == {
        "reader lm_head",
        "reader tokenizer segmentation",
        "inference.generation_max_length",
        "retriever layer norm",
    }
    assert (
        conversions["inference.generation_max_length"]["reference"],
        conversions["inference.generation_max_length"]["here"],
    ) == (8, 7)
    assert conversions["retriever layer norm"]["eps"] == imported_atlas["eps"]
    assert checkpoint_config(folder).inference.generation_max_length == 7
    assert (
        json.loads((folder / "retriever" / "query" / "contriever_config.json").read_text())["layer_norm"] == "reference"
    )


def test_retriever_embeddings_are_the_references(imported_atlas):
    """Both towers, through the indexing path (inference mode, length-sorted batches) and the training
    path (with gradients), equal the reference's Contriever in float64; a stock layer norm would not."""
    from retriever.encoder import use_layer_norm
    from retriever.retriever import Retriever

    retriever = Retriever.from_pretrained(imported_atlas["folder"] / "retriever")
    texts = ["the capital of zorbland is quimper", "a river in tarsia", "mount olo was first climbed in 1820"]
    passages = [{"title": t.split()[1], "text": t} for t in texts]
    for side, encoder, got in (
        (
            "query",
            retriever.query_encoder,
            torch.from_numpy(retriever.embed_queries(texts, precision="fp32")),
        ),  # float64 parity: not bf16
        ("passage", retriever.passage_encoder, retriever.encode_passages(passages).detach()),
    ):
        rendered = texts if side == "query" else [retriever.format_passage(p) for p in passages]
        maxlength = retriever.query_maxlength if side == "query" else retriever.passage_maxlength
        batch = encoder.tokenize(rendered, maxlength)
        want = ref.bert_embeddings(
            imported_atlas[side], heads=imported_atlas["heads"], eps=imported_atlas["eps"], **batch
        )
        assert relative_error(got, want) < RTOL
        use_layer_norm(encoder.model, "standard")
        with torch.no_grad():
            stock = encoder(**batch)
        use_layer_norm(encoder.model, "reference")
        assert relative_error(stock, want) > 1e-2  # the test tells the two norms apart


def test_reader_prompts_are_tokenized_as_the_reference_did(imported_atlas, t5_tokenizer_dir):
    from reader.inputs import encode_reader_inputs
    from reader.tokenizer import build_reader_tokenizer

    tokenizer = build_reader_tokenizer(imported_atlas["folder"] / "reader")
    stock = T5Tokenizer.from_pretrained(str(t5_tokenizer_dir))
    pieces, specials, ids = reference_vocabulary(t5_tokenizer_dir)
    for prompt in reference_prompts():
        want = ref.legacy_t5_tokens(prompt, pieces, specials, ids)
        assert tokenizer(prompt)["input_ids"] == want, prompt
        if prompt.endswith("<extra_id_0>"):  # closed book: the '▁' before the sentinel, which transformers 5 drops
            assert tokenizer.convert_ids_to_tokens(want)[-4:] == [":", "▁", "<extra_id_0>", "</s>"]
            assert stock(prompt)["input_ids"] != want
    # the run's own path to the reader: encode_reader_inputs with the run's passage format
    query = f"question: {QUESTIONS[0]} answer: <extra_id_0>"
    input_ids, mask = encode_reader_inputs(
        tokenizer, [query], [PASSAGES[0]], 40, "{query} title: {title} context: {text}"
    )
    for k, passage in enumerate(PASSAGES[0]):
        want = ref.legacy_t5_tokens(
            f"{query} title: {passage['title']} context: {passage['text']}", pieces, specials, ids
        )
        assert input_ids[0, k, : int(mask[0, k].sum())].tolist() == want
    closed_ids, _ = encode_reader_inputs(tokenizer, [query], [[]], 40)
    assert closed_ids[0, 0].tolist() == ref.legacy_t5_tokens(query, pieces, specials, ids)


def atlas_inputs(model) -> tuple[torch.Tensor, torch.Tensor]:
    queries = [f"question: {q} answer: <extra_id_0>" for q in QUESTIONS]
    from tasks.passage import Passage

    return model.reader_inputs(queries, [[Passage(id=p["title"], **p) for p in ps] for ps in PASSAGES])


def test_reader_logits_and_generations_are_the_references(imported_atlas):
    """The imported run, built as `atlas evaluate` builds it, reads the reference's prompts to the
    reference's logits and generates the reference's answers: 7 new tokens for its max_length 8."""
    from atlas.loading import load_model, model_spec

    folder = imported_atlas["folder"]
    model = load_model(model_spec(folder))
    input_ids, mask = atlas_inputs(model)
    decoder_ids = torch.tensor([[0, 52, 40, 7, 22], [0, 52, 9, 31, 5]])
    with torch.no_grad():
        logits = model.reader(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    want = ref.fid_t5_logits(
        imported_atlas["t5"],
        heads=4,
        input_ids=input_ids,
        attention_mask=mask,
        decoder_input_ids=decoder_ids,
        cross_bias=False,
    )
    assert relative_error(logits, want) < RTOL

    generated = model.generate(input_ids, mask, PASSAGES)
    expected = ref.greedy(
        imported_atlas["t5"], heads=4, input_ids=input_ids, attention_mask=mask, max_length=8, cross_bias=False
    )
    for row, want_ids in zip(generated.tolist(), expected):
        assert row[: len(want_ids)] == want_ids and set(row[len(want_ids) :]) <= {0}
    assert max(len(ids) for ids in expected) == 8  # an answer ran to max_length: 7 tokens after the start
    unconverted = model.reader.generate(input_ids, mask, max_length=8)
    assert unconverted.shape[1] == 9  # taking the reference's 8 as new tokens generates one more

    # the answers as text, through the one answer path, are the reference's: its evaluate decodes the ids with
    # the tokenizer, skipping special tokens, and transformers 4 cleans up the spaces before punctuation (nothing
    # respelled after the passages: the tokenizer is lossless)
    from tasks.base import get_task
    from tasks.passage import Passage

    queries = [f"question: {q} answer: <extra_id_0>" for q in QUESTIONS]
    passages = [[Passage(id=p["title"], **p) for p in ps] for ps in PASSAGES]
    texts = model.read(queries, passages).texts
    tokenizer = T5Tokenizer.from_pretrained(str(folder / "reader"))
    assert not model.restores_surface
    answers = [get_task("qa").postprocess(None, t) for t in texts]
    assert answers == [v4_clean_up(tokenizer.decode(ids, skip_special_tokens=True)).strip() for ids in expected]
    # the same through the Python API, loading the imported run by its folder (its passages given here)
    import atlas
    from tasks.base import Example

    loaded = atlas.Atlas.from_pretrained(folder)
    examples = [
        Example(id=str(n), query=q, target=None, answers=[], passages=ps)
        for n, (q, ps) in enumerate(zip(queries, passages))
    ]
    assert [a.text for a in loaded.answer_examples(examples)] == answers


def test_untied_reader_saves_untied_and_loads_without_a_warning(imported_atlas, caplog):
    from reader.fid import FiDReader
    from reader.t5_untied import UntiedT5ForConditionalGeneration

    folder = imported_atlas["folder"] / "reader"
    config = json.loads((folder / "config.json").read_text())
    assert (config["tie_word_embeddings"], config["scale_decoder_outputs"]) == (False, False)
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            reader = FiDReader.from_pretrained(folder)
    finally:
        transformers.logging.disable_propagation()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    t5 = reader.seq2seq
    assert isinstance(t5, UntiedT5ForConditionalGeneration)
    assert t5.encoder.embed_tokens.weight is t5.shared.weight and t5.decoder.embed_tokens.weight is t5.shared.weight
    assert t5.lm_head.weight is not t5.shared.weight
    assert torch.equal(t5.lm_head.weight, imported_atlas["t5"]["lm_head.weight"])
    reader.save_pretrained(folder.parent / "again")  # a training checkpoint of it stays untied
    assert json.loads((folder.parent / "again" / "config.json").read_text())["tie_word_embeddings"] is False


# --- a FiD reader saved by transformers 3 ----------------------------------------------------------------

CROSS_KEY = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"


@pytest.fixture(scope="module")
def imported_fid(tmp_path_factory, t5_tokenizer_dir) -> dict:
    """facebookresearch/FiD's FiDT5.save_pretrained under transformers 3.0.2: T5 v1.0 (relu, tied), the
    encoder wrapped (`encoder.encoder.block.{i}.module.…`), the first decoder block's cross-attention
    bias table, a 3.0.2 config.json (no tie_word_embeddings), a torch < 1.6 (non-zip) pytorch_model.bin."""
    root = tmp_path_factory.mktemp("fid-parity")
    vocab = len(T5Tokenizer.from_pretrained(str(t5_tokenizer_dir)))
    torch.manual_seed(15)  # a tiny random T5 whose greedy answers the bias changes
    config = T5Config(
        vocab_size=vocab,
        d_model=16,
        d_kv=6,
        d_ff=20,
        num_heads=4,
        num_layers=2,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
    )
    t5 = T5ForConditionalGeneration(config).eval()
    state = {}
    for key, value in t5.state_dict().items():
        if key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
            state[key] = value.clone()  # 3.0.2 saved the aliases of `shared` as tensors of their own
            continue
        if key.startswith("encoder."):
            parts = ("encoder." + key).split(".")
            if parts[2] == "block":
                parts.insert(4, "module")
            key = ".".join(parts)
        state[key] = value
    state[CROSS_KEY] = 0.7 * torch.randn(8, 4)  # (buckets, heads)
    src = root / "nq_reader_tiny"
    src.mkdir()
    (src / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["FiDT5"],
                "d_ff": 20,
                "d_kv": 6,
                "d_model": 16,
                "decoder_start_token_id": 0,
                "dropout_rate": 0.1,
                "eos_token_id": 1,
                "initializer_factor": 1.0,
                "is_encoder_decoder": True,
                "layer_norm_epsilon": 1e-06,
                "model_type": "t5",
                "n_positions": 512,
                "num_heads": 4,
                "num_layers": 2,
                "output_past": True,
                "pad_token_id": 0,
                "relative_attention_num_buckets": 8,
                "vocab_size": vocab,
            }
        )
    )
    torch.save(state, src / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert main(["import", "fid-reader", str(src), str(root / "reader"), "--tokenizer", str(t5_tokenizer_dir)]) == 0
    reference = {k: v for k, v in t5.state_dict().items()}
    reference[CROSS_KEY] = state[CROSS_KEY]
    del reference["lm_head.weight"]  # tied: the output layer is `shared`, scaled by d^-0.5
    return {"folder": root / "reader", "state": reference, "vocab": vocab}


def fid_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 3, 12) ids and mask: example 0's first passage has 3 tokens (shorter than the decoding), so
    packed decoding puts passage 1's tokens at fused indices below the decoder positions."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab - N_SENTINELS, (2, 3, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, 0, 3:] = 0
    mask[0, 2, 7:] = 0
    mask[1, 1, 10:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def load_fid(imported_fid):
    from reader.cross_attention_bias import has_cross_attention_bias
    from reader.fid import FiDReader

    reader = FiDReader.from_pretrained(imported_fid["folder"], dropout=0.0).eval()
    assert has_cross_attention_bias(reader.seq2seq)
    return reader


def test_fid_import_keeps_the_cross_attention_bias(imported_fid):
    folder = imported_fid["folder"]
    record = json.loads((folder / "import.json").read_text())
    assert [c["what"] for c in record["conversions"]] == ["reader cross-attention position bias"]
    assert record["conversions"][0]["reference"] == CROSS_KEY
    assert json.loads((folder / "config.json").read_text())["cross_attention_relative_bias"] is True
    reader = load_fid(imported_fid)
    table = reader.seq2seq.decoder.block[0].layer[1].EncDecAttention.relative_attention_bias.weight
    assert torch.equal(table, imported_fid["state"][CROSS_KEY])


def test_fid_logits_loss_and_gradient_are_the_references(imported_fid):
    reader = load_fid(imported_fid)
    ids, mask = fid_batch(imported_fid["vocab"])
    labels = torch.tensor([[17, 30, 8, 44, 1, -100], [25, 6, 19, 33, 12, 1]])
    decoder_ids = reader.shift_right(labels)
    output = reader(input_ids=ids, attention_mask=mask, labels=labels)
    want = ref.fid_t5_logits(
        imported_fid["state"],
        heads=4,
        input_ids=ids,
        attention_mask=mask,
        decoder_input_ids=decoder_ids,
        cross_bias=True,
    )
    assert relative_error(output.logits.detach(), want) < RTOL
    without = ref.fid_t5_logits(
        imported_fid["state"],
        heads=4,
        input_ids=ids,
        attention_mask=mask,
        decoder_input_ids=decoder_ids,
        cross_bias=False,
    )
    assert relative_error(without, want) > 1e-3  # the bias matters to these numbers
    keep = labels != -100
    nll = -want.log_softmax(-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)[keep].mean()
    assert abs(float(output.loss.detach()) - float(nll)) / float(nll) < RTOL
    output.loss.backward()  # training reaches the table
    table = reader.seq2seq.decoder.block[0].layer[1].EncDecAttention.relative_attention_bias.weight
    assert table.grad is not None and float(table.grad.abs().sum()) > 0


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
def test_fid_greedy_generation_is_the_references(imported_fid, pack):
    from atlas.importing.reference_checkpoint import reference_new_tokens

    reader = load_fid(imported_fid)
    ids, mask = fid_batch(imported_fid["vocab"])
    steps: list[torch.Tensor] = []  # the logits of every decoding step, (B, V)
    hook = reader.seq2seq.register_forward_hook(lambda _m, _a, out: steps.append(out.logits[:, -1].detach()))
    try:
        generated = reader.generate(ids, mask, max_length=reference_new_tokens(10), pack_passages=pack).tolist()
    finally:
        hook.remove()
    expected = ref.greedy(
        imported_fid["state"], heads=4, input_ids=ids, attention_mask=mask, max_length=10, cross_bias=True
    )
    for b, (row, want) in enumerate(zip(generated, expected)):
        assert row[: len(want)] == want and set(row[len(want) :]) <= {0}
        logits = ref.fid_t5_logits(
            imported_fid["state"],
            heads=4,
            input_ids=ids[b : b + 1],
            attention_mask=mask[b : b + 1],
            decoder_input_ids=torch.tensor([want[:-1]]),
            cross_bias=True,
        )[0]
        for t in range(len(want) - 1):  # every step's logits, not only its argmax
            assert relative_error(steps[t][b], logits[t]) < RTOL, (b, t)
    without = ref.greedy(
        imported_fid["state"], heads=4, input_ids=ids, attention_mask=mask, max_length=10, cross_bias=False
    )
    assert without != expected  # the bias changes these answers


@pytest.mark.parametrize("beams", [1, 3], ids=["greedy", "beams"])
def test_fid_cached_packed_decoding_steps_are_the_references(imported_fid, beams):
    """The decoder passes of generation over the packed passages with a prefilled cache, one token at a
    time — for beam search folded (the beams of an example share its keys): every row's logits at every
    step equal the formula's for its prefix over FiD's padded layout."""
    from reader.beam_attention import CACHE_KWARG, BeamSharedCrossAttentionCache

    reader = load_fid(imported_fid)
    ids, mask = fid_batch(imported_fid["vocab"])
    gen = torch.Generator().manual_seed(8)
    prefixes = torch.randint(3, 60, (2 * beams, 7), generator=gen)
    prefixes[:, 0] = 0
    with torch.no_grad():
        states = reader.encode(ids, mask)
        packed, packed_mask, positions = reader.fuse_packed(states, mask)
        cache = BeamSharedCrossAttentionCache.prefilled(reader.seq2seq.decoder, packed.last_hidden_state, packed_mask)
        cache.encoder_positions = positions
        memory = BaseModelOutput(last_hidden_state=packed.last_hidden_state.repeat_interleave(beams, 0))
        for step in range(prefixes.shape[1]):
            out = reader.seq2seq(
                encoder_outputs=memory,
                attention_mask=packed_mask.repeat_interleave(beams, 0),
                decoder_input_ids=prefixes[:, step : step + 1],
                use_cache=True,
                **{CACHE_KWARG: cache},
            )
            for row in range(2 * beams):
                example = row // beams
                want = ref.fid_t5_logits(
                    imported_fid["state"],
                    heads=4,
                    input_ids=ids[example : example + 1],
                    attention_mask=mask[example : example + 1],
                    decoder_input_ids=prefixes[row : row + 1, : step + 1],
                    cross_bias=True,
                )
                assert relative_error(out.logits[row, -1], want[0, -1]) < RTOL, (step, row)


def test_fid_beam_search_agrees_on_every_path(imported_fid):
    """Folded + packed (the shipped path), folded + unpacked, and transformers' own beam search (its own
    cache, beams repeated: T5's attention with the bias per row) give the same answers."""
    reader = load_fid(imported_fid)
    ids, mask = fid_batch(imported_fid["vocab"])
    packed = reader.generate(ids, mask, max_length=6, num_beams=3)
    unpacked = reader.generate(ids, mask, max_length=6, num_beams=3, pack_passages=False)
    with torch.no_grad():
        outputs, fused_mask = reader.fuse(reader.encode(ids, mask), mask)
        stock = reader.seq2seq.generate(
            encoder_outputs=outputs,
            attention_mask=fused_mask,
            max_new_tokens=6,
            num_beams=3,
            do_sample=False,
            decoder_start_token_id=0,
            eos_token_id=1,
            pad_token_id=0,
        )
    assert torch.equal(packed, unpacked) and torch.equal(packed, stock)


def test_fid_adist_gold_scores_include_the_bias(imported_fid):
    """gold_k = Σ_layers Σ_t Σ_{j ∈ passage k} mean_heads(α · ‖v‖) / (layers · T), α with the bias."""
    reader = load_fid(imported_fid)
    ids, mask = fid_batch(imported_fid["vocab"])
    labels = torch.tensor([[17, 30, 8, 1], [25, 6, 19, 1]])
    with torch.no_grad():
        got = reader.cross_attention_scores(reader.encode(ids, mask), mask, labels)
    for b in range(2):
        capture: list = []
        ref.fid_t5_logits(
            imported_fid["state"],
            heads=4,
            input_ids=ids[b : b + 1],
            attention_mask=mask[b : b + 1],
            decoder_input_ids=reader.shift_right(labels[b : b + 1]),
            cross_bias=True,
            capture=capture,
        )
        total = torch.zeros(ids.shape[1] * ids.shape[2], dtype=torch.float64)
        for probs, values in capture:  # (h, T, K·L), (h, K·L, d)
            total += (probs * values.norm(dim=-1).unsqueeze(1)).mean(0).sum(0)
        want = total.view(ids.shape[1], -1).sum(-1) / (len(capture) * labels.shape[1])
        assert relative_error(got[b], want) < RTOL


def test_an_imported_reader_whose_tokenizer_loses_text_answers_as_the_reference_decoded(tmp_path, tiny_encoder_path):
    """A small SentencePiece vocabulary without "-" and "'" loses text in a round trip (they become <unk>), as
    a lower-casing WordPiece does; the reference still decoded its answers with the tokenizer alone. The imported
    run's saved settings turn respelling off: generated "talat crown" (▁tal at ▁crown) stays "talat crown", not
    the passage's "tal at crown", and "sthi" stays "sthi" (before: `atlas evaluate` printed "tal at crown" and
    "s t hi")."""
    import yaml

    from atlas.loading import load_model, model_spec
    from reader.surface import decoding_is_lossless
    from tasks.base import get_task
    from tasks.passage import Passage

    chars = list("abcdefghijklmnopqrstuvwxyz0123456789.")
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -5.0), ("▁tal", -2.0), ("▁crown", -2.0)]
    vocab += [("▁" + c, -6.0) for c in chars] + [(c, -8.0) for c in chars] + [("at", -3.0), ("hi", -3.0)]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(N_SENTINELS - 1, -1, -1)]
    T5Tokenizer(vocab=vocab, extra_ids=N_SENTINELS).save_pretrained(str(tmp_path / "spm"))
    query, _ = bert_pair(tiny_encoder_path, untied=False)
    src = write_atlas_checkpoint(tmp_path / "ref", tiny_t5(len(vocab), seed=3), query, None, module=True)
    folder = import_atlas_checkpoint(
        src, tmp_path / "run", reader_tokenizer=str(tmp_path / "spm"), retriever_tokenizer=str(tiny_encoder_path)
    )
    model = load_model(model_spec(folder))
    tokenizer = model.reader_tokenizer
    assert not decoding_is_lossless(tokenizer)  # the case: a tokenizer that loses text
    assert not model.restores_surface
    assert yaml.safe_load((folder / "config.yaml").read_text())["inference"]["restore_surface"] is False
    pieces = [
        ["<pad>", "<extra_id_0>", "▁tal", "at", "▁crown", "</s>"],
        ["<pad>", "<extra_id_0>", "▁s", "t", "hi", "</s>"],
    ]
    generated = torch.tensor([tokenizer.convert_tokens_to_ids(p) for p in pieces])
    passages = [[Passage(id="a", title="", text="the tal at crown")], [Passage(id="b", title="", text="an s t hi")]]
    texts = model.decode(generated, passages)
    answers = [get_task("qa").postprocess(None, t) for t in texts]
    assert answers == [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in generated.tolist()]
    assert answers == ["talat crown", "sthi"]


# --- answers decoded as the reference decoded them: a SentencePiece model trained here ------------------

SPM_WORDS = ["talat", "crown", "sthi", "tal", "st", "the", "capital", "of", "river", "who", "is", "don't", "it's"]


def write_spm_reader_tokenizer(folder: Path, *, byte_fallback: bool = False) -> Path:
    """A T5 reader tokenizer folder as a user passes it to `--reader-tokenizer` (and as the hub's T5 folders and
    transformers 4's `save_pretrained` hold one): `spiece.model`, a unigram SentencePiece model trained here
    (`<pad>` 0, `</s>` 1, `<unk>` 2), with `tokenizer_config.json` and `special_tokens_map.json` naming the
    sentinels `<extra_id_0>`…, which T5 numbers down from the last id."""
    rng = random.Random(0)
    lines = [
        " ".join(rng.choice(SPM_WORDS) for _ in range(rng.randint(3, 10))) + rng.choice(["", ".", "?", " .", " ,"])
        for _ in range(300)
    ]
    folder.mkdir(parents=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(folder / "spiece"),
        vocab_size=330 if byte_fallback else 60,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        byte_fallback=byte_fallback,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    (folder / "spiece.vocab").unlink()
    sentinels = [f"<extra_id_{i}>" for i in range(N_SENTINELS)]
    specials = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "additional_special_tokens": sentinels}
    (folder / "special_tokens_map.json").write_text(json.dumps(specials))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**specials, "extra_ids": N_SENTINELS, "model_max_length": 512, "tokenizer_class": "T5Tokenizer"})
    )
    return folder


def import_with_reader_tokenizer(root: Path, tokenizer_folder: Path, encoder_path: Path):
    """An Atlas checkpoint whose reader tokenizer is `tokenizer_folder`, imported and loaded as `atlas evaluate`
    and `atlas ask` load it."""
    from atlas.loading import load_model, model_spec
    from reader.tokenizer import build_reader_tokenizer

    vocab = len(build_reader_tokenizer(tokenizer_folder))
    query, _ = bert_pair(encoder_path, untied=False)
    src = write_atlas_checkpoint(root / "ref", tiny_t5(vocab, seed=3), query, None, module=True)
    folder = import_atlas_checkpoint(
        src, root / "run", reader_tokenizer=str(tokenizer_folder), retriever_tokenizer=str(encoder_path)
    )
    return load_model(model_spec(folder))


@pytest.fixture(scope="module")
def spm_folder(tmp_path_factory) -> Path:
    return write_spm_reader_tokenizer(tmp_path_factory.mktemp("spm") / "t5-tokenizer")


@pytest.fixture(scope="module", params=["spiece.model", "tokenizer.json"])
def spm_imported(request, spm_folder, tmp_path_factory, tiny_encoder_path) -> dict:
    """The model imported with the SentencePiece folder itself, or with the `tokenizer.json` folder transformers
    makes of it, and the SentencePiece model, which the test decodes with directly."""
    root = tmp_path_factory.mktemp("spm-import")
    folder = spm_folder
    if request.param == "tokenizer.json":
        folder = root / "t5-tokenizer-json"
        T5Tokenizer.from_pretrained(str(spm_folder)).save_pretrained(str(folder))
        assert (folder / "tokenizer.json").is_file() and not (folder / "spiece.model").exists()
    processor = spm.SentencePieceProcessor(model_file=str(spm_folder / "spiece.model"))
    return {"model": import_with_reader_tokenizer(root, folder, tiny_encoder_path), "spm": processor}


def reference_answer(processor: spm.SentencePieceProcessor, ids: list[int]) -> str:
    """What the reference printed for generated `ids`: transformers 4's `T5Tokenizer.decode(ids,
    skip_special_tokens=True)`: the special tokens dropped (`<pad>`, `</s>`, `<unk>`, the sentinels, which lie past
    the SentencePiece vocabulary), SentencePiece's own decode of the other pieces, then transformers 4's clean-up
    of tokenization spaces (its fast tokenizer, which `AutoTokenizer` gave, differs only by spaces at the ends)."""
    special = {processor.pad_id(), processor.eos_id(), processor.unk_id()}
    pieces = [processor.id_to_piece(i) for i in ids if i not in special and i < processor.get_piece_size()]
    return v4_clean_up(processor.decode_pieces(pieces)).strip()


def answers_of(model, rows: list[list[int]]) -> tuple[list[str], list[str]]:
    """(the texts the imported model decodes (B, T') generated `rows` to, the QA answers `atlas evaluate` and `atlas
    ask` print from them)."""
    from tasks.base import get_task

    width = max(len(row) for row in rows)
    generated = torch.tensor([row + [0] * (width - len(row)) for row in rows])  # padded after </s>, as generated
    texts = model.decode(generated, None)
    return texts, [get_task("qa").postprocess(None, text) for text in texts]


def test_an_answer_split_by_a_special_token_is_printed_as_the_reference_printed_it(spm_imported):
    """The reference decoded with `skip_special_tokens=True`: a sentinel, `<pad>` or `<unk>` the reader generated
    inside an answer leaves nothing between the pieces around it, and " ." closes up. Before, the imported model
    decoded with the special tokens kept and the task put a space where each sentinel or pad was (`atlas
    evaluate` printed "tal at crown" and "st hi" where the reference printed "talat crown" and "sthi"), kept
    "<unk>" as text and left " ." open."""
    model, processor = spm_imported["model"], spm_imported["spm"]
    tokenizer = model.reader_tokenizer
    pieces = [
        ["<pad>", "<extra_id_0>", "▁tal", "<extra_id_3>", "a", "t", "▁crown", "</s>"],
        ["<pad>", "<extra_id_0>", "▁st", "<pad>", "h", "i", "</s>"],
        ["<pad>", "<extra_id_0>", "▁tal", "<unk>", "a", "t", "</s>"],
        ["<pad>", "<extra_id_0>", "▁crown", "▁", ".", "</s>"],
    ]
    rows = [tokenizer.convert_tokens_to_ids(p) for p in pieces]
    assert all(tokenizer.convert_ids_to_tokens(row) == p for row, p in zip(rows, pieces))
    _, answers = answers_of(model, rows)
    assert answers == [reference_answer(processor, row) for row in rows]
    assert answers == ["talat crown", "sthi", "talat", "crown."]


def test_imported_answers_are_the_references_for_any_generation(spm_imported):
    """Random generations over the whole vocabulary (pieces, `▁` alone and before punctuation, `<unk>`, `<pad>`,
    the sentinels, `</s>` in the middle): the imported model's decode is the reference's up to spaces at the ends,
    and the answer printed is it with its spaces normalised, as every answer (the task's post-processing)."""
    model, processor = spm_imported["model"], spm_imported["spm"]
    tokenizer = model.reader_tokenizer
    size = processor.get_piece_size()
    pieces = list(range(3, size))
    specials = [0, 1, 2, *range(size, size + N_SENTINELS)]
    spaces = [i for i in pieces if processor.id_to_piece(i) in ("▁", "▁.", ".", "'", ",")]
    rng = random.Random(4)
    rows = [
        [0]
        + [rng.choice(rng.choice([pieces, pieces, pieces, specials, spaces])) for _ in range(rng.randint(0, 9))]
        + [1]
        for _ in range(400)
    ]
    texts, answers = answers_of(model, rows)
    wants = [reference_answer(processor, row) for row in rows]
    assert [text.strip() for text in texts] == wants
    assert answers == [" ".join(want.split()) for want in wants]
    assert sum(any(i in specials[3:] for i in row[1:-1]) for row in rows) > 100  # sentinels inside answers
    assert sum(" " in want and "  " not in want for want in wants) > 100
    assert sum(want != " ".join(want.split()) for want in wants) > 0  # runs of spaces: normalised only in answers
    assert tokenizer.unk_token_id == 2 and len(tokenizer) == size + N_SENTINELS


def test_both_imports_decode_as_the_reference(imported_atlas, imported_fid):
    """An imported Atlas run (its config.yaml) and an imported FiD reader (its atlas.yaml) decode as their
    references, in float32; a model of this project's own keeps the tokenizer's decode, at `auto`."""
    from atlas.config import InferenceConfig
    from atlas.loading import checkpoint_config, model_spec

    for inference in (
        checkpoint_config(imported_atlas["folder"]).inference,
        model_spec(imported_fid["folder"]).config.inference,
    ):
        assert inference.reference_decoding is True
        assert inference.precision == "fp32"  # the reference's arithmetic, not the int8 decoding of `auto`
    assert InferenceConfig().reference_decoding is False
    assert InferenceConfig().precision == "auto"


def test_byte_pieces_are_printed_as_the_references_fast_tokenizer_printed_them(tmp_path, tiny_encoder_path):
    """A SentencePiece model with byte fallback (T5's has none): the reference's `AutoTokenizer` was transformers
    4.18's fast T5 tokenizer, converted from the SentencePiece model without its byte fallback, so a byte piece
    printed as its own text ("<0x21>", where SentencePiece's decode gives "!"); so does the import."""
    folder = write_spm_reader_tokenizer(tmp_path / "t5-bytes", byte_fallback=True)
    model = import_with_reader_tokenizer(tmp_path, folder, tiny_encoder_path)
    pieces = [
        ["<pad>", "<extra_id_0>", "▁crown", "<0x21>", "</s>"],
        ["<pad>", "<extra_id_0>", "▁tal", "<extra_id_2>", "<0x61>", "t", "▁", ".", "</s>"],
    ]
    rows = [model.reader_tokenizer.convert_tokens_to_ids(p) for p in pieces]
    assert all(model.reader_tokenizer.convert_ids_to_tokens(row) == p for row, p in zip(rows, pieces))
    assert answers_of(model, rows)[1] == ["crown<0x21>", "tal<0x61>t."]
