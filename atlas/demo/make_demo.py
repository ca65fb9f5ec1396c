"""Generate the shipped demo: a fictional encyclopedia and questions only its passages answer.

Every name (countries, cities, rivers, people, mountains, currencies, inventions) is made up
from syllables by a seeded RNG, so a closed-book reader cannot know any answer: answering
needs retrieval. Run `python -m atlas.demo.make_demo` to rewrite, byte for byte, the files
the package ships next to this script:

    encyclopedia.jsonl   passages {"id", "title", "text"} (one per entity, 40–70 words)
    train.jsonl          training questions {"question", "answers", "gold_doc", "relation"}
    heldout.jsonl        held-out questions, same form, about facts no training question asks
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from common.io import write_jsonl

HERE = Path(__file__).resolve().parent
SEED = 6
N_COUNTRIES, N_CITIES, N_PEOPLE, N_MOUNTAINS = 24, 48, 40, 24
N_TRAIN = 256

# the syllables names are made of and the common nouns facts draw from (each a list under its own key)
WORDS = json.loads((HERE / "demo_words.json").read_text(encoding="utf-8"))


class _Names:
    """Unique made-up names from syllables (seeded)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        """A new capitalised name of that many syllables, never returned before."""
        while True:
            name = "".join(
                self.rng.choice(WORDS["onsets"]) + self.rng.choice(WORDS["vowels"]) for _ in range(syllables)
            )
            name = (name + self.rng.choice(WORDS["codas"])).capitalize()
            if name.lower() not in self.used and len(name) >= 4:
                self.used.add(name.lower())
                return name


def _year(rng: random.Random, low: int, high: int) -> str:
    return str(rng.randint(low, high))


def generate(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """→ (passages, questions); each question names its gold passage id and relation."""
    # long: the demo world's generator, one kind of fact after another, seeded in one order (splitting it would
    # reorder the draws)
    rng = random.Random(seed)
    names = _Names(rng)
    people = [f"{names.word(2)} {names.word(2)}" for _ in range(N_PEOPLE)]
    countries = [names.word(rng.choice([2, 3])) for _ in range(N_COUNTRIES)]
    cities = [names.word(rng.choice([2, 3])) for _ in range(N_CITIES)]
    passages: list[dict] = []
    questions: list[dict] = []

    def add(kind: str, title: str, text: str, facts: list[tuple[str, str, str]]) -> None:
        pid = f"{kind}-{title.lower().replace(' ', '-')}"
        passages.append({"id": pid, "title": title, "text": text})
        for relation, question, answer in facts:
            questions.append({"question": question, "answers": [answer], "gold_doc": pid, "relation": relation})

    city_country = {city: countries[i % N_COUNTRIES] for i, city in enumerate(cities)}
    for i, country in enumerate(countries):
        capital, currency = cities[i], names.word(2).lower()
        export, animal, year = rng.choice(WORDS["exports"]), rng.choice(WORDS["animals"]), _year(rng, 1650, 1990)
        text = (
            f"{country} is an island nation in the {rng.choice(WORDS['seas'])} Sea. Its capital is {capital}, "
            f"and its currency is the {currency}. The main export of {country} is {export}. {country} "
            f"became independent in {year}, and its national animal is the {animal}."
        )
        add(
            "country",
            country,
            text,
            [
                ("capital", f"What is the capital of {country}?", capital),
                ("currency", f"What is the currency of {country}?", currency),
                ("export", f"What is the main export of {country}?", export),
                ("independence", f"In what year did {country} become independent?", year),
                ("animal", f"What is the national animal of {country}?", animal),
            ],
        )
    for city in cities:
        river, founder = names.word(2), rng.choice(people)
        year, landmark = _year(rng, 900, 1800), rng.choice(WORDS["landmarks"])
        population = f"{rng.randint(12, 950)},000"
        text = (
            f"{city} is a city in {city_country[city]}, on the banks of the {river} River. It was founded "
            f"in {year} by {founder}. {city} is famous for its {landmark}, and about {population} people "
            f"live there today."
        )
        add(
            "city",
            city,
            text,
            [
                ("river", f"Which river flows through {city}?", river),
                ("founder", f"Who founded the city of {city}?", founder),
                ("founded", f"In what year was {city} founded?", year),
                ("landmark", f"What is {city} famous for?", landmark),
                ("city_country", f"In which country is the city of {city}?", city_country[city]),
            ],
        )
    for person in people:
        profession, invention = rng.choice(WORDS["professions"]), rng.choice(WORDS["inventions"])
        birthplace, year = rng.choice(cities), _year(rng, 1500, 1950)
        text = (
            f"{person} was a {profession} born in {birthplace} in {year}. {person.split()[0]} is best "
            f"remembered for building the first {names.word(2).lower()} {invention}, and later taught "
            f"at the academy of {rng.choice(cities)}."
        )
        built = text.split("building the first ")[1].split(",")[0]
        add(
            "person",
            person,
            text,
            [
                ("profession", f"What was the profession of {person}?", profession),
                ("birthplace", f"Where was {person} born?", birthplace),
                ("born", f"In what year was {person} born?", year),
                ("invention", f"What did {person} build first?", built),
            ],
        )
    for _ in range(N_MOUNTAINS):
        mountain = names.word(2)
        country, climber = rng.choice(countries), rng.choice(people)
        height, year = str(rng.randint(1200, 8400)), _year(rng, 1780, 1990)
        text = (
            f"Mount {mountain} is a mountain in {country}, {height} metres high. It was first climbed by "
            f"{climber} in {year}. Snow covers the summit of Mount {mountain} for most of the year."
        )
        add(
            "mountain",
            f"Mount {mountain}",
            text,
            [
                ("height", f"How high is Mount {mountain} in metres?", height),
                ("climber", f"Who first climbed Mount {mountain}?", climber),
                ("mountain_country", f"In which country is Mount {mountain}?", country),
            ],
        )
    return passages, questions


def split(questions: list[dict], n_train: int, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """A seeded train / held-out split of the questions (each fact lands in exactly one side)."""
    order = list(range(len(questions)))
    random.Random(f"split-{seed}").shuffle(order)
    train = [questions[i] for i in sorted(order[:n_train])]
    heldout = [questions[i] for i in sorted(order[n_train:])]
    return train, heldout


def main(argv: list[str] | None = None) -> int:
    """Write encyclopedia.jsonl, train.jsonl and heldout.jsonl into `--out` (default: here)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    passages, questions = generate()
    train, heldout = split(questions, N_TRAIN)
    for name, records in (("encyclopedia", passages), ("train", train), ("heldout", heldout)):
        write_jsonl(args.out / f"{name}.jsonl", records)
    print(f"{len(passages)} passages, {len(train)} training and {len(heldout)} held-out questions → {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
