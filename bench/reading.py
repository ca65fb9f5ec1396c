"""Does the reader read? SQuAD v1.1 dev, official EM / F1, with the gold paragraph (K=1) and with the
gold among K=5 passages (4 distractors retrieved by MiniLM from all dev paragraphs, gold slot shuffled).

Readers compared in the same run: the shipped reader (atlas/demo/atlas-reader) and any others given
with --reader NAME=DIR (e.g. the retired atlas-mini exported from git history, or a checkpoint's
reader/ folder at equal training steps), each with every decoding of --decodings: `plain` (beam
search, Hugging Face's length penalty 1.0: the baseline), `lp0` (length penalty 0: hypotheses ranked
by log-probability alone) and `span` (length penalty 0, answers constrained to spans of the passages
read: `inference.span_answers`; `span-lp0.5` the same with length penalty 0.5), at every precision of
--precisions (`fp32`; `bf16`: the encoder pass under bfloat16 autocast; `int8`: the decoder and LM head with
int8 weights, `reader.int8_decoding`; `bf16-int8`: both; `auto`: int8 on a CPU; `inference.precision`),
every beam width of --beams (4 = the recipes' beam search, 1 = greedy) and every beam path of
--beam-paths (`folded`: what `FiDReader.generate` does, keys/values of each example's passages
projected and read once for all its beams, `reader.beam_attention`, and the decoder reading only the
passages' real tokens, packed, `FiDReader.fuse_packed`; `unpacked`: the baseline before packing, the
padded K·L layout, the copy head pointing into every beam's copy; `repeated`: the baseline before
`reader.beam_attention` too, T5 projecting and reading every beam's copy). Also measured: reader
inference throughput (questions/s at K=5, batch 16, this machine's threads) and, per row, its ratio to
the `unpacked`, `repeated` and `rowwise` rows of the same reader and settings. With --retrieval-priors, each K=5 reading
is repeated at each weight of the retrieval prior (`inference.retrieval_prior`: the copy head weighs the
passages' MiniLM scores for the question; readers with a copy head).

    .venv/bin/python bench/reading.py                                   # 1000 seeded dev questions
    .venv/bin/python bench/reading.py --reader atlas-mini=runs/atlas-mini --max-dev 300
    .venv/bin/python bench/reading.py --decodings span --precisions fp32,bf16 --max-dev 300
    .venv/bin/python bench/reading.py --decodings span --beam-paths folded,unpacked,repeated --beams 4,1 --max-dev 300
    .venv/bin/python bench/reading.py --decodings span --precisions bf16 --retrieval-priors 0,1 --max-dev 300
Prints a JSON object, then a table. Never runs in the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import random
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from reader.int8_decoding import ANSWERING_PRECISIONS  # after the path: the bench runs as a script
from tasks.passage import Passage  # as above

SQUAD_DEV = REPO_ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.json"
SHIPPED = REPO_ROOT / "atlas" / "demo" / "atlas-reader"
DECODINGS = {
    "plain": {"length_penalty": 1.0, "span_answers": False},
    "lp0": {"length_penalty": 0.0, "span_answers": False},
    "span": {"length_penalty": 0.0, "span_answers": True},
    "span-lp0.5": {"length_penalty": 0.5, "span_answers": True},
}
PRIOR_TEMPERATURE = 0.1  # retriever.temperature_score of the nq824 recipe, whose retrieval prior this checks
BEAM_PATHS = ("folded", "unpacked", "repeated", "rowwise", "host")
TARGETS = {"k1_exact_match": 60.0, "k1_f1": 70.0, "k5_gap_em": 10.0, "k5_questions_per_s": 20.0}


def distractor_passages(examples, pool, retriever, k: int, seed: int) -> list[list[Passage]]:
    """Per example: its gold paragraph and the k-1 other paragraphs of `pool` (examples whose gold
    paragraphs form the corpus) that MiniLM ranks highest for its question, in a seeded shuffled order,
    each with its MiniLM `score` for the question (what a retrieval prior weighs)."""
    import dataclasses

    import numpy as np

    paragraphs = sorted({e.passages[0].text: e.passages[0].title for e in pool}.items())
    vectors = retriever.embed_passages([{"title": title, "text": text} for text, title in paragraphs])
    queries = retriever.embed_queries([e.metadata["question"] for e in examples])
    scores = queries @ vectors.T
    row_of = {text: i for i, (text, _) in enumerate(paragraphs)}
    out = []
    for n, example in enumerate(examples):
        gold = dataclasses.replace(example.passages[0], score=float(scores[n, row_of[example.passages[0].text]]))
        order = np.argsort(-scores[n], kind="stable")
        others = [
            Passage(id=f"d{i}", title=paragraphs[i][1], text=paragraphs[i][0], score=float(scores[n, i]))
            for i in order
            if paragraphs[i][0] != gold.text
        ][: k - 1]
        passages = [gold, *others]
        random.Random(f"{seed}-{example.id}").shuffle(passages)
        out.append(passages)
    return out


@contextlib.contextmanager
def beam_path(name: str):
    """`folded`: generation as shipped. `unpacked`: as shipped before the passages' real tokens were
    packed (`FiDReader.fuse_packed`): the decoder reads the padded K·L layout and the copy head points
    into every beam's copy of it. `repeated`: the baseline before `reader.beam_attention` as well — an
    empty cache that T5 fills from every beam's copy of the encoder states (cross-attention keys/values
    projected and read beams times; only their reordering was skipped). `rowwise`: as shipped but for the
    span constraint, applied as transformers applies a `prefix_allowed_tokens_fn`, row by row (one
    device → host wait per beam per step) instead of on the device (`reader.span_constraint.DeviceSpanConstraint`).
    `host`: the span constraint a step at a time on the host (`StepPrefixConstraint`: one copy of the ids per
    step), as shipped before the device one."""
    if name == "folded":
        yield
        return
    from reader import fid

    if name in ("rowwise", "host"):
        from reader.span_constraint import StepPrefixConstraint

        shipped_kwargs = fid.constraint_kwargs
        fid.constraint_kwargs = (
            (lambda fn, _beams, _device: {"prefix_allowed_tokens_fn": fn} if fn else {})
            if name == "rowwise"
            else (lambda fn, beams, _device: {"logits_processor": [StepPrefixConstraint(fn, beams)]} if fn else {})
        )
        try:
            yield
        finally:
            fid.constraint_kwargs = shipped_kwargs
        return
    from transformers import DynamicCache

    from reader.beam_attention import BeamSharedCrossAttentionCache

    shipped_generate, shipped_source = fid.FiDReader.generate, fid.CopySource
    shipped_prefilled = BeamSharedCrossAttentionCache.__dict__["prefilled"]
    fid.FiDReader.generate = functools.partialmethod(shipped_generate, pack_passages=False)
    fid.CopySource = lambda *_args: None  # the copy head reads the beam-expanded states
    if name == "repeated":
        BeamSharedCrossAttentionCache.prefilled = classmethod(lambda cls, *_args: cls(DynamicCache(), DynamicCache()))
    try:
        yield
    finally:
        fid.FiDReader.generate, fid.CopySource = shipped_generate, shipped_source
        BeamSharedCrossAttentionCache.prefilled = shipped_prefilled


def read(
    reader,
    tokenizer,
    task,
    examples,
    passages,
    *,
    max_length: int,
    batch_size: int,
    beams: int,
    length_penalty: float = 1.0,
    span_answers: bool = False,
    precision: str = "fp32",
    retrieval_prior: float = 0.0,
) -> tuple[dict, float]:
    """Generate an answer for every example from its passages → (SQuAD metrics in %, questions/s),
    on the reader's device. `retrieval_prior`: w of `inference.retrieval_prior` over the passages' scores
    (τ = PRIOR_TEMPERATURE)."""
    import torch

    from atlas.model import ANSWER_SENTINEL, passage_log_prior, template_fields
    from reader.inputs import encode_reader_inputs
    from reader.span_constraint import PassageSpanConstraint
    from reader.surface import decode_answers

    device = next(reader.parameters()).device
    predictions, started = [], time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            batch_passages = passages[start : start + batch_size]
            read = template_fields(batch_passages)  # the reader's functions take text fields
            ids, mask = encode_reader_inputs(tokenizer, [e.query for e in chunk], read, max_length)
            ids, mask = ids.to(device), mask.to(device)
            constraint = (
                PassageSpanConstraint.from_passages(
                    tokenizer, read, answer_prefix=ANSWER_SENTINEL, vocab_size=reader.seq2seq.config.vocab_size
                )
                if span_answers
                else None
            )
            prior = (
                passage_log_prior(batch_passages, ids.shape[1], PRIOR_TEMPERATURE, retrieval_prior).to(device)
                if retrieval_prior
                else None
            )
            generated = reader.generate(
                ids,
                mask,
                max_length=24,
                num_beams=beams,
                length_penalty=length_penalty,
                prefix_allowed_tokens_fn=constraint,
                precision=precision,
                passage_log_prior=prior,
            )
            predictions += decode_answers(tokenizer, generated.cpu(), read)
    if device.type == "cuda":
        torch.cuda.synchronize()
    rate = len(examples) / (time.perf_counter() - started)
    return task.evaluate(examples, predictions), rate  # percent


def comma_list(text: str, convert=str) -> list:
    """The items of a comma-separated flag, each converted; [] where one does not convert."""
    try:
        return [convert(item) for item in text.split(",") if item.strip()]
    except ValueError:
        return []


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reader",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="another reader folder to compare (repeatable)",
    )
    parser.add_argument("--max-dev", type=int, default=1000, help="seeded sample of dev questions (0 = all 10,570)")
    parser.add_argument("--text-maxlength", type=int, default=320, help="reader tokens per (question, passage)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--beams",
        default="4",
        help="comma-separated beam search widths (1 = greedy); the first is the one the targets are judged at",
    )
    parser.add_argument(
        "--beam-paths",
        default="folded",
        help="comma-separated: folded (as shipped), unpacked (before packing the passages' real "
        "tokens), repeated (before folding the beams as well), rowwise (the span constraint row by row)",
    )
    parser.add_argument(
        "--decodings",
        default="plain,span",
        help=f"comma-separated decodings to measure each reader with ({', '.join(DECODINGS)})",
    )
    parser.add_argument(
        "--precisions",
        default="fp32",
        help=f"comma-separated inference precisions ({', '.join(ANSWERING_PRECISIONS)}: `inference.precision`); "
        "each reader × decoding runs at each, in the same run",
    )
    parser.add_argument(
        "--retrieval-priors",
        default="0",
        help="comma-separated inference.retrieval_prior weights (readers with a copy head): at K=5 the "
        "copy head weighs the passages' MiniLM scores, softmax(score / 0.1)^w (0 = none)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument(
        "--no-shipped",
        action="store_true",
        help="measure only the --reader folders (e.g. a new reader before it is exported)",
    )
    parser.add_argument("--k1-only", action="store_true", help="skip K=5 (a quick look at a checkpoint)")
    parser.add_argument(
        "-k",
        "--passages",
        type=int,
        default=5,
        help="passages read in the second setting: the gold among K-1 retrieved distractors",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, or auto (cuda where there is one)")
    parser.add_argument("--squad-dev", type=Path, default=SQUAD_DEV, help="SQuAD v1.1 dev JSON")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "bench-reading")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, the comma-separated ones checked and turned into lists (`beams`: the widths)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    decodings, precisions, beam_paths = (comma_list(f) for f in (args.decodings, args.precisions, args.beam_paths))
    widths, priors = comma_list(args.beams, int), comma_list(args.retrieval_priors, float)
    if not beam_paths or set(beam_paths) - set(BEAM_PATHS):
        parser.error(f"--beam-paths {args.beam_paths!r}: choose from {', '.join(BEAM_PATHS)}")
    if not widths or min(widths) < 1:
        parser.error(f"--beams {args.beams!r}: comma-separated positive integers")
    if not priors or min(priors) < 0:
        parser.error(f"--retrieval-priors {args.retrieval_priors!r}: comma-separated non-negative weights")
    if not precisions or set(precisions) - set(ANSWERING_PRECISIONS):
        parser.error(f"--precisions {args.precisions!r}: choose from {', '.join(ANSWERING_PRECISIONS)}")
    unknown = sorted(set(decodings) - set(DECODINGS))
    if unknown or not decodings:
        parser.error(f"--decodings: unknown {unknown}; choose from {list(DECODINGS)}")
    args.decodings, args.precisions, args.beam_paths = decodings, precisions, beam_paths
    args.beams, args.retrieval_priors = widths, priors
    return args


def reader_folders(args) -> dict[str, Path]:
    """Row name → reader folder: the shipped reader (unless --no-shipped or absent), then each --reader."""
    readers = {"shipped (atlas-reader)": SHIPPED} if (SHIPPED / "config.json").is_file() and not args.no_shipped else {}
    for item in args.reader:
        name, _, folder = item.partition("=")
        readers[name] = Path(folder)
    return readers


def row_name(reader_name: str, decoding: str, precision: str, beams: int, path: str, prior: float, first_width: int):
    name = reader_name if decoding == "plain" else f"{reader_name}+{decoding}"
    name = name if precision == "fp32" else f"{name}+{precision}"
    name = name if beams == first_width else f"{name}+{'greedy' if beams == 1 else f'beam{beams}'}"
    name = name if not prior else f"{name}+prior{prior:g}"
    return name if path == "folded" else f"{name}+{path}"  # last: the baselines' rows are name+path


def measure_reader(reader_name: str, folder: Path, args, task, examples, gold_only, with_distractors, device) -> dict:
    """Every reading of one reader (decodings × precisions × beams × beam paths × priors) → {row name: result};
    each printed as JSON as soon as it is measured."""
    from reader.fid import FiDReader
    from reader.tokenizer import build_reader_tokenizer

    reader, k1_done, results = FiDReader.from_pretrained(folder).eval().to(device), {}, {}
    tokenizer = build_reader_tokenizer(folder if (folder / "tokenizer.json").is_file() else None)
    runs = itertools.product(args.decodings, args.precisions, args.beams, args.beam_paths, args.retrieval_priors)
    for decoding, precision, beams, path, prior in runs:
        name = row_name(reader_name, decoding, precision, beams, path, prior, args.beams[0])
        settings = {"max_length": args.text_maxlength, "batch_size": args.batch_size, "beams": beams}
        settings |= {"precision": precision, **DECODINGS[decoding]}
        with beam_path(path):
            # K=1: one passage, a prior changes nothing; measured once per setting
            k1_setting = (decoding, precision, beams, path)
            if k1_setting not in k1_done:
                k1_done[k1_setting] = read(reader, tokenizer, task, examples, gold_only, **settings)[0]
            k5, rate = None, None  # None: not measured (null, - in the table)
            if not args.k1_only:
                k5, rate = read(reader, tokenizer, task, examples, with_distractors, **settings, retrieval_prior=prior)
        results[name] = {
            "folder": str(folder),
            "precision": precision,
            "beam_path": path,
            "decoding": {"beams": beams, **DECODINGS[decoding]},
            "retrieval_prior": prior,
            "k1": k1_done[k1_setting],
            "k5": k5,
            "k5_questions_per_s": rate,
        }
        print(json.dumps({name: results[name]}), flush=True)
    return results


def table_rows(results: dict, k: int) -> list[dict]:
    """Adds each result's `speedup_vs_<path>` (its K=k rate over that baseline row's) → the table's rows."""
    rows = []
    for name, result in results.items():
        rate = result["k5_questions_per_s"]
        for path in BEAM_PATHS[1:]:
            baseline = results.get(f"{name}+{path}", {}).get("k5_questions_per_s")
            result[f"speedup_vs_{path}"] = rate / baseline if rate and baseline else None
        k1, k5 = result["k1"], result["k5"]
        rows.append(
            {
                "reader": name,
                "EM K=1": k1["exact_match"],
                "F1 K=1": k1["f1"],
                f"EM K={k}": k5["exact_match"] if k5 else "-",
                f"F1 K={k}": k5["f1"] if k5 else "-",
                f"q/s K={k}": rate if rate is not None else "-",
                **{f"× {path}": result[f"speedup_vs_{path}"] or "-" for path in BEAM_PATHS[1:]},
            }
        )
    return rows


