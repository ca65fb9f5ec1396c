"""Library noise off while atlas loads and runs: transformers' load reports ("LOAD REPORT" tables of the
pooler MiniLM carries and the encoders leave unused), its per-file progress bars, and faiss's probe of
CPU-specific builds. Our own progress bars and log lines say what is happening."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_libraries(verbose: bool = False) -> Iterator[None]:
    """Within the block the libraries' own messages are hidden (unless `verbose`: then shown, at info level);
    their settings are put back after it, so a notebook's own logging is left as it was."""
    from transformers.utils import logging as hf_logging  # heavy: transformers

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    faiss = logging.getLogger("faiss")
    faiss_level = faiss.level
    if verbose:
        hf_logging.set_verbosity_info()
        faiss.setLevel(logging.INFO)
    else:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        faiss.setLevel(logging.WARNING)
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
        else:
            hf_logging.disable_progress_bar()
        faiss.setLevel(faiss_level)
