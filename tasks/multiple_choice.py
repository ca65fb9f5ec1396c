"""Multiple-choice prompts, option permutations and de-biased aggregation (MMLU and the like).

A reader that prefers a letter ("A") whatever the options say is biased. De-biasing presents the
same question with its options permuted (`cyclic`: the N rotations; `all`: the N! orders), maps
the reader's letter probabilities of each presentation back to the original options, and
averages them (Atlas, Izacard et al. 2022, §4.3).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import replace

from tasks.base import Example, format_template, strip_sentinels

PERMUTATION_MODES = ("single", "cyclic", "all")
DEFAULT_QUERY_TEMPLATE = "question: {question} answers: {options} Answer: <extra_id_0>"
DEFAULT_TARGET_TEMPLATE = "<extra_id_0> {letter}"


def format_options(options: dict[str, str]) -> str:
    """`{"A": "x", "B": "y"}` → `"(A) x (B) y"` (letters in alphabetical order)."""
    return " ".join(f"({letter}) {options[letter]}" for letter in sorted(options))


def multiple_choice_query(question: str, options: dict[str, str], template: str = DEFAULT_QUERY_TEMPLATE) -> str:
    """The reader input for a question and its options."""
    return format_template(template, "query_template", question=question.strip(), options=format_options(options))


def multiple_choice_target(letter: str, template: str = DEFAULT_TARGET_TEMPLATE) -> str:
    """The target text for the gold `letter`."""
    return format_template(template, "target_template", letter=letter)


def orderings(n: int, mode: str) -> list[tuple[int, ...]]:
    """Orders of n options for a permutation mode; the first is always the identity.

    `single` → [identity]; `cyclic` → the n rotations; `all` → the n! permutations
    (lexicographic, as `itertools.permutations`).
    """
    identity = tuple(range(n))
    if mode == "single":
        return [identity]
    if mode == "cyclic":
        return [identity[n - i :] + identity[: n - i] for i in range(n)] if n else [identity]
    if mode == "all":
        return list(itertools.permutations(identity))
    raise ValueError(f"unknown permutation mode '{mode}'; valid: {', '.join(PERMUTATION_MODES)}")


def permute(example: Example, mode: str) -> list[Example]:
    """The example presented under every ordering of `mode` (identity first).

    Each permuted example has id `"{id}#p{n}"`, its options reordered, its answer and target
    moved to the new letter of the gold option, and `metadata["letter_map"]` = {shown letter:
    original letter}; `metadata["original_id"]` is the example's id.
    """
    if not example.options:
        raise ValueError(f"example '{example.id}' has no options to permute")
    letters = sorted(example.options)
    question = example.metadata["question"]
    query_template = example.metadata.get("query_template", DEFAULT_QUERY_TEMPLATE)
    target_template = example.metadata.get("target_template", DEFAULT_TARGET_TEMPLATE)
    permuted = []
    for n, order in enumerate(orderings(len(letters), mode)):
        letter_map = {letters[j]: letters[order[j]] for j in range(len(letters))}
        options = {shown: example.options[original] for shown, original in letter_map.items()}
        back = {original: shown for shown, original in letter_map.items()}
        answers = [back[a] for a in example.answers if a in back]
        permuted.append(
            replace(
                example,
                id=f"{example.id}#p{n}",
                query=multiple_choice_query(question, options, query_template),
                target=multiple_choice_target(answers[0], target_template) if answers else None,
                answers=answers,
                options=options,
                metadata={**example.metadata, "letter_map": letter_map, "original_id": example.id},
            )
        )
    return permuted


def aggregate(permuted_examples: list[Example], letter_probs: list[dict[str, float]]) -> dict[str, float]:
    """De-biased probabilities of the *original* options: the mean over the presentations.

    `permuted_examples` are the output of `permute` for one question and `letter_probs[i]` the
    reader's probability of each shown letter for presentation i (a softmax over the letters'
    logits). Returns {original letter: mean probability}, letters in alphabetical order.
    """
    if len(permuted_examples) != len(letter_probs) or not permuted_examples:
        raise ValueError(f"{len(letter_probs)} probability dicts for {len(permuted_examples)} permuted examples")
    collected: dict[str, list[float]] = {}
    for example, probs in zip(permuted_examples, letter_probs):
        letter_map = example.metadata.get("letter_map")
        if letter_map is None:
            raise ValueError(f"example '{example.id}' was not made by permute() (no letter_map)")
        if set(probs) != set(letter_map):
            raise ValueError(
                f"example '{example.id}': probabilities for {sorted(probs)}, expected letters {sorted(letter_map)}"
            )
        for shown, original in letter_map.items():
            collected.setdefault(original, []).append(float(probs[shown]))
    # fsum: exact sums, so that a perfectly letter-biased reader gives exact ties.
    return {letter: math.fsum(v) / len(v) for letter, v in sorted(collected.items())}


def predict_letter(probs: dict[str, float]) -> str:
    """The most probable letter; ties go to the alphabetically first letter."""
    if not probs:
        raise ValueError("no letter probabilities")
    return max(sorted(probs), key=lambda letter: probs[letter])


_LETTER_IN_PARENS = re.compile(r"^\(?([A-Z])\)?[.:]?(\s|$)")


def parse_letter(prediction: str, letters: list[str]) -> str | None:
    """The option letter a generated text names (`"B"`, `"(B)"`, `"B."`, `"B) Paris"`), or None."""
    text = strip_sentinels(prediction)
    match = _LETTER_IN_PARENS.match(text)
    if match is None:
        return None
    letter = match.group(1)
    return letter if letter in letters else None
