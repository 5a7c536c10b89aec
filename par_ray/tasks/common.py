"""Thin base of the task suite: the :class:`Episode` batch, the :class:`Task` interface and the seeding helper.

Follows karpathy/nanochat ``tasks/common.py``: a small base here, one module per task family beside it. Every task
samples from a generator built by :func:`make_rng`, so a batch is a pure function of (task name, depth, n, seed,
step) and any two distinct (depth, seed, step) draw from independent streams.

Tensor suffixes: B batch (rows), T sequence length, Q queries per sequence, d depth (operations in the prompt).
"""

from __future__ import annotations

import dataclasses
import typing
import zlib
from dataclasses import dataclass

import numpy as np
import torch

BOS_ID = 0
"""Token id of the beginning-of-sequence marker, shared by every task."""

# Words: how a pretrained parent reads a task (``Task.words``, rendered by ``par_ray.prompts``). Each is one token of
# the Qwen BPE (Qwen2.5 and Qwen3 share it); ``tests/test_prompts.py`` checks every table on the real tokenizer.
BOS_WORD = "<|endoftext|>"
"""BOS of every task for a pretrained parent: Qwen's document separator, the token its pretraining put between
documents (Qwen defines no BOS of its own)."""
SEP_WORD = ":"
"""The separator between the operations and the queries."""
NOUNS = tuple(" " + w for w in """
apple ball cup dog egg key box bag desk shelf drawer hat pen book car tree house door window table chair bed
lamp clock phone card coin ring bell boat ship train plane bike horse cat bird fish frog bear lion tiger
wolf fox deer goat sheep cow pig duck mouse rabbit snake bee ant fly star moon sun cloud rain snow wind fire
water stone rock sand hill lake river sea island forest field garden farm road bridge tower castle church
school bank shop market hotel museum park city town village king queen prince knight soldier doctor nurse
teacher student farmer cook baker judge pilot driver captain artist singer writer poet actor player coach
child baby girl boy man woman friend brother sister mother father uncle aunt bread cake cheese milk tea
coffee wine beer soup rice corn bean salt sugar honey butter meat chicken pizza orange lemon banana grape
cherry peach berry potato tomato carrot onion pepper flower rose grass leaf seed root branch wood paper
glass metal iron gold silver copper steel plastic cotton silk wool leather rope wire chain nail hammer knife
fork spoon plate bowl bottle jar pot pan oven stove sink bath towel soap brush comb mirror shirt coat jacket
dress skirt shoe boot sock glove scarf belt button pocket wallet ticket letter stamp map flag sign picture
photo film song music drum guitar piano violin radio camera computer screen keyboard printer battery engine
wheel tire motor pump valve pipe tube tank barrel basket bucket ladder fence wall roof floor stair room
kitchen office hall garage cellar tent cabin hut palace temple tomb statue fountain pool beach coast valley
canyon cave desert jungle swamp ocean wave storm thunder lightning rainbow sky planet comet galaxy atom cell
brain heart lung bone skin blood hair eye ear nose mouth tooth tongue lip neck hand finger arm leg knee foot
toe head face chest back shoulder
""".split())
"""Concrete English nouns with a leading space, each one token of the Qwen BPE, in a fixed order: the names of the
moves of S5/A5 and of reachability's node labels (an arbitrary name per symbol, as the compact id was, but a
word of the parent's text rather than punctuation or a special id). Frozen data: a new word goes at the end."""


@dataclass(frozen=True)
class Episode:
    """A batch of prompts with the answer after every prefix of operations.

    ``states[:, k-1, q]`` is the answer token of query ``q`` after the first ``k`` operations (k = 1..d), so
    ``states[:, -1, :]`` are the answers the prompt asks for and earlier slices are the PAR progress targets.
    """

    input_ids: torch.Tensor
    """(B, T) int64 token ids."""
    read_positions: torch.Tensor
    """(Q,) int64 positions in the sequence where answers are read (the same for every row)."""
    states: torch.Tensor
    """(B, d, Q) int64 answer token ids after every prefix of operations."""
    depth: int
    """d, the number of operations in the prompt."""
    op_positions: torch.Tensor | None = None
    """(d,) int64 position of operation k (k = 1..d) in the sequence, the same for every row; ``None`` for tasks
    without one token per operation. Where the dense progress targets are read (``RecipeConfig.dense_targets``)."""
    progress_ids: torch.Tensor | None = None
    """(B, d) int64 the *whole* task state after each prefix of operations as one class in 0..``Task.num_states``-1
    (for permutation tasks: the index of the permutation), ``None`` where the task defines no such state. The
    dense progress target of operation position k (``par_ray.objectives.dense_progress_loss``)."""
    given: int = 0
    """m: the first m operations are given solved (:class:`GivenPrefix`, training only): the model must compute
    operations m+1..d, and iteration k's progress target is z_min(m + c·k, d)."""


