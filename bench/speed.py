"""How fast atlas embeds, reads and edits on this machine: today's float32 eager path against each faster one, in
one run, side by side, with the CPU's features named.

Every run first measures the machine's float32 roofline: the best GFLOP/s of `F.linear` on a 1024³ product and
on an encoder's feed-forward shape; each embedding path and the reader's encoder pass report their useful GFLOP/s
(2 per linear weight per real token, plus attention) and their share of it.

Parts (--parts, comma-separated; all by default):
- `embed`: passages/s embedding the same real passages (a seeded sample of the chunked nq824 + WikiText-2 corpus,
  MiniLM, max 256 tokens, batch 64, length-sorted batches) by `ContrieverEncoder.embed_texts` at fp32 (today's
  path), bf16 (bfloat16 autocast: `precision="bf16"`), bf16 weights (the model cast to bfloat16, layer norms
  included) and auto (what `precision="auto"` resolves to here); by ONNX Runtime (float32 after its BERT graph
  fusions, and int8: dynamic quantisation of those weights) where `onnxruntime` is installed; and by
  sentence-transformers' `SentenceTransformer.encode` as users run it (its defaults: batch 32). Each path's
  vectors against fp32's: the smallest cosine.
- `recall`: nq824 answer recall@5 and @20 (578 dev questions) over the whole chunked corpus, embedded
  (passages and questions) at each precision, exact inner-product search.
- `read`: the shipped reader's questions/s at K=1 (the gold paragraph) and K=5 (gold + 4 distractors MiniLM
  ranks highest among the sample's paragraphs), span decoding, beam 4, batch 16, `inference.precision` fp32,
  int8 (the decoder and LM head with int8 weights), bf16 and auto (both where they pay), on a seeded sample of
  SQuAD dev, the path `atlas` ships (bench/reading.py measures the quality of the same paths on 1,000); with
  --baseline-ref REF,
  the fp32 rate of the code at commit REF on the same questions, in the same run.
- `profile`: where a K=5 answer's time goes on the shipped path: tokenization (the reader inputs and the span
  constraint), the encoder pass (its useful GFLOP/s and share of the roofline), and inside `generate` the
  key/value prefill, the decoder layers, the LM head, the copy head, the span constraint, and the rest (beam
  search's log-softmax, scores and top-k, the forward's glue), then turning ids into answers.
- `edit`: a 1,000-passage `atlas index add` to an exact index of --edit-rows passages (grown from the nq824
  vectors as bench/scale.py grows its corpora, built from given vectors, so that no embedding is timed but the
  edit's), at --precision fp32 and auto.

    flock /work/cpu.lock .venv/bin/python bench/speed.py                      # everything
    .venv/bin/python bench/speed.py --parts embed --sample 256               # a quick look
    .venv/bin/python bench/speed.py --parts read,profile --baseline-ref eabf369   # reading against a commit

Writes JSON (--out, default bench/results/cpu/speed.json) and prints a table. Never runs in the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from index_data import NQ824_RUN, SHARED, ensure_nq824_corpus  # bench/index_data.py

PARTS = ("embed", "recall", "read", "profile", "edit")
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")


def machine() -> dict:
    """The CPU, its features that decide the fast paths, and what `auto` picks here."""
    from retriever.encoder import resolve_embedding_precision
    from retriever.index.exact_search import native_bf16_speedup

    model, flags = platform.processor(), set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    return {
        "cpu": model,
        "threads": torch.get_num_threads(),
        "features": {flag: flag in flags for flag in CPU_FLAGS},
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_matmul_speedup": round(native_bf16_speedup(), 2),
        "auto_embedding_precision": resolve_embedding_precision("auto", "cpu"),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def best_rate(fn, items: list, repeats: int) -> tuple[np.ndarray, float]:
    """(fn(items), items/s of the best of `repeats` timed calls), after a warm-up call on a few items."""
    fn(items[:16])
    best, out = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn(items)
        best = min(best, time.perf_counter() - started)
    return out, len(items) / best


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The smallest row-wise cosine of (N, d) a and b."""
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(cosine.min())


