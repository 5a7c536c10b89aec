"""The state-tracking task suite: a plain registry from task name to :class:`Task` instance.

Follows the PAR paper's task suite (S5 / A5 word problems, swap-S5). ``common.py`` holds the thin base; each family
has its own module.
"""

from __future__ import annotations

from par_ray.tasks.common import Episode, Filler, RecentFirst, Task
from par_ray.tasks.permutations import A5, S5, SWAP_S5

TASKS: dict[str, Task] = {task.name: task for task in (SWAP_S5, S5, A5)}


def get_task(name: str) -> Task:
    """The task registered as ``name``. Raises ``ValueError`` listing the known names if there is none."""
    if name not in TASKS:
        raise ValueError(f"task.name: {name!r} is not one of {list(TASKS)}")
    return TASKS[name]


OP_ORDERS = ("forward", "recent_first")


def build_task(task_cfg, train: bool = False) -> Task:
    """The task a ``TaskConfig`` describes: ``get_task(name)``, serialised per ``op_order``; with ``train=True`` and
    ``train_filler > 0``, wrapped in :class:`Filler` (training prompts only)."""
    task = get_task(task_cfg.name)
    if task_cfg.op_order == "recent_first":
        task = RecentFirst(task)
    elif task_cfg.op_order != "forward":
        raise ValueError(f"task.op_order: {task_cfg.op_order!r} is not one of {list(OP_ORDERS)}")
    if train and task_cfg.train_filler:
        task = Filler(task, task_cfg.train_filler)
    return task


__all__ = ["TASKS", "OP_ORDERS", "Episode", "Filler", "RecentFirst", "Task", "build_task", "get_task"]
