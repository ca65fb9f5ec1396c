"""Data converters behind `atlas data`: nq824 → KILT, KILT's knowledge source → corpus documents,
and a seeded train/evaluation split of one file.

- `nq824_to_kilt` writes nq824 (`../shared/data/nq824`: 820 gold paragraphs, 64 training and 578
  dev questions) in KILT's native format, each question's gold paragraph as its provenance, plus
  the knowledge source the index is built from, in which every passage carries the `wikipedia_id`
  the provenance names. KILT's scorer then finds real pages: R-precision, recall@k and KILT-EM mean
  something offline, and EM equals `atlas evaluate --task qa` on the same questions.
- `kilt_knowledge_documents` turns KILT's Wikipedia knowledge source (`kilt_knowledgesource.json`,
  one page per line with its paragraphs as a list) into the `{id, title, text, wikipedia_id}`
  documents `atlas corpus prepare` reads.
- `split_file` cuts one JSON-lines file into disjoint `train.jsonl` / `dev.jsonl` (a seeded sample
  of N records for training, the rest, in file order, for evaluation): a recipe's training and
  evaluation files never share an example (`tasks.data_checks.check_task_data` refuses those that do).

Every writer is atomic: a bad record raises `InputError` (file, line, field) and nothing is left.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.io import InputError, atomic_directory, read_jsonl, require_str, write_jsonl

NQ824_FILES = {"train": "train-64.jsonl", "dev": "dev.jsonl"}


@dataclass
class KiltConversion:
    """What `nq824_to_kilt` wrote: questions per split and documents in the knowledge source."""

    train: int
    dev: int
    gold_documents: int
    distractor_documents: int
    out: Path


def _documents(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """`(line, {id, title, text, wikipedia_id})` per record of a documents file. The page id is the
    record's own `wikipedia_id`, else its `id`: one document = one page."""
    for line, record in read_jsonl(path):
        doc_id = require_str(record, "id", path, line).strip()
        if not doc_id:
            raise InputError(path, line, "id", "empty id")
        text = require_str(record, "text", path, line)
        if not text.strip():
            raise InputError(path, line, "text", "the text is empty")
        page = require_str(record, "wikipedia_id", path, line, optional=True).strip()
        title = require_str(record, "title", path, line, optional=True)
        yield line, {"id": doc_id, "title": title, "text": text, "wikipedia_id": page or doc_id}


