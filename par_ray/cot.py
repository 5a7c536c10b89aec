"""Explicit chain-of-thought (CoT) baseline: the intermediate states written out as tokens on the same backbone.

The PAR paper compares latent recurrence with explicit chain-of-thought: the same parent model, no recurrence
(R = 1), trained with next-token prediction on the prompt followed by a written trace of the task state after every
operation, and decoded greedily at test time. Its accuracy is read on the final state; its test-time cost grows with
the depth d in generated tokens, which the results table reports next to the accuracy (``cot_tokens_d{D}``).

Trace format (after the prompt, which ends with its query tokens):

    z_1  STEP  z_2  STEP  …  STEP  z_d  END          L = d · (Q + 1) tokens

z_k is the block of Q answer tokens after the first k operations (``Episode.states[:, k-1, :]``, in query order), so
the last block before END is the answer z_d. ``STEP`` and ``END`` are two ids after the task's vocabulary
(:func:`cot_tokens`): a random-init model gains them (``par_ray.trial.VocabLayout.cot``); a pretrained parent reads
them as its tokens of ``","`` and ``"."`` (:data:`COT_WORDS`, :func:`trial_cot_tokens`), as it reads the task as
words (``par_ray.prompts``). Reachability has
no intermediate state: its ``states`` repeat the answer, so its trace is the answer written d times
(``par_ray.tasks.graphs``).

Training (:class:`CotTask`): the teacher-forced sequence ``prompt + trace[:-1]`` with read positions at the last
prompt token and every trace token but the last, each trained on the next trace token. It goes through the ordinary
training step (``recipe.fixed_iterations = 1``, ``supervise = "last"``, final targets): the read-out at those
positions is the next-token prediction, so the PAR cross-entropy there is the standard language-model loss on the
trace.

Testing (:func:`greedy_decode`, :func:`cot_accuracy_by_depth`): prefill the prompt into transformers'
``DynamicCache``, then one token per call (``LoopedLM.decode``), greedy, each row until it emits ``END`` (all rows of
all ranks stop together, so every rank makes the same forward calls), at most L(d) new tokens. A row is right when
its last block before ``END`` equals z_d; one that never emits ``END`` within L(d) tokens or ends on a malformed
block is wrong. Its cost is the tokens it generated, ``END`` included.

Tensor suffixes: B batch, T prompt tokens, L trace tokens, d depth, Q queries, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from par_ray.evaluation import sum_over_test_sets
from par_ray.tasks.common import Episode, Task

NUM_COT_TOKENS = 2
"""Ids a task vocabulary gains for the trace: STEP, END."""


@dataclass(frozen=True)
class CotTokens:
    """Token ids of the trace's separators."""

    step: int
    """Between two state blocks."""
    end: int
    """After the last block (the answer): decoding stops here."""


def cot_tokens(task_vocab_size: int) -> CotTokens:
    """STEP = ``task_vocab_size``, END = ``task_vocab_size + 1``."""
    return CotTokens(step=task_vocab_size, end=task_vocab_size + 1)


COT_WORDS = (",", ".")
"""STEP and END as a pretrained parent's words: the trace reads ``z_1, z_2, …, z_d.``"""


def trial_cot_tokens(task, tokenizer=None) -> CotTokens:
    """The trace's separators of a trial: :func:`cot_tokens` after the task's ids for a random-init model
    (``tokenizer=None``), else the parent's tokens of :data:`COT_WORDS`. Raises ``ValueError`` when one is not a
    single token."""
    if tokenizer is None:
        return cot_tokens(task.vocab_size)
    ids = [tokenizer.encode(w, add_special_tokens=False) for w in COT_WORDS]
    if any(len(i) != 1 for i in ids):
        raise ValueError(f"backbone.pretrained: the tokenizer must encode each trace separator {COT_WORDS} as one "
                         f"token, got {ids}")
    return CotTokens(step=ids[0][0], end=ids[1][0])


