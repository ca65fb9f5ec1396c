"""A run's metrics log: `{output_dir}/log.jsonl` (one JSON line per logged step) and TensorBoard."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from common.io import atomic_write_text

logger = logging.getLogger(__name__)


def read_log(path: Path) -> list[dict]:
    """The records of a run's `log.jsonl`, in order. A line that does not parse (a power cut keeps a log's last
    lines only as of its last fsync: they read back cut short, or as zeros) is dropped with a warning naming it."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s line %d: not a JSON record (cut short by a crash?); dropped", path, number)
    return records


class RunLog:
    """Console/TensorBoard/JSONL metrics: one line per logged step in `{output_dir}/log.jsonl`."""

    def __init__(self, output_dir: Path, resume_step: int | None):
        """`resume_step`: the step of the checkpoint a resumed run starts from (None: a new run).
        Lines logged after it by the interrupted run are dropped, so that the log of a resumed run
        equals the log of an uninterrupted one."""
        self.path = output_dir / "log.jsonl"
        if resume_step is not None and self.path.is_file():
            kept = [record for record in read_log(self.path) if record.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(record) + "\n" for record in kept))
        self.file = open(self.path, "a" if resume_step is not None else "w", encoding="utf-8")  # noqa: SIM115
        self.tensorboard = None
        try:
            from torch.utils.tensorboard import SummaryWriter  # optional: tensorboard (an extra)

            self.tensorboard = SummaryWriter(str(output_dir / "tensorboard"))
        except ImportError:  # tensorboard is an optional extra
            pass

    def write(self, step: int, values: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **values}) + "\n")
        self.file.flush()
        if self.tensorboard is not None:
            for key, value in values.items():
                self.tensorboard.add_scalar(key, value, step)

    def sync(self) -> None:
        """Make every line written so far durable: called before each checkpoint, so that a power cut leaves
        the log at least as far as the checkpoint a resumed run starts from."""
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        try:
            self.sync()  # a run that returned has its whole log on disk
        finally:
            self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


def logged_recall(path: Path) -> dict[str, float] | None:
    """The retriever's answer recall on training questions at step 0, as the run logged it (None if absent)."""
    if not path.is_file():
        return None
    for record in read_log(path):
        if record.get("step") == 0 and any(k.startswith("train_recall/") for k in record):
            return {k.removeprefix("train_recall/"): v for k, v in record.items() if k.startswith("train_recall/")}
    return None
