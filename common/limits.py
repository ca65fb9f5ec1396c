"""One set of limits for every front end: the Python API (`atlas.Atlas`, `atlas.Index`), the command line and the
server refuse the same inputs with the same numbers. They keep one request from holding a shared model for
minutes, and keep text from being cut without a word: a passage longer than MAX_PASSAGE_CHARS is refused
unsplit (split it into passages: `--chunk-words`), a question longer than MAX_QUESTION_CHARS is refused (the
query encoder and the reader would read only its start)."""

from __future__ import annotations

import re

MAX_QUESTION_CHARS = 2_000
MAX_PASSAGE_CHARS = 20_000
MAX_TITLE_CHARS = 1_000
MAX_ID_CHARS = 256
MAX_BATCH = 64  # questions of one server batch ask, passages of one server edit
MAX_ASK_K = 20  # passages the reader reads
MAX_SEARCH_K = 100

# The passage id grammar, one for the library, the command line and the server, so that every id the Python API
# accepts can be read, replaced and removed over HTTP (`/api/passages/{id}`): 1 to MAX_ID_CHARS characters; no white
# space first or last; no control character (NUL, line breaks, …); no `.` or `..` between slashes (clients resolve
# those path segments away before a request is sent, so such an id could not be reached). Any other character,
# `/` included, is allowed. The patterns are JSON Schema's (the server publishes them) and Python's alike.
# Python's white space (`str.isspace`) and control characters (C0, DEL, C1), as regex classes
SPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
CONTROL = r"\x00-\x1f\x7f-\x9f\u2028\u2029"
NOT_BLANK = f"[^{SPACE}]"  # a string that holds a character other than white space
# what an id must not match (unanchored alternatives, so that Python's `$`, which also matches before a final
# "\n", changes nothing)
BAD_ID = f"^[{SPACE}]|[{SPACE}]$|[{CONTROL}]|(^|/)[.][.]?(/|$)"
ID_RULE = (
    f"a passage id has 1 to {MAX_ID_CHARS} characters, no white space first or last, no control character (NUL, "
    "line breaks, ...) and no '.' or '..' between slashes"
)


def passage_id_problem(value: object) -> str | None:
    """Why `value` is not a passage id under the grammar above (`ID_RULE`); None when it is one."""
    if not isinstance(value, str):
        return f"a passage id is a string, not {type(value).__name__}"
    if not 1 <= len(value) <= MAX_ID_CHARS or re.search(BAD_ID, value):
        return ID_RULE
    return None


def check_passage_id(value: object, where: str = "passage id") -> str:
    """`value` when it is a passage id, else ValueError (TypeError for a non-string) naming `where`, the id and the
    rule."""
    problem = passage_id_problem(value)
    if problem is None:
        return value
    error = TypeError if not isinstance(value, str) else ValueError
    raise error(f"{where} {value!r:.80}: {problem}")


def check_question(question: str, where: str = "the question") -> None:
    """ValueError naming `where` when `question` is empty or longer than MAX_QUESTION_CHARS."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where} is empty or not text: {question!r}")
    if len(question) > MAX_QUESTION_CHARS:
        raise ValueError(
            f"{where} has {len(question):,} characters; the limit is {MAX_QUESTION_CHARS:,} (its start alone would "
            "be read): ask a shorter question"
        )


def check_k(k: int, limit: int, what: str = "k") -> None:
    """ValueError unless 1 <= k <= limit."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limit:
        raise ValueError(f"{what} must be an integer from 1 to {limit}, got {k!r}")
