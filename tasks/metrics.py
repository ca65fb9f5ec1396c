"""Answer metrics, written to give the same numbers as the scorers the benchmarks publish.

Every metric a user sees (`atlas evaluate`'s metrics.json, the training log and summary, `atlas
score`, the benchmarks) is a **percentage** (0–100, as papers print them) and has one name across
tasks (`METRIC_NAMES`); per-example scores in [0, 1] become a percentage only when averaged, by
`percent`. The single exception is KILT's official report (`tasks.kilt_scoring.official_report`),
which keeps the official scorers' own key names and [0, 1] scale so that it can be compared with
their output line by line.

- `normalize_answer`, `exact_match`, `f1`: the SQuAD v1.1 evaluation script (also used verbatim by
  KILT's `eval_downstream.py`, FiD and Atlas): lower-case, drop ASCII punctuation, drop the
  articles a/an/the, collapse white space; F1 over the bag of normalised tokens.
- `rouge_l`: the ROUGE-L F of the `rouge` PyPI package (1.0.1, `Rouge().get_scores(hyp, ref,
  avg=True)["rouge-l"]["f"]`), which is what KILT's scorer calls. That package is a
  summary-level ROUGE-L with unusual details that change the digits, reproduced here on purpose:
  sentences are split on "." only, words on single spaces (an empty word can occur), words are
  counted as *sets* (its default `exclusive=True`), the LCS words are recovered by one specific
  back-tracking order, and F carries a 1e-8 in the denominator.
- `has_answer`: the DPR / FiD answer-recall test: NFD-normalise, tokenise with DPR's
  `SimpleTokenizer` regular expression, lower-case, and look for the answer's token sequence.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import regex  # \p{L}-style Unicode classes, which the standard `re` module lacks

# name → meaning; every value is a percentage. `@k`: of the top k retrieved passages.
METRIC_NAMES: dict[str, str] = {
    "exact_match": "the SQuAD-normalised prediction equals a gold answer",
    "f1": "SQuAD token F1 with the closest gold answer",
    "rouge_l": "ROUGE-L F with the closest gold answer (the `rouge` package's, as KILT's)",
    "accuracy": "the prediction is the gold label / answer / option letter (strict)",
    "debiased_accuracy": "multiple choice: the most probable option, averaged over option orders",
    "answer_recall@k": "a gold answer's tokens occur in one of the top k passages (has_answer)",
    "answer_mrr": "mean of 1 / rank of the first passage holding an answer (0 when none)",
    "gold_recall@k": "one of the top k passages is a gold passage (examples naming gold ids)",
    "gold_mrr": "mean of 1 / rank of the first gold passage (examples naming gold ids)",
    "r_precision": "KILT: the first R distinct pages retrieved that are in a gold set of R pages",
    "provenance_precision@k": "KILT: gold provenance sets complete in the top k pages, over k",
    "provenance_recall@k": "KILT: gold provenance sets complete in the top k pages, over the sets",
    "provenance_success@k": "KILT: some gold provenance set is complete in the top k pages",
    "kilt_accuracy": "KILT: accuracy counted only where R-precision is 100",
    "kilt_exact_match": "KILT: exact_match counted only where R-precision is 100",
    "kilt_f1": "KILT: f1 counted only where R-precision is 100",
    "kilt_rouge_l": "KILT: rouge_l counted only where R-precision is 100",
}


def percent(scores: Iterable[float]) -> float:
    """The mean of per-example scores in [0, 1], as a percentage: 100 · (Σ scores / n), summed
    left to right as the official scorers sum, so exactly 100 × their mean; 0.0 for no scores."""
    total, n = 0.0, 0
    for score in scores:
        total += score
        n += 1
    return 100 * (total / n) if n else 0.0


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (Wilson 1927): (low, high) as fractions, 95% for z = 1.96.

    Unlike p ± z·sqrt(p(1-p)/n) it stays inside [0, 1] and is not empty at 0 or n successes: what a rate
    over a few dozen trials (the quickstart's edits followed) needs. (0.0, 1.0) for no trials."""
    if trials <= 0:
        return 0.0, 1.0
    p, n, z2 = successes / trials, trials, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * (p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5 / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, strip punctuation, drop a/an/the, collapse white space."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> bool:
    """True where the SQuAD-normalised prediction equals the normalised gold answer."""
    return normalize_answer(prediction) == normalize_answer(gold)


def f1(prediction: str, gold: str) -> float:
    """SQuAD v1.1 token F1 between one prediction and one gold answer (0 when nothing overlaps)."""
    prediction_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = Counter(prediction_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def _require_golds(golds: Sequence[str]) -> None:
    if len(golds) == 0:
        raise ValueError("no gold answers to compare the prediction with")


def max_exact_match(prediction: str, golds: Iterable[str]) -> float:
    """Exact match (0.0 or 1.0), maximised over several gold answers."""
    golds = list(golds)
    _require_golds(golds)
    return float(max(exact_match(prediction, g) for g in golds))


def max_f1(prediction: str, golds: Iterable[str]) -> float:
    """Token F1, maximised over several gold answers."""
    golds = list(golds)
    _require_golds(golds)
    return max(f1(prediction, g) for g in golds)


# --------------------------------------------------------------------------- ROUGE-L


def _rouge_sentences(text: str) -> list[str]:
    # The package splits on "." only and re-joins each piece's white-space-separated words.
    return [" ".join(piece.split()) for piece in text.split(".") if len(piece) > 0]


def _lcs_words(reference: list[str], hypothesis: list[str]) -> set[str]:
    """Words of the LCS of `reference` and `hypothesis`, recovered exactly as `rouge` 1.0.1 does.

    Which LCS is recovered matters, because the score counts the *set* of LCS words: the
    back-track prefers a match, then moving up in `reference` only when that is strictly better.
    """
    n, m = len(reference), len(hypothesis)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        row, previous_row, word = table[i], table[i - 1], reference[i - 1]
        for j in range(1, m + 1):
            if word == hypothesis[j - 1]:
                row[j] = previous_row[j - 1] + 1
            else:
                row[j] = max(previous_row[j], row[j - 1])
    words: set[str] = set()
    i, j = n, m
    while i > 0 and j > 0:  # iterative form of the package's recursion (no recursion limit)
        if reference[i - 1] == hypothesis[j - 1]:
            words.add(reference[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def rouge_l(prediction: str, gold: str) -> float:
    """ROUGE-L F of `prediction` against `gold`, as `rouge` 1.0.1 and KILT compute it.

    Returns 0.0 where the package would raise "Hypothesis is empty." / "Reference is empty."
    (a text with no sentence once split on "."), as KILT's scorer does. No normalisation.
    """
    hypothesis_sentences = _rouge_sentences(prediction)
    reference_sentences = _rouge_sentences(gold)
    if not hypothesis_sentences or not reference_sentences:
        return 0.0
    hypothesis_words = [w for s in hypothesis_sentences for w in s.split(" ")]
    reference_words = [w for s in reference_sentences for w in s.split(" ")]
    m = len(set(reference_words))
    n = len(set(hypothesis_words))
    union: set[str] = set()
    for reference_sentence in reference_sentences:
        reference_sentence_words = reference_sentence.split(" ")
        for hypothesis_sentence in hypothesis_sentences:
            union |= _lcs_words(reference_sentence_words, hypothesis_sentence.split(" "))
    llcs = len(union)
    r_lcs = llcs / m
    p_lcs = llcs / n
    return 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8))


# --------------------------------------------------------------------------- answer recall

# DPR's SimpleTokenizer: runs of letters/digits/marks, or any single non-space, non-control char.
_DPR_TOKEN = regex.compile(
    r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
    flags=regex.IGNORECASE + regex.UNICODE + regex.MULTILINE,
)


def dpr_tokenize(text: str) -> list[str]:
    """NFD-normalise and tokenise `text` as DPR's `SimpleTokenizer`, lower-cased."""
    text = unicodedata.normalize("NFD", text)
    return [match.group().lower() for match in _DPR_TOKEN.finditer(text)]


def has_answer(answers: Iterable[str], passage_text: str) -> bool:
    """True where the token sequence of any answer occurs in the passage (DPR/FiD answer recall).

    As in DPR, an answer with no tokens (an empty string) matches every passage.
    """
    passage_tokens = dpr_tokenize(passage_text)
    for answer in answers:
        answer_tokens = dpr_tokenize(answer)
        width = len(answer_tokens)
        for start in range(len(passage_tokens) - width + 1):
            if passage_tokens[start : start + width] == answer_tokens:
                return True
    return False
