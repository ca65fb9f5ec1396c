"""The paper recipes at their real size on a CPU, with random weights: the memory and time of a training step, and
the GPU memory that projects to.

For each recipe (default: the 16 paper recipes at the top of configs/), the real-size folders are written once per
architecture pair under --work (`atlas.real_size`; docs/guides/real-size.md). Then a child process builds the
recipe's model on them and runs --steps training steps, as the training loop does them: the loop's AdamW and
clipping, bf16 autocast where the recipe says `training.precision: bf16`, and the recipe's retriever loss. Each step
reads B questions with K given passages of WikiText-2 text, long enough to fill the recipe's reader and retriever
lengths. A fresh child per run means its peak RSS (VmHWM) is its own; it is reset before the last step through
/proc/self/clear_refs. The JSON records, per recipe: the parameters (reader; retriever trained and frozen), the
seconds of the last step, the peak RSS, the resident memory before the last step (weights and AdamW state), and the
step's working memory (peak − resident) with its share per passage once the gradients are taken out.

B and K are the recipe's unless --memory-gib would not hold them. Two probe runs at the recipe's B with K = 1 and 2
give the memory per passage; where the recipe's B and K would not fit, the largest K that fits at the recipe's B
(else at B = 1) is run instead. The JSON says which (`recipe_batch_size`, `recipe_passages`, `fit`).
--batch-size and --passages force B and K, and skip the probes.

The GPU projection is computed from the counts, not measured. It gives GiB per GPU at ZeRO stages 0-3 over --gpus
ranks: fp32 weights (4 B), fp32 gradients (4 B) and AdamW's two fp32 moments (8 B) per trainable reader parameter,
partitioned as each stage partitions them. The retriever keeps its own AdamW outside DeepSpeed (16 B per trained
parameter, 4 B per frozen one, on every rank). To that it adds the step's measured working memory per passage × B·K
(activations under the recipe's autocast, measured on the CPU).

    .venv/bin/python bench/real_size.py            # every paper recipe, real size: hours of CPU, 1.4 GB of disk
    .venv/bin/python bench/real_size.py --recipes nq-64shot.yaml --head-dim 4 --layers 1 --pieces 500 \\
        --passages 2 --length 64 --work /tmp/real-size --out /tmp/real-size.json          # smoke test: a minute
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.memory import reset_peak, status_kib  # after the path: the bench runs as a script

CONFIGS = REPO_ROOT / "configs"
SHARED_DATA = Path(os.environ.get("ATLAS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
PAPER_RECIPES = (
    "nq-64shot.yaml",
    "triviaqa-64shot.yaml",
    "fever-64shot.yaml",
    "mmlu-5shot.yaml",
    "mmlu-5shot-multitask.yaml",
    "mmlu-zeroshot.yaml",
    *(f"kilt-{task}.yaml" for task in ("aida", "eli5", "fever", "hotpotqa", "nq", "trex", "triviaqa", "wow", "zsre")),
    "pretrain-mlm.yaml",
)
GIB = 2**30
PROBE_PASSAGES = (1, 2)


def project_gpu_gib(reader: int, retriever_trained: int, retriever_frozen: int, step_bytes: float, gpus: int) -> dict:
    """GiB per GPU at ZeRO stages 0-3 over `gpus` ranks (module docstring): the reader's fp32 weights, gradients and
    AdamW moments partitioned as each stage partitions them (1: the moments; 2: and the gradients; 3: and the
    weights), the retriever whole on every rank, and `step_bytes` of activations (not partitioned)."""
    retriever = 16 * retriever_trained + 4 * retriever_frozen
    projection = {}
    for stage in range(4):
        weights, gradients, moments = 4 * reader, 4 * reader, 8 * reader
        moments /= gpus if stage >= 1 else 1
        gradients /= gpus if stage >= 2 else 1
        weights /= gpus if stage >= 3 else 1
        projection[f"zero{stage}"] = round((weights + gradients + moments + retriever + step_bytes) / GIB, 2)
    return projection


def synthetic_examples(paragraphs: list[str], batch: int, passages: int, words: int):
    """B examples, each with K passages of at least `words` words of real text, a query with `<extra_id_0>` and a
    three-word target."""
    from tasks.base import Example

    examples, cursor = [], 0

    def next_text() -> str:
        nonlocal cursor
        text = []
        while len(text) < words:
            text += paragraphs[cursor % len(paragraphs)].split()
            cursor += 1
        return " ".join(text)

    for b in range(batch):
        question = " ".join(next_text().split()[:12])
        given = [{"id": f"p{b}-{k}", "title": "", "text": next_text()} for k in range(passages)]
        query = f"question: {question}? answer: <extra_id_0>"
        examples.append(Example(id=str(b), query=query, target=None, answers=["a b c"], passages=given))
    return examples, ["<extra_id_0> a b c"] * batch


def run_steps(job: dict) -> dict:
    """In the child: build the recipe's model on the folders and run `job["steps"]` training steps; → the record."""
    import torch

    from atlas.assembly import build_model
    from atlas.config import load_config
    from atlas.real_size import training_paragraphs
    from atlas.training.loop import make_optimizers

    batch, passages, length = job["batch"], job["passages"], job["length"]
    sizes = [f"reader.n_context={passages}", f"retriever.n_context={passages}", f"training.batch_size={batch}"]
    if length is not None:
        sizes.append(f"reader.text_maxlength={length}")
    config = load_config(job["recipe"], [*job["overrides"], *sizes], check_data=False)
    model = build_model(config)
    model.train()
    optimizers = make_optimizers(model, config)
    words = max(config.reader.text_maxlength, config.retriever.passage_maxlength)  # ≥ 1 token a word: full inputs
    paragraphs = training_paragraphs(SHARED_DATA / "wikitext-2" / "valid.txt")
    examples, targets = synthetic_examples(paragraphs, batch, passages, words)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.training.precision == "bf16")
    trained = [p for p in model.parameters() if p.requires_grad]
    seconds, resident, reset = [], None, False
    for step in range(job["steps"]):
        if step == job["steps"] - 1:
            reset = reset_peak()
            resident = status_kib("VmRSS")
        start = time.perf_counter()
        with autocast:
            parts = model.losses(examples, targets)
        parts["total"].backward()
        for optimizer, _ in optimizers.stepped_by_loop(deepspeed=False):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, config.training.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
    peak = status_kib("VmHWM")
    retriever = model.retriever
    frozen = [] if retriever.tied else [p for p in retriever.passage_encoder.parameters() if not p.requires_grad]
    gradient_bytes = 4 * sum(p.numel() for p in trained)
    step_bytes = None if peak is None or resident is None or not reset else (peak - resident) * 1024
    return {
        "batch_size": batch,
        "passages": passages,
        "reader_length": config.reader.text_maxlength,
        "retriever_length": config.retriever.passage_maxlength,
        "precision": config.training.precision,
        "gradient_checkpointing": config.reader.gradient_checkpointing,
        "parameters": {
            "reader": sum(p.numel() for p in model.reader.parameters()),
            "retriever_trained": sum(p.numel() for p in retriever.parameters() if p.requires_grad),
            "retriever_frozen": sum(p.numel() for p in frozen),
        },
        "seconds_per_step": [round(s, 2) for s in seconds],
        "peak_rss_gib": None if peak is None else round(peak / 2**20, 3),
        "resident_before_step_gib": None if resident is None else round(resident / 2**20, 3),
        "step_memory_gib": None if step_bytes is None else round(step_bytes / GIB, 3),
        "step_memory_per_passage_mib": (
            None if step_bytes is None else round(max(0.0, step_bytes - gradient_bytes) / (batch * passages) / 2**20, 2)
        ),
        "losses": {name: round(value.item(), 4) for name, value in parts.items()},
    }