def stable_hash(text: str) -> int:
    """CRC-32 of ``text`` (UTF-8): an unsigned 32-bit int that, unlike ``hash()``, is the same in every process."""
    return zlib.crc32(text.encode("utf-8"))


def make_rng(name: str, depth: int, seed: int, step: int) -> np.random.Generator:
    """PCG64 generator seeded from ``SeedSequence([stable_hash(name), depth, seed, step])``.

    Distinct (name, depth, seed, step) give distinct entropy, hence independent streams; the depth is part of the
    key so that depth 8's stream is not a prefix of depth 9's. Arguments must be non-negative ints.
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([stable_hash(name), depth, seed, step])))


@dataclass(frozen=True)
class DepthPreset:
    """Train and test depths of one task under a published protocol (``PAPER_DEPTHS`` of each task module).

    ``presets.paper_trial`` reads it, so the paper preset of every task trains and tests at that task's depths.
    """

    train_depth: int
    """d_train, the largest depth trained on."""
    min_train_depth: int
    """Smallest depth trained on."""
    test_depths: tuple[int, ...]
    """Test depths, increasing, each >= train_depth."""
    source: str
    """Where the numbers come from (paper and section), or why they were chosen."""


class Task:
    """A sequential state-tracking task: a vocabulary, chance levels and a sampler of :class:`Episode` batches.

    Subclasses set the attributes below and implement :meth:`generate`; :meth:`sample` validates the arguments and
    seeds the generator, so every family shares one seeding rule.
    """

    name: str
    """Registry key, also part of the random-stream key."""
    vocab_size: int
    """Number of token ids the task uses (ids are 0..vocab_size-1); models use this as their vocabulary."""
    num_queries: int | None
    """Q, answers read per sequence; ``None`` when Q depends on the depth (``read_positions`` then says how many)."""
    chance: float
    """Per-query accuracy of guessing."""
    full_state_chance: float
    """Probability of getting all Q answers right by guessing a valid state."""
    answer_token_ids: tuple[int, ...]
    """Token ids that can be answers."""
    num_states: int = 0
    """Number of whole-task states that ``Episode.progress_ids`` indexes (0: the task defines none, so dense progress
    targets are unavailable)."""
    op_width: int | None = None
    """Tokens per operation when the prompt is serial — ``[BOS, op_1, …, op_d, SEP, …queries]`` with operation k at
    positions 1 + (k-1)·w … k·w and the separator at d·w + 1 — which :class:`RecentFirst` and :class:`Filler`
    require; ``None`` when the prompt has no such layout (they refuse the task)."""
    max_depth: int | None = None
    """Largest depth the task can generate (``None``: unbounded); :meth:`sample` rejects deeper requests."""
    words: tuple[str, ...] = ()
    """The text of each token id (``words[i]`` for id i, ``len == vocab_size``), each meant as one token of the
    pretrained parent's tokenizer: what a pretrained parent reads instead of the compact ids
    (``par_ray.prompts.render``). Random-init models read the compact ids."""

    def full_state_chance_at(self, depth: int) -> float:
        """Full-state chance at ``depth``: ``full_state_chance`` unless Q grows with the depth (then overridden)."""
        return self.full_state_chance

    def sample(self, depth: int, n: int, seed: int, step: int = 0) -> Episode:
        """Draw ``n`` sequences of ``depth`` operations; a pure function of (name, depth, n, seed, step).

        Returns an :class:`Episode` with input_ids (n, T), read_positions (Q,), states (n, depth, Q).
        Raises ``ValueError`` naming every bad argument: depth < 1 (or > ``max_depth``), n < 1, seed < 0 or step < 0.
        """
        problems = [
            f"{arg}: {value!r} must be an int >= {low}"
            for arg, value, low in (("depth", depth, 1), ("n", n, 1), ("seed", seed, 0), ("step", step, 0))
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low
        ]
        if self.max_depth is not None and not problems and depth > self.max_depth:
            problems.append(f"depth: {depth!r} exceeds this task's max_depth={self.max_depth}")
        if problems:
            raise ValueError(f"{self.name}.sample: " + "; ".join(problems))
        return self.generate(make_rng(self.name, int(depth), int(seed), int(step)), int(depth), int(n))

    def generate(self, rng: np.random.Generator, depth: int, n: int) -> Episode:
        """Draw the batch from ``rng`` (arguments already validated). Implemented by each family."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, vocab_size={self.vocab_size}, num_queries={self.num_queries})"


