"""Counterfactual passages: a fact's answer changed in the text that states it.

The same edit serves three places: the quickstart's and bench/nq824.py's corpus edits (change a fact in
the index, ask again, see whether the answer follows the text) and the reading task's `counterfactual`
training option, which shows the reader passages whose answer was swapped for another real answer of
the same kind, with that answer as the target — substitution training as in Longpre et al. 2021
("Entity-Based Knowledge Conflicts in Question Answering"): a reader taught only on true text learns
to prefer answers that sound right; one also taught on swapped text learns to answer from the passage.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from tasks.base import Example
from tasks.metrics import normalize_answer
from tasks.passage import Passage
from tasks.place_names import place_levels

# the word lists this module reads by (number words, months, prepositions, "what X" nouns by kind) are data
_WORDS = json.loads(Path(__file__).with_name("counterfactual_words.json").read_text(encoding="utf-8"))
NUMBER_WORDS = frozenset(_WORDS["number_words"])


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


def counterfactual_example(
    example: Example, pool: dict[str, list[str]], rng: random.Random, target_template: str, tries: int = 20
) -> Example | None:
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
    if not any(states(p.text, old) for p in example.passages or []):
        return None
    candidates = pool.get(answer_kind(old), [])
    if not candidates:
        return None
    old_words = set(old.lower().split())
    for _ in range(tries):
        new = rng.choice(candidates)
        if set(new.lower().split()) & old_words or any(new.lower() in p.text.lower() for p in example.passages):
            continue
        passages = [
            replace(p, text=replace_fact(p.text, old, new)) if states(p.text, old) else p for p in example.passages
        ]
        if any(states(p.text, other) for other in example.answers[1:] for p in passages):
            return None
        return replace(
            example,
            passages=passages,
            target=target_template.format(answer=new),
            answers=[new],
            metadata={**example.metadata, "counterfactual_of": old},
        )
    return None


# --- Corpus edits: choosing a replacement that reads as a statement of the same kind -----------------
#
# Changing a fact in a corpus tests whether a reader answers from the text only when the new text is a
# plausible statement: "The capital of Zorbland is nuston" (a currency in a capital's place) or "was
# discovered by between 1881 and 1885" invites a reader to distrust the passage. A replacement therefore
# keeps the old answer's kind (a year for a year), the question's kind (who → a person), and, where the
# data says it, the same relation; else spaCy's entity type of the old answer where it stands in its
# passage (Longpre et al. 2021's type-preserving substitution), or, for an answer that is no entity, its
# phrase shape. Both answers are typed in context: each in its own passage, then the replacement again in
# the sentence it would stand in (`reads_in_place`), with the kind its nearest answers name as a second
# opinion on spaCy's (`neighbour_kind`). Where no answer of the same type exists, the fact is skipped,
# never edited with a misfit.


def question_word(question: str) -> str:
    """'who', 'when', 'how many', …: the kind of thing a question asks for (so a replacement fits)."""
    words = question.lower().split()[:2]
    return " ".join(words) if words and words[0] == "how" else (words[0] if words else "")


# The kind of answer a question's form asks for. "who" wants a person (or a group of persons: a band, a team), "when"
# a time, "where" a place, "how many" a number; "what X" / "which X" the kind its noun X names ("what state" a place,
# "what dynasty" a people, "what novel" a work); other forms say nothing ("" : any kind). A replacement must answer
# a question of the same kind as the fact's, and the old answer's own entity kind must be one its question allows.
QUESTION_NOUN_KINDS = {noun: kind for kind, nouns in _WORDS["question_nouns"].items() for noun in nouns}
_WH_KINDS = {"who": "person", "whom": "person", "whose": "person", "when": "time", "where": "place"}
_HOW_KINDS = {"many": "number", "much": "number", "old": "number", "long": "duration"}
# "what kind of X", "what part of X", "which type of X": the noun after "of" is the one that names the kind
_KIND_WORDS = frozenset({"kind", "type", "sort", "form", "part", "name"})
# which entity kinds (`ENTITY_KINDS`, "" for no entity) each question kind allows for its answer
QUESTION_ALLOWS = {
    "person": {"person", "group", "people"},
    "time": {"time"},
    "duration": {"time", "number"},
    "place": {"place", "facility"},
    "number": {"number"},
    "group": {"group"},
    "people": {"people", "group"},
    "work": {"work", ""},
}


_PREPOSITIONS = frozenset(_WORDS["prepositions"])


def question_kind(question: str) -> str:
    """The kind of answer `question` asks for by its form: "person" (who), "time" (when, what year), "place"
    (where, what state), "number" (how many), "duration" (how long), or the kind its "what X" / "which X" noun
    names (`QUESTION_NOUN_KINDS`); "" when its form names none ("what is …", a noun it does not know)."""
    words = re.findall(r"[a-z0-9]+", question.lower())
    for k, word in enumerate(words):
        if k and words[k - 1] not in _PREPOSITIONS and not (word == "how" and k + 1 < len(words)):
            continue  # a relative clause ("the film an englishman who went up a hill"), not the question's form
        if word in _WH_KINDS:
            return _WH_KINDS[word]
        if word == "how" and k + 1 < len(words) and words[k + 1] in _HOW_KINDS:
            return _HOW_KINDS[words[k + 1]]
        if word in ("what", "which") and k + 1 < len(words):
            noun = words[k + 1]
            if noun in _KIND_WORDS and k + 3 < len(words) and words[k + 2] == "of":
                noun = words[k + 3]
            return QUESTION_NOUN_KINDS.get(noun, QUESTION_NOUN_KINDS.get(noun.rstrip("s"), ""))
    return ""


_MONTHS = frozenset(_WORDS["months"])


def value_shape(answer: str) -> str:
    """The written shape of a time or number answer, word by word: a four-digit year "Y", a month "M", a day or
    other number of one or two digits "D", a longer number "N<digits>", an ordinal "O", a number word "W", other
    words as they are — "December 20, 1951" → "M D Y", "in 1982" → "in Y", "the 1979–80 season" → "the Y D
    season", "3.2 million" → "N1 million", "two" → "W". A day-first date reads as a month-first one ("25
    September 2007" → "M D Y"). A replacement for a time or a number must have its answer's shape, so that a
    season stays a season, a full date a full date, a count a count of the same size."""
    parts = []
    for token in re.findall(r"\d+(?:[.,]\d+)*(?:st|nd|rd|th|s)?|[A-Za-z]+|[$£€¥%]", answer):
        low = token.lower()
        if re.fullmatch(r"\d+(st|nd|rd|th)", low):
            parts.append("O")
        elif re.fullmatch(r"\d{4}s", low):
            parts.append("Ys")
        elif re.fullmatch(r"\d{4}", low):
            parts.append("Y")
        elif re.fullmatch(r"\d{1,2}", low):
            parts.append("D")
        elif low[:1].isdigit():
            parts.append(f"N{len(re.split(r'[.]', low)[0].replace(',', ''))}")
        elif low in _MONTHS:
            parts.append("M")
        elif low in NUMBER_WORDS and low not in ("hundred", "thousand", "million", "billion"):
            parts.append("W")
        else:
            parts.append(low)
    shape = " ".join(parts)
    return re.sub(r"\bD M Y\b", "M D Y", shape)


def conjuncts(answer: str) -> int:
    """How many things `answer` names by its commas and "and"s ("Jerry Leiber and Mike Stoller": 2): a replacement
    names as many (two songwriters are not replaced by one country)."""
    return 1 + len(re.findall(r",(?!\s*\d)|\s(?:and|&)\s", answer))


def edit_answer(text: str, old: str, new: str, asked: str) -> str:
    """`text` with `old` replaced by `new` (whole words, any case); for a person asked about by
    'who' with a name of several words, the surname standing alone is replaced by the new surname
    too ("Johannes Gutenberg … Gutenberg was" → "Tom Rigg … Rigg was"; not in "Atletico Madrid"
    for "Real Madrid"). ValueError if `old` is not in it."""
    edited = replace_fact(text, old, new)
    if (
        asked in ("who", "who's", "whom", "whose")
        and len(old.split()) > 1
        and answer_kind(old) == answer_kind(new) == "name"
    ):
        surname, new_surname = old.split()[-1], new.split()[-1]

        def alone(match: re.Match) -> str:  # not part of another name ("Atletico Madrid" for "Real Madrid")
            # a capitalised word just before (not one that ends a sentence: "the Bible. Gutenberg was")
            after_name = re.search(r"(?:[A-Z][\w'’-]*|\b[A-Z]\.|\b(?:Mr|Mrs|Ms|Dr|St)\.)\s+$", edited[: match.start()])
            return match.group(0) if after_name else new_surname

        edited = re.sub(rf"(?<!\w){re.escape(surname)}(?!\w)", alone, edited)
    return edited


def answer_entity_label(doc, answer: str) -> str:
    """spaCy's entity label of `answer` where it first stands in `doc` (a tagged spaCy Doc): the label
    of the entity that covers most of it, if that covers at least half of its characters; "" when no
    entity does (a common noun, a phrase) or the answer is not in the text."""
    match = whole_words(answer).search(doc.text)
    if match is None:
        return ""
    covered, label = 0, ""
    for entity in doc.ents:
        overlap = min(entity.end_char, match.end()) - max(entity.start_char, match.start())
        if overlap > covered:
            covered, label = overlap, entity.label_
    return label if 2 * covered >= match.end() - match.start() else ""


def span_of(doc, phrase: str):
    """The tokens of a parsed spaCy Doc where `phrase` first stands (whole words, widened to whole tokens), or
    None where it does not."""
    match = whole_words(phrase).search(doc.text)
    span = None if match is None else doc.char_span(match.start(), match.end(), alignment_mode="expand")
    return span if span is not None and len(span) else None


def answer_shape(doc, answer: str) -> str:
    """The grammatical shape of `answer` where it first stands in `doc` (a parsed spaCy Doc): whether it
    opens with a determiner, its head word's part of speech and grammatical number — "DET NOUN Sing" for
    "a scythe", "NOUN Sing" for "butane", "NOUN Plur" for "stromal cells" — so that a replacement for an
    answer that is no entity reads as the same kind of phrase in its sentence; "" when it is not in the text."""
    span = span_of(doc, answer)
    if span is None:
        return ""
    number = span.root.morph.get("Number")
    return " ".join(
        part for part in ("DET" if span[0].pos_ == "DET" else "", span.root.pos_, number[0] if number else "") if part
    )


def candidates_sharing(
    candidates: list[tuple[str, int]], value: str, values: list[str]
) -> tuple[list[tuple[str, int]], bool]:
    """The candidates ((answer, pool row)) whose `values[row]` is the old answer's `value`, True; all of them, False,
    when `value` is "" or no candidate has it. With entity labels (`answer_entity_label`): a person for a person, a
    country for a country, a percentage for a percentage (Longpre et al.'s type-preserving substitution); with
    phrase shapes (`answer_shape`): "a sword" for "a scythe"."""
    kept = [(a, j) for a, j in candidates if value and values[j] == value]
    return (kept, True) if kept else (candidates, False)


@dataclass(frozen=True)
class AnswerType:
    """What a replacement must share with an answer: `answer_kind`, the spaCy entity label and the phrase
    shape of the answer where it stands in its passage ("" where unknown), and the relation the data
    names (a `relation` field; None without one)."""

    kind: str
    entity: str = ""
    shape: str = ""
    relation: str | None = None
    gender: str = ""  # "female" / "male" where its passage says so around it (`passage_gender`), else ""


_FEMALE = frozenset(
    ["she", "her", "hers", "herself", "actress", "woman", "women", "queen", "mother", "daughter", "wife", "girl"]
)
_MALE = frozenset(["he", "him", "his", "himself", "man", "men", "king", "father", "son", "husband", "boy"])


def passage_gender(text: str, name: str) -> str:
    """ "female" or "male" where the words around `name` in `text` say so — the sentence it first stands in and the
    next, by their pronouns and gendered nouns ("she", "actress", "Women's Singles"; "he", "his"), one side
    outnumbering the other — else "". A replacement for a person must not be named by its own passage as the other
    ("Ben Fransham … is an English actress … her role")."""
    match = whole_words(name).search(text)
    if match is None:
        return ""
    start = max((m.end() for m in re.finditer(r"[.!?]\s+", text[: match.start()])), default=0)
    ends = [m.end() for m in re.finditer(r"[.!?](?:\s+|$)", text[match.end() :])]
    window = text[start : match.end() + (ends[1] if len(ends) > 1 else len(text))]
    words = re.findall(r"[a-z]+", window.lower())
    female, male = sum(w in _FEMALE for w in words), sum(w in _MALE for w in words)
    return "female" if female > male else "male" if male > female else ""


def tag_answers(
    answers: list[str], contexts: list[str | None], relations: list[str | None] | None = None, nlp=None
) -> list[AnswerType]:
    """Each answer's `AnswerType`, tagged where it stands in its context (the passage stating it; an
    answer with no context, or not found in it, is tagged on its own). `nlp`: a spaCy pipeline with NER and
    a parser (`tasks.salient_span.load_pipeline`); None tags kind and relation only."""
    relations = relations or [None] * len(answers)
    if nlp is None:
        return [AnswerType(answer_kind(a), relation=r) for a, r in zip(answers, relations, strict=True)]
    texts = [c if c and states(c, a) else a for a, c in zip(answers, contexts, strict=True)]
    return [
        AnswerType(answer_kind(a), answer_entity_label(doc, a), answer_shape(doc, a), r, passage_gender(doc.text, a))
        for doc, a, r in zip(nlp.pipe(texts), answers, relations, strict=True)
    ]


def _is_one_phrase(span) -> bool:
    """Whether a spaCy span is one phrase of its sentence: every token but the span's root has its head
    inside the span ("the New England Patriots"), not words that attach elsewhere ("therefore sign" in
    "concerned with therefore sign": "therefore" modifies the verb)."""
    root = span.root
    return all(span.start <= token.head.i < span.end for token in span if token.i != root.i)


def sentence_of(text: str, answer: str) -> str:
    """The sentence of `text` where `answer` first stands (whole words), or all of `text` when it cannot
    tell: from the sentence end before the answer to the one after it."""
    match = whole_words(answer).search(text)
    if match is None:
        return text
    start = max((m.end() for m in re.finditer(r"[.!?]\s+(?=[A-Z\"'(])", text[: match.start()])), default=0)
    end = re.search(r"[.!?](?=\s+[A-Z\"'(]|\s*$)", text[match.end() :])
    return text[start : match.end() + end.end()] if end else text[start:]


# spaCy's entity labels by the kind of thing they name. The small English pipeline's label for a name
# can change with the sentence around it ("Fascist Italy" LOC in one, GPE in another); in place, a
# replacement must name the same kind of thing, not carry the same fine label.
ENTITY_KINDS = {
    **dict.fromkeys(("GPE", "LOC"), "place"),
    "FAC": "facility",  # a building, an airport, a road: not a place a state or a city can stand in for
    "ORG": "group",
    "NORP": "people",  # a nationality, a religious or political group: not a band, a team or a cartoon character
    **dict.fromkeys(("WORK_OF_ART", "PRODUCT", "EVENT", "LAW", "LANGUAGE"), "work"),
    **dict.fromkeys(("DATE", "TIME"), "time"),
    **dict.fromkeys(("CARDINAL", "QUANTITY", "MONEY", "PERCENT", "ORDINAL"), "number"),
    "PERSON": "person",
}
# word classes that make a phrase more than a noun phrase: a replacement brings none its answer lacks
# ("therefore sign" for "epistemology": an adverb where a noun stood)
_CLAUSE_WORDS = frozenset({"ADV", "VERB", "AUX", "PRON", "SCONJ", "INTJ", "X", "SYM"})


def entity_kind(label: str) -> str:
    """The kind of thing a spaCy entity label names (`ENTITY_KINDS`; the label itself where it has none)."""
    return ENTITY_KINDS.get(label, label)


def _word_classes(doc, phrase: str) -> set[str]:
    span = span_of(doc, phrase)
    return set() if span is None else {token.pos_ for token in span} & _CLAUSE_WORDS


def reads_in_place(nlp, sentence: str, old: str, new: str, original=None) -> str | None:
    """Why `new` does not read as the same kind of thing as `old` in the sentence stating `old`, or None
    when it does. Checked in context for both, as the reader will see them: `sentence` (`original`: its
    parse, when the caller has it) and `sentence` with `old` replaced by `new` are parsed (`nlp`: a spaCy
    pipeline with NER and a parser). `new` must stand in the edited one as one phrase (`_is_one_phrase`)
    naming the kind of thing `old` names in the original (`ENTITY_KINDS`: "Nazi Germany" for "Fascist
    Italy", not "the New England Patriots" for "Fifty Shades of Grey") or, where `old` is no entity, as no
    entity, with `old`'s phrase shape and no word class `old` lacks (`_CLAUSE_WORDS`)."""
    original = nlp(sentence) if original is None else original
    old_label, old_shape = answer_entity_label(original, old), answer_shape(original, old)
    edited = replace_fact(sentence, old, new)
    doc = nlp(edited)
    span = span_of(doc, new)
    if span is None:
        return f"{new!r} not found in the edited sentence"
    if not _is_one_phrase(span):
        return f"{new!r} does not read as one phrase where {old!r} stood"
    label = answer_entity_label(doc, new)
    kind, old_kind = entity_kind(label), entity_kind(old_label)
    if kind != old_kind:
        return f"{new!r} reads as {label or 'no entity'} where {old!r} read as {old_label or 'no entity'}"
    if not old_label:
        shape = answer_shape(doc, new)
        if shape != old_shape:
            return f"{new!r} is a {shape or '?'} phrase where {old!r} was a {old_shape or '?'} one"
        extra = _word_classes(doc, new) - _word_classes(original, old)
        if extra:
            return f"{new!r} brings a word class {old!r} lacks ({', '.join(sorted(extra))})"
    return None


@dataclass(frozen=True)
class FactEdit:
    """One planned corpus edit: question `example`'s answer `old` becomes `new` in every passage of
    `passage_ids`; `kept` says what `new` shares with `old` ("relation capital", "entity person" (the
    kind of thing both name, `ENTITY_KINDS`), "shape DET NOUN Sing")."""

    example: int
    old: str
    new: str
    kept: str
    passage_ids: tuple[str, ...]


@dataclass
class EditPlan:
    """The edits chosen, and every eligible fact left unedited with the reason."""

    edits: list[FactEdit]
    skipped: list[tuple[int, str]]


def _may_replace(i: int, j: int, answers, norm, types, asked, texts: list[str], used: set[str]) -> bool:
    """`plan_fact_edits`' rules, before the type's, for answer `j` replacing answer `i` (stated in `texts`);
    `asked`: each row's `question_kind`."""
    return (
        j != i
        and bool(norm[j])
        and norm[j] not in used
        and not _shared_words(norm[i], norm[j], _is_value(types[i]))
        and types[j].kind == types[i].kind
        and asked[j] == asked[i]
        and conjuncts(answers[j]) == conjuncts(answers[i])
        and (not _is_value(types[i]) or _same_value(answers[i], answers[j]))
        and len(answers[j].split()) <= max(3, len(answers[i].split()) + 1)
        and not any(answers[j].lower() in t for t in texts)
    )


def _inside_a_name(text: str, answer: str) -> bool:
    """Whether `answer` stands in `text` as part of a longer name: right after a capitalised word that does not
    open a sentence ("Diana Rigg" for "Rigg") or right before one ("Kansas City" for "Kansas"), where replacing
    it would leave half a name ("Diana Dottie West"). Only a one-word name is checked: a name of several words is
    a whole name, whatever stands beside it (a table's cells: "Nominee George W. Bush Al Gore")."""
    if len(answer.split()) > 1 or not answer[:1].isupper():
        return False
    for match in whole_words(answer).finditer(text):
        before = re.search(r"(?:^|[.!?:;\"(]\s*|\s)([A-Z][\w'’-]*)\s+$", text[: match.start()])
        if before and not re.search(r"(?:^|[.!?:;\"(])\s*[A-Z][\w'’-]*\s+$", text[: match.start()]):
            return True
        if re.match(r"\s+[A-Z][a-z]", text[match.end() :]):
            return True
    return False


def _qualified(text: str, place: str) -> bool:
    """Whether `place` stands in `text` followed by a comma and a capitalised name: a larger place that qualifies it
    ("Atlanta, Georgia")."""
    return any(re.match(r",\s*[A-Z][a-z]", text[m.end() :]) for m in whole_words(place).finditer(text))


def _is_bare_name(answer: str) -> bool:
    """Whether `answer` is a name alone: its first word capitalised and no article ("The Impalas", a band tagged
    PERSON) or description ("produced by Quincy Jones", "rock band Urge Overkill") before it."""
    return answer[:1].isupper() and answer.split()[0].lower() not in ("the", "a", "an")


def _alike(i: int, j: int, answers: list[str], types: list[AnswerType], kind: str) -> bool:
    """The rule within an entity kind for answer `j` replacing answer `i`: a person's name by a name of at least as
    many words when it had several (not "Robin" for "Sloane Stephens") and, where the old one's passage names its
    gender (`passage_gender`), by a person whose own passage names the same; a place by one of its level
    (`place_levels`: a country for a country, not "Bulgaria" for "Rome")."""
    old, new = answers[i], answers[j]
    if kind == "person":
        return (
            _is_bare_name(new)
            and (len(old.split()) < 2 or len(new.split()) >= 2)
            and (not types[i].gender or types[j].gender == types[i].gender)
        )
    if kind == "place":
        return bool(place_levels(old) & place_levels(new))
    return True


_LINKING_WORDS = frozenset(["and", "of", "in", "on", "at", "by", "for", "to", "from"])


def _shared_words(old: str, new: str, value: bool) -> set[str]:
    """The words two normalised answers share that a replacement must not: any but linking words ("and" in "Jerry
    Leiber and Mike Stoller"); for a time or a number, only those with a digit (a season for a season shares
    "season", "6 million" for "3.2 million" shares "million": their `value_shape` says they must)."""
    shared = set(old.split()) & set(new.split())
    return {w for w in shared if any(c.isdigit() for c in w)} if value else shared - _LINKING_WORDS


def _is_value(answer_type: AnswerType) -> bool:
    """Whether an answer is a time or a number (its written shape, `value_shape`, must be kept)."""
    return answer_type.kind in ("year", "number") or entity_kind(answer_type.entity) in ("time", "number")


# a year replaced by one at most this far from it, so that the passage's other dates still read around it (a song
# of 2002 is not said to come out in 1917)
MAX_YEARS_APART = 25


def _same_value(old: str, new: str) -> bool:
    """Whether time or number `new` can stand for `old`: the same `value_shape`, and each year within
    `MAX_YEARS_APART` of the old one's."""
    if value_shape(new) != value_shape(old):
        return False
    years = [re.findall(r"(?<!\d)\d{4}(?!\d)", text) for text in (old, new)]
    return all(abs(int(a) - int(b)) <= MAX_YEARS_APART for a, b in zip(*years))


# The embedding similarity (cosine) a replacement must have with the old answer where the kind of thing it names is
# broad: a place, a group, a work, a people, a facility or a phrase that is no entity ("Real Madrid" is a group, and
# so is a hotel chain; a city is a place, and so is a country; "scythe" and "water ice" are both singular nouns).
# Persons, times and numbers, whose kind and written shape already make a sentence that reads, need none.
BROAD_KIND_SIMILARITY = 0.5
_NARROW_KINDS = frozenset({"person", "time", "number"})


def _fits_question(i: int, answers: list[str], asked: list[str], types: list[AnswerType], similarity) -> str | None:
    """Why fact `i`'s answer cannot be typed by its question (its entity kind not one the question allows, or
    its nearest answers naming another kind than spaCy's label), or None."""
    kind = entity_kind(types[i].entity)
    allowed = QUESTION_ALLOWS.get(asked[i])
    if allowed is not None and kind not in allowed:
        return f"its question asks for a {asked[i]}, its answer reads as {types[i].entity or 'no entity'}"
    if kind == "person" and asked[i] != "person":  # "what was the biggest tank": a tank tagged PERSON
        return f"its answer reads as PERSON, its question does not ask for a person ({asked[i] or 'no kind named'})"
    if kind == "person" and not _is_bare_name(answers[i]):
        return "its answer is more than a person's name"
    if types[i].entity and similarity is not None:
        voted = neighbour_kind(i, types, similarity, -1)
        if voted not in (None, kind):
            return f"spaCy tags its answer {types[i].entity}, its nearest answers name a {voted}"
    return None


def _of_its_type(
    i: int, candidates: list[int], answers: list[str], types: list[AnswerType], similarity
) -> tuple[str | None, list | str]:
    """`plan_fact_edits`' type rule for fact `i`: → (what the kept candidates share with it, them), or (None, the
    reason to skip it)."""
    if types[i].relation is not None:
        return f"relation {types[i].relation}", [j for j in candidates if types[j].relation == types[i].relation]
    if types[i].entity:
        kind = entity_kind(types[i].entity)
        return f"entity {kind}", [
            j
            for j in candidates
            if entity_kind(types[j].entity) == kind
            and _alike(i, j, answers, types, kind)
            and (similarity is None or neighbour_kind(j, types, similarity, i) in (None, kind))
        ]
    if types[i].kind == "name" or "PROPN" in types[i].shape.split():
        # a name no entity label covers ("Vice President of the United States", headed by a proper noun): what
        # it names is not known, and a phrase shape is no kind for a name
        return None, "its answer is a name spaCy does not tag as an entity where it stands"
    if types[i].shape:
        shape = types[i].shape
        return f"shape {shape}", [j for j in candidates if not types[j].entity and types[j].shape == shape]
    return None, "its answer's type is unknown (no relation, entity or phrase shape)"


def _unfit_fact(
    i: int, passages: list[Passage], used_passages: set[str], answers, types, asked, similarity
) -> str | None:
    """`plan_fact_edits`' rules for fact `i` itself (stated in `passages`), before any replacement is sought: why it
    is not edited, or None."""
    if not passages:
        return "no passage read states its answer"
    if any(p.id in used_passages for p in passages):
        return "its passage is already edited for another question"
    if any(_inside_a_name(p.text, answers[i]) for p in passages):
        return "its answer stands inside a longer name in the passage"
    if entity_kind(types[i].entity) == "place" and any(_qualified(p.text, answers[i]) for p in passages):
        # "Atlanta, Georgia": another city would stand in Georgia ("London, Georgia")
        return "its place is qualified by a larger one in the passage"
    return None if types[i].relation is not None else _fits_question(i, answers, asked, types, similarity)


def _first_in_place(nlp, text: str, answers: list[str], i: int, candidates: list[int]) -> tuple[int | None, str]:
    """The first of the `CANDIDATES_TRIED_IN_PLACE` first `candidates` that reads as answer `i` does in its
    sentence of `text` (`reads_in_place`): → (its row, ""), or (None, why the first did not)."""
    sentence = sentence_of(text, answers[i])
    original, misfits = nlp(sentence), []
    for j in candidates[:CANDIDATES_TRIED_IN_PLACE]:
        misfit = reads_in_place(nlp, sentence, answers[i], answers[j], original)
        if misfit is None:
            return j, ""
        misfits.append(misfit)
    return None, misfits[0]


# candidates tried in place (`reads_in_place`) per fact, most similar first: each costs a parse
CANDIDATES_TRIED_IN_PLACE = 8
NEIGHBOURS_VOTING = 7  # `neighbour_kind`


def neighbour_kind(j: int, types: list[AnswerType], similarity, leave_out: int) -> str | None:
    """What kind of thing (`ENTITY_KINDS`) answer `j` names by the answers nearest to it: the kind of more than
    half of its `NEIGHBOURS_VOTING` most similar answers that carry an entity label (itself and `leave_out`
    aside), or None without such a majority (or with fewer than 3 of them). A second opinion on spaCy's label
    of one answer in one sentence, which the small pipeline gets wrong for names it has not seen ("Om Prakash
    Rawat" tagged LOC: his nearest answers are persons)."""
    labelled = [x for x in range(len(types)) if x not in (j, leave_out) and types[x].entity]
    nearest = sorted(labelled, key=lambda x: (-float(similarity[j][x]), x))[:NEIGHBOURS_VOTING]
    if len(nearest) < 3:
        return None
    kind, count = Counter(entity_kind(types[x].entity) for x in nearest).most_common(1)[0]
    return kind if 2 * count > len(nearest) else None


def plan_fact_edits(
    questions: list[str],
    answers: list[str],
    types: list[AnswerType],
    eligible: list[int],
    stating: dict[int, list[Passage]],
    n: int | None,
    similarity=None,
    nlp=None,
) -> EditPlan:
    """Choose up to `n` corpus edits (None: no cap), one per eligible fact, in the order of `eligible`.

    Args:
        questions, answers, types: the pool of real answers a replacement is drawn from (row j: question
            j, its answer, `tag_answers`' type); a fact to edit is a row of it.
        eligible: rows whose fact may be edited (e.g. answered right, the answer stated in the top passage).
        stating: row → the passages that state its answer and are edited with it.
        similarity: (rows, rows) array of answer similarities (e.g. cosine of their embeddings): the
            replacement is the most similar candidate (a city for a city); None: the first candidate.

    A replacement is another row's answer that differs from the old one in every word, occurs in none of
    the passages edited, has the old answer's `answer_kind`, answers a question of the same kind
    (`question_word`), has at most one word more than the old answer (3 words at least), was not chosen
    for another edit of the plan, and has the same relation where the data names one, else an entity
    label of the same kind (`ENTITY_KINDS`: a place for a place; with `similarity`, not naming another
    kind by its nearest answers, `neighbour_kind`), else (an answer that is no entity) the same phrase
    shape; a name with no entity label (capitalised, or headed by a proper noun) is skipped. With `nlp` (a
    spaCy pipeline), an answer typed by entity or shape (not by a relation the data names) also has its
    replacement checked where it will stand: the first of the `CANDIDATES_TRIED_IN_PLACE` most similar
    candidates that reads as the same kind of phrase in the sentence of the first passage edited
    (`reads_in_place`) is taken. A fact
    with no such replacement, or whose passages another edit of the plan already changed, is skipped with
    the reason.
    """
    edits: list[FactEdit] = []
    skipped: list[tuple[int, str]] = []
    used_replacements: set[str] = set()
    used_passages: set[str] = set()
    asked = [question_kind(q) for q in questions]
    norm = [normalize_answer(a) for a in answers]
    for i in eligible:
        if n is not None and len(edits) == n:
            break
        passages = stating.get(i, [])
        unfit = _unfit_fact(i, passages, used_passages, answers, types, asked, similarity)
        if unfit is not None:
            skipped.append((i, unfit))
            continue
        texts = [p.text.lower() for p in passages]
        candidates = [
            j for j in range(len(answers)) if _may_replace(i, j, answers, norm, types, asked, texts, used_replacements)
        ]
        kept, candidates = _of_its_type(i, candidates, answers, types, similarity)
        if kept is None:
            skipped.append((i, candidates))
            continue
        if not candidates:
            skipped.append((i, f"no other answer of its type ({kept}) fits"))
            continue
        if similarity is not None:  # most similar first (a city for a city), ties to the earlier row
            candidates = sorted(candidates, key=lambda j: (-float(similarity[i][j]), j))
            if types[i].relation is None and entity_kind(types[i].entity) not in _NARROW_KINDS:
                candidates = [j for j in candidates if float(similarity[i][j]) >= BROAD_KIND_SIMILARITY]
                if not candidates:
                    skipped.append((i, f"no answer of its type ({kept}) is close enough to it"))
                    continue
        best, misfit = candidates[0], None
        if nlp is not None and types[i].relation is None:
            best, misfit = _first_in_place(nlp, passages[0].text, answers, i, candidates)
        if best is None:
            skipped.append((i, f"no answer of its type ({kept}) reads as one in its sentence: {misfit}"))
            continue
        edits.append(FactEdit(i, answers[i], answers[best], kept, tuple(p.id for p in passages)))
        used_replacements.add(norm[best])
        used_passages.update(p.id for p in passages)
    return EditPlan(edits, skipped)


@dataclass(frozen=True)
class Following:
    """Whether an answer asked again after an edit follows it. `exact`: it equals the replacement under the metrics'
    normalisation (`normalize_answer`: lower case, no punctuation or articles). `contained`: the replacement
    stands in it as a whole span of normalised words ("the 1985–86 season" for "1985–86", "regions of Tecala" for
    "Tecala"), and the old answer does not (an answer naming both follows neither). Exact implies contained."""

    exact: bool
    contained: bool


def _holds_span(words: list[str], span: list[str]) -> bool:
    return bool(span) and any(words[k : k + len(span)] == span for k in range(len(words) - len(span) + 1))


def follows(answer: str, replacement: str, old: str) -> Following:
    """How `answer` (given after the edit) follows the edit of `old` into `replacement` (`Following`)."""
    words, new_words, old_words = (normalize_answer(text).split() for text in (answer, replacement, old))
    return Following(
        exact=words == new_words and bool(new_words),
        contained=_holds_span(words, new_words) and not _holds_span(words, old_words),
    )