def child(job: dict) -> dict:
    """`run_steps(job)` in a fresh process (its peak RSS its own)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)]
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the child run {job} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def choose_sizes(job: dict, config, memory_gib: float) -> tuple[int, int, dict | None]:
    """(B, K) to run: the recipe's if they fit `memory_gib`, else the largest K that fits at the recipe's B, else
    B = 1 and the largest K then; → (B, K, the probes' record). Two probe runs at the recipe's B (K = 1 and 2) give
    the memory: the resident weights and AdamW state, plus fp32 gradients, plus per passage the larger of the two
    runs' difference and the K = 2 run's own share (which carries the fixed part of a step: conservative)."""
    batch, passages = config.training.batch_size, config.reader.n_context
    probes = [child({**job, "batch": batch, "passages": k, "steps": 2}) for k in PROBE_PASSAGES]
    if any(p["step_memory_gib"] is None for p in probes):
        return batch, passages, {"probes": probes, "note": "no peak RSS reset on this system: the recipe's B, K"}
    difference = (probes[1]["step_memory_gib"] - probes[0]["step_memory_gib"]) / (batch * (PROBE_PASSAGES[1] - 1))
    per_passage = max(difference, probes[1]["step_memory_per_passage_mib"] / 1024)
    counts = probes[0]["parameters"]
    gradients = 4 * (counts["reader"] + counts["retriever_trained"]) / GIB
    fixed = max(p["resident_before_step_gib"] for p in probes) + gradients
    record = {"probes": probes, "per_passage_gib": round(per_passage, 4), "fixed_gib": round(fixed, 3)}

    def fits(b: int) -> int:
        return int((memory_gib - fixed) / (b * per_passage)) if per_passage > 0 else passages

    if fits(batch) >= 1:
        return batch, min(passages, fits(batch)), record
    return 1, max(1, min(passages, fits(1))), record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=list(PAPER_RECIPES), help="recipe files under configs/")
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "real-size", help="the real-size folders")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "cpu" / "real-size.json")
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (the last is timed)")
    parser.add_argument("--head-dim", type=int, help="narrower models (tests): heads of this size (published 64)")
    parser.add_argument("--layers", type=int, help="shallower models (tests): layers of each stack")
    parser.add_argument("--pieces", type=int, help="the reader tokenizer's pieces (default: T5's 32,000)")
    parser.add_argument("--batch-size", type=int, help="B of every run (default: the recipe's, if it fits)")
    parser.add_argument("--passages", type=int, help="K of every run (default: the recipe's, if it fits)")
    parser.add_argument("--length", type=int, help="the reader's tokens per passage (default: the recipe's)")
    parser.add_argument("--memory-gib", type=float, default=20.0, help="what a run may use, for choosing B and K")
    parser.add_argument("--gpus", type=int, default=8, help="ranks of the ZeRO projection")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_steps(json.loads(args.child))))
        return 0

    from atlas.config import load_config
    from atlas.quiet import quiet_libraries
    from atlas.real_size import RealSizeFolders, training_paragraphs, write_real_size
    from reader.tokenizer import T5_PIECES

    texts = [
        paragraph
        for name in ("wikitext-2/valid.txt", "wikitext-2/test.txt", "squad/train-v1.1.json")
        for paragraph in training_paragraphs(SHARED_DATA / name)
    ]
    started, results, written = time.perf_counter(), {}, {}
    for name in args.recipes:
        config = load_config(CONFIGS / name, check_data=False)
        pair = (config.reader.model, config.retriever.model)
        if pair not in written:  # written once per architecture pair and size, and kept for the next run
            narrowed = "".join(
                f"-{k}{v}" for k, v in (("h", args.head_dim), ("l", args.layers), ("p", args.pieces)) if v
            )
            folder = args.work / f"{pair[0].split('/')[-1]}-{pair[1].split('/')[-1]}{narrowed}"
            folders = RealSizeFolders(reader=folder / "reader", retriever=folder / "retriever")
            if not (folders.reader.is_dir() and folders.retriever.is_dir()):
                pieces = args.pieces or T5_PIECES
                with quiet_libraries(False):  # transformers' shard-writing bars are not the bench's output
                    write_real_size(
                        config, folder, texts=texts, head_dim=args.head_dim, layers=args.layers, pieces=pieces
                    )
            written[pair] = folders.overrides()
        job = {"recipe": str(CONFIGS / name), "overrides": written[pair], "length": args.length, "steps": args.steps}
        fit = None
        if args.batch_size is not None or args.passages is not None:
            batch = args.batch_size or config.training.batch_size
            passages = args.passages or config.reader.n_context
        else:
            batch, passages, fit = choose_sizes(job, config, args.memory_gib)
        record = child({**job, "batch": batch, "passages": passages})
        record["recipe_batch_size"], record["recipe_passages"] = config.training.batch_size, config.reader.n_context
        if fit is not None:
            record["fit"] = fit
        if record["step_memory_per_passage_mib"] is not None:
            counts = record["parameters"]
            step_bytes = record["step_memory_per_passage_mib"] * 2**20 * batch * passages
            record[f"gpu_gib_{args.gpus}_ranks"] = project_gpu_gib(
                counts["reader"], counts["retriever_trained"], counts["retriever_frozen"], step_bytes, args.gpus
            )
        results[name] = record
        print(name, json.dumps(record), flush=True)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    report = {
        "command": shlex.join(["python", "bench/real_size.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPU cores, {memory / GIB:.0f} GiB ({platform.machine()})",
        "wall_s": round(time.perf_counter() - started, 1),
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out", "work")},
        "recipes": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
