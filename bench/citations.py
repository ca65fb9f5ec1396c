"""Where do the shipped reader's answers come from? Citations (`Answer.citations`) measured on nq824 dev (the reader
reading the top 5 passages MiniLM retrieves from nq824's 820 paragraphs cut into 100-word passages) and on SQuAD v1.1
dev (the gold paragraph read alone, K=1), and the effect of `inference.require_support` on nq824's EM / F1 (the
shipped reader answers with spans of the passages it read, `inference.span_answers`, so every answer is cited; the
same reader decoding freely is measured too).

    .venv/bin/python bench/citations.py                       # nq824 dev (578) and 1,000 seeded SQuAD dev questions
    .venv/bin/python bench/citations.py --max-squad 200 --max-nq 100 --out bench/results/cpu/citations.json

Per data set: the share of answers with a citation (supported); citation precision (the best-cited passage holds a
gold answer); the share whose best-cited passage is the gold passage (nq824: cut from the gold paragraph; SQuAD: the
paragraph); for wrong answers (EM 0) that are cited, the share whose cited passage held a right answer elsewhere (the
reader read the right passage and chose the wrong span); and a few examples of each kind. Prints JSON, then a table.
Never runs in the test suite; the data are read from ../shared/data and the bench says so where they are absent.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import atlas
from atlas.quiet import quiet_libraries
from tasks.base import Example
from tasks.citations import NO_ANSWER, find_citations
from tasks.metrics import max_exact_match, max_f1, percent
from tasks.passage import Passage

DATA = REPO_ROOT.parent / "shared" / "data"
EXAMPLES_PER_KIND = 3


def nq824(max_questions: int | None) -> tuple[list[dict], Path]:
    """nq824 dev questions {question, answers, gold_doc} and its documents file."""
    folder = DATA / "nq824"
    rows = [json.loads(line) for line in (folder / "dev.jsonl").open(encoding="utf-8")]
    return rows[:max_questions], folder / "documents.jsonl"


def squad(max_questions: int, seed: int = 0) -> list[dict]:
    """A seeded sample of SQuAD v1.1 dev questions {question, answers, title, context, pid}."""
    data = json.loads((DATA / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    rows = []
    for article in data:
        for n, paragraph in enumerate(article["paragraphs"]):
            for qa in paragraph["qas"]:
                rows.append(
                    {
                        "question": qa["question"],
                        "answers": [a["text"] for a in qa["answers"]],
                        "title": article["title"].replace("_", " "),
                        "context": paragraph["context"],
                        "pid": f"{article['title']}-{n}",
                    }
                )
    return random.Random(seed).sample(rows, min(max_questions, len(rows)))


def measure(rows: list[dict], answers: list, gold_passage) -> dict:
    """The citation figures of `answers` (`atlas.Answer`s) against `rows` (their gold answers); `gold_passage(row,
    passage_id)` says whether a passage is the row's gold passage."""
    kinds: dict[str, list] = {"supported right": [], "supported wrong, right answer in the cited passage": []}
    kinds |= {"supported wrong, not in the cited passage": [], "unsupported": []}
    cited = precise = gold = wrong_cited = wrong_right_there = 0
    em, f1, em_abstaining, f1_abstaining = [], [], [], []
    for row, answer in zip(rows, answers):
        right = max_exact_match(answer.text, row["answers"])
        em.append(right)
        f1.append(max_f1(answer.text, row["answers"]))
        abstained = answer.text if answer.supported else NO_ANSWER
        em_abstaining.append(max_exact_match(abstained, row["answers"]))
        f1_abstaining.append(max_f1(abstained, row["answers"]))
        example = {"question": row["question"], "answer": answer.text, "gold": row["answers"][:3]}
        if not answer.supported:
            kinds["unsupported"].append(example)
            continue
        cited += 1
        best = answer.citations[0]
        passage = next(p for p in answer.passages if p.id == best.passage_id)
        holds = any(find_citations(g, [passage]) for g in row["answers"])
        precise += holds
        gold += gold_passage(row, passage.id)
        example |= {"cited": f"{passage.id} {best.field}[{best.start}:{best.end}]", "quote": best.quote}
        if right:
            kinds["supported right"].append(example)
        else:
            wrong_cited += 1
            wrong_right_there += holds
            kind = (
                "supported wrong, right answer in the cited passage"
                if holds
                else "supported wrong, not in the cited passage"
            )
            kinds[kind].append(example)
    n = len(rows)
    return {
        "questions": n,
        "exact_match": percent(em),
        "f1": percent(f1),
        "supported": 100 * cited / n,
        "citation_precision": 100 * precise / max(cited, 1),
        "cited_gold_passage": 100 * gold / max(cited, 1),
        "wrong_cited": wrong_cited,
        "wrong_with_the_right_answer_in_the_cited_passage": 100 * wrong_right_there / max(wrong_cited, 1),
        "require_support": {"exact_match": percent(em_abstaining), "f1": percent(f1_abstaining)},
        "examples": {kind: found[:EXAMPLES_PER_KIND] for kind, found in kinds.items()},
    }