def _serial_width(base: Task, option: str) -> int:
    """``base.op_width``; raises ``ValueError`` naming ``option`` when the task has no serial layout."""
    if base.op_width is None:
        raise ValueError(f"{option}: task {base.name!r} has no serial [BOS, ops, SEP, queries] layout "
                         f"(op_width is None); use it only with tasks that have one")
    return base.op_width


_COPIED = ("name", "vocab_size", "num_queries", "chance", "full_state_chance", "answer_token_ids", "op_width",
           "max_depth", "num_states", "words")


class RecentFirst(Task):
    """The same task with the operations listed most recent first: ``[BOS, op_d, …, op_1, SEP, queries]``.

    The answers are unchanged (states still follow the order in which operations are *applied*); only the prompt's
    serialisation changes. An option of this framework, not of the PAR paper (``TaskConfig.op_order``): with it, the
    state after the first k operations is the composition of the k operations *nearest* the queries, so a core that
    composes its state with the previous token's at every iteration (relative position −1, length-agnostic under
    rotary embeddings) produces exactly the progress-aligned targets z_k. Requires a serial layout
    (``Task.op_width``): multi-token operations are reversed as whole blocks, their own tokens kept in order.
    Raises ``ValueError`` for a task without one.
    """

    def __init__(self, base: Task):
        self.base = base
        _serial_width(base, "task.op_order='recent_first'")
        for attr in _COPIED:
            setattr(self, attr, getattr(base, attr))

    def full_state_chance_at(self, depth: int) -> float:
        return self.base.full_state_chance_at(depth)

    def sample(self, depth: int, n: int, seed: int, step: int = 0) -> Episode:
        """The base task's batch with the d operation blocks at positions 1..d·w reversed; same shapes and states
        as ``base.sample``."""
        ep = self.base.sample(depth, n, seed, step)
        w = self.op_width
        ids = ep.input_ids.clone()
        ops_BdW = ep.input_ids[:, 1 : depth * w + 1].reshape(-1, depth, w)
        ids[:, 1 : depth * w + 1] = ops_BdW.flip(1).reshape(-1, depth * w)
        op_positions = None
        if ep.op_positions is not None:  # operation k keeps its offset o inside its block, the block moves to d-1-b
            block, offset = (ep.op_positions - 1) // w, (ep.op_positions - 1) % w
            op_positions = 1 + (depth - 1 - block) * w + offset
        return dataclasses.replace(ep, input_ids=ids, op_positions=op_positions)


class Filler(Task):
    """The same task with 0..``max_filler`` extra separator tokens between the operations and the queries.

    ``[BOS, op_1, …, op_d, SEP × (1 + f), queries]``, with f drawn uniformly from 0..max_filler once per batch from
    its own stream (a pure function of (name, depth, seed, step), like the batch itself); the read positions move by
    f, the answers are unchanged. A training-only option of this framework (``TaskConfig.train_filler``): with it,
    the distance from the queries to operation k varies, so a model cannot locate operation k by that distance — the
    prompt-length failure of docs/experiments.md, experiment 5. Requires a serial layout (``Task.op_width``: the
    separator at position d·w + 1). Raises ``ValueError`` for ``max_filler < 0`` or a task without one.
    """

    def __init__(self, base: Task, max_filler: int):
        if max_filler < 0:
            raise ValueError(f"task.train_filler: must be >= 0, got {max_filler}")
        _serial_width(base, "task.train_filler")
        self.base, self.max_filler = base, int(max_filler)
        for attr in _COPIED:
            setattr(self, attr, getattr(base, attr))

    def full_state_chance_at(self, depth: int) -> float:
        return self.base.full_state_chance_at(depth)

    def sample(self, depth: int, n: int, seed: int, step: int = 0) -> Episode:
        """The base task's batch with f extra separators after position d·w + 1: input_ids (n, T + f),
        read_positions shifted by f, the same states."""
        ep = self.base.sample(depth, n, seed, step)
        f = int(make_rng(self.name + "/filler", depth, seed, step).integers(0, self.max_filler + 1))
        if f == 0:
            return ep
        sep_at = depth * self.op_width + 1
        sep = ep.input_ids[:, sep_at : sep_at + 1]
        ids = torch.cat([ep.input_ids[:, : sep_at + 1], sep.expand(-1, f), ep.input_ids[:, sep_at + 1 :]], dim=1)
        return dataclasses.replace(ep, input_ids=ids, read_positions=ep.read_positions + f)


