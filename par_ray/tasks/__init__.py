"""The task suite: a plain registry from task name to :class:`Task` instance, and each task's paper depths.

Follows the PAR paper's task suite: S5 / A5 word problems and swap-S5 (``permutations.py``), rule-table chains
(``rule_tables.py``), object tracking (``object_tracking.py``), the prior looped-transformer benchmarks of Fan et al.
2024 (``looped_benchmarks.py``: parity, addition) and graph reachability, the negative control (``graphs.py``).
``common.py`` holds the thin base; each family has its own module.
"""

from __future__ import annotations

from par_ray.tasks import graphs, looped_benchmarks, object_tracking, permutations, rule_tables
from par_ray.tasks.common import DepthPreset, Episode, Filler, GivenPrefix, RecentFirst, Task
from par_ray.tasks.graphs import REACHABILITY
from par_ray.tasks.looped_benchmarks import ADDITION, PARITY
from par_ray.tasks.object_tracking import OBJECT_TRACKING
from par_ray.tasks.permutations import A5, S5, SWAP_S5
from par_ray.tasks.rule_tables import RULE_TABLE_TASK

TASKS: dict[str, Task] = {
    task.name: task
    for task in (SWAP_S5, S5, A5, RULE_TABLE_TASK, OBJECT_TRACKING, PARITY, ADDITION, REACHABILITY)
}
"""Task name → task; ``par_ray.config.TASK_NAMES`` lists the same names in the same order (a test checks)."""

PAPER_DEPTHS: dict[str, DepthPreset] = {
    **permutations.PAPER_DEPTHS, **rule_tables.PAPER_DEPTHS, **object_tracking.PAPER_DEPTHS,
    **looped_benchmarks.PAPER_DEPTHS, **graphs.PAPER_DEPTHS,
}
"""Task name → its paper train/test depths (each module's ``PAPER_DEPTHS``, with its source); read by
``presets.paper_trial``."""


def get_task(name: str) -> Task:
    """The task registered as ``name``. Raises ``ValueError`` listing the known names if there is none."""
    if name not in TASKS:
        raise ValueError(f"task.name: {name!r} is not one of {list(TASKS)}")
    return TASKS[name]


OP_ORDERS = ("forward", "recent_first")


def build_task(task_cfg, train: bool = False) -> Task:
    """The task a ``TaskConfig`` describes: ``get_task(name)``, serialised per ``op_order``; with ``train=True`` and
    ``train_filler > 0``, wrapped in :class:`Filler`, and with ``given_prefix > 0`` in :class:`GivenPrefix` (training
    prompts only). Raises ``ValueError`` for an unknown
    name or op_order, or for ``recent_first`` / ``train_filler`` on a task without a serial layout
    (``Task.op_width is None``: reachability)."""
    task = get_task(task_cfg.name)
    if task_cfg.op_order == "recent_first":
        task = RecentFirst(task)
    elif task_cfg.op_order != "forward":
        raise ValueError(f"task.op_order: {task_cfg.op_order!r} is not one of {list(OP_ORDERS)}")
    if train and task_cfg.train_filler:
        task = Filler(task, task_cfg.train_filler)
    if train and task_cfg.given_prefix:
        task = GivenPrefix(task, task_cfg.given_prefix)
    return task


__all__ = ["TASKS", "PAPER_DEPTHS", "OP_ORDERS", "DepthPreset", "Episode", "Filler", "GivenPrefix", "RecentFirst", "Task",
           "build_task", "get_task"]
