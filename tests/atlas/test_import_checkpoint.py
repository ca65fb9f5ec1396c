"""`atlas import atlas-checkpoint` and `atlas import fid-reader` on tiny fixtures written in the
reference implementations' exact layouts (facebookresearch/atlas `model.pth.tar`: `opt`, `step`,
`model` with `reader.` / `retriever.contriever.` or `retriever.query_contriever.` +
`retriever.passage_contriever.` keys, DDP `.module` infixes; facebookresearch/FiD FiDT5 folders
with the wrapped encoder `encoder.encoder.block.{i}.module.…`).

What is checked: the imported reader's logits equal a plain T5 built from the same tensors;
the imported retriever's embeddings equal Contriever mean pooling with the same weights; the
options that matter land in the config; `atlas evaluate` and `atlas ask` run on the imported
run; bad or unsafe input gives one error naming the file and leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import BertModel, T5Config, T5ForConditionalGeneration

from atlas.cli import main
from atlas.importing.reference_checkpoint import import_atlas_checkpoint, import_fid_reader
from atlas.importing.safe_pickle import UnsafePickleError
from common.io import InputError

TEXTS = ["the capital of zorbland is quimper", "a river in tarsia", "mount olo"]


@pytest.fixture(scope="module")
def reader_tokenizer_dir(tmp_path_factory) -> Path:
    from reader.tokenizer import build_reader_tokenizer

    folder = tmp_path_factory.mktemp("reader-tokenizer")
    build_reader_tokenizer(None).save_pretrained(str(folder))
    return folder


def tiny_t5(
    vocab_size: int, *, gated: bool = True, tied: bool = False, seed: int = 0, decoder_layers: int = 2
) -> T5ForConditionalGeneration:
    """A 2-layer, 16-wide T5 (lm-adapt layout when gated and untied, T5 v1.0 when relu and tied).

    The sizes the import infers from shapes differ from their defaults and from each other:
    heads × d_kv = 24 ≠ d_model (as in T5-11B), 8 relative-attention buckets, and
    `decoder_layers` (generation needs as many as the encoder has: transformers sizes its cache
    by the encoder's depth)."""
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=vocab_size,
        d_model=16,
        d_kv=6,
        d_ff=20,
        num_heads=4,
        num_layers=2,
        num_decoder_layers=decoder_layers,
        relative_attention_num_buckets=8,
        feed_forward_proj="gated-gelu" if gated else "relu",
        tie_word_embeddings=tied,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    model = T5ForConditionalGeneration(config)
    if not tied:  # transformers ties lm_head to `shared` at construction; lm-adapt has its own
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    return model.eval()


def reference_options(**changes) -> argparse.Namespace:
    """The options a reference run stores as `opt` (a subset, with its names and defaults)."""
    opt = argparse.Namespace(
        name="nq-64shot",
        checkpoint_dir=Path("/ckpt"),
        reader_model_type="google/t5-base-lm-adapt",
        retriever_model_path="facebook/contriever",
        text_maxlength=40,
        target_maxlength=16,
        n_context=2,
        retriever_n_context=3,
        gold_score_mode="ppmean",
        temperature_gold=0.1,
        temperature_score=0.05,
        query_side_retriever_training=False,
        train_retriever=True,
        encoder_format="{query} title: {title} context: {text}",
        retriever_format="{title} {text}",
        generation_max_length=4,
        generation_num_beams=1,
        task="qa",
        qa_prompt_format="question: {question} answer: <extra_id_0>",
        lr=4e-5,
        lr_retriever=4e-5,
        total_steps=30,
        warmup_steps=5,
        scheduler="linear",
        weight_decay=0.01,
        per_gpu_batch_size=1,
        accumulation_steps=1,
        clip=1.0,
        precision="bf16",
        refresh_index="-1",
        filtering_overretrieve_ratio=2,
        seed=0,
        train_data=["nq-train.jsonl"],
        eval_data=[],
    )
    for key, value in changes.items():
        setattr(opt, key, value)
    return opt


def write_atlas_checkpoint(
    folder: Path,
    reader: T5ForConditionalGeneration,
    query: BertModel,
    passage: BertModel | None,
    *,
    module: bool,
    opt: argparse.Namespace | None = None,
    step: int = 12,
) -> Path:
    """`folder/model.pth.tar` as the reference's save_atlas_model writes it."""
    wrap = ".module" if module else ""
    state = {f"reader{wrap}.{k}": v for k, v in reader.state_dict().items()}
    if passage is None:
        state.update({f"retriever{wrap}.contriever.{k}": v for k, v in query.state_dict().items()})
    else:
        state.update({f"retriever{wrap}.query_contriever.{k}": v for k, v in query.state_dict().items()})
        state.update({f"retriever{wrap}.passage_contriever.{k}": v for k, v in passage.state_dict().items()})
    folder.mkdir(parents=True, exist_ok=True)
    optimizer = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2)}},
        "param_groups": [{"lr": 1e-4, "params": [0]}],
    }
    torch.save(
        {
            "step": step,
            "model": state,
            "optimizer": optimizer,
            "retr_optimizer": None,
            "scheduler": {"last_epoch": step, "_step_count": step + 1},
            "retr_scheduler": None,
            "opt": opt or reference_options(query_side_retriever_training=passage is not None),
        },
        folder / "model.pth.tar",
    )
    return folder / "model.pth.tar"


