"""Task prompts as a pretrained parent reads them: every task id rendered as a word of the parent's tokenizer.

A random-init model reads the compact task ids 0..V_task−1 (its vocabulary is the task's). A pretrained parent has
its own vocabulary: fed the compact ids it would read the first tokens of the Qwen BPE — ``!`` as BOS, the moves
as ``"`` ``#`` ``$`` ``%`` …, and the halting query ``?`` among the S5 moves — and its prior would barely be engaged.
So each task names its tokens (``Task.words``, one table per task in ``par_ray.tasks``: object and location names,
``" swap"``, digits, ``":"``…) and :func:`render` maps them through the parent's tokenizer: every word must be one
token, the task's tokens distinct, and none may be a halting word (``par_ray.halting.HALT_WORDS``: ``?``, `` Yes``,
`` No``) or a chain-of-thought separator (``par_ray.cot.COT_WORDS``: ``,``, ``.``), since those are read or
appended in the same prompts. The rendered task (``par_ray.tasks.common.Rendered``) samples the same batches in
parent ids. Source: the PAR paper retrofits pretrained Qwen parents on these tasks as text.
"""

from __future__ import annotations

from par_ray.cot import COT_WORDS
from par_ray.halting import HALT_WORDS
from par_ray.tasks.common import Rendered, Task


def reserved_words() -> dict[str, str]:
    """Words a task may not use, each with what reads it: the halting query and answers, the CoT separators."""
    return {**{w: "halting" for w in HALT_WORDS}, **{w: "chain-of-thought" for w in COT_WORDS}}


def token_table(task: Task, tokenizer) -> tuple[int, ...]:
    """The parent id of every task id: ``tokenizer.encode(task.words[i], add_special_tokens=False)``, one token each.

    Raises ``ValueError`` naming the task and every problem: a task without words, a word that is not one token,
    two task ids on the same parent token, or a task token equal to a halting or chain-of-thought token.
    """
    if len(task.words) != task.vocab_size:
        raise ValueError(f"task.name: {task.name!r} has {len(task.words)} words for {task.vocab_size} token ids, so a "
                         f"pretrained parent cannot read it; use a random-init backbone (backbone.pretrained=None)")
    encode = lambda w: tokenizer.encode(w, add_special_tokens=False)  # noqa: E731
    ids = [encode(w) for w in task.words]
    problems = [f"{w!r} is {len(i)} tokens {i}" for w, i in zip(task.words, ids) if len(i) != 1]
    table = [i[0] if len(i) == 1 else -1 for i in ids]
    seen: dict[int, str] = {}
    for w, t in zip(task.words, table):
        if t >= 0 and t in seen:
            problems.append(f"{seen[t]!r} and {w!r} are the same token {t}")
        seen.setdefault(t, w)
    for w, reader in reserved_words().items():
        r = encode(w)
        if len(r) == 1 and r[0] in seen:
            problems.append(f"{seen[r[0]]!r} is token {r[0]}, the {reader} word {w!r}")
    if problems:
        raise ValueError(f"task.name: {task.name!r} does not render through backbone.pretrained's tokenizer: "
                         + "; ".join(problems))
    return tuple(table)


def render(task: Task, tokenizer=None) -> Task:
    """``task`` in the parent's token ids (:class:`~par_ray.tasks.common.Rendered` of :func:`token_table`), or
    ``task`` itself when ``tokenizer`` is ``None`` (a random-init backbone: compact ids, unchanged). Raises
    ``ValueError`` as :func:`token_table` does."""
    return task if tokenizer is None else Rendered(task, token_table(task, tokenizer))
