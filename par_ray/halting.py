"""Learned halting without added parameters (PAR paper §3, "Learned Halting"): tokens and the halting query position.

The model is asked "is the computation complete?" through the *same* readout as the answers (``LoopedLM.readout``:
coda → final norm → lm_head). Every prompt gets one extra token at its end, the halting query; its read position is
appended after the answer read positions, so one readout call returns answers and the halting logits together:

    read positions  [answer_0 … answer_{Q-1}, halt]            logits (K, B, Q + 1, V)
    P(Yes) after k  = softmax([logit_No, logit_Yes])[1] at the halting position

P(Yes) is the two-way softmax over the Yes and No tokens only (the rest of the vocabulary is ignored), for task
vocabularies and pretrained vocabularies alike. The causal mask keeps the answers unchanged by the appended token.

Token ids (:func:`halt_tokens`):

- random-init models with a task vocabulary: the task's ids stay as they are; three ids are added after them,
  ``query = V_task``, ``Yes = V_task + 1``, ``No = V_task + 2``, and the model is built with ``V_task + 3`` tokens —
  only when some stage of the trial trains halting (``par_ray.trial.Resolved.halting``; ``VocabLayout``), so other
  trials are unchanged;
- pretrained parents: the tokenizer's own ``" Yes"`` and ``" No"`` tokens and ``"?"`` as the query (each must be a
  single token), so the pretrained readout starts from its meaning of the words.

Tensor suffixes: B batch, T tokens, Q queries, d depth.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from par_ray.tasks.common import Episode

NUM_HALT_TOKENS = 3
"""Ids a task vocabulary gains when halting is on: query, Yes, No."""


@dataclass(frozen=True)
class HaltTokens:
    """Token ids of the halting query and of the two answers."""

    query: int
    yes: int
    no: int


def task_halt_tokens(task_vocab_size: int) -> HaltTokens:
    """Ids appended after a task vocabulary of ``task_vocab_size`` tokens: query, Yes, No (model vocab + 3)."""
    return HaltTokens(query=task_vocab_size, yes=task_vocab_size + 1, no=task_vocab_size + 2)


def tokenizer_halt_tokens(tokenizer) -> HaltTokens:
    """``" Yes"``, ``" No"`` and ``"?"`` of a pretrained tokenizer (anything with ``encode(text,
    add_special_tokens=False) -> list[int]``). ``ValueError`` when one of them is not a single token."""
    ids = {text: tokenizer.encode(text, add_special_tokens=False) for text in HALT_WORDS}
    bad = {t: i for t, i in ids.items() if len(i) != 1}
    if bad:
        raise ValueError(f"backbone.pretrained: the tokenizer must encode each halting word as one token, got {bad}")
    query, yes, no = (ids[w][0] for w in HALT_WORDS)
    return HaltTokens(query=query, yes=yes, no=no)


HALT_WORDS = ("?", " Yes", " No")
"""The halting query and its two answers as a pretrained parent's words (query, Yes, No)."""


def halt_tokens(task, tokenizer=None) -> HaltTokens:
    """The halting token ids of a trial: :func:`task_halt_tokens` for random-init backbones (``tokenizer=None``),
    :func:`tokenizer_halt_tokens` of the parent's tokenizer otherwise (``par_ray.weights.parent_tokenizer``: loaded
    offline from the checkpoint directory)."""
    if tokenizer is None:
        return task_halt_tokens(task.vocab_size)
    return tokenizer_halt_tokens(tokenizer)


def with_halt_query(ep: Episode, query_id: int) -> Episode:
    """``ep`` with the halting query token appended to every row: input_ids (B, T + 1), read_positions (Q + 1,)
    whose last entry (T) is the halting position; states unchanged (B, d, Q)."""
    B, T = ep.input_ids.shape
    ids = torch.cat([ep.input_ids, torch.full((B, 1), query_id, dtype=ep.input_ids.dtype)], dim=1)
    reads = torch.cat([ep.read_positions, torch.tensor([T], dtype=ep.read_positions.dtype)])
    return dataclasses.replace(ep, input_ids=ids, read_positions=reads)  # every other field (given!) kept


def p_yes(halt_logits_KBV: torch.Tensor, tokens: HaltTokens) -> torch.Tensor:
    """P(Yes) from the halting position's logits (..., V): two-way softmax over (No, Yes), float32 (...)."""
    return torch.softmax(yes_no_logits(halt_logits_KBV, tokens), dim=-1)[..., 1]


def yes_no_logits(halt_logits_KBV: torch.Tensor, tokens: HaltTokens) -> torch.Tensor:
    """(..., V) -> (..., 2) float32 logits of (No, Yes): class 1 = Yes, as in ``objectives.halting_targets``."""
    return halt_logits_KBV[..., [tokens.no, tokens.yes]].float()
