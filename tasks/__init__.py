"""Task adapters (QA, reading, KILT, MMLU, FEVER, pretext tasks, salient spans), their metrics and
scorers, file I/O and progress, and the model helpers that retriever and reader share (`tasks.modeling`).
The bottom package: imports no other package of the project.
Importing it registers every task in `tasks.base.TASKS`; build one with `get_task(name, **options)`."""

from tasks import fever, kilt, mmlu, pretext, qa, reading, salient_span  # noqa: F401  (each module registers its task)
from tasks.base import TASKS, Example, Task, get_task, register_task
from tasks.passage import Passage

__all__ = ["TASKS", "Example", "Passage", "Task", "get_task", "register_task"]
