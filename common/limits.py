"""One set of limits for every front end: the Python API (`atlas.Atlas`, `atlas.Index`), the command line and the
server refuse the same inputs with the same numbers. They keep one request from holding a shared model for
minutes, and keep text from being cut without a word: a passage longer than MAX_PASSAGE_CHARS is refused
unsplit (split it into passages: `--chunk-words`), a question longer than MAX_QUESTION_CHARS is refused (the
query encoder and the reader would read only its start)."""

from __future__ import annotations

MAX_QUESTION_CHARS = 2_000
MAX_PASSAGE_CHARS = 20_000
MAX_TITLE_CHARS = 1_000
MAX_ID_CHARS = 256
MAX_BATCH = 64  # questions of one server batch ask, passages of one server edit
MAX_ASK_K = 20  # passages the reader reads
MAX_SEARCH_K = 100


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
