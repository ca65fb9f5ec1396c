"""Task adapters (QA, reading, KILT, MMLU, FEVER, pretext tasks, salient spans), their metrics and
scorers, and the passage record every package passes on (`tasks.passage.Passage`).
Imports only `common` of the project's packages.
Importing it registers every task in `tasks.base.TASKS`; build one with `get_task(name, **options)`."""

from tasks import fever, kilt, mmlu, pretext, qa, reading, salient_span  # noqa: F401  (each module registers its task)
from tasks.base import TASKS, Example, Task, get_task, register_task
from tasks.passage import Passage

__all__ = ["TASKS", "Example", "Passage", "Task", "get_task", "register_task"]
