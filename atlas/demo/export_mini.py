"""Export a pretraining run's reader as the shipped `atlas-mini` (fp16 safetensors + model card).

    python -m atlas.demo.export_mini runs/pretrain-mini atlas/demo/atlas-mini --wall-s 2100

The card's figures come from the run itself (config, log, corpus manifest) and from
`demo_mlm_loss`, a closed-book span-corruption loss on the shipped demo encyclopedia that anyone
can recompute from the shipped files (a test does).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def demo_mlm_loss(reader_folder: str | Path, passages: str | Path = HERE / "encyclopedia.jsonl", seed: int = 0,
                  batch_size: int = 16) -> float:
    """Mean token cross-entropy (nats) of T5 span corruption of every passage in `passages`, the
    reader reading the corrupted passage alone (no retrieval), corruption seeded by `seed`.

    Token-weighted over all target tokens, accumulated in float64.
    """
    from reader.fid import IGNORE_INDEX, build_reader
    from reader.tokenizer import build_reader_tokenizer
    from tasks.base import get_task

    tokenizer = build_reader_tokenizer(reader_folder)
    reader = build_reader(str(reader_folder), vocab_size=len(tokenizer))
    reader.eval()
    task = get_task("mlm", seed=seed)
    examples = task.load(passages)
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


def _run_facts(run: Path) -> dict:
    """Steps, batch, final loss and corpus counts of the pretraining run in `run`."""
    from atlas.checkpoint import resolve_checkpoint
    from atlas.config import load_config

    checkpoint = resolve_checkpoint(run)
    config = load_config(checkpoint / "config.yaml")
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    losses = [r["loss/total"] for r in logged if "loss/total" in r]
    corpus = json.loads((Path(config.task.train_data[0]) / "corpus.json").read_text())
    step = int(checkpoint.name.split("-")[-1])
    return {"checkpoint": checkpoint, "config": config, "step": step,
            "final_loss": sum(losses[-5:]) / len(losses[-5:]), "first_loss": losses[0],
            "corpus": {"documents": corpus["stats"]["documents"], "passages": corpus["count"],
                       "words": corpus["stats"]["words"], "sources": [Path(s).name for s in corpus["sources"]]}}


def export(run: str | Path, out: str | Path, *, wall_s: float | None = None) -> dict:
    """Write `out` (replaced atomically): fp16 safetensors T5, the reader tokenizer, README.md, card.json."""
    from transformers import T5ForConditionalGeneration

    from tasks.io import atomic_directory

    facts = _run_facts(Path(run))
    checkpoint, config = facts["checkpoint"], facts["config"]
    model = T5ForConditionalGeneration.from_pretrained(str(checkpoint / "reader"), dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    with atomic_directory(Path(out), overwrite=True) as tmp:
        model.half().save_pretrained(str(tmp), safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (checkpoint / "reader" / name).is_file():
                shutil.copyfile(checkpoint / "reader" / name, tmp / name)
        loss = demo_mlm_loss(tmp)
        t5 = model.config
        card = {
            "architecture": {"type": "T5 (v1.0 layout, ReLU FFN, tied embeddings)", "d_model": t5.d_model,
                             "d_ff": t5.d_ff, "d_kv": t5.d_kv, "num_heads": t5.num_heads,
                             "encoder_layers": t5.num_layers, "decoder_layers": t5.num_decoder_layers,
                             "vocab_size": t5.vocab_size, "parameters": n_params, "dtype": "float16"},
            "pretraining": {"task": config.task.name, "options": config.task.options, "steps": facts["step"],
                            "batch_size": config.training.batch_size, "lr": config.training.lr,
                            "scheduler": config.training.scheduler, "passages_read": config.reader.n_context,
                            "text_maxlength": config.reader.text_maxlength, "retriever": config.retriever.model,
                            "first_loss": round(facts["first_loss"], 4), "final_loss": round(facts["final_loss"], 4),
                            "wall_s": wall_s, "corpus": facts["corpus"]},
            "demo_mlm_loss": {"value": round(loss, 4), "seed": 0, "data": "atlas/demo/encyclopedia.jsonl"},
        }
        (tmp / "card.json").write_text(json.dumps(card, indent=2) + "\n")
        (tmp / "README.md").write_text(model_card(card))
    return card


def model_card(card: dict) -> str:
    """The Markdown model card of `card` (see `export`)."""
    a, p = card["architecture"], card["pretraining"]
    wall = "not recorded" if p["wall_s"] is None else f"{p['wall_s'] / 60:.0f} min"
    return f"""# atlas-mini

A small T5 reader for `atlas`, pretrained here, offline, the Atlas way: retrieval-augmented T5 span
corruption. It exists so that `atlas quickstart` and the CPU recipes have a reader that is not random;
it is far too small to know facts by itself and is meant to be fine-tuned (few-shot) with retrieval.
On GPUs, point the same recipes at `google/t5-base-lm-adapt` and `facebook/contriever` instead.

## Architecture
T5 encoder-decoder, d_model {a['d_model']}, d_ff {a['d_ff']}, {a['num_heads']} heads of {a['d_kv']},
{a['encoder_layers']} encoder + {a['decoder_layers']} decoder layers, {a['parameters'] / 1e6:.1f}M parameters,
stored in {a['dtype']} safetensors. Vocabulary: {a['vocab_size']} tokens = the WordPiece vocabulary of
all-MiniLM-L6-v2 (lower-cased) in T5 layout (`<pad>` 0, `</s>` 1, `<unk>` 2, `<extra_id_0..99>`), so the
reader and the default retriever share one tokenizer. Loads with plain
`transformers.T5ForConditionalGeneration.from_pretrained(folder)` (use `dtype=torch.float32` to train).

## Pretraining
- Task: `{p['task']}` (T5 span corruption, options {json.dumps(p['options'])}); each corrupted passage is read
  together with the top-{p['passages_read']} passages that the frozen `{p['retriever']}` retriever finds,
  the passage itself filtered out (no trivial retrievals). Inputs cut to {p['text_maxlength']} tokens.
- Data: {', '.join(p['corpus']['sources'])}: {p['corpus']['documents']} documents,
  {p['corpus']['passages']} passages of 100 words, {p['corpus']['words']:,} words (WikiText-2 valid+test
  articles and the 820 NaturalQuestions evidence paragraphs of nq824; CC BY-SA).
- Optimisation: {p['steps']} steps of batch {p['batch_size']}, AdamW lr {p['lr']}, {p['scheduler']} schedule.
- Loss (token cross-entropy): {p['first_loss']:.3f} at the first logged step → {p['final_loss']:.3f} (mean of
  the last five logged steps). Wall time: {wall} on a 2-core CPU shared with other jobs, index build included.
- It is a weak model: this much compute (400 small steps) teaches word statistics, not reading.
  Few-shot fine-tuning with retrieval is what makes it answer; see `atlas quickstart`.

## Check figure
Closed-book span-corruption loss on the shipped demo encyclopedia (`atlas/demo/encyclopedia.jsonl`,
corruption seed {card['demo_mlm_loss']['seed']}): **{card['demo_mlm_loss']['value']:.4f}** nats/token.
`tests/test_quickstart.py` recomputes it from these weights with `atlas.demo.export_mini.demo_mlm_loss`.

## Reproduce
```
atlas corpus prepare ../shared/data/wikitext2-articles.jsonl ../shared/data/nq824/documents.jsonl \\
    --out runs/pretrain-mini-corpus
atlas train configs/pretrain-mini.yaml
python -m atlas.demo.export_mini runs/pretrain-mini atlas/demo/atlas-mini
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
