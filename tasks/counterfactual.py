"""Counterfactual passages: a fact's answer changed in the text that states it.

The same edit serves three places: the quickstart's and bench/nq824.py's corpus edits (change a fact in
the index, ask again, see whether the answer follows the text) and the reading task's `counterfactual`
training option, which shows the reader passages whose answer was swapped for another real answer of
the same kind, with that answer as the target — substitution training as in Longpre et al. 2021
("Entity-Based Knowledge Conflicts in Question Answering"): a reader taught only on true text learns
to prefer answers that sound right; one also taught on swapped text learns to answer from the passage.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from tasks.base import Example

NUMBER_WORDS = frozenset({
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen",
    "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty", "thirty", "forty", "fifty",
    "sixty", "seventy", "eighty", "ninety", "hundred", "thousand", "million", "billion"})


def whole_words(phrase: str) -> re.Pattern:
    """A pattern matching `phrase` as whole words, in any case (not "tin" inside "tinsel")."""
    return re.compile(rf"(?<!\w){re.escape(phrase)}(?!\w)", re.IGNORECASE)


def replace_fact(text: str, old: str, new: str) -> str:
    """`text` with every whole-word occurrence of `old` (any case) replaced by `new`; ValueError if none."""
    edited, count = whole_words(old).subn(lambda _match: new, text)
    if count == 0:
        raise ValueError(f"{old!r} does not occur in the passage")
    return edited


def states(text: str, answer: str) -> bool:
    """Whether `text` holds `answer` as whole words (any case)."""
    return whole_words(answer).search(text) is not None


def answer_kind(answer: str) -> str:
    """The shape a replacement must share: "year", "number" (digits or number words), "name" (every
    word capitalised) or "text" — so that the edited sentence still reads as a statement of its kind."""
    if re.fullmatch(r"\d{4}", answer):
        return "year"
    if re.search(r"\d", answer) or all(w in NUMBER_WORDS for w in answer.lower().split()):
        return "number"
    words = [w for w in answer.split() if w[:1].isalpha()]
    return "name" if words and all(w[:1].isupper() for w in words) else "text"


def counterfactual_example(example: Example, pool: dict[str, list[str]], rng: random.Random,
                           target_template: str, tries: int = 20) -> Example | None:
    """`example` with its first answer replaced, in every passage that states it, by another answer of
    the same kind drawn from `pool` (kind → answers), and that answer as its target and only answer.

    The replacement shares no word with the old answer and occurs in none of the passages (so the new
    fact is stated only where the edit put it); None when no such answer is found in `tries` draws,
    when no passage states the old answer as whole words, or when another of its gold
    answers ("Broncos" beside "Denver Broncos") would still stand in the edited text.

    Args:
        pool: answers by `answer_kind`, drawn from uniformly.
        target_template: the task's target template, with `{answer}`.
    """
    old = example.answers[0]
    if not any(states(p["text"], old) for p in example.passages or []):
        return None
    candidates = pool.get(answer_kind(old), [])
    if not candidates:
        return None
    old_words = set(old.lower().split())
    for _ in range(tries):
        new = rng.choice(candidates)
        if set(new.lower().split()) & old_words or any(new.lower() in p["text"].lower() for p in example.passages):
            continue
        passages = [{**p, "text": replace_fact(p["text"], old, new)} if states(p["text"], old) else p
                    for p in example.passages]
        if any(states(p["text"], other) for other in example.answers[1:] for p in passages):
            return None
        return replace(example, passages=passages, target=target_template.format(answer=new), answers=[new],
                       metadata={**example.metadata, "counterfactual_of": old})
    return None