def part_roofline(args) -> dict:
    """The machine's float32 limit, measured in this run: the best GFLOP/s of `F.linear` on a cube and on an
    encoder's feed-forward shape (every path's share of the roofline is taken against the larger)."""
    generator = torch.Generator().manual_seed(args.seed)
    results = {}
    for name, (m, k, n) in {"1024x1024x1024": (1024, 1024, 1024), "5120x384x1536": (5120, 384, 1536)}.items():
        x, w = torch.randn(m, k, generator=generator), torch.randn(n, k, generator=generator)
        with torch.no_grad():
            torch.nn.functional.linear(x, w)  # warm-up: kernel selection, packing
            best = float("inf")
            for _ in range(10):
                started = time.perf_counter()
                torch.nn.functional.linear(x, w)
                best = min(best, time.perf_counter() - started)
        results[name] = round(2 * m * k * n / best / 1e9, 1)
    return {"float32_gflops": results, "roofline_gflops": max(results.values())}


def encoder_flops(model: torch.nn.Module, lengths, width: int) -> float:
    """The useful FLOPs of a transformer encoder over sequences of `lengths` real tokens (no padding): 2 per
    weight of its linear layers per token, and 4·L²·d per layer per sequence for attention."""
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    layers = sum(1 for m in model.modules() if type(m).__name__ in ("BertLayer", "T5Block"))
    lengths = np.asarray(lengths, dtype=np.float64)
    return float(2 * weights * lengths.sum() + layers * 4 * width * (lengths**2).sum())


