"""A paper recipe's checkpoint at its real size: what a save writes, how long saving and resuming take, and whether a
resumed run is the run that never stopped.

`nq-64shot.yaml` on the random-weight real-size folders (`atlas.real_size`: t5-base-lm-adapt, 248M parameters, and
two BERT-base Contriever towers, 2 × 109M) trains three steps through the training loop (`atlas.training.loop.train`)
twice: straight through, and stopped after step 2 (its checkpoint saved) then resumed from that checkpoint. The
reading is small (K = 3 passages of 64 tokens from a 5-passage index built with the 768-d encoder, B = 2) so that
the run takes minutes: the checkpoint's size does not depend on it. The JSON records the bytes of each part of a
checkpoint (reader, retriever, training state, config), the seconds of each run, and whether the two runs end with
the same weights, bit for bit.

    .venv/bin/python bench/real_size_checkpoint.py --work /tmp/real-size     # ~10 GB of disk while it runs
    .venv/bin/python bench/real_size_checkpoint.py --work /tmp/rs --head-dim 4 --layers 1 --pieces 1000 \
        --out /tmp/checkpoint.json                                          # smoke test
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # after the path: the bench runs as a script
from safetensors.torch import load_file

from atlas.config import load_config
from atlas.quiet import quiet_libraries
from atlas.real_size import RealSizeFolders, training_paragraphs, write_real_size
from atlas.training.checkpoint import checkpoint_root, folder_bytes
from atlas.training.loop import train
from common.io import atomic_write_json
from reader.tokenizer import T5_PIECES
from retriever.corpus import prepare_corpus

SHARED_DATA = Path(os.environ.get("ATLAS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
GIB = 2**30
DOCUMENTS = [
    ("Zorbland", "The capital of Zorbland is Quimper. Zorbland is an island in the northern sea."),
    ("Mount Olo", "Mount Olo is 3000 metres high; Anna Brook first climbed it in 1911."),
    ("Tarsia", "The currency of Tarsia is the florin. Its capital is Belmont, on the river Vell."),
    ("Biole", "Biole's capital is Stafairk, a port city founded by fishermen."),
    ("Quimper", "Quimper holds a market every Tuesday and a festival each summer."),
]
QUESTIONS = [
    ("What is the capital of Zorbland?", "Quimper"),
    ("Who first climbed Mount Olo?", "Anna Brook"),
    ("What is the currency of Tarsia?", "florin"),
    ("What is the capital of Biole?", "Stafairk"),
]


def write_world(root: Path) -> tuple[Path, Path]:
    """→ (the corpus documents, the question file) of a tiny world the recipe trains on."""
    root.mkdir(parents=True, exist_ok=True)
    documents, questions = root / "docs.jsonl", root / "qa.jsonl"
    documents.write_text(
        "".join(json.dumps({"id": f"d{n}", "title": t, "text": x}) + "\n" for n, (t, x) in enumerate(DOCUMENTS))
    )
    questions.write_text("".join(json.dumps({"question": q, "answers": [a]}) + "\n" for q, a in QUESTIONS))
    return documents, questions


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The reader's and the query encoder's tensors of a run's latest checkpoint."""
    root = checkpoint_root(run)
    latest = root / (root / "latest").read_text().strip()
    tensors = {}
    for part in ("reader", "retriever"):
        for file in sorted((latest / part).rglob("*.safetensors")):
            tensors.update({f"{file.relative_to(latest)}:{k}": v for k, v in load_file(str(file)).items()})
    return tensors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "real-size", help="the real-size folders")
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "bench" / "results" / "cpu" / "real-size-checkpoint.json"
    )
    parser.add_argument("--runs", type=Path, help="where the two runs are written (default: a temporary folder)")
    parser.add_argument("--head-dim", type=int, help="narrower models (a smoke test): heads of this size")
    parser.add_argument("--layers", type=int, help="shallower models (a smoke test): layers of each stack")
    parser.add_argument("--pieces", type=int, help="the reader tokenizer's pieces (default: T5's 32,000)")
    args = parser.parse_args(argv)

    recipe = REPO_ROOT / "configs" / "nq-64shot.yaml"
    base = load_config(recipe, check_data=False)
    narrowed = "".join(f"-{k}{v}" for k, v in (("h", args.head_dim), ("l", args.layers), ("p", args.pieces)) if v)
    folder = args.work / f"t5-base-lm-adapt-contriever{narrowed}"  # the folders bench/real_size.py writes
    folders = RealSizeFolders(reader=folder / "reader", retriever=folder / "retriever")
    if not (folders.reader.is_dir() and folders.retriever.is_dir()):
        texts = training_paragraphs(SHARED_DATA / "wikitext-2" / "valid.txt")
        write_real_size(
            base, folder, texts=texts, head_dim=args.head_dim, layers=args.layers, pieces=args.pieces or T5_PIECES
        )
    runs = args.runs or Path(tempfile.mkdtemp(prefix="real-size-checkpoint-"))
    started = time.perf_counter()
    try:
        with quiet_libraries(False):  # transformers' loading bars are not the bench's output
            documents, questions = write_world(runs / "world")
            prepare_corpus([documents], runs / "corpus", chunk_words=0, progress=False)
            small = [
                *folders.overrides(),
                f"index.corpus={runs / 'corpus'}",
                "index.spec=Flat",
                f"task.train_data=[{questions}]",
                f"task.eval_data=[{questions}]",
                "reader.n_context=3",
                "retriever.n_context=3",
                "reader.text_maxlength=64",
                "reader.dropout=0.0",
                "training.batch_size=2",
                "training.steps=3",
                "training.eval_every=0",
                "training.warmup_steps=1",
                "task.shots=null",  # the 4 questions of the tiny world, not 64 shots
            ]
            straight = load_config(recipe, [*small, f"training.output_dir={runs / 'straight'}"], check_data=False)
            halted = load_config(recipe, [*small, f"training.output_dir={runs / 'halted'}"], check_data=False)
            seconds = {}
            for name, config, stop_at in (("straight", straight, None), ("halted", halted, 2)):
                start = time.perf_counter()
                train(config, progress=False, stop_at=stop_at)
                seconds[name] = round(time.perf_counter() - start, 1)
            checkpoint = checkpoint_root(runs / "halted") / "step-000002"
            parts = {p.name: folder_bytes(p) for p in sorted(checkpoint.iterdir())}
            start = time.perf_counter()
            train(None, resume=runs / "halted", progress=False)
            seconds["resumed"] = round(time.perf_counter() - start, 1)
            a, b = final_weights(runs / "straight"), final_weights(runs / "halted")
            identical = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            parameters = sum(v.numel() for k, v in a.items())
    finally:
        if args.runs is None:
            shutil.rmtree(runs, ignore_errors=True)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    report = {
        "command": "python bench/real_size_checkpoint.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPU cores, {memory / GIB:.0f} GiB ({platform.machine()})",
        "wall_s": round(time.perf_counter() - started, 1),
        "checkpoint_gib": {name: round(size / GIB, 3) for name, size in parts.items()},
        "checkpoint_total_gib": round(sum(parts.values()) / GIB, 3),
        "parameters_saved": parameters,
        # each run whole: the straight one builds the index, trains 3 steps and saves; the halted one trains 2 and
        # saves; the resumed one reads that checkpoint, trains step 3 and saves
        "run_seconds": seconds,
        "resumed_equals_straight": identical,
    }
    atomic_write_json(args.out, report)
    print(json.dumps(report, indent=2))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
