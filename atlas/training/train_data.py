"""The training data of a run: its examples, and the seeded stream of batches that a checkpoint
resumes exactly (`DataPosition`)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace

from atlas.config import AtlasConfig
from common.io import InputError
from tasks.base import Example
from tasks.fewshot import sample_shots
from tasks.score import record_location

# the recipe's messages keep the logger name they have always had (`atlas train` prints it)
logger = logging.getLogger("atlas.training.loop")


@dataclass
class DataPosition:
    """Where the example stream stands: the epoch and the offset in that epoch's order."""

    epoch: int = 0
    offset: int = 0


class ExampleStream:
    """Training examples in a seeded order per epoch; the position is saved for resuming.

    The target of an example is drawn per (seed, epoch, example) — e.g. a random gold
    answer per epoch — so that a resumed run draws exactly the same targets.
    """

    def __init__(self, examples: list[Example], task, seed: int, position: DataPosition | None = None):
        self.examples = examples
        self.task = task
        self.seed = seed
        self.position = position or DataPosition()

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(f"order-{self.seed}-{epoch}").shuffle(order)
        return order

    def next_batch(self, size: int) -> tuple[list[Example], list[str]]:
        """The next `size` examples with their targets (wrapping into the next epoch)."""
        if not self.examples:
            raise ValueError("no training examples (is task.train_data empty?)")
        batch, targets = [], []
        order = self._order(self.position.epoch)
        while len(batch) < size:
            if self.position.offset >= len(order):
                self.position = DataPosition(self.position.epoch + 1, 0)
                order = self._order(self.position.epoch)
            index = order[self.position.offset]
            example = self.examples[index]
            rng = random.Random(f"target-{self.seed}-{self.position.epoch}-{index}")
            query, target = self.task.training_pair(example, rng)
            batch.append(example if query == example.query else replace(example, query=query))
            targets.append(target)
            self.position.offset += 1
        return batch, targets


def _trainable(task, path, skip_invalid: bool) -> list[Example]:
    """The examples of `path` that have a training target. One without (e.g. a question with no
    answers, fine for prediction) is an InputError here, at start, instead of a crash at the step
    that draws it; with `skip_invalid` it is counted, logged and left out."""
    kept, skipped = [], 0
    for example in task.load(path, skip_invalid=skip_invalid):
        try:
            task.train_target(example, random.Random(0))
        except ValueError as error:
            if not skip_invalid:
                location = record_location(task, path, example.id) or (path, None)
                raise InputError(
                    location[0], location[1], task.answer_field, f"{error} (set task.skip_invalid=true to leave it out)"
                ) from None
            skipped += 1
            continue
        kept.append(example)
    if skipped:
        logger.warning("%s: %d example(s) without a training target skipped", path, skipped)
    return kept


def load_training_examples(config: AtlasConfig, task) -> list[Example]:
    """All examples of `task.train_data` (data files; for pretext tasks also prepared corpus
    folders, whose passage ids match the index's so that trivial retrievals are found), reduced
    to a seeded `task.shots` subset when set, then expanded by the task (MMLU's permutations)."""
    examples = [e for path in config.task.train_data for e in _trainable(task, path, config.task.skip_invalid)]
    if config.task.shots is not None:
        examples = sample_shots(examples, config.task.shots, seed=config.training.seed)
    return task.training_examples(examples)
