"""Pretraining pretext tasks made from corpus passages `{"id", "title", "section"?, "text"}`.

- `mlm`: T5 span corruption: about `noise_density` of the words, in spans of mean length
  `mean_span_length`, are replaced by sentinels `<extra_id_i>` in the query; the target lists
  each sentinel followed by the words it hides (word-level: no tokenizer is needed here).
- `lm`: the passage is cut at a random word, the cut drawn between `min_context_ratio` and
  `max_context_ratio` of its words; prefix → continuation.
- `section`: `"{title}, {section}"` → the section's text (passages without a section are unused).
What becomes of the passage an example was made from is the option `source_passage`:
- `filter` (default): its id is the example's `source_id`, so that retrieving that very passage
  (a trivial retrieval, Atlas's and REALM's term) is filtered out;
- `keep`: plain retrieval, which may return it;
- `ensure`: it is the example's `evidence`, kept among the passages read — the target is then
  in what the reader reads, which teaches a small reader to copy from its passages. Examples are made with a
  seeded RNG at load time; `training_pair` draws a fresh corruption / cut for each presentation.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from common.io import InputError, require_str
from tasks.base import (
    Example,
    Task,
    check_lengths,
    format_template,
    register_task,
    strip_sentinels,
)
from tasks.metrics import exact_match, f1, percent, rouge_l
from tasks.passage import Passage

SOURCE_PASSAGE = ("filter", "keep", "ensure")


def _span_lengths(num_items: int, num_segments: int, rng: random.Random) -> list[int]:
    """Split `num_items` into `num_segments` random positive lengths (T5's random segmentation)."""
    boundaries = [i < num_segments - 1 for i in range(num_items - 1)]
    rng.shuffle(boundaries)
    boundaries.append(True)
    lengths, previous = [], -1
    for i, is_end in enumerate(boundaries):
        if is_end:
            lengths.append(i - previous)
            previous = i
    return lengths


def span_corrupt(
    words: list[str], noise_density: float, mean_span_length: float, rng: random.Random
) -> tuple[str, str]:
    """T5 span corruption of a word list → (input with sentinels, target of sentinel + words).

    The number of noise words is round(len · density) clamped to [1, len − 1]; the number of
    spans round(noise / mean_span_length), at least 1. Spans alternate non-noise, noise.
    """
    length = len(words)
    if length < 2:
        raise ValueError("span corruption needs at least 2 words")
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    num_spans = max(round(num_noise / mean_span_length), 1)
    num_spans = min(num_spans, num_noise, length - num_noise)
    noise_lengths = _span_lengths(num_noise, num_spans, rng)
    keep_lengths = _span_lengths(length - num_noise, num_spans, rng)
    inputs: list[str] = []
    outputs: list[str] = []
    offset = 0
    for i, (keep, noise) in enumerate(zip(keep_lengths, noise_lengths)):
        sentinel = f"<extra_id_{i}>"
        inputs += words[offset : offset + keep] + [sentinel]
        offset += keep
        outputs += [sentinel] + words[offset : offset + noise]
        offset += noise
    return " ".join(inputs), " ".join(outputs)


def lm_split(words: list[str], min_ratio: float, max_ratio: float, rng: random.Random) -> tuple[str, str]:
    """Cut a word list at a random word between the two ratios → (prefix, continuation).

    The cut k (the prefix's word count) is uniform in [⌊n·min⌋, ⌊n·max⌋] clamped to [1, n − 1].
    """
    n = len(words)
    if n < 2:
        raise ValueError("a prefix/continuation split needs at least 2 words")
    low = min(max(int(n * min_ratio), 1), n - 1)
    high = min(max(int(n * max_ratio), low), n - 1)
    cut = rng.randint(low, high)
    return " ".join(words[:cut]), " ".join(words[cut:])


class _PretextTask(Task):
    """Shared loading and scoring of the pretext tasks (EM, F1, ROUGE-L of the target)."""

    metrics = ("exact_match", "f1", "rouge_l")
    base_options: ClassVar[dict[str, Any]] = {"seed": 0, "min_words": 2, "max_words": 512, "source_passage": "filter"}

    def __init__(self, **options: Any):
        super().__init__(**options)
        if self.options["source_passage"] not in SOURCE_PASSAGE:
            raise ValueError(
                f"{self.name}: source_passage must be one of {', '.join(SOURCE_PASSAGE)}; "
                f"got {self.options['source_passage']!r}"
            )

    def iter_records(
        self, path, on_error: Callable[[InputError], None] | None = None
    ) -> Iterator[tuple[str, int, dict[str, Any]]]:
        """Passages from JSON lines, or from a prepared corpus folder (`atlas corpus prepare`).

        Reading the prepared folder's `passages.arrow` directly keeps the example ids equal to
        the chunked passage ids of the index built from it, which trivial-retrieval filtering needs.
        """
        arrow = Path(path) / "passages.arrow"
        if not arrow.is_file():
            yield from super().iter_records(path, on_error)
            return
        import pyarrow as pa  # heavy: pyarrow, only to read a prepared corpus folder; `import tasks` stays light

        with pa.memory_map(str(arrow)) as source:
            records = (record for batch in pa.ipc.open_stream(source) for record in batch.to_pylist())
            for row, record in enumerate(records, start=1):
                yield str(arrow), row, record

    def parse_record(self, record: dict[str, Any], path: str, line: int, index: int) -> Example | None:
        """A corpus passage → a pretext example (seeded by the option `seed` and the passage id)."""
        passage = self.passage(record, path, line)
        return self.from_passage(passage, random.Random(f"{self.options['seed']}:{passage['id']}"))

    @staticmethod
    def passage(record: dict[str, Any], path: str, line: int) -> dict[str, str]:
        """The checked `{id, title, section, text}` of a corpus record (InputError if malformed)."""
        passage = {
            "id": require_str(record, "id", path, line),
            "title": require_str(record, "title", path, line, optional=True),
            "section": require_str(record, "section", path, line, optional=True),
            "text": require_str(record, "text", path, line),
        }
        if not passage["id"].strip():
            raise InputError(path, line, "id", "the id is empty")
        return passage

    def _words(self, text: str) -> list[str] | None:
        words = text.split()[: self.options["max_words"]]
        return words if len(words) >= max(2, self.options["min_words"]) else None

    def from_passage(self, passage: dict[str, str], rng: random.Random) -> Example | None:
        """One example from a passage dict, or None where the passage is too short / unusable."""
        raise NotImplementedError

    def training_pair(self, example: Example, rng: random.Random) -> tuple[str, str]:
        """A fresh corruption / cut of the example's passage for this presentation."""
        fresh = self.from_passage(example.metadata["passage"], rng)
        return fresh.query, fresh.target

    def evaluate(
        self,
        examples: list[Example],
        predictions: list[str],
        *,
        retrieved: list[list[Passage]] | None = None,
    ) -> dict[str, float]:
        """EM, F1 and ROUGE-L (percent) of the generated text (sentinels dropped) against the target."""
        check_lengths(examples, predictions)
        em_scores, f1_scores, rouge_scores = [], [], []
        for example, prediction in zip(examples, predictions):
            answer = self.postprocess(example, prediction)
            gold = example.answers[0]
            em_scores.append(float(exact_match(answer, gold)))
            f1_scores.append(f1(answer, gold))
            rouge_scores.append(rouge_l(answer, gold) if answer else 0.0)
        return {"exact_match": percent(em_scores), "f1": percent(f1_scores), "rouge_l": percent(rouge_scores)}

    def _example(self, passage: dict, query: str, target: str) -> Example:
        """The example, with the source passage filtered, kept or ensured (`source_passage`)."""
        mode = self.options["source_passage"]
        return Example(
            id=passage["id"],
            query=query,
            target=target,
            answers=[strip_sentinels(target)],
            source_id=passage["id"] if mode == "filter" else None,
            evidence=Passage(id=passage["id"], title=passage.get("title") or "", text=passage.get("text") or "")
            if mode == "ensure"
            else None,
            metadata={"passage": passage},
        )


@register_task("mlm")
class MaskedLanguageModelling(_PretextTask):
    """T5 span corruption of a passage, answered with retrieval of *other* passages."""

    default_options: ClassVar[dict[str, Any]] = {
        **_PretextTask.base_options,
        "noise_density": 0.15,
        "mean_span_length": 3.0,
    }

    def from_passage(self, passage: dict[str, str], rng: random.Random) -> Example | None:
        """The passage's words with random spans replaced by sentinels → the hidden spans."""
        words = self._words(passage["text"])
        if words is None:
            return None
        query, target = span_corrupt(words, self.options["noise_density"], self.options["mean_span_length"], rng)
        return self._example(passage, query, target)


@register_task("lm")
class PrefixLanguageModelling(_PretextTask):
    """Continue a passage from a random prefix."""

    default_options: ClassVar[dict[str, Any]] = {
        **_PretextTask.base_options,
        "min_context_ratio": 0.5,
        "max_context_ratio": 0.5,
    }

    def from_passage(self, passage: dict[str, str], rng: random.Random) -> Example | None:
        """Prefix of the passage → its continuation."""
        words = self._words(passage["text"])
        if words is None:
            return None
        prefix, continuation = lm_split(
            words, self.options["min_context_ratio"], self.options["max_context_ratio"], rng
        )
        return self._example(passage, prefix, continuation)


@register_task("section")
class SectionGeneration(_PretextTask):
    """Generate a section's text from the page title and the section name."""

    default_options: ClassVar[dict[str, Any]] = {
        **_PretextTask.base_options,
        "query_template": "{title}, {section}",
    }

    def from_passage(self, passage: dict[str, str], rng: random.Random) -> Example | None:
        """`"{title}, {section}"` → the section text (None where the passage has no section)."""
        if not passage["section"].strip() or self._words(passage["text"]) is None:
            return None
        query = format_template(
            self.options["query_template"],
            "query_template",
            title=passage["title"].strip(),
            section=passage["section"].strip(),
        )
        return self._example(passage, query, " ".join(self._words(passage["text"])))