class OnnxEncoder:
    """An encoder exported to ONNX (the pooled, normalised output of `ContrieverEncoder.forward`) and run by ONNX
    Runtime, with the same length-sorted batches as `embed_texts`: float32 after ORT's BERT fusions, or int8
    (`onnxruntime.quantization.quantize_dynamic` of those weights, per channel)."""

    def __init__(self, encoder, folder: Path, *, int8: bool):
        import onnx
        import onnxruntime
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.transformers.optimizer import optimize_model

        self.encoder = encoder
        plain, fused = folder / "encoder.onnx", folder / "encoder-fused.onnx"
        if not fused.is_file():
            batch = encoder.tokenize(["a short text", "and a somewhat longer one to pad the other"])
            with torch.no_grad():
                torch.onnx.export(
                    encoder.eval(),
                    (batch["input_ids"], batch["attention_mask"]),
                    str(plain),
                    input_names=["input_ids", "attention_mask"],
                    output_names=["embedding"],
                    dynamic_axes={"input_ids": {0: "B", 1: "L"}, "attention_mask": {0: "B", 1: "L"}},
                    opset_version=17,
                    dynamo=False,
                )
            config = encoder.model.config
            optimize_model(
                str(plain), model_type="bert", num_heads=config.num_attention_heads, hidden_size=config.hidden_size
            ).save_model_to_file(str(fused))
        path = fused
        if int8:
            path = folder / "encoder-int8.onnx"
            if not path.is_file():
                quantize_dynamic(
                    str(fused),
                    str(path),
                    weight_type=QuantType.QInt8,
                    per_channel=True,
                    # the fused graph's contrib ops (Attention, SkipLayerNormalization) give shape inference no
                    # types: their outputs are float32
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def embed_texts(self, texts: list[str], *, batch_size: int = 64, max_length: int = 256) -> np.ndarray:
        """(N, d) float32 in the order of `texts`."""
        encoded = self.encoder.tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
        lengths = np.array([len(ids) for ids in encoded])
        order = np.argsort(-lengths, kind="stable")
        out = np.empty((len(texts), self.encoder.dim), dtype=np.float32)
        pad_id = self.encoder.tokenizer.pad_token_id or 0
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            ids = np.full((len(rows), int(lengths[rows].max())), pad_id, dtype=np.int64)
            mask = np.zeros_like(ids)
            for i, row in enumerate(rows):
                ids[i, : lengths[row]] = encoded[row]
                mask[i, : lengths[row]] = 1
            out[rows] = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        return out


def embedding_paths(retriever, work: Path, batch_size: int) -> dict:
    """name → (texts → (N, d) float32 vectors) for every embedding path measured."""
    encoder, max_length = retriever.passage_encoder, retriever.passage_maxlength
    bf16_weights = copy.deepcopy(encoder).to(torch.bfloat16)

    def at(precision: str, model=encoder):
        return lambda texts: model.embed_texts(texts, batch_size=batch_size, max_length=max_length, precision=precision)

    paths = {
        "fp32 eager (today)": at("fp32"),
        "bf16 autocast": at("bf16"),
        "bf16 weights": at("fp32", bf16_weights),
        "auto": at("auto"),
    }
    try:
        import onnxruntime  # noqa: F401  (an optional extra)
    except ImportError:
        print("onnxruntime is not installed: its paths are not measured", file=sys.stderr)
    else:
        for name, int8 in (("onnxruntime fp32", False), ("onnxruntime int8", True)):
            onnx = OnnxEncoder(encoder, work, int8=int8)
            paths[name] = lambda texts, onnx=onnx: onnx.embed_texts(texts, batch_size=batch_size, max_length=max_length)
    from sentence_transformers import SentenceTransformer

    from common.modeling import encoder_source

    sentence_transformer = SentenceTransformer(encoder_source("minilm"), device="cpu")
    paths["SentenceTransformer.encode"] = lambda texts: sentence_transformer.encode(texts, convert_to_numpy=True)
    return paths


def part_embed(args, retriever, texts: list[str], work: Path) -> dict:
    paths = embedding_paths(retriever, work, args.batch_size)
    results, reference = {}, None
    for name, fn in paths.items():
        vectors, rate = best_rate(fn, texts, args.repeats)
        reference = vectors if reference is None else reference
        results[name] = {
            "passages_per_s": round(rate, 2),
            "min_cosine_to_fp32": round(min_cosine(vectors, reference), 5),
        }
        print(json.dumps({name: results[name]}), flush=True)
    today = results["fp32 eager (today)"]["passages_per_s"]
    sentence = results["SentenceTransformer.encode"]["passages_per_s"]
    encoder = retriever.passage_encoder
    lengths = [
        len(ids)
        for ids in encoder.tokenizer(texts, truncation=True, max_length=retriever.passage_maxlength)["input_ids"]
    ]
    flops_per_passage = encoder_flops(encoder.model, lengths, encoder.model.config.hidden_size) / len(texts)
    for result in results.values():
        result["vs_fp32_eager"] = round(result["passages_per_s"] / today, 2)
        result["vs_sentence_transformers"] = round(result["passages_per_s"] / sentence, 2)
        result["useful_gflops"] = round(result["passages_per_s"] * flops_per_passage / 1e9, 1)
        result["roofline_share"] = round(result["useful_gflops"] / args.roofline, 3)
    return {
        "passages": len(texts),
        "batch_size": args.batch_size,
        "max_tokens": retriever.passage_maxlength,
        "paths": results,
    }


def answer_recall(examples, corpus_texts: list[str], top: np.ndarray) -> dict:
    """Answer recall@5/@20 (percent) of per-question ranked passage rows `top` (Q, ≥ 20)."""
    from tasks.metrics import has_answer

    out = {}
    for k in (5, 20):
        found = [any(has_answer(e.answers, corpus_texts[j]) for j in row[:k]) for e, row in zip(examples, top)]
        out[f"answer_recall@{k}"] = round(100 * sum(found) / len(found), 2)
    return out


def part_recall(args, retriever, corpus_texts: list[str], work: Path) -> dict:
    """nq824 answer recall@5/@20 over the whole chunked corpus, the passages and the questions embedded by each
    path, exact inner-product search.

    bf16 where it is emulated (no AVX512-BF16 or AMX: several times slower than float32) is measured on the
    candidates: the union U of every question's float32 top `--recall-candidates` passages is embedded in
    bfloat16 and each question ranked over U. A passage outside its question's float32 top C scores at most the
    C-th float32 score s_C; with δ the largest |bf16 − fp32| score change measured over U × questions, its
    bfloat16 score is at most s_C + δ, so a question whose bfloat16 20th score over U is above s_C + δ has the
    top 20 the whole corpus would give (the share of such questions is reported: `certified`). Where bfloat16 is
    native the whole corpus is embedded in bfloat16."""
    from retriever.embedding_precision import resolve_embedding_precision
    from retriever.retrieval_eval import read_retrieval_examples

    examples = read_retrieval_examples(SHARED / "nq824" / "dev.jsonl")
    questions = [e.question for e in examples]
    encoder, max_length = retriever.passage_encoder, retriever.passage_maxlength
    vectors = corpus_vectors(args, retriever, corpus_texts, work)
    queries = retriever.embed_queries(questions, precision="fp32")
    scores = queries @ vectors.T  # (Q, N)
    ranked = np.argsort(-scores, axis=1, kind="stable")
    results = {"fp32": answer_recall(examples, corpus_texts, ranked[:, :20])}
    print(json.dumps({"fp32": results["fp32"]}), flush=True)
    native = resolve_embedding_precision("auto", "cpu") == "bf16"
    q_bf16 = retriever.embed_queries(questions, precision="bf16")
    if native:
        v_bf16 = encoder.embed_texts(corpus_texts, batch_size=args.batch_size, max_length=max_length, precision="bf16")
        results["bf16"] = answer_recall(examples, corpus_texts, np.argsort(-(q_bf16 @ v_bf16.T), axis=1)[:, :20])
    else:
        c = args.recall_candidates
        union = np.unique(ranked[:, :c])
        v_bf16 = encoder.embed_texts(
            [corpus_texts[i] for i in union], batch_size=args.batch_size, max_length=max_length, precision="bf16"
        )
        s_bf16 = q_bf16 @ v_bf16.T  # (Q, |U|)
        delta = float(np.abs(s_bf16 - scores[:, union]).max())
        order = np.argsort(-s_bf16, axis=1, kind="stable")
        s_c = np.take_along_axis(scores, ranked[:, c - 1 : c], axis=1)[:, 0]
        certified = np.take_along_axis(s_bf16, order[:, 19:20], axis=1)[:, 0] > s_c + delta
        results["bf16"] = answer_recall(examples, corpus_texts, union[order[:, :20]])
        results["bf16"] |= {
            "method": f"candidates: the union of each question's fp32 top {c} ({len(union)} passages) in bf16",
            "max_score_change": round(delta, 5),
            "certified": round(float(certified.mean()), 3),
        }
    print(json.dumps({"bf16": results["bf16"]}), flush=True)
    with contextlib.suppress(ImportError):
        import onnxruntime  # noqa: F401

        onnx = OnnxEncoder(encoder, work, int8=True)
        v_int8 = onnx.embed_texts(corpus_texts, batch_size=args.batch_size, max_length=max_length)
        q_int8 = onnx.embed_texts(questions, max_length=retriever.query_maxlength)
        results["onnxruntime int8"] = answer_recall(
            examples, corpus_texts, np.argsort(-(q_int8 @ v_int8.T), axis=1, kind="stable")[:, :20]
        )
        print(json.dumps({"onnxruntime int8": results["onnxruntime int8"]}), flush=True)
    for result in results.values():
        for k in (5, 20):
            result[f"recall@{k}_minus_fp32"] = round(
                result[f"answer_recall@{k}"] - results["fp32"][f"answer_recall@{k}"], 2
            )
    return {"questions": len(questions), "passages": len(corpus_texts), "paths": results}


def reading_setup(args, retriever):
    """(reader, tokenizer, task, examples, K=1 passages, K=5 passages) on a seeded SQuAD dev sample."""
    from reading import SHIPPED, SQUAD_DEV, distractor_passages  # bench/reading.py

    from reader.fid import FiDReader
    from reader.tokenizer import build_reader_tokenizer
    from tasks.base import get_task

    task = get_task("reading")
    examples = random.Random(args.seed).sample(task.load(SQUAD_DEV), args.questions)
    reader = FiDReader.from_pretrained(SHIPPED).eval()
    tokenizer = build_reader_tokenizer(SHIPPED)
    k5 = distractor_passages(examples, examples, retriever, 5, args.seed)
    return reader, tokenizer, task, examples, [e.passages for e in examples], k5


READ_PRECISIONS = ("fp32", "int8", "bf16", "bf16-int8", "auto")


def part_read(args, setup) -> dict:
    """Questions/s of the shipped reader at K=1 and K=5 at each `inference.precision`, on the shipped path
    (`bench/reading.py`'s `read`: span decoding, beam 4, batch 16); with `--baseline-ref`, the same
    questions read by that commit's code in the same run (`baseline_rates`)."""
    from reading import DECODINGS, read  # bench/reading.py

    reader, tokenizer, task, examples, k1, k5 = setup
    results = {}
    for precision in READ_PRECISIONS:
        settings = {"max_length": 320, "batch_size": 16, "beams": 4, "precision": precision, **DECODINGS["span"]}
        for warm_up in (k1, k5):  # each shape once, and the int8 copies made
            read(reader, tokenizer, task, examples[:16], warm_up[:16], **settings)
        k1_metrics, k1_rate = read(reader, tokenizer, task, examples, k1, **settings)
        k5_metrics, k5_rate = read(reader, tokenizer, task, examples, k5, **settings)
        results[precision] = {
            "k1_questions_per_s": round(k1_rate, 2),
            "k5_questions_per_s": round(k5_rate, 2),
            "k1_exact_match": round(k1_metrics["exact_match"], 1),
            "k5_exact_match": round(k5_metrics["exact_match"], 1),
        }
        print(json.dumps({precision: results[precision]}), flush=True)
    baseline = baseline_rates(args) if args.baseline_ref else None
    for result in results.values():
        for k in ("k1", "k5"):
            rate = result[f"{k}_questions_per_s"]
            result[f"{k}_vs_fp32"] = round(rate / results["fp32"][f"{k}_questions_per_s"], 2)
            if baseline:
                result[f"{k}_vs_baseline"] = round(rate / baseline[f"{k}_questions_per_s"], 2)
    report = {"questions": len(examples), "decoding": "span, beam 4, batch 16", "precisions": results}
    if baseline:
        report["baseline"] = {"ref": args.baseline_ref, **baseline}
    return report


def baseline_rates(args) -> dict:
    """fp32 questions/s at K=1 and K=5 of the code at `--baseline-ref` on the same questions: its own
    bench/speed.py `--parts read`, run from a detached worktree beside this one (so that ../shared is found)."""
    import subprocess

    ref = subprocess.run(
        ["git", "rev-parse", "--short", args.baseline_ref], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    folder = ROOT.parent / f"speed-baseline-{ref}"
    if not folder.is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(folder), args.baseline_ref], cwd=ROOT, check=True)
    runs = folder / NQ824_RUN.relative_to(ROOT)
    if not runs.exists():  # the chunked corpus its main() loads: this run's, not prepared again
        runs.parent.mkdir(parents=True, exist_ok=True)
        runs.symlink_to(NQ824_RUN)
    out = folder / "runs" / "baseline-speed.json"
    command = [sys.executable, "bench/speed.py", "--parts", "read", "--questions", str(args.questions)]
    subprocess.run([*command, "--seed", str(args.seed), "--out", str(out)], cwd=folder, check=True)
    fp32 = json.loads(out.read_text())["read"]["precisions"]["fp32"]
    return {k: fp32[k] for k in ("k1_questions_per_s", "k5_questions_per_s", "k1_exact_match", "k5_exact_match")}


