"""T5 with an output projection of its own (T5 v1.1 / lm-adapt: Atlas's readers), saved as such.

transformers 5's `T5Config` sets `tie_word_embeddings=True` whatever it is given (it keeps the old
meaning of `false`, no scaling of the decoder output, in `scale_decoder_outputs`), so a
`T5ForConditionalGeneration` ties `lm_head` to `shared`; a checkpoint whose `lm_head` differs keeps
it only because transformers declines, at every load, to tie two different tensors (with a
warning), and its saved config says tied. `UntiedT5ForConditionalGeneration` ties only the input
embeddings (encoder and decoder `embed_tokens` ↔ `shared`, as every T5 does), and its saved
`config.json` says `tie_word_embeddings: false`, which `FiDReader.from_pretrained` reads back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import ClassVar

from transformers import T5ForConditionalGeneration

UNTIED_ARCHITECTURE = "T5ForConditionalGeneration"


class UntiedT5ForConditionalGeneration(T5ForConditionalGeneration):
    """`T5ForConditionalGeneration` whose `lm_head` is a parameter of its own; same modules, same keys."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {
        k: v for k, v in T5ForConditionalGeneration._tied_weights_keys.items() if k != "lm_head.weight"
    }

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """`T5ForConditionalGeneration.save_pretrained`, with `tie_word_embeddings: false` in config.json
        (the in-memory config cannot hold it: T5Config forces true) and the plain T5 architecture name,
        so that any T5 loader builds it (transformers' own with the warning, `FiDReader` without)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        file = Path(save_directory) / "config.json"
        config = json.loads(file.read_text(encoding="utf-8"))
        config.update(tie_word_embeddings=False, architectures=[UNTIED_ARCHITECTURE])
        file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def saved_untied(folder: str | Path) -> bool:
    """Whether the model folder's config.json says `tie_word_embeddings: false` (an own `lm_head`)."""
    file = Path(folder) / "config.json"
    return json.loads(file.read_text(encoding="utf-8")).get("tie_word_embeddings") is False