def trace_length(depth: int, num_queries: int) -> int:
    """L = d · (Q + 1): d blocks of Q state tokens, each followed by STEP (END after the last)."""
    return depth * (num_queries + 1)


def format_trace(states_BdQ: torch.Tensor, tokens: CotTokens) -> torch.Tensor:
    """The trace of every row: (B, d, Q) states -> (B, L) tokens ``z_1 STEP … z_d END``."""
    B, d, _ = states_BdQ.shape
    sep_Bd1 = torch.full((B, d, 1), tokens.step, dtype=states_BdQ.dtype, device=states_BdQ.device)
    sep_Bd1[:, -1] = tokens.end
    return torch.cat([states_BdQ, sep_Bd1], dim=-1).reshape(B, -1)


def parse_trace(trace: Sequence[int] | torch.Tensor, tokens: CotTokens) -> list[tuple[int, ...]] | None:
    """The state blocks of one trace, up to its first END: ``[z_1, …, z_k]`` as tuples of token ids.

    Inverse of :func:`format_trace` on one row (``parse_trace(format_trace(s)[b]) == [tuple(z) for z in s[b]]``).
    Tokens after END are ignored. Returns ``None`` when the trace has no END (it never finished).
    """
    ids = trace.tolist() if isinstance(trace, torch.Tensor) else list(trace)
    if tokens.end not in ids:
        return None
    blocks, block = [], []
    for t in ids[: ids.index(tokens.end) + 1]:
        if t in (tokens.step, tokens.end):
            blocks.append(tuple(block))
            block = []
        else:
            block.append(t)
    return blocks


def final_state(trace: Sequence[int] | torch.Tensor, tokens: CotTokens) -> tuple[int, ...] | None:
    """The answer a generated trace gives: its last block before END, or ``None`` when it has no END."""
    blocks = parse_trace(trace, tokens)
    return blocks[-1] if blocks else None


class CotTask(Task):
    """A task's prompts with their teacher-forced trace appended: the training data of the CoT baseline.

    ``sample`` returns input_ids (B, T + L - 1) = ``prompt + trace[:-1]``, read_positions (L,) = T-1 … T+L-2 (each
    predicts the next trace token) and states (B, d, L) = the trace at every d (a view: there is no progress target
    other than the trace itself, so ``final`` and ``progress`` targets coincide). The vocabulary grows by
    :data:`NUM_COT_TOKENS`. Test prompts are the base task's own (:func:`cot_accuracy_by_depth`).
    """

    def __init__(self, base: Task, tokens: CotTokens):
        self.base, self.tokens = base, tokens
        for attr in ("name", "num_queries", "chance", "full_state_chance", "answer_token_ids", "max_depth"):
            setattr(self, attr, getattr(base, attr))
        self.vocab_size = base.vocab_size + NUM_COT_TOKENS
        self.num_states = 0  # no whole-task state classes for the dense targets on the trace
        self.op_width = None  # the trace breaks the serial [BOS, ops, SEP, queries] layout

    def full_state_chance_at(self, depth: int) -> float:
        return self.base.full_state_chance_at(depth)

    def sample(self, depth: int, n: int, seed: int, step: int = 0) -> Episode:
        ep = self.base.sample(depth, n, seed, step)
        trace_BL = format_trace(ep.states, self.tokens)
        B, T = ep.input_ids.shape
        L = trace_BL.shape[1]
        return Episode(input_ids=torch.cat([ep.input_ids, trace_BL[:, :-1]], dim=1),
                       read_positions=torch.arange(T - 1, T - 1 + L), states=trace_BL[:, None].expand(B, depth, L),
                       depth=depth)


