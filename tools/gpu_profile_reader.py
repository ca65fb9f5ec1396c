"""Where the reader's answering time goes on a GPU: torch.profiler over SQuAD dev questions read as bench/reading.py
reads them at K=5 (beam 4, answers constrained to spans), after one warm-up batch.

    python tools/gpu_profile_reader.py --squad-dev DEV.json --questions 64 --batch-size 32 --out runs/gpu/profile.txt

Writes the operators by their own host time (top 30) and by device time (top 15), and counts the calls that make
the host wait for the device (stream and device synchronisations, device-to-host copies): the figures item 3 of
the GPU issue needs before choosing between CUDA graphs, larger batches and fewer syncs.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "Memcpy DtoH", "aten::item")


def main(argv: list[str] | None = None) -> int:
    import reading as bench_reading  # bench/reading.py
    import torch
    from torch.profiler import ProfilerActivity, profile

    from common.modeling import encoder_source
    from reader.fid import FiDReader
    from reader.tokenizer import build_reader_tokenizer
    from retriever.retriever import Retriever
    from tasks.base import get_task

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squad-dev", type=Path, default=bench_reading.SQUAD_DEV)
    parser.add_argument("--questions", type=int, default=64, help="questions profiled (after one warm-up batch)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "gpu" / "profile.txt")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    task = get_task("reading")
    everything = task.load(args.squad_dev)
    examples = random.Random(0).sample(everything, args.batch_size + args.questions)
    retriever = Retriever.from_pretrained(encoder_source("minilm")).to(device).eval()
    passages = bench_reading.distractor_passages(examples, everything, retriever, 5, 0)
    reader = FiDReader.from_pretrained(bench_reading.SHIPPED).eval().to(device)
    tokenizer = build_reader_tokenizer(bench_reading.SHIPPED)
    settings = {"max_length": 320, "batch_size": args.batch_size, "beams": 4, "precision": args.precision}
    settings.update(bench_reading.DECODINGS["span"])
    warm, profiled = slice(0, args.batch_size), slice(args.batch_size, None)
    bench_reading.read(reader, tokenizer, task, examples[warm], passages[warm], **settings)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        metrics, rate = bench_reading.read(reader, tokenizer, task, examples[profiled], passages[profiled], **settings)
    events = profiler.key_averages()
    waits = {name: sum(e.count for e in events if name in e.key) for name in WAITS}
    setting = f"K=5, beam 4, span answers, batch {args.batch_size}, {args.precision}, {device}"
    lines = [
        f"{args.questions} questions, {setting}: {rate:.1f} questions/s profiled, EM {metrics['exact_match']:.1f}",
        "calls that wait for the device: " + ", ".join(f"{name} {count}" for name, count in waits.items()),
        "",
        events.table(sort_by="self_cpu_time_total", row_limit=30),
    ]
    if device.type == "cuda":
        lines.append(events.table(sort_by="self_cuda_time_total", row_limit=15))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
