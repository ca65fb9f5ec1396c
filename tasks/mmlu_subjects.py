"""The standard MMLU subject → subcategory → category mapping (hendrycks/test `categories.py`).

The four categories reported in the MMLU paper and by Atlas: STEM, humanities, social sciences,
other (business, health, misc.). The subject → subcategory table is `mmlu_subcategories.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

SUBCATEGORIES: dict[str, str] = json.loads(Path(__file__).with_name("mmlu_subcategories.json").read_text())

CATEGORIES: dict[str, tuple[str, ...]] = {
    "STEM": ("physics", "chemistry", "biology", "computer science", "math", "engineering"),
    "humanities": ("history", "philosophy", "law"),
    "social sciences": ("politics", "culture", "economics", "geography", "psychology"),
    "other": ("other", "business", "health"),
}

_CATEGORY_OF_SUBCATEGORY = {sub: cat for cat, subs in CATEGORIES.items() for sub in subs}


def subject_category(subject: str) -> str | None:
    """The MMLU category of `subject` (e.g. `college_physics` → `STEM`); None if not MMLU's."""
    subcategory = SUBCATEGORIES.get(subject)
    return None if subcategory is None else _CATEGORY_OF_SUBCATEGORY[subcategory]
