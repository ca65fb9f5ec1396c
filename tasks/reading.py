"""Reading comprehension (SQuAD v1.1): question + the paragraph that holds the answer → answer.

Used as an intermediate stage that teaches a reader to read before few-shot fine-tuning, and
to measure reading (SQuAD-official EM/F1). Accepted inputs:
- the official SQuAD JSON `{data: [{title, paragraphs: [{context, qas: [{id, question,
  answers: [{text, answer_start}]}]}]}]}`;
- JSON lines `{id?, question, context, title?, answers: [{text, answer_start}] | [str], distractors?:
  [str | {title?, text}]}`.

Each example carries its passages (no retrieval): the gold paragraph and, with the option
`distractors: n`, n other paragraphs of the same article (the hardest negatives: same topic,
same names; in JSON lines, the first n of the record's `distractors`, e.g. a retriever's), in a
seeded shuffled order, so the reader learns to find the passage and not only to copy from one.
`max_words: n` cuts the gold paragraph to a seeded window of n words that holds the answer
(training inputs then match a corpus of ~100-word passages, and cost less).
`counterfactual: p` swaps, in a seeded share p of the training examples, the answer for another
training answer of the same kind in the passages and the target (`tasks.counterfactual`), so that the
reader learns to answer from the text even where it states something unexpected (edited corpora).

Bad records (missing field, empty context, an answer that is not in its context at
`answer_start`) raise an `InputError` naming the file, the record (`data[i].paragraphs[j]
.qas[k]` for SQuAD JSON, the line for JSON lines) and the field.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from common.io import InputError, read_jsonl, require_str
from tasks.base import Example, register_task
from tasks.counterfactual import answer_kind, counterfactual_example
from tasks.passage import Passage
from tasks.qa import QATask

logger = logging.getLogger(__name__)


def _window(context: str, start: int, end: int, max_words: int, rng: random.Random) -> str:
    """A window of at most `max_words` whitespace words of `context` that holds chars [start, end)."""
    words = context.split()
    if len(words) <= max_words:
        return context
    # a word starts at or before char p exactly when some of it lies in context[: p + 1]
    # (an answer whose span starts in the context's leading white space starts with its first word)
    first = max(len(context[: start + 1].split()) - 1, 0)  # the last word starting at or before the answer
    last = len(context[:end].split()) - 1  # the last word starting before the answer's end
    if last - first + 1 > max_words:
        return context
    low, high = max(0, last - max_words + 1), min(first, len(words) - max_words)
    begin = rng.randint(low, high)
    return " ".join(words[begin : begin + max_words])


@register_task("reading")
class ReadingTask(QATask):
    """SQuAD-style reading comprehension: QA's query/target templates, random gold answer per epoch
    and SQuAD-official EM / F1 (max over gold answers), with the passages given by the data."""

    default_options: ClassVar[dict[str, Any]] = {
        "query_template": "question: {question} answer: <extra_id_0>",
        "target_template": "<extra_id_0> {answer}",
        "max_words": 0,  # cut the gold paragraph to a window of this many words holding the answer; 0 = whole
        "distractors": 0,  # other paragraphs read beside the gold one (the article's; JSON lines: the record's)
        "counterfactual": 0.0,  # share of training examples whose answer is swapped in the text (and target)
        "seed": 0,
    }

    def __init__(self, **options: Any):
        super().__init__(**options)
        for key in ("max_words", "distractors"):
            value = self.options[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"task option {key} must be a non-negative integer, got {value!r}")
        share = self.options["counterfactual"]
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise ValueError(f"task option counterfactual must be a share between 0 and 1, got {share!r}")

    # ------------------------------------------------------------------ loading
    def iter_records(
        self, path: str | Path, on_error: Callable[[InputError], None] | None = None
    ) -> Iterator[tuple[str, int, dict[str, Any]]]:
        """SQuAD JSON → one record per question (with its paragraph and the article's others);
        JSON lines → one record per line. `line` is the 1-based question number in SQuAD JSON."""
        path = Path(path)
        if path.suffix != ".json":
            for line, record in read_jsonl(path, on_error):
                yield str(path), line, record
            return
        if not path.is_file():
            raise InputError(path, None, None, "file not found")
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise InputError(path, None, None, f"not a SQuAD JSON file: {error}") from None
        if not isinstance(document, dict) or not isinstance(document.get("data"), list):
            raise InputError(path, None, "data", "expected the SQuAD layout {data: [{title, paragraphs}]}")
        number = 0
        for i, article in enumerate(document["data"]):
            paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
            if not isinstance(paragraphs, list):
                error = InputError(path, None, f"data[{i}].paragraphs", "missing or not a list")
                if on_error is None:
                    raise error
                on_error(error)
                continue
            contexts = [p.get("context") if isinstance(p, dict) else None for p in paragraphs]
            readable = [n for n, c in enumerate(contexts) if isinstance(c, str) and c.strip()]  # distractors
            title = str(article.get("title", "")).replace("_", " ")
            for j, paragraph in enumerate(paragraphs):
                qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
                if not isinstance(qas, list):
                    error = InputError(path, None, f"data[{i}].paragraphs[{j}].qas", "missing or not a list")
                    if on_error is None:
                        raise error
                    on_error(error)
                    continue
                for k, qa in enumerate(qas):
                    number += 1
                    yield (
                        str(path),
                        number,
                        {
                            **(qa if isinstance(qa, dict) else {}),
                            "context": paragraph.get("context"),
                            "title": title,
                            "_where": f"data[{i}].paragraphs[{j}].qas[{k}]",
                            "_siblings": (contexts, j, readable),
                        },
                    )

    def parse_record(self, record: dict[str, Any], path: str, line: int, index: int) -> Example:
        """One question with its paragraph → Example with the gold (and distractor) passages."""
        where = record.get("_where")
        field = (lambda name: f"{where}.{name}") if where else (lambda name: name)
        at = None if where else line
        question = record.get("question")
        if not isinstance(question, str) or not question.strip():
            raise InputError(path, at, field("question"), "expected a non-empty string")
        context = record.get("context")
        if not isinstance(context, str) or not context.strip():
            raise InputError(path, at, field("context"), "expected a non-empty string (the paragraph)")
        answers, spans = self._answers(record, context, path, at, field)
        example_id = require_str(record, "id", path, line) if "id" in record else str(index)
        rng = random.Random(f"{self.options['seed']}-{example_id}")
        text = context
        if self.options["max_words"] and spans:
            start, end = spans[0]
            text = _window(context, start, end, self.options["max_words"], rng)
        title = str(record.get("title") or "")
        gold = Passage(id=f"{example_id}-gold", title=title, text=text)
        if "_siblings" in record:  # SQuAD JSON: other paragraphs of the same article
            distractors = self._distractors(record, rng, title, example_id)
        else:  # JSON lines: the record's own list, if any
            distractors = self._listed_distractors(record, path, at, field, example_id)
        passages = [gold] + distractors
        rng.shuffle(passages)
        return Example(
            id=example_id,
            query=self.query(question.strip()),
            target=self.target(answers[0]),
            answers=answers,
            passages=passages,
            metadata={"question": question.strip()},
        )

    # ------------------------------------------------------------------ training
    def training_examples(self, examples: list[Example]) -> list[Example]:
        """With `counterfactual: p`, a seeded share p of the examples is replaced by its counterfactual
        twin (`tasks.counterfactual.counterfactual_example`): the first answer swapped, in every passage
        that states it, for another training answer of the same kind, which becomes the target. Evaluation
        data is never changed. An example with no usable swap stays as it is."""
        share = self.options["counterfactual"]
        if not share:
            return examples
        pool: dict[str, list[str]] = {}
        for example in examples:
            if example.answers:
                pool.setdefault(answer_kind(example.answers[0]), []).append(example.answers[0])
        rng = random.Random(f"counterfactual-{self.options['seed']}")
        swapped = []
        for example in examples:
            twin = None
            if example.answers and rng.random() < share:
                twin = counterfactual_example(example, pool, rng, self.options["target_template"])
            swapped.append(twin or example)
        changed = sum(a is not b for a, b in zip(swapped, examples, strict=True))
        logger.info("counterfactual: %d of %d training examples read a swapped answer", changed, len(examples))
        return swapped

    @staticmethod
    def _answers(record, context, path, at, field) -> tuple[list[str], list[tuple[int, int]]]:
        raw = record.get("answers")
        if not isinstance(raw, list) or not raw:
            raise InputError(path, at, field("answers"), "expected a non-empty list of answers")
        answers, spans = [], []
        for n, answer in enumerate(raw):
            if isinstance(answer, str):
                text, start = answer, context.find(answer)
            elif isinstance(answer, dict) and isinstance(answer.get("text"), str):
                text, start = answer["text"], answer.get("answer_start")
                if not isinstance(start, int) or context[start : start + len(text)] != text:
                    raise InputError(
                        path,
                        at,
                        field(f"answers[{n}]"),
                        f"answer {text!r} is not in the context at answer_start={start!r}",
                    )
            else:
                raise InputError(path, at, field(f"answers[{n}]"), "expected a string or {text, answer_start}")
            if not text.strip() or start < 0:
                raise InputError(path, at, field(f"answers[{n}]"), f"answer {text!r} is not in the context")
            if text not in answers:
                answers.append(text)
            spans.append((start, start + len(text)))
        return answers, spans

    def _listed_distractors(self, record, path, at, field, example_id: str) -> list[Passage]:
        """The first `distractors` passages of a JSON-lines record's `distractors` list (strings or
        `{title?, text}`), e.g. paragraphs a retriever ranked highest for the question
        (`tools/squad_retrieved_distractors.py`)."""
        wanted, listed = self.options["distractors"], record.get("distractors")
        if not wanted or listed is None:
            return []
        if not isinstance(listed, list):
            raise InputError(path, at, field("distractors"), "expected a list of passages")
        passages = []
        for n, item in enumerate(listed[:wanted]):
            title, text = ("", item) if isinstance(item, str) else (item.get("title", ""), item.get("text"))
            if not isinstance(text, str) or not text.strip() or not isinstance(title, str):
                raise InputError(path, at, field(f"distractors[{n}]"), "expected a non-empty string or {title?, text}")
            max_words = self.options["max_words"]
            text = " ".join(text.split()[:max_words]) if max_words else text
            passages.append(Passage(id=f"{example_id}-d{n}", title=title, text=text))
        return passages

    def _distractors(self, record, rng: random.Random, title: str, example_id: str) -> list[Passage]:
        wanted = self.options["distractors"]
        if not wanted:
            return []
        contexts, own, readable = record["_siblings"]
        others = [n for n in readable if n != own]
        picked = rng.sample(others, min(wanted, len(others)))
        max_words = self.options["max_words"]
        return [
            Passage(
                id=f"{example_id}-d{n}",
                title=title,
                text=" ".join(contexts[n].split()[:max_words]) if max_words else contexts[n],
            )
            for n in picked
        ]
