"""Training-step cost of each retriever loss vs `none`, and the cost of gold scoring.

Part 1 (steps): one Atlas-style training step with a FiD reader built from config
(`t5-small` size by default, vocabulary of the MiniLM-derived reader tokenizer) on B × K × L
synthetic token ids: retriever scores from the MiniLM query encoder (fwd + bwd; passage
embeddings precomputed = frozen passage encoder, the few-shot default) or a learnable (B, K)
score tensor, gold scores, reader loss, backward, AdamW step. Each (loss, gradient
checkpointing) setting runs in a fresh process (a new `python` started by `subprocess`), and
its peak RSS is that process's own high-water mark (`VmHWM`, see `peak_rss_gib`). When the
reader's encoder has no dropout (`--dropout 0`, or `--encoder-dropout off`: the decoder keeps
`--dropout`), the gold scores reuse the training pass's encoder states.
Ratios to the `none` step (same checkpointing setting): wall time, CPU time, FLOPs, peak RSS;
issue 13's target is `pdist` and `adist` ≤ 1.2× `none` in wall time per step (issue 4 asked 1.5×).

Each retriever loss runs once per `--gold-precision` (default: fp32 and the recipes' default, auto =
bf16 where the hardware multiplies bfloat16 natively): the precision of the gold scores' own eval-mode
encoder pass (`reader.encoder_precision`).

Part 2 (gold cost; `--no-gold-cost` skips it): seconds for one batch's gold scores, four ways:
  naive     a separate full reader pass (encoder + decoder) per passage, as the reference
            does for `loop` (K passes over K-1 passages) and per-passage scoring;
  batched   one eval-mode encoder pass over B·K passages, then batched decoder passes
            (what `RetrieverLoss.gold_scores` does when not given encoder states);
  batched_bf16  the same with the encoder pass under bfloat16 autocast (where native);
  reused    decoder passes only, on encoder states already computed by the training pass.
"before/after" = naive / reused: the reference's second reader pass vs reusing encoder states.

    .venv/bin/python bench/train_step.py                       # issue shape, all losses
    .venv/bin/python bench/train_step.py --passages 5 --length 64 --steps 2   # quick
    .venv/bin/python bench/train_step.py --model t5-tiny --passages 3 --length 32 --steps 1  # smoke
Prints a JSON object, then a short table of ratios to the `none` step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from atlas.config import RetrieverConfig
from bench.memory import status_kib
from reader.encoder_precision import PRECISIONS, native_bf16, resolve_precision
from reader.fid import FiDReader, build_reader
from reader.tokenizer import build_reader_tokenizer
from retriever.losses import build_retriever_loss

LOSSES = ["none", "adist", "pdist", "loop", "emdr"]


def peak_rss_gib() -> float:
    """Peak resident set size of this process's own address space, in GiB.

    `VmHWM` (the high-water mark of the memory map that `exec` created) rather than
    `ru_maxrss`: at `exec` Linux folds the peak of the address space being replaced (the
    parent's, shared or copied by vfork/fork) into the child's `ru_maxrss`, so a child would
    report at least its parent's peak (measured here: a child of a 400 MiB parent reports
    ~410 MiB in `ru_maxrss` and 13 MiB in `VmHWM`).
    Off Linux, `ru_maxrss` is the fallback (and may include the parent's peak).
    """
    hwm = status_kib("VmHWM")
    if hwm is not None:
        return hwm / 2**20
    divisor = 2**30 if sys.platform == "darwin" else 2**20  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / divisor


def current_rss_gib() -> float | None:
    """Resident set size now (VmRSS), in GiB; None off Linux."""
    rss = status_kib("VmRSS")
    return None if rss is None else rss / 2**20


def synthetic_batch(args, vocab_size: int):
    """Random passage ids (B, K, L) ending in eos, full masks, labels (B, T) ending in eos."""
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab_size, (args.batch, args.passages, args.length), generator=gen)
    input_ids[..., -1] = 1
    mask = torch.ones_like(input_ids)
    labels = torch.randint(3, vocab_size, (args.batch, args.target_length), generator=gen)
    labels[:, -1] = 1
    return input_ids, mask, labels


def make_reader(args) -> FiDReader:
    tokenizer = build_reader_tokenizer()
    return build_reader(args.model, vocab_size=len(tokenizer), dropout=args.dropout, seed=0)


class ScoreSource:
    """Retriever scores (B, K) with gradient: MiniLM query encoder or a learnable tensor."""

    def __init__(self, kind: str, batch: int, n_passages: int, device: torch.device) -> None:
        self.kind = kind
        if kind == "minilm":
            from common.modeling import encoder_source
            from retriever.encoder import ContrieverEncoder

            self.encoder = ContrieverEncoder.from_pretrained(encoder_source("minilm")).to(device).train()
            self.dim = self.encoder.dim
            self.query = self.encoder.tokenize(
                [("who wrote the opera carmen and when was it first performed in paris")] * batch,
                max_length=64,
            )
            self.passage_embeddings = torch.randn(batch, n_passages, self.dim).to(device)
            self.parameters = list(self.encoder.parameters())
        else:
            self.dim = 384
            self.scores = torch.nn.Parameter(torch.randn(batch, n_passages).to(device))
            self.parameters = [self.scores]

    def __call__(self) -> torch.Tensor:
        if self.kind == "minilm":
            query = self.encoder(self.query["input_ids"], self.query["attention_mask"])  # (B, d)
            return torch.einsum("bd,bkd->bk", query, self.passage_embeddings)
        return self.scores


def run_setting(args, loss_name: str, checkpointing: bool, gold_precision: str = "fp32") -> dict:
    """Time `args.steps` training steps (after one warm-up) for one setting → its JSON row."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    reader = make_reader(args).to(device).train()
    if args.encoder_dropout == "off":
        reader.disable_encoder_dropout()
    if checkpointing:
        reader.gradient_checkpointing_enable()
    batch = tuple(t.to(device) for t in synthetic_batch(args, reader.config.vocab_size))
    scores_source = ScoreSource(args.retriever, args.batch, args.passages, device)
    retriever_loss = build_retriever_loss(
        loss_name,
        temperature_gold=0.01,
        temperature_score=0.01,
        gold_precision="fp32" if gold_precision == "-" else gold_precision,
    )
    reuse = reader.encoder_is_dropout_free()
    if not retriever_loss.trains_retriever:
        precision_used = "-"
    else:
        precision_used = "reused" if reuse else resolve_precision(gold_precision, reader.seq2seq.encoder)
    optimizer = torch.optim.AdamW(list(reader.parameters()) + scores_source.parameters, lr=1e-5)
    rss_before_steps = current_rss_gib()  # model, optimizer and batch built, no step yet
    flop_counter = FlopCounterMode(display=False)
    times, cpu_times, gold_times = timed_steps(
        args, reader, batch, scores_source, retriever_loss, optimizer, flop_counter
    )
    return {
        "loss": loss_name,
        "checkpointing": checkpointing,
        "encoder_states_reused": reuse,
        "gold_precision": gold_precision if retriever_loss.trains_retriever else "-",
        "gold_precision_used": precision_used,
        "seconds_per_step": statistics.median(times),
        "cpu_seconds_per_step": statistics.median(cpu_times),
        "gold_seconds": statistics.median(gold_times),
        "gflops_per_step": flop_counter.get_total_flops() / 1e9,
        "step_times": times,
        "peak_rss_gib": round(peak_rss_gib(), 3),
        "device": str(device),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if device.type == "cuda" else None,
        "rss_before_steps_gib": None if rss_before_steps is None else round(rss_before_steps, 3),
        "pid": os.getpid(),
    }


def timed_steps(args, reader, batch, scores_source, retriever_loss, optimizer, flop_counter) -> tuple[list, list, list]:
    """One warm-up step (whose FLOPs `flop_counter` counts), then `args.steps` timed ones → per timed step: wall
    seconds, CPU seconds, wall seconds of the retriever loss (gold scores)."""
    input_ids, mask, labels = batch
    device = torch.device(args.device)
    # training.precision: bf16 autocasts the forward pass, as the training loop does
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    reuse = reader.encoder_is_dropout_free()
    times, cpu_times, gold_times = [], [], []
    for step in range(args.steps + 1):
        # The warm-up step (not timed) counts the step's FLOPs: a contention-free figure.
        counting = flop_counter if step == 0 else contextlib.nullcontext()
        counting.__enter__()
        synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        with autocast:
            scores = scores_source() if retriever_loss.trains_retriever else None
            output = reader(input_ids, mask, labels=labels)
        loss = output.loss
        synchronize()
        gold_start = time.perf_counter()
        if retriever_loss.trains_retriever:
            states = output.encoder_last_hidden_state.view(*input_ids.shape, -1) if reuse else None
            loss = loss + retriever_loss(
                reader, scores, input_ids, mask, labels, dim=scores_source.dim, encoder_states=states
            )
        synchronize()
        gold_time = time.perf_counter() - gold_start
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize()
        counting.__exit__(None, None, None)
        if step > 0:  # the first step warms up allocators and kernels
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
            gold_times.append(gold_time)
    return times, cpu_times, gold_times


def naive_gold(reader: FiDReader, loss_name: str, input_ids, mask, labels) -> None:
    """The reference's way: a separate full reader pass per passage (loop: over K-1 passages)."""
    n_passages = input_ids.shape[1]
    for k in range(n_passages):
        if loss_name == "loop":
            keep = [j for j in range(n_passages) if j != k]
            reader(input_ids[:, keep], mask[:, keep], labels=labels)
        else:
            reader(input_ids[:, k : k + 1], mask[:, k : k + 1], labels=labels)


def gold_cost(args) -> list[dict]:
    """Seconds for one batch's gold scores: naive vs batched vs reused encoder states."""
    reader = make_reader(args).eval()
    input_ids, mask, labels = synthetic_batch(args, reader.config.vocab_size)
    rows = []
    with torch.no_grad():
        states = reader.encode(input_ids, mask)
        for loss_name in args.gold_losses:
            loss = build_retriever_loss(loss_name)
            bf16_loss = build_retriever_loss(loss_name, gold_precision="bf16")
            timings = {}
            ways = ("naive", "batched", "batched_bf16", "reused")
            if not native_bf16(input_ids.device):
                ways = ("naive", "batched", "reused")
            for way in ways:
                start, cpu_start = time.perf_counter(), time.process_time()
                if way == "naive":
                    naive_gold(reader, loss_name, input_ids, mask, labels)
                else:
                    (bf16_loss if way == "batched_bf16" else loss).gold_scores(
                        reader,
                        input_ids,
                        mask,
                        labels,
                        encoder_states=states if way == "reused" else None,
                    )
                timings[way] = time.perf_counter() - start
                timings[f"{way}_cpu"] = time.process_time() - cpu_start
            rows.append(
                {
                    "loss": loss_name,
                    **{f"{k}_seconds": v for k, v in timings.items()},
                    "naive_over_batched": timings["naive"] / timings["batched"],
                    "naive_over_reused": timings["naive"] / timings["reused"],
                    "batched_over_batched_bf16": (
                        timings["batched"] / timings["batched_bf16"] if "batched_bf16" in timings else None
                    ),
                    "cpu_naive_over_batched": timings["naive_cpu"] / timings["batched_cpu"],
                    "cpu_naive_over_reused": timings["naive_cpu"] / timings["reused_cpu"],
                }
            )
    return rows


TARGET_RATIO = 1.2  # issue 13 (issue 4 asked 1.5×): pdist and adist steps ≤ 1.2× the `none` step
TARGET_LOSSES = ("pdist", "adist")


def run_in_fresh_process(loss_name: str, checkpointing: bool, gold_precision: str) -> dict:
    """One (loss, checkpointing, gold precision) setting in a new Python process; its JSON row."""
    argv = [
        sys.executable,
        __file__,
        *sys.argv[1:],
        "--single",
        json.dumps({"loss": loss_name, "checkpointing": checkpointing, "gold_precision": gold_precision}),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"setting {loss_name} checkpointing={checkpointing} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def add_ratios(rows: list[dict]) -> None:
    """Each row's ratios to the `none` row of the same checkpointing setting (when measured)."""
    for row in rows:
        base = next(
            (r for r in rows if r["loss"] == "none" and r["checkpointing"] == row["checkpointing"]),
            None,
        )
        if base is None:
            continue
        row["ratio_to_none"] = row["seconds_per_step"] / base["seconds_per_step"]
        row["cpu_ratio_to_none"] = row["cpu_seconds_per_step"] / base["cpu_seconds_per_step"]
        row["flops_ratio_to_none"] = row["gflops_per_step"] / base["gflops_per_step"]
        row["rss_ratio_to_none"] = row["peak_rss_gib"] / base["peak_rss_gib"]


def target_verdicts(rows: list[dict]) -> list[dict]:
    """The target per (checkpointing, gold precision) setting: every TARGET_LOSSES step ≤
    TARGET_RATIO × `none`."""
    verdicts = []
    settings = sorted({(r["checkpointing"], r["gold_precision"]) for r in rows if r["loss"] in TARGET_LOSSES})
    for checkpointing, precision in settings:
        measured = {
            r["loss"]: r["ratio_to_none"]
            for r in rows
            if r["checkpointing"] == checkpointing
            and r["gold_precision"] == precision
            and r["loss"] in TARGET_LOSSES
            and "ratio_to_none" in r
        }
        verdicts.append(
            {
                "checkpointing": checkpointing,
                "gold_precision": precision,
                "ratios": measured,
                "met": all(v <= TARGET_RATIO for v in measured.values()) if measured else None,
                "missing": [loss for loss in TARGET_LOSSES if loss not in measured],
            }
        )
    return verdicts


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" if key in row else "-"


def print_table(args, result: dict) -> None:
    """Short table after the JSON: per-loss ratios to `none`, the target, the gold ratios."""
    print(
        f"\n{args.model} B={args.batch} K={args.passages} L={args.length} T={args.target_length} "
        f"dropout={args.dropout} encoder dropout {args.encoder_dropout} retriever={args.retriever} "
        f"threads={result['shape']['threads']}"
    )
    if result["steps"]:
        reuse = result["steps"][0]["encoder_states_reused"]
        print(
            "gold scores "
            + (
                "reuse the training pass's encoder states (no encoder dropout)"
                if reuse
                else "run their own eval-mode encoder pass (encoder dropout > 0; --encoder-dropout off reuses states)"
            )
        )
        print(
            f"{'loss':7s} {'gold':6s} {'ckpt':5s} {'s/step':>7s} {'gold s':>7s} {'x none':>7s} {'cpu x':>6s} "
            f"{'GFLOP':>7s} {'flop x':>7s} {'peak GiB':>9s} {'rss x':>6s}"
        )
        for row in result["steps"]:
            print(
                f"{row['loss']:7s} {row['gold_precision_used']:6s} {('on' if row['checkpointing'] else 'off'):5s} "
                f"{row['seconds_per_step']:7.2f} {row['gold_seconds']:7.2f} "
                f"{_ratio(row, 'ratio_to_none'):>7s} {_ratio(row, 'cpu_ratio_to_none'):>6s} "
                f"{row['gflops_per_step']:7.1f} {_ratio(row, 'flops_ratio_to_none'):>7s} "
                f"{row['peak_rss_gib']:9.2f} {_ratio(row, 'rss_ratio_to_none'):>6s}"
            )
        for verdict in result["target"]:
            ckpt = "on" if verdict["checkpointing"] else "off"
            shown = ", ".join(f"{k} {v:.2f}x" for k, v in verdict["ratios"].items()) or "none measured"
            state = {True: "MET", False: "NOT met", None: "not measured"}[verdict["met"]]
            missing = f" (missing: {', '.join(verdict['missing'])})" if verdict["missing"] else ""
            print(
                f"issue-13 target (pdist, adist ≤ {TARGET_RATIO}x none), checkpointing {ckpt}, "
                f"gold precision {verdict['gold_precision']}: "
                f"{shown} → {state}{missing}"
            )
    for row in result["gold_cost"]:
        print(
            f"gold {row['loss']:6s} before/after (naive second reader pass / reused encoder "
            f"states): {row['naive_over_reused']:.1f}x  [naive {row['naive_seconds']:.2f} s, "
            f"batched {row['batched_seconds']:.2f} s, reused {row['reused_seconds']:.2f} s; "
            f"naive/batched {row['naive_over_batched']:.1f}x; cpu time {row['cpu_naive_over_reused']:.1f}x]"
        )
        if row["batched_over_batched_bf16"] is not None:
            print(
                f"gold {row['loss']:6s} own encoder pass full / bf16: {row['batched_over_batched_bf16']:.2f}x  "
                f"[{row['batched_seconds']:.2f} s vs {row['batched_bf16_seconds']:.2f} s]"
            )


def parse_args() -> argparse.Namespace:
    """The flags; `losses`, `gold_losses` and `gold_precision` as checked lists."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="t5-small")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--passages", type=int, default=20)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--target-length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per setting (after a warm-up)")
    parser.add_argument("--dropout", type=float, default=0.1, help="0 lets gold reuse encoder states")
    parser.add_argument("--losses", default=",".join(LOSSES))
    parser.add_argument(
        "--gold-precision",
        default=f"fp32,{RetrieverConfig().gold_precision}",
        help="gold passes' encoder precision(s) to time, comma-separated (fp32, bf16, auto; "
        "'full' = fp32); the default compares fp32 with the recipes' default",
    )
    parser.add_argument(
        "--encoder-dropout",
        choices=["on", "off"],
        default="on",
        help="off: the reader's encoder runs without dropout (reader.encoder_dropout: false), "
        "so the gold scores reuse the training pass's encoder states",
    )
    parser.add_argument("--checkpointing", choices=["off", "on", "both"], default="both")
    parser.add_argument("--retriever", choices=["minilm", "learnable"], default="minilm")
    parser.add_argument("--no-gold-cost", action="store_true", help="skip part 2 (gold cost)")
    parser.add_argument("--gold-losses", default="pdist,adist,loop")
    parser.add_argument("--no-steps", action="store_true", help="skip part 1")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the reader and the retriever run")
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="the forward pass's precision (training.precision: bf16 autocasts it)",
    )
    parser.add_argument("--single", help=argparse.SUPPRESS)  # internal: one setting per process
    args = parser.parse_args()
    args.losses, args.gold_losses = args.losses.split(","), args.gold_losses.split(",")
    args.gold_precision = ["fp32" if p == "full" else p for p in args.gold_precision.split(",")]  # old name
    bad = sorted(set(args.gold_precision) - set(PRECISIONS) - {"-"})
    if bad:
        parser.error(f"unknown gold precision(s) {bad}; valid: {list(PRECISIONS)}")
    unknown = sorted(set(args.losses + args.gold_losses) - set(LOSSES))
    if unknown:
        parser.error(f"unknown loss(es) {unknown}; valid: {LOSSES}")
    return args


def step_rows(args) -> list[dict]:
    """Part 1: every (checkpointing, loss, gold precision) setting, each in a fresh process → their rows."""
    rows = []
    for checkpointing in {"off": [False], "on": [True], "both": [False, True]}[args.checkpointing]:
        for loss_name in args.losses:
            for precision in ["-"] if loss_name == "none" else args.gold_precision:
                row = run_in_fresh_process(loss_name, checkpointing, precision)
                print(
                    f"  {loss_name:6s} checkpointing={checkpointing!s:5s} gold {row['gold_precision_used']:6s} "
                    f"{row['seconds_per_step']:.2f} s/step gold {row['gold_seconds']:.2f} s  "
                    f"{row['peak_rss_gib']:.2f} GiB",
                    file=sys.stderr,
                )
                rows.append(row)
    return rows


def main() -> None:
    args = parse_args()
    if args.single:
        setting = json.loads(args.single)
        print(json.dumps(run_setting(args, setting["loss"], setting["checkpointing"], setting["gold_precision"])))
        return
    flags = ("model", "batch", "passages", "length", "target_length", "dropout", "encoder_dropout", "retriever")
    shape = {flag: getattr(args, flag) for flag in flags} | {"threads": torch.get_num_threads()}
    result: dict = {"shape": shape, "steps": [], "target": [], "gold_cost": []}
    if not args.no_steps:
        result["steps"] = step_rows(args)
        add_ratios(result["steps"])
        result["target"] = target_verdicts(result["steps"])
    if not args.no_gold_cost:
        result["gold_cost"] = gold_cost(args)
    print(json.dumps(result, indent=1))
    print_table(args, result)


if __name__ == "__main__":
    main()
