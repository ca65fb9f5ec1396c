"""Export a pretraining run's reader as the shipped `atlas-mini` (fp16 safetensors + model card).

    python -m atlas.demo.export_mini runs/pretrain-mini-fid atlas/demo/atlas-mini --wall-s 1500

The card's figures come from the runs themselves (config, log, corpus manifest) — a run that
continued from an exported reader (its `reader.model` folder has a `card.json`) inherits that
card's stages — and from two check figures that anyone can recompute from the shipped files (a
test does): `demo_mlm_loss`, a closed-book span-corruption loss on the shipped demo encyclopedia,
and `demo_reading`, exact match on the demo's held-out questions with the gold passage given and
no fine-tuning.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
from pathlib import Path

import torch

from atlas.demo.export_reader import demo_reading_em  # one definition, shared

HERE = Path(__file__).resolve().parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TASK_DESCRIPTIONS = {
    "mlm": "T5 span corruption, each corrupted passage read with the top passages the frozen retriever finds",
    "ssm": "salient span masking asked as questions (REALM): a wh-word and the words around an entity, date, "
           "number or noun phrase of one sentence → the span, read from the top passages the frozen "
           "retriever finds for that query",
}


def _load(reader_folder: str | Path):
    from reader.fid import build_reader
    from reader.tokenizer import build_reader_tokenizer

    tokenizer = build_reader_tokenizer(reader_folder)
    reader = build_reader(str(reader_folder), vocab_size=len(tokenizer))
    reader.eval()
    return reader, tokenizer


def demo_mlm_loss(reader_folder: str | Path, passages: str | Path = HERE / "encyclopedia.jsonl", seed: int = 0,
                  batch_size: int = 16) -> float:
    """Mean token cross-entropy (nats) of T5 span corruption of every passage in `passages`, the
    reader reading the corrupted passage alone (no retrieval), corruption seeded by `seed`.

    Token-weighted over all target tokens, accumulated in float64.
    """
    from reader.fid import IGNORE_INDEX
    from tasks.base import get_task

    reader, tokenizer = _load(reader_folder)
    examples = get_task("mlm", seed=seed).load(passages)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = examples[start : start + batch_size]
            inputs = tokenizer([e.query for e in batch], padding="longest", truncation=True, max_length=256,
                               return_tensors="pt")
            targets = tokenizer([e.target for e in batch], padding="longest", return_tensors="pt")
            labels = targets["input_ids"].masked_fill(targets["attention_mask"] == 0, IGNORE_INDEX)  # (B, T)
            logits = reader(inputs["input_ids"][:, None], inputs["attention_mask"][:, None], labels=labels).logits
            log_probs = logits.double().log_softmax(-1)  # (B, T, V)
            mask = labels != IGNORE_INDEX
            picked = log_probs.gather(-1, labels.clamp(min=0)[..., None])[..., 0]  # (B, T)
            total -= picked[mask].sum().item()
            count += int(mask.sum())
    return total / count


def _run_facts(run: Path, wall_s: float | None) -> list[dict]:
    """The pretraining stages behind the run in `run`: the stages of the exported reader it started
    from (its `card.json`), then this run's own (task, steps, batch, losses, corpus, wall time)."""
    from atlas.config import load_config
    from atlas.training.checkpoint import resolve_checkpoint

    checkpoint = resolve_checkpoint(run)
    config = load_config(checkpoint / "config.yaml")
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    losses = [r["loss/total"] for r in logged if "loss/total" in r]
    corpus = json.loads((Path(config.task.train_data[0]) / "corpus.json").read_text())
    earlier = []
    start_card = Path(config.reader.model) / "card.json"
    if start_card.is_file():
        earlier = json.loads(start_card.read_text())["pretraining"]
    stage = {"task": config.task.name, "options": config.task.options, "steps": int(checkpoint.name.split("-")[-1]),
             "batch_size": config.training.batch_size, "lr": config.training.lr,
             "scheduler": config.training.scheduler, "warmup_steps": config.training.warmup_steps,
             "passages_read": config.reader.n_context, "text_maxlength": config.reader.text_maxlength,
             "retriever": config.retriever.model,
             "start": "previous stage" if earlier else
                      f"random init, token embeddings from {config.reader.init_embeddings}" if config.reader.init_embeddings
                      else "random init",
             "first_loss": round(losses[0], 4), "final_loss": round(sum(losses[-5:]) / len(losses[-5:]), 4),
             "wall_s": wall_s,
             "corpus": {"documents": corpus["stats"]["documents"], "passages": corpus["count"],
                        "words": corpus["stats"]["words"], "sources": [Path(s).name for s in corpus["sources"]]}}
    return [*earlier, stage]


