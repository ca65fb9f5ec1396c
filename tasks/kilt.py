"""KILT tasks from native KILT jsonl: `{"id", "input", "output": [{"answer", "provenance"}]}`.

One adapter covers every KILT dataset; the dataset (taken from the file name, e.g.
`hotpotqa-dev-kilt.jsonl`, or the `kilt_task` option) decides the target handling and the
primary metric (KILT's leaderboard metric):

| dataset                          | kind            | target                           | primary     |
|----------------------------------|-----------------|----------------------------------|-------------|
| fever                            | fact checking   | SUPPORTS/REFUTES → "true"/"false" | accuracy    |
| aidayago2, wned, cweb            | entity linking  | the Wikipedia title              | accuracy    |
| trex, structured_zeroshot (zsRE) | slot filling    | the object entity                | accuracy    |
| nq, hotpotqa, triviaqa           | open-domain QA  | a gold answer                    | exact_match |
| eli5                             | long-form QA    | a gold answer                    | rouge_l     |
| wow                              | dialogue        | the next utterance               | f1          |

The metrics are the project's names in percent (`exact_match`, `kilt_exact_match`, `r_precision`,
`provenance_recall@5`, …: 100 × the official value, `tasks.kilt_scoring.as_metrics`);
`KiltTask.official_report` gives the official scorers' own keys and [0, 1] scale.

Dialogue inputs (turns separated by new lines) are joined with `dialogue_separator`. Predictions
are scored by `tasks.kilt_scoring`, the port of KILT's official scorers; provenance is the
retrieved passages' `wikipedia_id`. Scoring provenance (R-precision, recall@k, KILT-*) needs every
labelled evaluation record's gold pages (`check_provenance`): a recipe whose evaluation file has a
record without them is refused at config load (`tasks.data_checks.check_task_data`) with its file, line and
field, unless the option `provenance_metrics` is false (answers scored only); `evaluate` itself
scores such a record as KILT's scorer does (R-precision 0) and warns.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any, ClassVar

from common.io import InputError, require_str
from tasks.base import Example, Task, check_lengths, format_template, register_task
from tasks.kilt_scoring import (
    DOWNSTREAM_KEYS,
    as_metrics,
    check_outputs,
    gold_answers,
    official_report,
    score_kilt,
    write_kilt_predictions,  # noqa: F401  (re-exported: the evaluation loop writes with it)
)
from tasks.passage import PASSAGE_FIELDS, Passage

logger = logging.getLogger(__name__)

# dataset → (kind, primary metric: a name of `tasks.metrics.METRIC_NAMES`)
KILT_DATASETS: dict[str, tuple[str, str]] = {
    "fever": ("fact_checking", "accuracy"),
    "aidayago2": ("entity_linking", "accuracy"),
    "wned": ("entity_linking", "accuracy"),
    "cweb": ("entity_linking", "accuracy"),
    "trex": ("slot_filling", "accuracy"),
    "structured_zeroshot": ("slot_filling", "accuracy"),
    "nq": ("qa", "exact_match"),
    "hotpotqa": ("qa", "exact_match"),
    "triviaqa": ("qa", "exact_match"),
    "eli5": ("long_form_qa", "rouge_l"),
    "wow": ("dialogue", "f1"),
    "generic": ("qa", "exact_match"),
}
_ALIASES = {"zsre": "structured_zeroshot", "zeroshot": "structured_zeroshot", "aida": "aidayago2"}
FEVER_TO_WORD = {"SUPPORTS": "true", "REFUTES": "false"}
WORD_TO_FEVER = {word: label for label, word in FEVER_TO_WORD.items()}


def infer_kilt_dataset(path: str | os.PathLike) -> str:
    """The KILT dataset named by a file name (`nq-dev-kilt.jsonl` → `nq`), or `generic`."""
    stem = Path(path).name.lower()
    for name in sorted([*KILT_DATASETS, *_ALIASES], key=len, reverse=True):
        if stem.startswith((name + "-", name + "_", name + ".")):
            return _ALIASES.get(name, name)
    return "generic"


@register_task("kilt")
class KiltTask(Task):
    """Any KILT dataset in native KILT format, scored with KILT's official definitions."""

    metrics = ("exact_match", "accuracy", "f1", "rouge_l")
    answer_field = "output[].answer"
    has_provenance = True  # kilt_predictions.jsonl: each answer with the pages of the passages read
    default_options: ClassVar[dict[str, Any]] = {
        "kilt_task": "auto",
        "query_template": "question: {input} answer: <extra_id_0>",
        "target_template": "<extra_id_0> {answer}",
        "dialogue_separator": " / ",
        "provenance_key": "wikipedia_id",
        # false: score the answers only (a KILT-format file without gold pages); true: also
        # R-precision, recall@k and the KILT- scores, which need every record's provenance
        "provenance_metrics": True,
    }

    def __init__(self, **options: Any):
        super().__init__(**options)
        chosen = self.options["kilt_task"]
        chosen = _ALIASES.get(chosen, chosen)
        if chosen != "auto" and chosen not in KILT_DATASETS:
            valid = ", ".join(["auto", *KILT_DATASETS])
            raise ValueError(f"unknown kilt_task '{chosen}'; valid: {valid}")
        self.options["kilt_task"] = chosen
        if self.options["provenance_key"] not in PASSAGE_FIELDS:
            raise ValueError(
                f"unknown provenance_key {self.options['provenance_key']!r}: it names a passage "
                f"field; valid: {', '.join(PASSAGE_FIELDS)}"
            )

    def dataset_for(self, path: str | os.PathLike) -> str:
        """The KILT dataset of a file: the `kilt_task` option, or inferred from its name."""
        chosen = self.options["kilt_task"]
        return infer_kilt_dataset(path) if chosen == "auto" else chosen

    def load(self, path: str | os.PathLike, *, skip_invalid: bool = False) -> list[Example]:
        """Read a KILT file (see `Task.load`); warns where the dataset is not recognised."""
        if self.dataset_for(path) == "generic":
            logger.warning(
                "%s: KILT dataset not recognised from the file name; scoring as generic QA "
                "(set task option kilt_task to one of %s)",
                path,
                ", ".join(KILT_DATASETS),
            )
        return super().load(path, skip_invalid=skip_invalid)

    def parse_record(self, record: dict[str, Any], path: str, line: int, index: int) -> Example:
        """One KILT record → Example; gold record kept in `metadata['kilt']` for scoring."""
        dataset = self.dataset_for(path)
        example_id = require_str(record, "id", path, line).strip()
        text = require_str(record, "input", path, line)
        if not text.strip():
            raise InputError(path, line, "input", "the input is empty")
        outputs = record.get("output", [])
        if not isinstance(outputs, list):
            raise InputError(path, line, "output", "expected a list")
        check_outputs(outputs, path, line)
        gold = {"id": example_id, "input": text, "output": outputs}
        # The official scorer's gold answers (a set), kept here in file order.
        golds = gold_answers(gold)
        answers = [a for a in dict.fromkeys((o.get("answer") or "").strip() for o in outputs) if a in golds]
        if dataset == "fever":
            unknown = [a for a in answers if a not in FEVER_TO_WORD]
            if unknown:
                raise InputError(
                    path,
                    line,
                    "output.answer",
                    f"unknown FEVER label {unknown[0]!r}; valid: {', '.join(FEVER_TO_WORD)}",
                )
        if KILT_DATASETS[dataset][0] == "dialogue":
            text = self.options["dialogue_separator"].join(t.strip() for t in text.split("\n") if t.strip())
        query = format_template(self.options["query_template"], "query_template", input=text.strip())
        target = self._target(dataset, answers[0]) if answers else None
        return Example(
            id=example_id,
            query=query,
            target=target,
            answers=answers,
            metadata={"kilt": gold, "kilt_task": dataset, "source": (str(path), line)},
        )

    def _target(self, dataset: str, answer: str) -> str:
        word = FEVER_TO_WORD[answer] if dataset == "fever" else answer
        return format_template(self.options["target_template"], "target_template", answer=word)

    def train_target(self, example: Example, rng: random.Random) -> str:
        """A gold answer drawn at random per presentation (FEVER labels as true/false)."""
        if not example.answers:
            raise ValueError(f"example '{example.id}' has no answers to train on")
        return self._target(example.metadata["kilt_task"], rng.choice(example.answers))

    def postprocess(self, example: Example, prediction: str) -> str:
        """Generated text → the KILT answer (FEVER: "true"/"false" → SUPPORTS/REFUTES)."""
        answer = super().postprocess(example, prediction)
        if example.metadata.get("kilt_task") == "fever":
            return WORD_TO_FEVER.get(answer.lower(), answer)
        return answer

    def provenance(self, passages: list[Passage]) -> list[dict]:
        """KILT provenance entries for retrieved passages that carry a page id (in rank order): the
        passage field named by `provenance_key` as the `wikipedia_id`, and the `title` where it has one."""
        key = self.options["provenance_key"]
        entries = []
        for passage in passages:
            page = getattr(passage, key)
            if page not in (None, ""):  # a corpus without page ids leaves the field empty
                entry = {"wikipedia_id": str(page)}
                if passage.title:
                    entry["title"] = passage.title
                entries.append(entry)
        return entries

    def evaluate(
        self,
        examples: list[Example],
        predictions: list[str],
        *,
        retrieved: list[list[Passage]] | None = None,
    ) -> dict[str, float]:
        """KILT's metrics in percent under the project's names: exact_match, accuracy, f1,
        rouge_l; with `retrieved`, also kilt_*, r_precision and provenance_*@k.

        The primary metric (first key) is the dataset's leaderboard metric.
        """
        scores = as_metrics(self.official_scores(examples, predictions, retrieved=retrieved))
        primary = KILT_DATASETS[examples[0].metadata["kilt_task"] if examples else "generic"][1]
        return {primary: scores[primary], **{k: v for k, v in scores.items() if k != primary}}

    def official_report(
        self,
        examples: list[Example],
        predictions: list[str],
        *,
        retrieved: list[list[Passage]] | None = None,
    ) -> dict[str, dict[str, float]]:
        """The scores as KILT's official scorers print them: their key names and [0, 1] scale,
        grouped `downstream` / `kilt` / `retrieval` (`tasks.kilt_scoring.official_report`)."""
        return official_report(self.official_scores(examples, predictions, retrieved=retrieved))

    def official_scores(
        self,
        examples: list[Example],
        predictions: list[str],
        *,
        retrieved: list[list[Passage]] | None = None,
    ) -> dict[str, float]:
        """`tasks.kilt_scoring.score_kilt` of the predictions: official key names, [0, 1] scale;
        the downstream metrics only without `retrieved`."""
        check_lengths(examples, predictions)
        if retrieved is not None and len(retrieved) != len(examples):
            raise ValueError(f"{len(retrieved)} retrieval lists for {len(examples)} examples")
        datasets = {e.metadata["kilt_task"] for e in examples}
        if len(datasets) > 1:
            raise ValueError(f"examples from several KILT datasets: {sorted(datasets)}")
        if not self.options["provenance_metrics"]:
            retrieved = None
        if retrieved is not None:
            try:
                check_provenance(examples)
            except InputError as error:  # scored as KILT's scorer does (R-precision 0), but said
                logger.warning("%s; such records score R-precision 0 and no KILT- points", error)
        gold_records = [e.metadata["kilt"] for e in examples]
        guess_records = []
        for n, (example, prediction) in enumerate(zip(examples, predictions)):
            output: dict[str, Any] = {"answer": self.postprocess(example, prediction)}
            if retrieved is not None:
                output["provenance"] = self.provenance(retrieved[n])
            guess_records.append({"id": example.id, "output": [output]})
        scores = score_kilt(gold_records, guess_records)
        if retrieved is None:
            scores = {name: scores[name] for name in DOWNSTREAM_KEYS}
        return scores


def check_provenance(examples: list[Example]) -> None:
    """Raise `InputError` (file, line, field) for the first labelled record whose gold pages are
    missing: no provenance entry in any output, or an entry without a `wikipedia_id`.

    R-precision, recall@k and the KILT- scores compare the retrieved pages with these; KILT's own
    scorer gives a record without them R-precision 0 in silence. Records without answers (an
    unlabelled test file) are not scored, so not checked.
    """
    for example in examples:
        if not example.answers:
            continue
        path, line = example.metadata.get("source", ("<examples>", None))
        pages = 0
        for n, output in enumerate(example.metadata["kilt"]["output"]):
            for m, entry in enumerate(output.get("provenance") or []):
                if entry.get("wikipedia_id") in (None, ""):
                    raise InputError(
                        path,
                        line,
                        f"output[{n}].provenance[{m}].wikipedia_id",
                        "missing: each provenance entry names its Wikipedia page",
                    )
                pages += 1
        if not pages:
            raise InputError(
                path,
                line,
                "output[].provenance",
                "no provenance in any output: R-precision, recall@k and the KILT- scores compare the "
                "retrieved pages with the record's gold pages; give them, or set "
                "task.options.provenance_metrics=false to score the answers only",
            )
