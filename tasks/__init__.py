"""Task adapters (QA, reading comprehension, KILT, MMLU, FEVER, pretext tasks, salient span masking), metrics, file I/O.

Importing the package registers every task in `tasks.base.TASKS`; build one with
`get_task(name, **options)`.
"""

from tasks import fever, kilt, mmlu, pretext, qa, reading, salient_span  # noqa: F401  (each module registers its task)
from tasks.base import TASKS, Example, Task, get_task, register_task

__all__ = ["TASKS", "Example", "Task", "get_task", "register_task"]
