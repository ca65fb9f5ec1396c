"""SQuAD v1.1 JSON → JSON lines whose every question carries the paragraphs a retriever ranks highest for it.

Each line is a `reading` task record `{id, question, title, context, answers: [{text, answer_start}],
distractors: [{title, text}, …]}`: the `distractors` are the other paragraphs of the same file that the
encoder (MiniLM by default, as atlas retrieves) scores highest for the question, best first, the gold
paragraph left out. A reader trained with `task.options.distractors: 4` on it reads the gold among 5
retrieved paragraphs, as `bench/reading.py` measures at K=5 and as nq824's questions read their top 5
(configs/reader-stages/reader-squad-stage10-gpu.yaml).

    python tools/squad_retrieved_distractors.py ../shared/data/squad/train-v1.1.json runs/squad-train-k5.jsonl
    python tools/squad_retrieved_distractors.py TRAIN OUT --distractors 4 --device cuda

Paragraphs and questions are embedded once each; the scores are taken a block of questions at a time.
Written atomically; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def squad_questions(path: Path) -> tuple[list[tuple[str, str]], list[dict]]:
    """The file's paragraphs as (title, text), and its questions, each with its paragraph's index."""
    from common.io import InputError

    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        articles = document["data"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(path, None, "data", f"not a SQuAD v1.1 JSON file ({error})") from None
    paragraphs, questions = [], []
    for article in articles:
        title = str(article.get("title", "")).replace("_", " ")
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                questions.append({**qa, "paragraph": len(paragraphs)})
            paragraphs.append((title, paragraph["context"]))
    return paragraphs, questions


def retrieved_distractors(question_vectors, paragraph_vectors, gold, n: int, block: int = 4096) -> list[list[int]]:
    """Per question, the `n` paragraphs of highest score (inner product) other than its gold one, best
    first. question_vectors (Q, D), paragraph_vectors (P, D) tensors, gold (Q,)."""
    import torch

    out = []
    for start in range(0, len(question_vectors), block):
        scores = question_vectors[start : start + block] @ paragraph_vectors.T  # (block, P)
        rows = torch.arange(scores.shape[0], device=scores.device)
        scores[rows, gold[start : start + block]] = -torch.inf
        out += torch.topk(scores, n, dim=1, sorted=True).indices.tolist()
    return out


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    from common.io import write_jsonl
    from common.modeling import encoder_source
    from retriever.retriever import Retriever

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("squad", type=Path, help="SQuAD v1.1 JSON (e.g. train-v1.1.json)")
    parser.add_argument("out", type=Path, help="JSON lines to write")
    parser.add_argument("--distractors", type=int, default=4, help="paragraphs listed per question (default 4)")
    parser.add_argument("--encoder", default="minilm", help="retriever encoder (default minilm)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    if args.distractors < 1:
        parser.error("--distractors must be at least 1")
    import torch

    paragraphs, questions = squad_questions(args.squad)
    retriever = Retriever.from_pretrained(encoder_source(args.encoder)).to(args.device).eval()
    print(f"{len(questions):,} questions, {len(paragraphs):,} paragraphs", file=sys.stderr)
    passages = [{"title": title, "text": text} for title, text in paragraphs]
    paragraph_vectors = torch.from_numpy(
        retriever.embed_passages(passages, batch_size=args.batch_size, progress=True)
    ).to(args.device)
    question_vectors = torch.from_numpy(
        retriever.embed_queries([q["question"] for q in questions], batch_size=args.batch_size)
    ).to(args.device)
    gold = torch.tensor([q["paragraph"] for q in questions], device=args.device)
    ranked = retrieved_distractors(question_vectors, paragraph_vectors, gold, args.distractors)

    def records():
        for question, others in zip(tqdm(questions, desc="records", file=sys.stderr), ranked, strict=True):
            title, context = paragraphs[question["paragraph"]]
            yield {
                "id": question["id"],
                "question": question["question"],
                "title": title,
                "context": context,
                "answers": question["answers"],
                "distractors": [passages[i] for i in others],
            }

    written = write_jsonl(args.out, records())
    print(f"wrote {args.out} ({written:,} questions, {args.distractors} distractors each)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from atlas.quiet import quiet_libraries

    with quiet_libraries():  # transformers' load report of MiniLM, as the CLI hides it
        raise SystemExit(main())
