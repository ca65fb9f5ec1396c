"""Place names by level, so that a corpus edit replaces a country by a country and a city by a city.

`place_levels` reads a place's level from its name: a continent or world region, a country (CLDR's English territory
names, from Babel 2.x's `Locale("en").territories`, with common and historical names added), a US state, or none of
these (a city, a county, a building: "other"). Names in two lists (Georgia, New York, Washington) are of both levels.
The lists are `place_names.json`'s, by level.
"""

from __future__ import annotations

import json
from pathlib import Path

NAMES_BY_LEVEL = {
    level: frozenset(names)
    for level, names in json.loads(Path(__file__).with_name("place_names.json").read_text(encoding="utf-8")).items()
}


def place_levels(name: str) -> frozenset[str]:
    """The levels a place `name` is of: a subset of {"region", "country", "state"}, or {"other"} for a place in
    none of the lists. The part before a comma decides ("Kent County, Maryland" is a county, "other"); a leading
    "the" is dropped."""
    head = name.split(",")[0].strip()
    head = head[4:] if head.lower().startswith("the ") else head
    levels = {level for level, names in NAMES_BY_LEVEL.items() if head in names}
    return frozenset(levels or {"other"})