def _nq824_record(record: dict, path: Path, line: int, example_id: str, documents: dict[str, dict]) -> dict:
    """One nq824 question → a KILT record: one output per gold answer, each with the gold paragraph
    as provenance (KILT's NQ files give every answer its evidence the same way)."""
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise InputError(path, line, "question", "missing or empty")
    answers = record.get("answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise InputError(path, line, "answers", "expected a non-empty list of non-empty strings")
    gold = require_str(record, "gold_doc", path, line).strip()
    if gold not in documents:
        raise InputError(path, line, "gold_doc", f"'{gold}' is not a document of documents.jsonl")
    document = documents[gold]
    # each nq824 document is one paragraph of its page: paragraph 0, the whole of its text
    provenance = {
        "wikipedia_id": document["wikipedia_id"],
        "title": document["title"],
        "start_paragraph_id": 0,
        "start_character": 0,
        "end_paragraph_id": 0,
        "end_character": len(document["text"]),
    }
    outputs = [{"answer": answer, "provenance": [provenance]} for answer in dict.fromkeys(answers)]
    return {"id": example_id, "input": question.strip(), "output": outputs}


def nq824_to_kilt(
    nq824: str | os.PathLike,
    out: str | os.PathLike,
    *,
    distractors: Sequence[str | os.PathLike] = (),
    overwrite: bool = False,
) -> KiltConversion:
    """Write nq824 in KILT format under `out` (atomically): `train.jsonl` (the 64 training
    questions, ids `nq824-train-N`), `dev.jsonl` (the 578 dev questions, `nq824-dev-N`, N = the
    0-based line of the source file) and `knowledge.jsonl`, the knowledge source for
    `atlas corpus prepare`: the 820 paragraphs, `wikipedia_id` = their nq824 id (the provenance's),
    then the `distractors` documents (e.g. WikiText-2's articles), each its own page.

    Every retrieved passage thus names a page, so that R-precision ranks the gold page among all
    the pages retrieved, distractors included.
    """
    nq824 = Path(nq824)
    documents: dict[str, dict] = {}
    first: dict[str, str] = {}  # document id → where it was first seen

    def read_documents(path: Path) -> None:
        for line, doc in _documents(path):
            if doc["id"] in documents:
                raise InputError(path, line, "id", f"duplicate document id '{doc['id']}' (first at {first[doc['id']]})")
            documents[doc["id"]] = doc
            first[doc["id"]] = f"{path}:{line}"

    read_documents(nq824 / "documents.jsonl")
    gold = len(documents)
    splits = {}
    for split, name in NQ824_FILES.items():
        path = nq824 / name
        splits[split] = [
            _nq824_record(record, path, line, f"nq824-{split}-{n}", documents)
            for n, (line, record) in enumerate(read_jsonl(path))
        ]
    for path in distractors:  # read after the questions: a question's gold_doc must be one of nq824's own
        read_documents(Path(path))
    with atomic_directory(out, overwrite=overwrite) as tmp:
        for split, records in splits.items():
            write_jsonl(tmp / f"{split}.jsonl", records)
        write_jsonl(tmp / "knowledge.jsonl", documents.values())
    return KiltConversion(len(splits["train"]), len(splits["dev"]), gold, len(documents) - gold, Path(out))


# ----------------------------------------------------------------------------- KILT Wikipedia


def _page_text(paragraphs: list[str]) -> str:
    """A KILT page's paragraphs after the title (paragraph 0) as one text: section headings
    (`Section::::…`) dropped, bullet markers (`BULLET::::- `) removed."""
    kept = []
    for paragraph in paragraphs[1:]:
        paragraph = paragraph.strip()
        if not paragraph or paragraph.startswith("Section::::"):
            continue
        kept.append(paragraph.removeprefix("BULLET::::- ").strip())
    return " ".join(kept)


def kilt_knowledge_documents(source: str | os.PathLike) -> Iterator[dict[str, str]]:
    """KILT's knowledge source (`{"wikipedia_id", "wikipedia_title", "text": [paragraphs…]}` per
    line) → one `{id, title, text, wikipedia_id}` document per page with any text (id = page id)."""
    for line, record in read_jsonl(source):
        page = require_str(record, "wikipedia_id", source, line).strip()
        title = require_str(record, "wikipedia_title", source, line, optional=True)
        paragraphs = record.get("text")
        if not isinstance(paragraphs, list) or not all(isinstance(p, str) for p in paragraphs):
            raise InputError(source, line, "text", "expected a list of paragraph strings")
        text = _page_text(paragraphs)
        if text:
            yield {"id": page, "title": title, "text": text, "wikipedia_id": page}


def write_kilt_knowledge(source: str | os.PathLike, out: str | os.PathLike) -> int:
    """`kilt_knowledge_documents(source)` written to `out` as JSON lines, atomically → pages written."""
    return write_jsonl(out, kilt_knowledge_documents(source))


# ----------------------------------------------------------------------------- splitting


def split_file(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    train: int,
    seed: int = 0,
    prefix: str = "",
    overwrite: bool = False,
) -> tuple[int, int]:
    """Split a JSON-lines file into `out/{prefix}train.jsonl` (a seeded sample of `train` records, in
    file order) and `out/{prefix}dev.jsonl` (every other record), atomically → (train, dev) counts.
    (A KILT dataset is read from its file name: `--prefix hotpotqa-` keeps it.)

    Records are copied as they are (every line must be a JSON object); the split is by record, so
    two identical records can still land on both sides, which a recipe's overlap check reports.
    """
    records: list[dict[str, Any]] = [record for _, record in read_jsonl(path)]
    if not 0 < train < len(records):
        raise ValueError(
            f"{path}: --train must be between 1 and {len(records) - 1} "
            f"(the file has {len(records)} records), got {train}"
        )
    chosen = set(random.Random(seed).sample(range(len(records)), train))
    with atomic_directory(out, overwrite=overwrite) as tmp:
        write_jsonl(tmp / f"{prefix}train.jsonl", (r for n, r in enumerate(records) if n in chosen))
        write_jsonl(tmp / f"{prefix}dev.jsonl", (r for n, r in enumerate(records) if n not in chosen))
    return train, len(records) - train