class StageClock:
    """Seconds spent per stage of answering, from forward hooks and wrapped callables."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._started: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
            self.calls[name] = self.calls.get(name, 0) + 1

    def hook(self, module: torch.nn.Module, name: str) -> list:
        def before(*_):
            self._started[name] = time.perf_counter()

        def after(*_):
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - self._started.pop(name)
            self.calls[name] = self.calls.get(name, 0) + 1

        return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]

    def wrap(self, fn, name: str):
        def timed(*a, **kw):
            with self.stage(name):
                return fn(*a, **kw)

        return timed


PROFILE_STAGES = {  # a stage inside `generate` → what it times
    "key/value prefill": "BeamSharedCrossAttentionCache.prefilled: every layer's cross-attention keys and values",
    "decoder layers": "the T5 decoder stack, one step of every beam",
    "LM head": "the output projection onto the 30,620-piece vocabulary",
    "copy head": "the pointer over the passages' tokens and its mixture with the vocabulary distribution",
    "span constraint": "DeviceSpanConstraint: the allowed next tokens, and the mask",
}


def part_profile(args, setup) -> dict:
    """Where the time of K=5 answers goes on the shipped path (fp32, span decoding, beam 4, batch 16): the
    generation's stages timed by hooks on the modules and by wrapping the prefill and the constraint at their
    classes (`generate` still builds what it ships: the on-device constraint, the shared key/value cache)."""
    from unittest import mock

    from atlas.model import ANSWER_SENTINEL, template_fields
    from reader.beam_attention import BeamSharedCrossAttentionCache
    from reader.inputs import encode_reader_inputs
    from reader.span_constraint import DeviceSpanConstraint, PassageSpanConstraint
    from reader.surface import decode_answers

    reader, tokenizer, _task, examples, _k1, k5 = setup
    clock = StageClock()
    seq2seq = reader.seq2seq
    handles = clock.hook(seq2seq.decoder, "decoder layers") + clock.hook(seq2seq.lm_head, "LM head")
    if getattr(seq2seq, "copy_head", None) is not None:
        handles += clock.hook(seq2seq.copy_head, "copy head")
    prefilled = BeamSharedCrossAttentionCache.prefilled.__func__
    patches = [
        mock.patch.object(
            BeamSharedCrossAttentionCache,
            "prefilled",
            classmethod(lambda cls, *a, **kw: clock.wrap(prefilled, "key/value prefill")(cls, *a, **kw)),
        ),
        mock.patch.object(
            DeviceSpanConstraint, "__call__", clock.wrap(DeviceSpanConstraint.__call__, "span constraint")
        ),
    ]
    real_tokens, started = [], time.perf_counter()
    with torch.no_grad(), contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        for start in range(0, len(examples), 16):
            chunk = examples[start : start + 16]
            with clock.stage("tokenization (reader inputs + span constraint)"):
                read = template_fields(k5[start : start + 16])
                ids, mask = encode_reader_inputs(tokenizer, [e.query for e in chunk], read, 320)
                constraint = PassageSpanConstraint.from_passages(
                    tokenizer, read, answer_prefix=ANSWER_SENTINEL, vocab_size=seq2seq.config.vocab_size
                )
            real_tokens += mask.sum(-1).flatten().tolist()
            with clock.stage("encoder pass"):
                states = reader.encode(ids, mask, precision="fp32")
            with clock.stage("generate"):
                generated = reader.generate(
                    ids,
                    mask,
                    max_length=24,
                    num_beams=4,
                    length_penalty=0.0,
                    prefix_allowed_tokens_fn=constraint,
                    encoder_states=states,
                )
            with clock.stage("ids → answers"):
                decode_answers(tokenizer, generated.cpu(), read)
    total = time.perf_counter() - started
    for handle in handles:
        handle.remove()
    return profile_report(args, clock, total, len(examples), real_tokens, seq2seq)


def profile_report(args, clock: StageClock, total: float, questions: int, lengths: list[int], seq2seq) -> dict:
    """The profile's stages in seconds and shares; the rest of `generate` (beam search's log-softmax, scores
    and top-k, Hugging Face's bookkeeping, the forward's glue) by difference; the encoder's useful GFLOP/s."""
    seconds = dict(clock.seconds)
    inside = sum(seconds.get(stage, 0.0) for stage in PROFILE_STAGES)
    seconds["rest of generate (beam search, glue)"] = seconds.pop("generate") - inside
    seconds["other (loop, batching)"] = total - sum(seconds.values())
    stages = {
        name: {"seconds": round(value, 3), "share": round(value / total, 3), "calls": clock.calls.get(name)}
        for name, value in seconds.items()
    }
    for name, stage in stages.items():
        print(f"  {name:48s} {stage['seconds']:8.2f} s  {100 * stage['share']:5.1f} %", flush=True)
    encoder = seq2seq.encoder
    width = getattr(seq2seq.config, "d_model", None) or encoder.config.hidden_size
    useful = encoder_flops(encoder, lengths, width) / seconds["encoder pass"] / 1e9
    return {
        "questions": questions,
        "seconds": round(total, 2),
        "questions_per_s": round(questions / total, 2),
        "stages": stages,
        "stage_meanings": PROFILE_STAGES,
        "encoder_useful_gflops": round(useful, 1),
        "encoder_roofline_share": round(useful / args.roofline, 3),
    }