def bert_pair(encoder_path: Path, *, untied: bool) -> tuple[BertModel, BertModel | None]:
    query = BertModel.from_pretrained(str(encoder_path), add_pooling_layer=False).eval()
    if not untied:
        return query, None
    passage = BertModel.from_pretrained(str(encoder_path), add_pooling_layer=False).eval()
    with torch.no_grad():  # a passage encoder that differs from the query encoder
        for p in passage.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return query, passage


def mean_pooled(model: BertModel, tokenizer, texts: list[str], max_length: int) -> torch.Tensor:
    """Contriever's embedding written out: mean of the last hidden states over real tokens, (B, d)."""
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # (B, L, d)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return (hidden * mask).sum(1) / mask.sum(1)


def plain_t5_logits(t5: T5ForConditionalGeneration, input_ids, decoder_input_ids) -> torch.Tensor:
    with torch.no_grad():
        return t5(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), decoder_input_ids=decoder_input_ids
        ).logits


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.mark.parametrize(
    ("untied", "module"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["tied", "tied-module", "untied", "untied-module"],
)
def test_round_trip_logits_embeddings_and_config(tmp_path, reader_tokenizer_dir, tiny_encoder_path, untied, module):
    from reader.fid import FiDReader
    from reader.tokenizer import build_reader_tokenizer
    from retriever.retriever import Retriever

    tokenizer = build_reader_tokenizer(reader_tokenizer_dir)
    t5 = tiny_t5(len(tokenizer), gated=not untied, tied=untied, decoder_layers=3)  # both T5 layouts across the cases
    query, passage = bert_pair(tiny_encoder_path, untied=untied)
    src = write_atlas_checkpoint(tmp_path / "ref" / "checkpoint" / "step-12", t5, query, passage, module=module)

    folder = import_atlas_checkpoint(
        src.parent,
        tmp_path / "run",
        reader_tokenizer=str(reader_tokenizer_dir),
        retriever_tokenizer=str(tiny_encoder_path),
    )
    assert folder == tmp_path / "run" / "checkpoints" / "step-000012"
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-000012"

    # reader: FiD over one passage = the plain T5 built from the same tensors, logit for logit
    imported = FiDReader.from_pretrained(folder / "reader").eval()
    got = imported.seq2seq.config
    assert (
        got.d_kv,
        got.num_heads,
        got.d_ff,
        got.num_layers,
        got.num_decoder_layers,
        got.relative_attention_num_buckets,
    ) == (6, 4, 20, 2, 3, 8)
    assert imported.seq2seq.config.scale_decoder_outputs == untied  # T5 v1.0 scales, lm-adapt does not
    assert torch.equal(imported.seq2seq.lm_head.weight, t5.lm_head.weight)
    assert imported.seq2seq.config.feed_forward_proj == ("relu" if untied else "gated-gelu")
    ids = torch.tensor([tokenizer("question: where is quimper answer: <extra_id_0>")["input_ids"]])
    decoder_ids = torch.tensor([[0, 5, 9, 11]])
    with torch.no_grad():
        fid_logits = imported(
            input_ids=ids[:, None], attention_mask=torch.ones_like(ids)[:, None], decoder_input_ids=decoder_ids
        ).logits
    torch.testing.assert_close(fid_logits, plain_t5_logits(t5, ids, decoder_ids), rtol=0, atol=0)

    # retriever: the reference's Contriever (its second-moment layer norm, mean pooling) with the same
    # BERT weights, on each side, written out in float64 (tests/atlas/reference_math.py)
    from tests.atlas.reference_math import bert_embeddings

    retriever = Retriever.from_pretrained(folder / "retriever")
    assert retriever.tied == (not untied)
    assert retriever.query_encoder.layer_norm == retriever.passage_encoder.layer_norm == "reference"
    with torch.no_grad():
        got_q = retriever.query_encoder.encode(TEXTS, 40)
        got_p = retriever.passage_encoder.encode(TEXTS, 40)
    batch = retriever.query_encoder.tokenize(TEXTS, 40)
    for got, bert in ((got_q, query), (got_p, passage if untied else query)):
        want = bert_embeddings(
            bert.state_dict(), heads=bert.config.num_attention_heads, eps=bert.config.layer_norm_eps, **batch
        )
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    if untied:
        assert not torch.allclose(got_q, got_p)

    # the options that matter, mapped
    from atlas.loading import checkpoint_config

    config = checkpoint_config(folder)
    assert (config.retriever.tied, config.retriever.loss.name, config.retriever.pooling) == (
        not untied,
        "pdist",
        "mean",
    )
    assert (config.retriever.temperature_gold, config.retriever.temperature_score) == (0.1, 0.05)
    assert (config.reader.n_context, config.retriever.n_context, config.reader.text_maxlength) == (2, 3, 40)
    assert (config.retriever.passage_maxlength, config.reader.answer_maxlength) == (40, 16)
    assert (config.training.precision, config.task.name, config.index.refresh) == ("bf16", "qa", "never")
    assert config.reader.model == str((folder / "reader").resolve())
    record = json.loads((folder / "import.json").read_text())
    assert record["step"] == 12 and set(record["not_imported"]) == {"optimizer", "scheduler"}
    assert record["options"]["checkpoint_dir"] == "/ckpt"


@pytest.mark.parametrize(("mode", "loss"), [("evalnormsum", "adist"), ("emdr", "emdr"), ("loop", "loop")])
def test_gold_score_modes_map_to_losses(mode, loss):
    from atlas.importing.reference_checkpoint import config_from_options

    config, notes = config_from_options(
        reference_options(gold_score_mode=mode, scheduler="fixed", precision="fp16"),
        tied=True,
        closed_book=False,
        source="x",
    )
    assert config.retriever.loss.name == loss and config.training.scheduler == "constant"
    assert config.retriever.loss.options.get("granularity") == ("token" if loss == "emdr" else None)
    assert config.training.precision == "fp32" and any("fp16" in n for n in notes)


def test_closed_book_checkpoint_imports_without_a_retriever(tmp_path, reader_tokenizer_dir):
    """A --closed_book run saved reader tensors only: a run folder without retriever/, closed-book;
    the same tensors under options that say it retrieved are refused, naming the file."""
    from atlas.loading import checkpoint_config
    from reader.tokenizer import build_reader_tokenizer

    t5 = tiny_t5(len(build_reader_tokenizer(reader_tokenizer_dir)))
    src = tmp_path / "ref" / "model.pth.tar"
    src.parent.mkdir()
    state = {f"reader.{k}": v for k, v in t5.state_dict().items()}
    torch.save({"step": 3, "model": state, "opt": reference_options(closed_book=True, use_file_passages=True)}, src)
    folder = import_atlas_checkpoint(src, tmp_path / "run", reader_tokenizer=str(reader_tokenizer_dir))
    assert not (folder / "retriever").exists() and (folder / "reader" / "config.json").is_file()
    assert checkpoint_config(folder).task.closed_book
    torch.save({"step": 3, "model": state, "opt": reference_options()}, src)
    _assert_refused(
        tmp_path / "again", src, {"reader_tokenizer": str(reader_tokenizer_dir)}, InputError, "options say it retrieved"
    )


def test_file_passages_run_is_imported_closed_book_with_a_note():
    """The reference's --use_file_passages (without --closed_book) read passages from the data
    files; with no such mode here the run is closed-book, and import.json says so."""
    from atlas.importing.reference_checkpoint import config_from_options

    opt = reference_options(use_file_passages=True, closed_book=False)
    config, notes = config_from_options(opt, tied=False, closed_book=True, source="x")
    assert config.task.closed_book and any("use_file_passages" in n for n in notes)
    _, notes = config_from_options(
        reference_options(use_file_passages=True, closed_book=True), tied=False, closed_book=True, source="x"
    )
    assert not any("use_file_passages" in n for n in notes)


def test_evaluate_and_ask_run_on_the_imported_run(tmp_path, reader_tokenizer_dir, tiny_encoder_path, capsys):
    import pickle

    from reader.tokenizer import build_reader_tokenizer

    tokenizer = build_reader_tokenizer(reader_tokenizer_dir)
    query, _ = bert_pair(tiny_encoder_path, untied=False)
    src = write_atlas_checkpoint(tmp_path / "ref", tiny_t5(len(tokenizer)), query, None, module=True)
    assert (
        main(
            [
                "import",
                "atlas-checkpoint",
                str(src),
                str(tmp_path / "run"),
                "--reader-tokenizer",
                str(reader_tokenizer_dir),
                "--retriever-tokenizer",
                str(tiny_encoder_path),
            ]
        )
        == 0
    )

    # the reference's saved index of 2 shards, embedded with the same passage encoder
    from retriever.retriever import Retriever

    retriever = Retriever.from_pretrained(tmp_path / "run" / "checkpoints" / "step-000012" / "retriever")
    docs = [
        {"id": f"p{i}", "title": t.split()[0], "text": t, "section": ""}
        for i, t in enumerate(
            [
                "quimper is the capital of zorbland",
                "fenwick is a river in tarsia",
                "belmont has a clock tower",
                "anna brook climbed mount olo",
                "the florin is the currency of tarsia",
            ]
        )
    ]
    vectors = torch.from_numpy(retriever.embed_passages(docs)).to(torch.float16)  # (N, d)
    (tmp_path / "ref-index").mkdir()
    for shard, rows in enumerate((slice(0, 3), slice(3, 5))):
        torch.save(vectors[rows].T.contiguous(), tmp_path / "ref-index" / f"embeddings.{shard}.pt")
        with open(tmp_path / "ref-index" / f"passages.{shard}.pt", "wb") as f:
            pickle.dump(docs[rows], f, protocol=pickle.HIGHEST_PROTOCOL)
    assert (
        main(
            [
                "import",
                "atlas-index",
                str(tmp_path / "ref-index"),
                "--corpus-out",
                str(tmp_path / "corpus"),
                "--index-out",
                str(tmp_path / "index"),
                "--encoder",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    # the vectors came from the named encoder: re-embedding the first passages agrees (fp16 rounding aside)
    assert json.loads((tmp_path / "index" / "manifest.json").read_text())["imported"]["encoder_agreement"] > 0.99

    (tmp_path / "qa.jsonl").write_text(
        "".join(
            json.dumps(q) + "\n"
            for q in [
                {"question": "what is the capital of zorbland", "answers": ["quimper"]},
                {"question": "what is the currency of tarsia", "answers": ["florin"]},
            ]
        )
    )
    capsys.readouterr()
    assert (
        main(
            [
                "evaluate",
                str(tmp_path / "run"),
                "--data",
                str(tmp_path / "qa.jsonl"),
                "--index",
                str(tmp_path / "index"),
                "--out",
                str(tmp_path / "eval"),
                "evaluation.retrieval_k=[1,2]",
            ]
        )
        == 0
    )
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert {"exact_match", "f1"} <= set(metrics)
    predictions = [json.loads(line) for line in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2
    for prediction in predictions:  # retrieved from the imported index, best first
        scores = [p["score"] for p in prediction["passages"]]
        assert len(scores) >= 2 and scores == sorted(scores, reverse=True)
        assert {p["id"] for p in prediction["passages"]} <= {d["id"] for d in docs}
    assert main(["ask", str(tmp_path / "run"), "where is quimper", "--index", str(tmp_path / "index")]) == 0
    assert "Q: where is quimper" in capsys.readouterr().out

    # the run's config names the imported weights: a new run fine-tunes from them
    assert (
        main(
            [
                "train",
                str(tmp_path / "run" / "config.yaml"),
                f"task.train_data=[{tmp_path / 'qa.jsonl'}]",
                f"index.path={tmp_path / 'index'}",
                f"training.output_dir={tmp_path / 'tuned'}",
                "training.steps=1",
                "training.precision=fp32",
                "training.warmup_steps=0",
            ]
        )
        == 0
    )
    assert (tmp_path / "tuned" / "checkpoints" / "step-000001" / "training_state.pt").is_file()
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "run")]) == 2  # weights only: nothing to resume
    assert "no training state" in capsys.readouterr().err


def assert_imported_reader_gives_t5s_logits(folder, tokenizer, t5) -> None:
    """The reader imported into `folder` reads one passage to the logits `t5` gives, exactly."""
    from reader.fid import FiDReader

    reader = FiDReader.from_pretrained(folder).eval()
    ids = torch.tensor([tokenizer("question: who climbed olo answer: <extra_id_0>")["input_ids"]])
    decoder_ids = torch.tensor([[0, 7, 3]])
    with torch.no_grad():
        logits = reader(
            input_ids=ids[:, None], attention_mask=torch.ones_like(ids)[:, None], decoder_input_ids=decoder_ids
        ).logits
    torch.testing.assert_close(logits, plain_t5_logits(t5, ids, decoder_ids), rtol=0, atol=0)


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors-shards", "bin-shards"])
def test_a_sharded_fid_reader_folder_imports_whole(tmp_path, reader_tokenizer_dir, safe):
    """What save_pretrained writes above its shard size (a T5-XL reader): shards and an index, read whole."""
    from reader.tokenizer import build_reader_tokenizer

    tokenizer = build_reader_tokenizer(reader_tokenizer_dir)
    t5 = tiny_t5(len(tokenizer), gated=True, tied=False, seed=5)
    src = tmp_path / "fid-xl"
    t5.save_pretrained(src, max_shard_size="20KB", safe_serialization=safe)
    if not safe:  # transformers 5 writes safetensors only: the torch-file shards of an older one, by hand
        from safetensors.torch import load_file as load_shard

        index = json.loads((src / "model.safetensors.index.json").read_text())
        renamed = {}
        for shard in sorted(set(index["weight_map"].values())):
            renamed[shard] = shard.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
            torch.save(load_shard(str(src / shard)), src / renamed[shard])
            (src / shard).unlink()
        index["weight_map"] = {name: renamed[shard] for name, shard in index["weight_map"].items()}
        (src / "pytorch_model.bin.index.json").write_text(json.dumps(index))
        (src / "model.safetensors.index.json").unlink()
    assert len(list(src.glob("*-of-*"))) > 2

    out = tmp_path / "out"
    assert main(["import", "fid-reader", str(src), str(out), "--tokenizer", str(reader_tokenizer_dir)]) == 0
    assert_imported_reader_gives_t5s_logits(out, tokenizer, t5)

    # a shard that lacks what its index lists is named, not imported half
    shards = sorted(src.glob("*-of-*"))
    shards[-1].unlink()
    with pytest.raises(InputError, match=shards[-1].name):
        import_fid_reader(src, tmp_path / "half")
    assert not (tmp_path / "half").exists()


def test_fid_reader_folder_imports_with_the_same_logits(tmp_path, reader_tokenizer_dir):
    from reader.tokenizer import build_reader_tokenizer

    tokenizer = build_reader_tokenizer(reader_tokenizer_dir)
    t5 = tiny_t5(len(tokenizer), gated=False, tied=True, seed=3)
    # FiDT5.save_pretrained after wrap_encoder: the encoder under encoder.encoder., each block in a
    # CheckpointWrapper (.module.), weights in pytorch_model.bin, no tokenizer
    state = {}
    for key, value in t5.state_dict().items():
        if key.startswith("encoder."):
            key = "encoder." + key
            parts = key.split(".")
            if parts[2] == "block":
                parts.insert(4, "module")
            key = ".".join(parts)
        state[key] = value
    assert "encoder.encoder.block.1.module.layer.0.SelfAttention.q.weight" in state
    src = tmp_path / "nq_reader_base"
    src.mkdir()
    config = t5.config.to_dict()
    config["architectures"] = ["FiDT5"]
    (src / "config.json").write_text(json.dumps(config))
    torch.save(state, src / "pytorch_model.bin")

    with pytest.raises(ValueError, match="--tokenizer"):
        import_fid_reader(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert (
        main(["import", "fid-reader", str(src), str(tmp_path / "out"), "--tokenizer", str(reader_tokenizer_dir)]) == 0
    )
    assert_imported_reader_gives_t5s_logits(tmp_path / "out", tokenizer, t5)
    assert build_reader_tokenizer(tmp_path / "out").get_vocab() == tokenizer.get_vocab()
    # run as a reader folder, it answers as FiD decoded: with the tokenizer alone, nothing respelled
    from atlas.loading import model_spec

    assert model_spec(tmp_path / "out").config.inference.restore_surface is False


def test_contriever_layout_folder_loads_and_pools_the_same(tmp_path, tiny_encoder_path):
    """A `facebook/contriever`-layout folder (BertModel keys without `bert.`, architectures
    ["Contriever"], pytorch_model.bin, no sentence-transformers files) already loads as is."""
    from transformers import AutoTokenizer

    from retriever.encoder import ContrieverEncoder

    model, _ = bert_pair(tiny_encoder_path, untied=False)
    folder = tmp_path / "contriever"
    folder.mkdir()
    config = model.config.to_dict()
    config["architectures"] = ["Contriever"]
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    AutoTokenizer.from_pretrained(str(tiny_encoder_path)).save_pretrained(str(folder))
    encoder = ContrieverEncoder.from_pretrained(folder)
    assert (encoder.pooling, encoder.normalize) == ("mean", False)
    with torch.no_grad():
        got = encoder.encode(TEXTS, 32)
    torch.testing.assert_close(got, mean_pooled(model, encoder.tokenizer, TEXTS, 32))


# --- bad input: one error naming the file, nothing written ------------------------------------


@pytest.fixture
def reference_checkpoint(tmp_path, reader_tokenizer_dir, tiny_encoder_path):
    from reader.tokenizer import build_reader_tokenizer

    t5 = tiny_t5(len(build_reader_tokenizer(reader_tokenizer_dir)))
    query, _ = bert_pair(tiny_encoder_path, untied=False)
    src = write_atlas_checkpoint(tmp_path / "ref", t5, query, None, module=False)
    return {
        "src": src,
        "t5": t5,
        "query": query,
        "kwargs": {"reader_tokenizer": str(reader_tokenizer_dir), "retriever_tokenizer": str(tiny_encoder_path)},
    }


def _rewrite(src: Path, change) -> None:
    checkpoint = torch.load(src, weights_only=False)  # our own fixture file
    change(checkpoint)
    torch.save(checkpoint, src)


def _assert_refused(tmp_path, src, kwargs, error, match):
    before = tree(tmp_path)
    with pytest.raises(error, match=match) as caught:
        import_atlas_checkpoint(src, tmp_path / "run", **kwargs)
    assert str(src) in str(caught.value)
    assert tree(tmp_path) == before  # no output, no temporary folder
    return caught.value


def test_unknown_key_layout_is_named(tmp_path, reference_checkpoint):
    src = reference_checkpoint["src"]
    _rewrite(src, lambda c: c["model"].update({"generator.lm_head.weight": torch.zeros(2, 2)}))
    error = _assert_refused(tmp_path, src, reference_checkpoint["kwargs"], InputError, "unknown key layout")
    assert error.field == "model.generator.lm_head.weight"


def test_wrong_shape_is_named(tmp_path, reference_checkpoint):
    src = reference_checkpoint["src"]
    key = "reader.decoder.block.1.layer.0.SelfAttention.q.weight"
    _rewrite(src, lambda c: c["model"].update({key: torch.zeros(8, 16)}))
    error = _assert_refused(tmp_path, src, reference_checkpoint["kwargs"], InputError, r"shape \(8, 16\)")
    assert error.field == "decoder.block.1.layer.0.SelfAttention.q.weight"


def test_missing_tensor_is_named(tmp_path, reference_checkpoint):
    src = reference_checkpoint["src"]
    _rewrite(src, lambda c: c["model"].pop("retriever.contriever.encoder.layer.1.output.dense.bias"))
    error = _assert_refused(tmp_path, src, reference_checkpoint["kwargs"], InputError, "missing tensor")
    assert error.field == "encoder.layer.1.output.dense.bias"


def test_offline_without_tokenizers_says_what_to_pass(tmp_path, reference_checkpoint, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the options name hub models; no network here
    before = tree(tmp_path)
    with pytest.raises(ValueError, match="--reader-tokenizer"):
        import_atlas_checkpoint(reference_checkpoint["src"], tmp_path / "run")
    assert tree(tmp_path) == before


def test_truncated_checkpoint_is_named(tmp_path, reference_checkpoint):
    src = reference_checkpoint["src"]
    src.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    _assert_refused(tmp_path, src, reference_checkpoint["kwargs"], InputError, "truncated")


def test_truncated_or_corrupt_legacy_format_checkpoint_is_named(tmp_path, reference_checkpoint):
    """A checkpoint in torch's pre-1.6 (non-zip) format, cut or damaged anywhere: one InputError
    naming the file, never an IndexError / AssertionError / struct.error from deep inside torch."""
    src = reference_checkpoint["src"]
    checkpoint = torch.load(src, weights_only=False)  # our own fixture file
    torch.save(checkpoint, src, _use_new_zipfile_serialization=False)
    data = src.read_bytes()
    damaged = [data[:n] for n in (10, 50, 200, 1000, len(data) // 2)]
    damaged.append(data[:300] + bytes([0xFF]) + data[301:])  # a storage key's digits overwritten
    for content in damaged:
        src.write_bytes(content)
        _assert_refused(tmp_path, src, reference_checkpoint["kwargs"], InputError, "truncated or not a torch file")


def test_windows_paths_are_outside_the_allow_list(tmp_path, reference_checkpoint):
    """The reference stores its options as strings: a Windows path (which cannot even be built on
    this system) is refused as a global outside the allow-list, not reported as a truncated file."""
    from pathlib import PureWindowsPath

    src = reference_checkpoint["src"]
    _rewrite(src, lambda c: setattr(c["opt"], "checkpoint_dir", PureWindowsPath("C:/ckpt")))
    error = _assert_refused(tmp_path, src, reference_checkpoint["kwargs"], UnsafePickleError, "allow-list")
    assert "pathlib.PureWindowsPath" in str(error)


class _Payload:
    """What a malicious checkpoint hides: unpickling it would run a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path, reference_checkpoint, capsys):
    src, marker = reference_checkpoint["src"], tmp_path / "PWNED"
    _rewrite(src, lambda c: c.update(opt=_Payload(marker)))
    error = _assert_refused(tmp_path, src, reference_checkpoint["kwargs"], UnsafePickleError, "allow-list")
    assert "system" in str(error)
    assert not marker.exists()
    # the command line says the same in one line and exits 2
    kwargs = reference_checkpoint["kwargs"]
    assert (
        main(
            [
                "import",
                "atlas-checkpoint",
                str(src),
                str(tmp_path / "run"),
                "--reader-tokenizer",
                kwargs["reader_tokenizer"],
                "--retriever-tokenizer",
                kwargs["retriever_tokenizer"],
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("atlas import: error: ") and str(src) in err and len(err.splitlines()) == 1
    assert not marker.exists() and not (tmp_path / "run").exists()