def export(run: str | Path, out: str | Path, *, wall_s: float | None = None) -> dict:
    """Write `out` (replaced atomically): fp16 safetensors T5, the reader tokenizer, README.md, card.json."""
    from transformers import T5ForConditionalGeneration

    from atlas.training.checkpoint import resolve_checkpoint
    from tasks.io import atomic_directory

    stages = _run_facts(Path(run), wall_s)
    checkpoint = resolve_checkpoint(run)
    model = T5ForConditionalGeneration.from_pretrained(str(checkpoint / "reader"), dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    with atomic_directory(Path(out), overwrite=True) as tmp:
        model.half().save_pretrained(str(tmp), safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (checkpoint / "reader" / name).is_file():
                shutil.copyfile(checkpoint / "reader" / name, tmp / name)
        # a saved fast tokenizer keeps the truncation/padding of its last call; ship it without
        fast = json.loads((tmp / "tokenizer.json").read_text())
        fast["truncation"] = fast["padding"] = None
        (tmp / "tokenizer.json").write_text(json.dumps(fast, ensure_ascii=False, indent=2) + "\n")
        t5 = model.config
        card = {
            "architecture": {"type": "T5 (v1.0 layout, ReLU FFN, tied embeddings)", "d_model": t5.d_model,
                             "d_ff": t5.d_ff, "d_kv": t5.d_kv, "num_heads": t5.num_heads,
                             "encoder_layers": t5.num_layers, "decoder_layers": t5.num_decoder_layers,
                             "vocab_size": t5.vocab_size, "parameters": n_params, "dtype": "float16"},
            "pretraining": stages,
            "demo_mlm_loss": {"value": round(demo_mlm_loss(tmp), 4), "seed": 0,
                              "data": "atlas/demo/encyclopedia.jsonl"},
            "demo_reading": {"exact_match": round(demo_reading_em(tmp), 4), "data": "atlas/demo/heldout.jsonl",
                             "passages": "the gold passage alone", "fine_tuned": False},
        }
        (tmp / "card.json").write_text(json.dumps(card, indent=2) + "\n")
        (tmp / "README.md").write_text(model_card(card))
    return card


def _stage_lines(number: int, p: dict) -> str:
    wall = "not recorded" if p["wall_s"] is None else f"{p['wall_s'] / 60:.0f} min"
    return f"""{number}. `{p['task']}` — {TASK_DESCRIPTIONS.get(p['task'], p['task'])}; options {json.dumps(p['options'])}.
   Top-{p['passages_read']} passages of the frozen `{p['retriever']}` retriever, inputs cut to {p['text_maxlength']} tokens;
   from {p['start']}; {p['steps']} steps of batch {p['batch_size']}, AdamW lr {p['lr']}, {p['warmup_steps']} warm-up
   steps, {p['scheduler']} schedule. Loss (token cross-entropy) {p['first_loss']:.3f} at the first logged step →
   {p['final_loss']:.3f} (mean of the last five logged steps). Wall time: {wall} on the 2-core CPU.
"""


def model_card(card: dict) -> str:
    """The Markdown model card of `card` (see `export`)."""
    a, stages = card["architecture"], card["pretraining"]
    corpus = stages[-1]["corpus"]
    reading = card["demo_reading"]["exact_match"]
    # the card says what the weights do, measured, not what the recipe hopes for
    skill = (f"With the gold passage given and no fine-tuning it answers {100 * reading:.1f}% of the demo's held-out "
             "questions exactly (check figures below)." if reading > 0 else
             "At this size and this much CPU pretraining it has **not yet learned to copy**: with the gold "
             "passage given and no fine-tuning it answers none of the demo's held-out questions exactly.")
    if len(stages) > 1:
        reproduce = """atlas train configs/pretrain-mini.yaml                                   # stage 1: one passage
python -m atlas.demo.export_mini runs/pretrain-mini runs/atlas-mini-stage1
atlas train configs/pretrain-mini-fid.yaml                               # stage 2: four passages
python -m atlas.demo.export_mini runs/pretrain-mini-fid atlas/demo/atlas-mini --wall-s SECONDS"""
    else:
        reproduce = """atlas train configs/pretrain-mini.yaml
python -m atlas.demo.export_mini runs/pretrain-mini atlas/demo/atlas-mini --wall-s SECONDS"""
    return f"""# atlas-mini

A small T5 reader for `atlas`, pretrained here, offline, with a retrieval-augmented pretext task:
REALM's salient span masking asked as questions, meant to teach it to find a sentence among retrieved
passages and copy the answer out of it. {skill} It exists so that `atlas quickstart` and the CPU
recipes run offline end to end; it is far too small to know many facts by itself and is meant to be
fine-tuned (few-shot) with retrieval. For meaningful answers, point the same recipes at
`google/t5-base-lm-adapt` and `facebook/contriever` on a GPU.

## Architecture
T5 encoder-decoder, d_model {a['d_model']}, d_ff {a['d_ff']}, {a['num_heads']} heads of {a['d_kv']},
{a['encoder_layers']} encoder + {a['decoder_layers']} decoder layers, {a['parameters'] / 1e6:.1f}M parameters,
stored in {a['dtype']} safetensors. Vocabulary: {a['vocab_size']} tokens = the WordPiece vocabulary of
all-MiniLM-L6-v2 (lower-cased) in T5 layout (`<pad>` 0, `</s>` 1, `<unk>` 2, `<extra_id_0..99>`), so the
reader and the default retriever share one tokenizer. Loads with plain
`transformers.T5ForConditionalGeneration.from_pretrained(folder)` (use `dtype=torch.float32` to train).

## Pretraining
Data: {', '.join(corpus['sources'])}: {corpus['documents']} documents, {corpus['passages']} passages of 100
words, {corpus['words']:,} words (WikiText-2 valid+test articles and the 820 NaturalQuestions evidence
paragraphs of nq824; CC BY-SA). No question of any benchmark is trained on. Stages:

{"".join(_stage_lines(i + 1, p) for i, p in enumerate(stages))}
## Check figures
- Closed-book span-corruption loss on the shipped demo encyclopedia (`atlas/demo/encyclopedia.jsonl`,
  corruption seed {card['demo_mlm_loss']['seed']}): **{card['demo_mlm_loss']['value']:.4f}** nats/token.
- Reading without fine-tuning: exact match **{100 * card['demo_reading']['exact_match']:.1f}%** on the demo's
  held-out questions (`atlas/demo/heldout.jsonl`, made-up facts) with the gold passage given.

`tests/test_quickstart.py` recomputes both from these weights (`atlas.demo.export_mini`).

## Reproduce
```
pip install -e '.[pretrain]'          # spaCy tags the salient spans
atlas corpus prepare ../shared/data/wikitext2-articles.jsonl ../shared/data/nq824/documents.jsonl \\
    --out runs/pretrain-mini-corpus
atlas index build --corpus runs/pretrain-mini-corpus --encoder minilm --out runs/pretrain-mini-index
{reproduce}
```
"""


def main(argv: list[str] | None = None) -> int:
    """Command line: RUN OUT [--wall-s SECONDS]."""
    parser = argparse.ArgumentParser(description="export a pretraining run as atlas-mini")
    parser.add_argument("run")
    parser.add_argument("out")
    parser.add_argument("--wall-s", type=float, default=None, help="wall time of the pretraining run")
    args = parser.parse_args(argv)
    card = export(args.run, args.out, wall_s=args.wall_s)
    print(json.dumps(card, indent=2))
    return 0 if math.isfinite(card["demo_mlm_loss"]["value"]) else 1


if __name__ == "__main__":
    random.seed(0)
    raise SystemExit(main())