@torch.no_grad()
def greedy_decode(model_fn, prompt_BT: torch.Tensor, tokens: CotTokens, max_new: int,
                  reduce_sum=lambda t: t) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding with transformers' KV cache until every row has emitted END (or ``max_new`` tokens).

    Args:
        model_fn: the (possibly wrapped) ``LoopedLM``; called as ``model_fn(ids, cache=cache)`` ->
            next-token logits (B, T, V) (``LoopedLM.decode``).
        prompt_BT: (B, T) prompts, all of length T.
        max_new: cap on generated tokens per row (>= 1).
        reduce_sum: sums a tensor over ranks, so all ranks stop at the same step (identity on one rank).
    Returns:
        ``(generated_BN, lengths_B)``: the N <= ``max_new`` generated tokens (rows that finished early keep
        generating; their tokens after END are ignored) and each row's cost, tokens up to and including its first
        END (``max_new`` when it has none).
    Raises: ValueError for ``max_new < 1``.
    """
    from transformers import DynamicCache

    if max_new < 1:
        raise ValueError(f"max_new: must be >= 1, got {max_new}")
    cache = DynamicCache()
    next_B = model_fn(prompt_BT, cache=cache)[:, -1].argmax(-1)
    done_B = torch.zeros_like(next_B, dtype=torch.bool)
    lengths_B = torch.zeros_like(next_B)
    out = []
    for i in range(max_new):
        out.append(next_B)
        lengths_B += (~done_B).long()  # this token counts for rows that had not finished before it
        done_B |= next_B == tokens.end
        left = reduce_sum((~done_B).sum().double().reshape(1))
        if i + 1 == max_new or left.item() == 0:
            break
        next_B = model_fn(next_B[:, None], cache=cache)[:, -1].argmax(-1)
    return torch.stack(out, dim=1), lengths_B


@torch.no_grad()
def cot_accuracy_by_depth(model_fn, task: Task, eval_cfg, tokens: CotTokens, device: torch.device, rank: int = 0,
                          world_size: int = 1, reduce_sum=lambda t: t,
                          progress: Callable[[int, int, int], None] | None = None) -> dict[int, dict[str, float]]:
    """Greedy-decoded accuracy on the final state at every test depth, and the decoding cost.

    The test sets are :func:`par_ray.evaluation.accuracy_by_depth`'s (``task.sample(d, n, eval_cfg.seed, 0)``, the
    base task's prompts), split over ranks the same way; each row decodes at most L(d) = :func:`trace_length` tokens.
    ``progress``: called after every test batch (:func:`par_ray.evaluation.sum_over_test_sets`).

    With ``eval.bracket_max_sequences`` > 0, more sequences are drawn near the crossing of the ``acc`` curve after
    the first pass (adaptive sampling, :func:`par_ray.evaluation.sum_over_test_sets`).

    Returns:
        ``{d: {"acc": final state right (all Q queries), "acc_query": per-query accuracy of the final block (0 for a
        row without one), "tokens": mean generated tokens per sequence, "right": sequences fully right, "n":
        sequences}}``.
    """
    def counts(depth: int, ep: Episode, ids_BT: torch.Tensor, answers_BQ: torch.Tensor) -> torch.Tensor:
        Q = ep.read_positions.numel()
        gen_BN, lengths_B = greedy_decode(model_fn, ids_BT, tokens, trace_length(depth, Q), reduce_sum)
        right = query_right = 0.0
        for row, want in zip(gen_BN.cpu(), answers_BQ.tolist()):
            got = final_state(row, tokens)
            if got is not None and len(got) == Q:
                hits = sum(g == w for g, w in zip(got, want))
                right += float(hits == Q)
                query_right += hits / Q
        # right, queries right, tokens, sequences
        return torch.tensor([right, query_right, lengths_B.sum().item(), ids_BT.shape[0]], dtype=torch.float64,
                            device=device)

    results: dict[int, dict[str, float]] = {}
    for depth, (c_4,) in sum_over_test_sets(task, eval_cfg, counts, device, rank, world_size, reduce_sum,
                                            progress=progress,
                                            score=lambda c: (c[0][0].item(), c[0][3].item())).items():
        n = c_4[3].clamp_min(1)
        results[depth] = {"acc": (c_4[0] / n).item(), "acc_query": (c_4[1] / n).item(),
                          "tokens": (c_4[2] / n).item(), "right": c_4[0].item(), "n": c_4[3].item()}
    return results