def nq824_report(args: argparse.Namespace, work: Path) -> dict:
    """nq824 dev: the reader's own settings (span-constrained), then the same reader decoding freely."""
    rows, documents = nq824(args.max_nq)
    index = atlas.Index.build(documents, work / "nq824-index", chunk_words=100, progress=False)
    is_gold = lambda row, pid: pid.rsplit("-", 1)[0] == row["gold_doc"]
    report = {}
    for name, overrides in (("nq824", []), ("nq824 free decoding", ["inference.span_answers=false"])):
        # free decoding (no span constraint) gives answers a passage may not hold: what require_support abstains on
        model = atlas.Atlas.from_pretrained("atlas-reader", index=index, overrides=overrides)
        started = time.perf_counter()
        answers = model.answer([r["question"] for r in rows], k=args.k, progress=False)
        report[name] = measure(rows, answers, is_gold) | {"k": args.k, "overrides": overrides}
        report[name]["seconds"] = round(time.perf_counter() - started, 1)
    return report


def squad_report(args: argparse.Namespace) -> dict:
    """SQuAD dev: the gold paragraph read alone, with the reader tokens bench/reading.py reads it with."""
    overrides = [f"inference.text_maxlength={args.squad_text_maxlength}"]
    model = atlas.Atlas.from_pretrained("atlas-reader", overrides=overrides)
    sample = squad(args.max_squad)
    examples = [
        Example(
            id=str(n),
            query=model.task.query(r["question"]),
            target=None,
            answers=[],
            passages=[Passage(id=r["pid"], title=r["title"], text=r["context"])],
        )
        for n, r in enumerate(sample)
    ]
    started = time.perf_counter()
    answers = model.answer_examples(examples, questions=[r["question"] for r in sample], progress=False)
    report = measure(sample, answers, lambda row, pid: pid == row["pid"]) | {"k": 1, "overrides": overrides}
    report["seconds"] = round(time.perf_counter() - started, 1)
    return {"squad": report}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-nq", type=int, default=None, help="nq824 dev questions (default: all 578)")
    parser.add_argument("--max-squad", type=int, default=1000, help="seeded SQuAD dev questions")
    parser.add_argument("-k", type=int, default=5, help="passages the reader reads on nq824")
    parser.add_argument(
        "--squad-text-maxlength",
        type=int,
        default=320,
        help="reader tokens per SQuAD (question, paragraph), as bench/reading.py",
    )
    parser.add_argument("--parts", default="nq824,squad", help="what to measure: nq824, squad or both")
    parser.add_argument("--out", help="also write the JSON here (merged into it where it holds other parts)")
    args = parser.parse_args()
    if not (DATA / "nq824").is_dir() or not (DATA / "squad" / "dev-v1.1.json").is_file():
        print(f"bench/citations.py: the data are not at {DATA} (nq824/, squad/dev-v1.1.json); nothing measured")
        return 2
    report: dict = {"command": "python bench/citations.py " + " ".join(sys.argv[1:]), "date": time.strftime("%F %H:%M")}
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as work, quiet_libraries(False):
        if "nq824" in parts:
            report |= nq824_report(args, Path(work))
        if "squad" in parts:
            report |= squad_report(args)
    if args.out and Path(args.out).is_file():  # the parts measured in another run are kept
        report = json.loads(Path(args.out).read_text(encoding="utf-8")) | report
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    header = f"{'':<20}{'EM':>6}{'F1':>6}{'cited':>7}{'precise':>9}{'gold':>6}"
    print(f"\n{header}{'wrong, right there':>20}{'EM/F1 abstaining':>18}")
    for name in [n for n in ("nq824", "nq824 free decoding", "squad") if n in report]:
        r = report[name]
        abstaining = f"{r['require_support']['exact_match']:.1f}/{r['require_support']['f1']:.1f}"
        print(
            f"{name:<20}{r['exact_match']:>6.1f}{r['f1']:>6.1f}{r['supported']:>7.1f}{r['citation_precision']:>9.1f}"
            f"{r['cited_gold_passage']:>6.1f}{r['wrong_with_the_right_answer_in_the_cited_passage']:>20.1f}{abstaining:>18}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
