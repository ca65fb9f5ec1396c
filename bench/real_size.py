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
--batch-size sets the B of the probes and the run (a recipe whose own B would not fit even at K = 1: pretrain-mlm's
64, a T5-large reader's 8); --passages sets K and skips the probes.

Recipes of one shape (`shape_of`: the same models, B, K, lengths, precision, loss; they differ in their data) are
measured once. The JSON is written after each recipe, and a run started again keeps the recipes already measured
with the same settings: a killed run resumes, and a recipe run alone with other settings joins the file.

The GPU projection is computed from the counts, not measured. It gives GiB per GPU at ZeRO stages 0-3 over --gpus
ranks: fp32 weights (4 B), fp32 gradients (4 B) and AdamW's two fp32 moments (8 B) per trainable reader parameter,
partitioned as each stage partitions them. The retriever keeps its own AdamW outside DeepSpeed (16 B per trained
parameter, 4 B per frozen one, on every rank). To that it adds the step's memory per passage read × the recipe's
B·K: the slope of the peak RSS between the narrowest and the widest run measured (activations under the recipe's
autocast, on the CPU). `gpu_plan` then says, per GPU size, the first way the recipe fits, and the results page's
table (--page) is written from the JSON files.

    .venv/bin/python bench/real_size.py            # every paper recipe, real size: hours of CPU, 1.4 GB of disk
    .venv/bin/python bench/real_size.py --recipes pretrain-mlm.yaml --batch-size 8
    .venv/bin/python bench/real_size.py --recipes nq-64shot.yaml --reader google/t5-large-lm-adapt --batch-size 1 \
        --out bench/results/cpu/real-size-large.json
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
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "cpu" / "real-size.json"


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


def shape_of(config) -> dict:
    """What a step's memory and time depend on: recipes of one shape are measured once (the others point to it)."""
    reader, retriever, training = config.reader, config.retriever, config.training
    return {
        "reader": reader.model,
        "retriever": retriever.model,
        "batch_size": training.batch_size,
        "passages": reader.n_context,
        "reader_length": reader.text_maxlength,
        "answer_length": reader.answer_maxlength,
        "retriever_length": retriever.passage_maxlength,
        "query_length": retriever.query_maxlength,
        "precision": training.precision,
        "gradient_checkpointing": reader.gradient_checkpointing,
        "loss": retriever.loss.name,
        "tied": retriever.tied,
        "train_passage_encoder": retriever.train_passage_encoder,
        "trains": training.steps > 0,
    }


def memory_per_passage_gib(record: dict) -> float | None:
    """GiB of a step's memory per passage read: the slope of the peak RSS between the K = 1 probe and the widest run
    measured (the recipe's run where K > 2, else the K = 2 probe); the step's own share where no probes ran."""
    fit = record.get("fit") or {}
    probes = [p for p in fit.get("probes", []) if p.get("peak_rss_gib") is not None]
    runs = sorted([*probes, record], key=lambda r: r["batch_size"] * r["passages"])
    if len(probes) == len(fit.get("probes", [])) >= 1 and record.get("peak_rss_gib") is not None:
        low, high = runs[0], runs[-1]
        passages = high["batch_size"] * high["passages"] - low["batch_size"] * low["passages"]
        if passages > 0:
            return max(0.0, (high["peak_rss_gib"] - low["peak_rss_gib"]) / passages)
    share = record.get("step_memory_per_passage_mib")
    return None if share is None else share / 1024


# the GPU sizes the results page plans for (GB as sold, in GiB), and what is kept free of them (CUDA context,
# allocator fragmentation)
GPU_SIZES_GB = (24, 40, 80)
GPU_HEADROOM = 0.9


def gpu_plan(record: dict, gpus: int) -> dict:
    """Per GPU size, the first way the recipe's step fits (projected, module docstring): as written on one GPU, under
    ZeRO-2 over `gpus`, or with B split into accumulation steps (the largest divisor of B that fits, the same global
    batch) on one GPU; None where even one question a step does not fit.
    → {"per_passage_gib", "one_gpu_gib", "zero2_<gpus>_gpus_gib", "<size>GB": plan}"""
    per_passage = memory_per_passage_gib(record)
    if per_passage is None or record.get("run") != "training step":
        return {}
    counts = record["parameters"]
    batch, passages = record["recipe_batch_size"], record["recipe_passages"]

    def projected(b: int, ranks: int) -> dict:
        step_bytes = per_passage * GIB * b * passages
        return project_gpu_gib(
            counts["reader"], counts["retriever_trained"], counts["retriever_frozen"], step_bytes, ranks
        )

    plan = {
        "per_passage_gib": round(per_passage, 4),
        "one_gpu_gib": projected(batch, 1)["zero0"],
        f"zero2_{gpus}_gpus_gib": projected(batch, gpus)["zero2"],
    }
    for size in GPU_SIZES_GB:
        room = size * 1e9 / GIB * GPU_HEADROOM
        if projected(batch, 1)["zero0"] <= room:
            plan[f"{size}GB"] = "as written"
        elif projected(batch, gpus)["zero2"] <= room:
            plan[f"{size}GB"] = f"ZeRO-2 over {gpus} GPUs"
        else:
            smaller = [b for b in range(batch - 1, 0, -1) if batch % b == 0]  # B/2, B/4, …: the same global batch
            splits = [b for b in smaller if projected(b, 1)["zero0"] <= room]
            if splits:
                b = splits[0]
                plan[f"{size}GB"] = f"training.batch_size={b} training.accumulation_steps={batch // b}"
            else:
                plan[f"{size}GB"] = None
    return plan


def synthetic_examples(paragraphs: list[str], batch: int, passages: int, words: int, answer_words: int = 3):
    """B examples, each with K passages of at least `words` words of real text, a query with `<extra_id_0>` and a
    target of `answer_words` words (the recipe's answer length: a long-answer task's decoder runs at its length)."""
    from tasks.base import Example

    examples, cursor = [], 0

    def next_text(count: int = words) -> str:
        nonlocal cursor
        text = []
        while len(text) < count:
            text += paragraphs[cursor % len(paragraphs)].split()
            cursor += 1
        return " ".join(text)

    targets = []
    for b in range(batch):
        question = " ".join(next_text().split()[:12])
        given = [{"id": f"p{b}-{k}", "title": "", "text": next_text()} for k in range(passages)]
        query = f"question: {question}? answer: <extra_id_0>"
        answer = " ".join(next_text(answer_words).split()[:answer_words])
        examples.append(Example(id=str(b), query=query, target=None, answers=[answer], passages=given))
        targets.append(f"<extra_id_0> {answer}")
    return examples, targets


def run_steps(job: dict) -> dict:
    """In the child: build the recipe's model on the folders and run `job["steps"]` training steps (evaluation
    batches for a recipe without training); → the record."""
    from atlas.assembly import build_model
    from atlas.config import load_config
    from atlas.real_size import training_paragraphs

    batch, passages, length = job["batch"], job["passages"], job["length"]
    sizes = [f"reader.n_context={passages}", f"retriever.n_context={passages}", f"training.batch_size={batch}"]
    if length is not None:
        sizes.append(f"reader.text_maxlength={length}")
    config = load_config(job["recipe"], [*job["overrides"], *sizes], check_data=False)
    model = build_model(config)
    trains = config.training.steps > 0
    words = max(config.reader.text_maxlength, config.retriever.passage_maxlength)  # ≥ 1 token a word: full inputs
    paragraphs = training_paragraphs(SHARED_DATA / "wikitext-2" / "valid.txt")
    examples, targets = synthetic_examples(paragraphs, batch, passages, words, config.reader.answer_maxlength)
    trained = [p for p in model.parameters() if p.requires_grad] if trains else []
    seconds, resident, reset, parts = [], None, False, {}
    step = training_step(model, config, examples, targets) if trains else evaluation_batch(model, config, examples)
    for number in range(job["steps"]):
        if number == job["steps"] - 1:
            reset = reset_peak()
            resident = status_kib("VmRSS")
        start = time.perf_counter()
        parts = step()
        seconds.append(time.perf_counter() - start)
    peak = status_kib("VmHWM")
    retriever = model.retriever
    frozen = [] if retriever.tied else [p for p in retriever.passage_encoder.parameters() if not p.requires_grad]
    gradient_bytes = 4 * sum(p.numel() for p in trained)
    step_bytes = None if peak is None or resident is None or not reset else (peak - resident) * 1024
    return {
        "run": "training step" if trains else "evaluation batch",
        "batch_size": batch,
        "passages": passages,
        "answer_length": config.reader.answer_maxlength,
        "reader_length": config.reader.text_maxlength,
        "retriever_length": config.retriever.passage_maxlength,
        "precision": config.training.precision if trains else config.inference.precision,
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


def training_step(model, config, examples, targets):
    """→ one training step as the loop takes it: the recipe's losses (bf16 autocast where it says so), backward, the
    loop's clipping and AdamW; the step returns the losses."""
    import torch

    from atlas.training.loop import make_optimizers

    model.train()
    optimizers = make_optimizers(model, config)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.training.precision == "bf16")

    def step() -> dict:
        with autocast:
            parts = model.losses(examples, targets)
        parts["total"].backward()
        for optimizer, _ in optimizers.stepped_by_loop(deepspeed=False):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, config.training.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return parts

    return step


def evaluation_batch(model, config, examples):
    """→ one evaluation batch of a recipe without training (zero-shot MMLU): each of the B questions scored as
    `atlas.evaluate.predict_multiple_choice` scores it, four options under the task's cyclic presentations (4 reader
    passes of K passages, one question at a time); the step returns the mean option log-probability."""
    import torch

    letters = ["A", "B", "C", "D"]
    model.eval()

    @torch.no_grad()
    def step() -> dict:
        total = torch.zeros(())
        for example in examples:
            shown = [example] * len(letters)  # the cyclic presentations: one reading each, same length
            logits = model.option_logits(shown, letters, [example.passages] * len(shown))  # (4, 4)
            total += logits.float().log_softmax(-1).mean()
        return {"total": total / len(examples)}

    return step


def child(job: dict) -> dict:
    """`run_steps(job)` in a fresh process (its peak RSS its own)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)]
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the child run {job} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def choose_sizes(job: dict, batch: int, passages: int, memory_gib: float) -> tuple[int, int, dict | None]:
    """(B, K) to run: `batch` and `passages` (the recipe's) if they fit `memory_gib`, else the largest K that fits at
    that B, else B = 1 and the largest K then; → (B, K, the probes' record). Two probe runs at that B (K = 1 and 2)
    give the memory: the resident weights and AdamW state, plus fp32 gradients, plus per passage the larger of the
    two runs' difference and the K = 2 run's own share (which carries the fixed part of a step: conservative)."""
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
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (the last is timed)")
    parser.add_argument("--head-dim", type=int, help="narrower models (tests): heads of this size (published 64)")
    parser.add_argument("--layers", type=int, help="shallower models (tests): layers of each stack")
    parser.add_argument("--pieces", type=int, help="the reader tokenizer's pieces (default: T5's 32,000)")
    parser.add_argument("--batch-size", type=int, help="B of every run (default: the recipe's, if it fits)")
    parser.add_argument(
        "--passages", type=int, help="K of every run, with no probes (default: the recipe's, if it fits)"
    )
    parser.add_argument("--reader", help="a larger reader than the recipe's (google/t5-large-lm-adapt, …)")
    parser.add_argument("--length", type=int, help="the reader's tokens per passage (default: the recipe's)")
    parser.add_argument("--memory-gib", type=float, default=20.0, help="what a run may use, for choosing B and K")
    parser.add_argument("--gpus", type=int, default=8, help="ranks of the ZeRO projection")
    parser.add_argument(
        "--page",
        type=Path,
        help="the results page whose table is written from --out and the other real-size*.json beside it "
        "(default: docs/results/real-size.md when --out is the default)",
    )
    parser.add_argument("--page-only", action="store_true", help="write the page's table from the JSON; run nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.page is None and args.out.resolve() == DEFAULT_OUT:
        args.page = REPO_ROOT / "docs" / "results" / "real-size.md"
    if args.child:
        print(json.dumps(run_steps(json.loads(args.child))))
        return 0
    if args.page_only:
        if args.page is None:
            parser.error("--page-only needs --page (or the default --out)")
        write_page(args.page, page_reports(args.out), args.gpus)
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
    # what a record's figures depend on (the memory budget only chose its B and K, which it records)
    measuring = ("steps", "head_dim", "layers", "pieces", "batch_size", "passages", "length")
    run_settings = {k: getattr(args, k) for k in measuring}
    # a run killed part way resumes: recipes measured with these settings are kept, the others measured again; the
    # file keeps every recipe, each with the command that measured it
    results = json.loads(args.out.read_text())["recipes"] if args.out.is_file() else {}
    command = shlex.join(["python", "bench/real_size.py", *(argv if argv is not None else sys.argv[1:])])
    started, written = time.perf_counter(), {}
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for name in args.recipes:
        overrides = [f"reader.model={args.reader}"] if args.reader else []
        config = load_config(CONFIGS / name, overrides, check_data=False)
        label = name if not args.reader else f"{name} with {args.reader.split('/')[-1]}"
        shape = shape_of(config)
        if results.get(label, {}).get("run_settings") == run_settings:
            print(label, "kept from", args.out, flush=True)
            continue
        results.pop(label, None)
        measured = next(
            (
                other
                for other, r in results.items()
                if r.get("shape") == shape and "same_shape_as" not in r and r.get("run_settings") == run_settings
            ),
            None,
        )
        if measured is not None:  # one shape, one measurement: a step of it costs the same whatever the task
            results[label] = {"same_shape_as": measured, "shape": shape, "run_settings": run_settings}
            print(label, "has the shape of", measured, flush=True)
            write_report(args, argv, results, started, memory)
            continue
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
        batch = args.batch_size or config.training.batch_size
        passages = args.passages or config.reader.n_context
        fit = None
        if args.passages is None:
            batch, passages, fit = choose_sizes(job, batch, passages, args.memory_gib)
        record = child({**job, "batch": batch, "passages": passages})
        record["recipe_batch_size"], record["recipe_passages"] = config.training.batch_size, config.reader.n_context
        record["reader_model"], record["shape"], record["run_settings"] = config.reader.model, shape, run_settings
        record["command"] = command
        record["load_average"] = [round(x, 2) for x in os.getloadavg()]  # what else ran on the cores
        if fit is not None:
            record["fit"] = fit
        if record["run"] == "training step":
            record["gpu_plan"] = gpu_plan(record, args.gpus)
        results[label] = record
        print(label, json.dumps(record), flush=True)
        write_report(args, argv, results, started, memory)
    write_report(args, argv, results, started, memory)
    if args.page is not None:
        write_page(args.page, page_reports(args.out), args.gpus)
    return 0


def page_reports(out: Path) -> list[dict]:
    """The reports the page shows: `out` first, then every other real-size*.json beside it."""
    files = [
        out,
        *sorted(p for p in out.parent.glob("real-size*.json") if p != out and p.name != "real-size-checkpoint.json"),
    ]
    return [json.loads(p.read_text()) for p in files if p.is_file()]


PAGE_START, PAGE_END = "<!-- bench/real_size.py writes the table below -->", "<!-- end of the table -->"


def page_table(reports: list[dict], gpus: int) -> str:
    """The results page's table: one row per measured shape (the recipes sharing it named), its run, and the GPU
    plan of its recipe as written (`gpu_plan`)."""
    columns = [
        "recipes",
        "reader",
        "parameters: reader; retriever trained + frozen",
        "run: B × K (recipe's)",
        "tokens: reader / answer / retriever",
        "seconds",
        "peak RSS",
        f"GPU GiB as written: one / ZeRO-2 over {gpus} (projected)",
        *(f"{size} GB GPU" for size in GPU_SIZES_GB),
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for report in reports:
        recipes = report["recipes"]
        for label, record in recipes.items():
            if "same_shape_as" in record:
                continue
            sharing = [label, *(other for other, r in recipes.items() if r.get("same_shape_as") == label)]
            counts = {k: f"{v / 1e6:.1f}M" for k, v in record["parameters"].items()}
            plan = gpu_plan(record, gpus)
            kind = "training" if record["run"] == "training step" else "evaluation"
            run = f"{kind} {record['batch_size']} × {record['passages']}"
            recipe_size = f"({record['recipe_batch_size']} × {record['recipe_passages']})"
            lengths = [record["reader_length"], record["answer_length"], record["retriever_length"]]
            if plan:
                memory = f"{plan['one_gpu_gib']:.1f} / {plan[f'zero2_{gpus}_gpus_gib']:.1f}"
                fits = [plan.get(f"{size}GB") or "does not fit" for size in GPU_SIZES_GB]
            else:
                memory, fits = "no training", ["—"] * len(GPU_SIZES_GB)
            cells = [
                ", ".join(f"`{name}`" for name in sharing),
                record.get("reader_model", "").split("/")[-1],
                f"{counts['reader']}; {counts['retriever_trained']} + {counts['retriever_frozen']}",
                f"{run} {recipe_size}",
                " / ".join(str(n) for n in lengths),
                f"{record['seconds_per_step'][-1]:.0f}",
                f"{record['peak_rss_gib']:.1f} GiB",
                memory,
                *fits,
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_page(page: Path, reports: list[dict], gpus: int) -> None:
    """Put `page_table(reports)` between the page's markers (the prose around it is written by hand)."""
    from common.io import atomic_write_text

    text = page.read_text(encoding="utf-8")
    if PAGE_START not in text or PAGE_END not in text:
        raise ValueError(f"{page}: no '{PAGE_START}' … '{PAGE_END}' markers to put the table between")
    before, rest = text.split(PAGE_START, 1)
    after = rest.split(PAGE_END, 1)[1]
    atomic_write_text(page, f"{before}{PAGE_START}\n{page_table(reports, gpus)}\n{PAGE_END}{after}")


def write_report(args, argv, results: dict, started: float, memory: int) -> None:
    """The JSON so far, written atomically after each recipe (a killed run resumes from it)."""
    from common.io import atomic_write_json

    report = {
        "command": shlex.join(["python", "bench/real_size.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPU cores, {memory / GIB:.0f} GiB ({platform.machine()})",
        "wall_s": round(time.perf_counter() - started, 1),
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out", "work", "page", "page_only")},
        "recipes": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
