"""`atlas quickstart`: the whole system on the shipped demo (or your documents) in minutes, offline.

prepare the corpus → build the MiniLM index → few-shot fine-tune the shipped `atlas-reader`
(and, with a retriever loss, the query encoder) → evaluate on held-out questions (EM, F1, answer recall@k) → answer three
questions with their evidence → edit facts in up to 25 passages, update the index with the same
`add_passages` that `atlas index add` runs (old versions removed in the same commit), and ask again: the share of
answers that follow the new text with no retraining is reported. Everything lands in one output folder:

    OUT/corpus/  OUT/index/  OUT/train/ (checkpoint, log, evaluations)  OUT/edit/
    OUT/report.json  OUT/report.md
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from atlas.config import AtlasConfig, load_config
from tasks.counterfactual import replace_fact
from tasks.io import atomic_write_json, atomic_write_text, read_jsonl, write_jsonl
from tasks.metrics import has_answer, normalize_answer

DEMO = Path(__file__).resolve().parent
SHIPPED_READER = DEMO / "atlas-reader"
RECIPE = DEMO / "quickstart.yaml"
# Small enough for CI (about a minute on 2 cores): fewer shots, steps, passages and questions.
TINY_OVERRIDES = ["task.shots=16", "training.steps=6", "training.warmup_steps=1", "training.batch_size=2",
                  "reader.text_maxlength=96",
                  "evaluation.max_examples=8", "evaluation.retrieval_k=[1,2]", "training.log_every=1"]
MAX_USER_TRAIN = 64


@dataclass
class QuickstartData:
    """What one quickstart run reads: documents to index, training and held-out questions."""

    documents: list[Path]
    train: Path
    heldout: Path


def demo_data() -> QuickstartData:
    """The shipped demo: the fictional encyclopedia and its train / held-out questions."""
    return QuickstartData([DEMO / "encyclopedia.jsonl"], DEMO / "train.jsonl", DEMO / "heldout.jsonl")


def user_data(docs: Path, questions: Path | None, out: Path, seed: int = 0) -> QuickstartData:
    """The user's documents. With `questions` (QA jsonl about them), a seeded split: up to 64 to
    fine-tune on, the rest held out. Without, the reader is fine-tuned on the demo's questions over
    an index of both corpora and evaluated on the demo's held-out questions."""
    if questions is None:
        demo = demo_data()
        return QuickstartData([Path(docs), *demo.documents], demo.train, demo.heldout)
    records = [record for _, record in read_jsonl(questions)]
    if len(records) < 4:
        raise ValueError(f"{questions}: need at least 4 questions to fine-tune and evaluate, got {len(records)}")
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_train = min(MAX_USER_TRAIN, len(records) // 2)
    split = out / "questions"
    split.mkdir(parents=True, exist_ok=True)
    write_jsonl(split / "train.jsonl", [records[i] for i in sorted(order[:n_train])])
    write_jsonl(split / "heldout.jsonl", [records[i] for i in sorted(order[n_train:])])
    return QuickstartData([Path(docs)], split / "train.jsonl", split / "heldout.jsonl")


def quickstart_config(out: Path, data: QuickstartData, *, tiny: bool = False, reader: str | Path | None = None,
                      overrides: list[str] = ()) -> AtlasConfig:
    """The recipe `atlas/demo/quickstart.yaml` with its paths pointed into `out`."""
    reader = str(reader or SHIPPED_READER)
    reader = str(Path(reader).resolve()) if Path(reader).exists() else reader  # else a preset name
    paths = [f"reader.model={reader}", f"index.path={(out / 'index').resolve()}",
             f"task.train_data=[{data.train.resolve()}]", f"task.eval_data=[{data.heldout.resolve()}]",
             f"training.output_dir={(out / 'train').resolve()}"]
    return load_config(RECIPE, [*paths, *(TINY_OVERRIDES if tiny else []), *overrides])


def answer_with_evidence(model, examples, n_evidence: int = 3) -> list[dict]:
    """Answer each example; → [{"question", "answer", "gold", "evidence": [{id, title, text, score}]}]."""
    answers, passages = model.predict(examples)
    shown = []
    for example, answer, read in zip(examples, answers, passages or [[]] * len(examples)):
        shown.append({"question": example.metadata.get("question", example.query), "answer": answer,
                      "gold": example.answers,
                      "evidence": [{k: p.get(k) for k in ("id", "title", "text", "score")} for p in read[:n_evidence]]})
    return shown


def edit_passages(model, index_path: Path, edits: list[tuple[dict, str, str]], work: Path,
                  progress: bool = True) -> list[dict]:
    """Change `old` to `new` in each `(passage, old, new)` of `edits` (distinct passages) and update
    the index in place in one commit that removes the old versions and adds the new ones (same
    ids; a crash leaves all edits or none), then reload it into `model`.

    Uses `retriever.index_update.add_passages`, the function behind `atlas index add`.
    → per edit {"id", "before", "after"} (the passage text before and after).
    """
    from retriever.index import PassageIndex
    from retriever.index_update import add_passages

    ids = [passage["id"] for passage, _, _ in edits]
    if len(set(ids)) != len(ids):
        raise ValueError("edit_passages: each passage may be edited once per call")
    edited = [{"id": passage["id"], "title": passage.get("title", ""), "text": replace_fact(passage["text"], old, new)}
              for passage, old, new in edits]
    work.mkdir(parents=True, exist_ok=True)
    edited_file = work / f"edited-{len(list(work.glob('edited-*.jsonl')))}.jsonl"
    write_jsonl(edited_file, edited)
    add_passages(index_path, [edited_file], model.retriever, chunk_words=0, progress=progress, remove=ids)
    model.index = PassageIndex.load(index_path, retriever=model.retriever)
    return [{"id": e["id"], "before": passage["text"], "after": e["text"]} for (passage, _, _), e in zip(edits, edited)]


def edit_passage(model, index_path: Path, passage: dict, old: str, new: str, work: Path,
                 progress: bool = True) -> dict:
    """`edit_passages` for one passage: → {"id", "before", "after"}."""
    return edit_passages(model, index_path, [(passage, old, new)], work, progress=progress)[0]


def pick_edit(examples, predictions: list[str], passages: list[list[dict]], relations: list[str | None]):
    """A question whose top passage holds its answer — preferably one the reader got right — and a
    replacement answer: another question's answer of the same relation (or any other answer) that
    the passage does not contain. → (example index, replacement) or None."""
    chosen = pick_edits(examples, predictions, passages, relations, 1)
    return chosen[0] if chosen else None


def pick_edits(examples, predictions: list[str], passages: list[list[dict]], relations: list[str | None],
               n: int) -> list[tuple[int, str]]:
    """Up to `n` edits as `pick_edit` chooses them, each on another top passage (questions the reader
    got right first, then the others whose top passage holds the answer). → [(example index, replacement)]."""
    answers = [e.answers[0] for e in examples]

    def grounded(i: int) -> bool:
        return bool(passages[i]) and has_answer([answers[i]], passages[i][0]["text"])

    right = [i for i in range(len(examples)) if normalize_answer(predictions[i]) == normalize_answer(answers[i])]
    order = [i for i in right if grounded(i)] + [i for i in range(len(examples)) if grounded(i) and i not in right]
    chosen: list[tuple[int, str]] = []
    used: set = set()
    for i in order:
        if len(chosen) == n:
            break
        passage = passages[i][0]
        if passage.get("id", id(passage)) in used:
            continue
        same_kind = [a for j, a in enumerate(answers) if relations[j] is not None and relations[j] == relations[i]]
        for candidate in same_kind + answers:
            if normalize_answer(candidate) != normalize_answer(answers[i]) and not has_answer([candidate], passage["text"]):
                chosen.append((i, candidate))
                used.add(passage.get("id", id(passage)))
                break
    return chosen


def _metrics_row(name: str, metrics: dict, ks: list[int]) -> dict:
    return {"model": name, "exact_match": 100 * metrics["exact_match"], "f1": 100 * metrics["f1"],
            **{f"answer_recall@{k}": 100 * metrics.get(f"answer_recall@{k}", float("nan")) for k in ks}}


def format_table(rows: list[dict]) -> str:
    """A Markdown table of metric rows (the first key is the row label, numbers to one decimal)."""
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    return "\n".join(lines)


def summary_lines(rows: list[dict], edit: dict) -> str:
    """What the reader got right, in two sentences for the report."""
    before, after = rows
    lines = [(f"Held-out exact match {before['exact_match']:.1f}% before fine-tuning, "
              f"{after['exact_match']:.1f}% after ({after['model']}).")]
    if edit.get("done"):
        lines.append(f"After editing {edit['edited']} facts in the corpus and updating the index (no retraining), "
                     f"{edit['followed']} answers ({edit['follow_rate']:.0f}%) follow the new text.")
    return " ".join(lines)


def run_quickstart(out: str | Path, *, docs: str | Path | None = None, questions: str | Path | None = None,
                   tiny: bool = False, reader: str | Path | None = None, overrides: list[str] = (),
                   n_edits: int = 25, progress: bool = True, echo: Callable[[str], None] = print) -> dict:
    """Run every quickstart step into the folder `out` (created; must not exist yet); → the report.

    `n_edits`: how many facts (on distinct passages) are edited at the last step (4 with `tiny`)."""
    from atlas.build import build_atlas
    from atlas.evaluate import evaluate, predict_generation
    from atlas.training.checkpoint import checkpoint_config
    from atlas.training.loop import train
    from retriever.corpus import prepare_corpus
    from retriever.encoder import build_retriever
    from retriever.index_build import build_index
    from tasks.base import get_task

    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists (choose another --out)")
    out.mkdir(parents=True)
    started = time.perf_counter()
    timings: dict[str, float] = {}

    def stage(name: str, since: float) -> float:
        timings[name] = round(time.perf_counter() - since, 1)
        return time.perf_counter()

    n_edits = min(n_edits, 4) if tiny else n_edits
    data = demo_data() if docs is None else user_data(Path(docs), Path(questions) if questions else None, out)
    config = quickstart_config(out, data, tiny=tiny, reader=reader, overrides=overrides)
    echo(f"[1/6] preparing the corpus from {', '.join(str(d) for d in data.documents)}")
    t = time.perf_counter()
    stats = prepare_corpus(data.documents, out / "corpus", chunk_words=100, progress=progress)
    echo(f"      {stats.documents} documents → {stats.passages} passages")
    t = stage("prepare", t)
    echo("[2/6] building the MiniLM index")
    retriever = build_retriever(config.retriever)
    build_index(out / "corpus", retriever, out / "index", spec=config.index.spec, batch_size=config.retriever.batch_size,
                progress=progress, encoder_source=config.retriever.model)
    del retriever
    t = stage("index", t)

    task = get_task(config.task.name, **config.task.options)
    ks = config.evaluation.retrieval_k
    reader_name = Path(config.reader.model).name
    echo(f"[3/6] evaluating {reader_name} before fine-tuning on {data.heldout.name}")
    before = evaluate(build_atlas(config), task, data.heldout, config.evaluation, out_dir=out / "eval-before")
    t = stage("eval_before", t)
    shots = config.task.shots or sum(1 for _ in read_jsonl(data.train))
    trained = "reader + query encoder" if config.retriever.loss != "none" else "reader (retriever frozen)"
    echo(f"[4/6] fine-tuning the {trained} on {shots} questions, {config.training.steps} steps")
    summary = train(config, progress=progress)
    after = summary["eval"]
    t = stage("train_and_eval", t)
    rows = [_metrics_row(f"{reader_name}, no fine-tuning", before, ks),
            _metrics_row(f"{reader_name}, {shots}-shot fine-tuned", after, ks)]
    table = format_table(rows)
    echo(table)

    echo("[5/6] answers with their evidence")
    checkpoint = Path(summary["checkpoint"])
    model = build_atlas(checkpoint_config(checkpoint), checkpoint=checkpoint)
    model.eval()
    examples = task.load(data.heldout)[: config.evaluation.max_examples]
    shown = answer_with_evidence(model, examples[:3])
    for item in shown:
        echo(f"  Q: {item['question']}\n  A: {item['answer']}   (gold: {' | '.join(item['gold'])})")
        for p in item["evidence"]:
            echo(f"     [{p['score']:.2f}] {p['title']}: {p['text'][:110]}…")
    t = stage("answers", t)

    echo(f"[6/6] editing up to {n_edits} facts in the corpus and updating the index (no retraining)")
    predictions, passages = predict_generation(model, task, examples, config.evaluation)
    predictions = [task.postprocess(e, p) for e, p in zip(examples, predictions)]
    relations = [r.get("relation") for _, r in read_jsonl(data.heldout)][: len(examples)]
    read = [ps[: config.reader.n_context] for ps in passages]
    choices = pick_edits(examples, predictions, read, relations, n_edits)
    edit: dict = {"done": False, "reason": "no held-out question has its answer in its top passage"}
    if choices:
        changes = edit_passages(model, out / "index", [(read[i][0], examples[i].answers[0], replacement)
                                                       for i, replacement in choices], out / "edit", progress=progress)
        asked = [examples[i] for i, _ in choices]
        new_answers, new_passages = model.predict(asked)
        facts = []
        for (i, replacement), change, new_answer, new_read in zip(choices, changes, new_answers, new_passages):
            facts.append({"question": examples[i].metadata.get("question"), "gold": examples[i].answers[0],
                          "old_answer": predictions[i],
                          "old_answer_right": normalize_answer(predictions[i]) == normalize_answer(examples[i].answers[0]),
                          "replacement": replacement, "new_answer": new_answer,
                          "follows_edit": normalize_answer(new_answer) == normalize_answer(replacement),
                          "edited_passage_retrieved": any(p["id"] == change["id"] for p in new_read), **change})
        followed = sum(f["follows_edit"] for f in facts)
        right = [f for f in facts if f["old_answer_right"]]
        edit = {"done": True, "edited": len(facts), "followed": followed,
                "follow_rate": 100 * followed / len(facts),
                "right_before": len(right), "follow_rate_right_before":
                    100 * sum(f["follows_edit"] for f in right) / len(right) if right else float("nan"),
                "retrieved_after": sum(f["edited_passage_retrieved"] for f in facts), **facts[0], "facts": facts}
        first = facts[0]
        echo(f"  Q: {first['question']}\n  before the edit: {first['old_answer']}\n"
             f"  edited passage {first['id']}: …{first['gold']} → {first['replacement']}…\n"
             f"  after the edit:  {first['new_answer']}   "
             f"({'follows the new text' if first['follows_edit'] else 'did not follow'})")
        echo(f"  {followed} of {len(facts)} edited facts are answered from the new text "
             f"({edit['follow_rate']:.0f}%; {len(right)} of them were answered right before the edit)")
    else:
        echo(f"  skipped: {edit['reason']}")
    stage("edit", t)

    report = {"out": str(out.resolve()), "tiny": tiny, "documents": [str(d) for d in data.documents],
              "passages": stats.passages, "shots": shots, "steps": config.training.steps,
              "table": rows, "answers": shown, "edit": edit, "timings_s": timings,
              "wall_s": round(time.perf_counter() - started, 1), "checkpoint": str(checkpoint)}
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", f"# atlas quickstart\n\n{summary_lines(rows, edit)}\n\n{table}\n\n"
                      f"```json\n{json.dumps({'edit': edit, 'timings_s': timings}, indent=2)}\n```\n")
    echo(summary_lines(rows, edit))
    echo(f"done in {report['wall_s']:.0f} s; everything is in {out}")
    return report