def corpus_vectors(args, retriever, corpus_texts: list[str], work: Path) -> np.ndarray:
    """The fp32 vectors of the whole chunked corpus (N, d), embedded once and kept in `work`."""
    path = work / "corpus-fp32.npy"
    if not path.is_file():
        vectors = retriever.passage_encoder.embed_texts(
            corpus_texts, batch_size=args.batch_size, max_length=retriever.passage_maxlength, precision="fp32"
        )
        np.save(work / "corpus-fp32.tmp.npy", vectors)
        (work / "corpus-fp32.tmp.npy").replace(path)
    return np.load(path)


def part_edit(args, retriever, corpus_texts: list[str], work: Path) -> dict:
    """A 1,000-passage `atlas index add` to an exact index of `args.edit_rows` passages, at each precision, each
    one command (the index's own work and the embedding; process start and model load included).

    The index is built from given vectors, grown as bench/scale.py grows its corpora: row i is a real passage
    drawn at random with its MiniLM vector plus Gaussian noise (norm 0.3), renormalised."""
    import subprocess

    from retriever.index.vectors import EncoderRecord, write_encoder_record

    n = args.edit_rows
    folder = work / f"edit-{n}"
    index = folder / "index"
    cli = [sys.executable, "-m", "atlas"]
    built = {}
    if not (index / "manifest.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        base = corpus_vectors(args, retriever, corpus_texts, work)
        rng = np.random.default_rng([args.seed, 7])
        drawn = rng.integers(0, len(corpus_texts), size=n)
        with (folder / "docs.jsonl").open("w", encoding="utf-8") as out:
            out.writelines(
                json.dumps({"id": f"x{i:09d}", "title": "", "text": corpus_texts[d]}) + "\n"
                for i, d in enumerate(drawn)
            )
        vectors = np.empty((n, base.shape[1]), dtype=np.float16)
        for start in range(0, n, 100_000):
            block = base[drawn[start : start + 100_000]]
            block = block + rng.standard_normal(block.shape, dtype=np.float32) * (0.3 / np.sqrt(block.shape[1]))
            vectors[start : start + 100_000] = block / np.linalg.norm(block, axis=1, keepdims=True)
        np.save(folder / "vectors.npy", vectors)
        write_encoder_record(folder / "vectors.npy", EncoderRecord.of(retriever, "minilm"))
        for name, argv in (
            (
                "corpus prepare",
                [
                    "corpus",
                    "prepare",
                    str(folder / "docs.jsonl"),
                    "--out",
                    str(folder / "corpus"),
                    "--chunk-words",
                    "0",
                ],
            ),
            (
                "index build (given vectors)",
                ["index", "build", "--corpus", str(folder / "corpus"), "--vectors", str(folder / "vectors.npy")]
                + ["--out", str(index), "--spec", "Flat"],
            ),
        ):
            started = time.perf_counter()
            subprocess.run(cli + argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            built[name] = round(time.perf_counter() - started, 1)
    rng = np.random.default_rng([args.seed, 8])
    results = {}
    for precision in ("fp32", "auto"):
        added = folder / f"add-{precision}.jsonl"
        drawn = rng.integers(0, len(corpus_texts), size=1000)
        added.write_text(
            "".join(
                json.dumps({"id": f"new-{precision}-{i}", "title": "", "text": corpus_texts[d]}) + "\n"
                for i, d in enumerate(drawn)
            )
        )
        argv = ["index", "add", "--index", str(index), "--corpus", str(added), "--no-compact", "--precision", precision]
        started = time.perf_counter()
        subprocess.run(cli + argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        results[precision] = {"wall_s": round(time.perf_counter() - started, 2)}
        print(json.dumps({f"add 1,000 at {precision}": results[precision]}), flush=True)
    results["auto"]["vs_fp32"] = round(results["fp32"]["wall_s"] / results["auto"]["wall_s"], 2)
    return {"rows": n, "index": "Flat (exact), from given vectors", "setup_s": built, "add_1000": results}


def save(out: Path, report: dict) -> None:
    """Write `report` over the parts it measured of the JSON at `out` (atomic)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out.read_text()) if out.is_file() else {}
    out.with_suffix(".tmp").write_text(json.dumps({**previous, **report}, indent=1) + "\n")
    out.with_suffix(".tmp").replace(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {', '.join(PARTS)}")
    parser.add_argument("--sample", type=int, default=512, help="passages embedded per path")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats per embedding path (the best counts)")
    parser.add_argument("--questions", type=int, default=96, help="SQuAD dev questions read per setting")
    parser.add_argument("--edit-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--recall-candidates", type=int, default=30, help="fp32 top passages per question embedded in emulated bf16"
    )
    parser.add_argument(
        "--baseline-ref", help="a commit whose fp32 reading is measured on the same questions in this run (`read`)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-speed")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu" / "speed.json")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts {args.parts!r}: choose from {', '.join(PARTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    from atlas.quiet import quiet_libraries
    from common.modeling import encoder_source
    from retriever.corpus import Corpus
    from retriever.retriever import Retriever

    args.work.mkdir(parents=True, exist_ok=True)
    with quiet_libraries():
        retriever = Retriever.from_pretrained(encoder_source("minilm")).eval()
    corpus = Corpus.load(ensure_nq824_corpus(NQ824_RUN / "corpus"))
    corpus_texts = [retriever.format_passage(p) for p in corpus.rows(np.arange(len(corpus)))]
    sample = np.sort(np.random.default_rng(args.seed).choice(len(corpus_texts), size=args.sample, replace=False))
    report = {
        "command": "bench/speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
    }
    print(json.dumps(report["machine"]), flush=True)
    report["roofline"] = part_roofline(args)  # every part's share of the machine's limit is taken against it
    args.roofline = report["roofline"]["roofline_gflops"]
    print(json.dumps(report["roofline"]), flush=True)
    setup = None
    for part in parts:
        print(f"--- {part}", flush=True)
        if part == "embed":
            report["embed"] = part_embed(args, retriever, [corpus_texts[i] for i in sample], args.work)
        elif part == "recall":
            report["recall"] = part_recall(args, retriever, corpus_texts, args.work)
        elif part in ("read", "profile"):
            setup = setup or reading_setup(args, retriever)
            report[part] = (part_read if part == "read" else part_profile)(args, setup)
        elif part == "edit":
            report["edit"] = part_edit(args, retriever, corpus_texts, args.work)
        save(args.out, report)  # after every part: a long run stopped keeps what it measured
    again = part_roofline(args)  # measured again at the end: the larger of the two is the machine's limit
    if again["roofline_gflops"] > args.roofline:
        report["roofline"] = {**again, "measured": "at the end of the run (larger than at its start)"}
        args.roofline = again["roofline_gflops"]
        for result in report.get("embed", {}).get("paths", {}).values():
            result["roofline_share"] = round(result["useful_gflops"] / args.roofline, 3)
        if "profile" in report:
            profile = report["profile"]
            profile["encoder_roofline_share"] = round(profile["encoder_useful_gflops"] / args.roofline, 3)
        save(args.out, report)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