class GivenPrefix(Task):
    """The same task with its first m operations given solved: m ~ U{0..max_given} per batch, the batch drawn at
    depth d + m, and the tokens of operations 1..m replaced (by the training step, which knows the model's
    vocabulary) with the state tokens of z_1..z_m, the dense state classes read as inputs.

    ``[BOS, z_1, …, z_m, op_{m+1}, …, op_{m+d}, SEP, queries]``: the model computes d operations, as without the
    option, but the frontier starts at position m + 1, so the operations it computes in training lie anywhere in
    1..d + max_given. Without it, the operation at position j is always computed at iteration j (with c = 1), and a
    model cannot tell "position j" from "iteration j" (docs/experiments.md, experiments 8–9). A training-only option
    of this framework (``TaskConfig.given_prefix``), not the paper's. Needs a serial layout with one token per
    operation and a whole-task state (``Task.num_states``); raises ``ValueError`` otherwise or for max_given < 0.
    """

    def __init__(self, base: Task, max_given: int):
        if max_given < 0:
            raise ValueError(f"task.given_prefix: must be >= 0, got {max_given}")
        if _serial_width(base, "task.given_prefix") != 1 or not base.num_states:
            raise ValueError(f"task.given_prefix: task {base.name!r} needs one token per operation and a whole-task "
                             f"state (op_width=1, num_states>0)")
        self.base, self.max_given = base, int(max_given)
        for attr in _COPIED:
            setattr(self, attr, getattr(base, attr))

    def full_state_chance_at(self, depth: int) -> float:
        return self.base.full_state_chance_at(depth)

    def sample(self, depth: int, n: int, seed: int, step: int = 0) -> Episode:
        """The base task's batch at depth d + m with ``given=m`` (m drawn from its own stream, a pure function of
        (name, depth, seed, step)); token ids are the base task's (the step swaps in the state tokens)."""
        m = int(make_rng(self.name + "/given", depth, seed, step).integers(0, self.max_given + 1))
        ep = self.base.sample(depth + m, n, seed, step)
        return dataclasses.replace(ep, given=m)


class Rendered(Task):
    """The same task in a pretrained parent's token ids: every compact id i becomes ``token_ids[i]``.

    Prompts and answers (``input_ids``, ``states``, ``answer_token_ids``) are mapped through the table; positions,
    depths and the whole-task state classes (``progress_ids``) are unchanged, so a batch is the base task's batch
    read in the parent's vocabulary. Build it with ``par_ray.prompts.render``, which makes the table from
    ``Task.words`` and the parent's tokenizer and checks it. ``vocab_size`` becomes ``max(token_ids) + 1`` (ids
    stay below it). Raises ``ValueError`` unless ``token_ids`` has one distinct id per base token.
    """

    def __init__(self, base: Task, token_ids: typing.Sequence[int]):
        if len(token_ids) != base.vocab_size or len(set(token_ids)) != len(token_ids):
            raise ValueError(f"{base.name}: token_ids must map each of the {base.vocab_size} task ids to a distinct "
                             f"parent id, got {len(token_ids)} ids ({len(set(token_ids))} distinct)")
        self.base = base
        for attr in _COPIED:
            setattr(self, attr, getattr(base, attr))
        self.token_ids = torch.tensor(list(token_ids), dtype=torch.int64)
        self.answer_token_ids = tuple(int(self.token_ids[i]) for i in base.answer_token_ids)
        self.vocab_size = int(self.token_ids.max()) + 1

    def full_state_chance_at(self, depth: int) -> float:
        return self.base.full_state_chance_at(depth)

    def sample(self, depth: int, n: int, seed: int, step: int = 0) -> Episode:
        """The base task's batch with ``input_ids`` and ``states`` in parent ids; same shapes."""
        ep = self.base.sample(depth, n, seed, step)
        return dataclasses.replace(ep, input_ids=self.token_ids[ep.input_ids], states=self.token_ids[ep.states])