def targets_met(results: dict, k: int) -> dict:
    """{met_by, met}: the shipped reader judged against TARGETS; {} without a K=5 reading of it."""
    # judged with the decoding the shipped recipes use (atlas/demo/quickstart.yaml: inference.span_answers)
    judged = next((n for n in ("shipped (atlas-reader)+span", "shipped (atlas-reader)") if n in results), None)
    shipped = results.get(judged)
    if shipped is None or shipped["k5"] is None or k != 5:
        return {}
    met = {
        "k1_exact_match": shipped["k1"]["exact_match"] >= TARGETS["k1_exact_match"],
        "k1_f1": shipped["k1"]["f1"] >= TARGETS["k1_f1"],
        "k5_gap_em": shipped["k1"]["exact_match"] - shipped["k5"]["exact_match"] <= TARGETS["k5_gap_em"],
        "k5_questions_per_s": shipped["k5_questions_per_s"] >= TARGETS["k5_questions_per_s"],
    }
    return {"met_by": judged, "met": met}


def main(argv: list[str] | None = None) -> int:
    import torch

    from atlas.demo.quickstart import format_table
    from common.modeling import encoder_source
    from retriever.retriever import Retriever
    from tasks.base import get_task

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.squad_dev.is_file():
        print(f"skipped: {args.squad_dev} not found")
        return 0
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    k, task = args.passages, get_task("reading")
    everything = task.load(args.squad_dev)
    examples = everything
    if args.max_dev:
        examples = random.Random(args.seed).sample(everything, min(args.max_dev, len(everything)))
    retriever = Retriever.from_pretrained(encoder_source("minilm")).to(device)
    retriever.eval()
    gold_only = [e.passages for e in examples]
    with_distractors = None if args.k1_only else distractor_passages(examples, everything, retriever, k, args.seed)

    results = {}
    for reader_name, folder in reader_folders(args).items():
        results |= measure_reader(reader_name, folder, args, task, examples, gold_only, with_distractors, device)
    rows = table_rows(results, k)
    # "k5*" keys hold the K=--passages reading (5 unless asked otherwise: `passages` says which)
    report = {
        "dev_questions": len(examples),
        "passages": k,
        "device": str(device),
        "text_maxlength": args.text_maxlength,
        "beams": args.beams,
        "readers": results,
        "targets": TARGETS,
        **targets_met(results, k),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    from atlas.quiet import quiet_libraries

    with quiet_libraries():  # transformers' load report of MiniLM, as the CLI hides it
        raise SystemExit(main())
