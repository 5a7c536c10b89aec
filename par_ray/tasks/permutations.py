"""Permutation word problems on 5 objects: ``swap_s5``, ``s5`` and ``a5``.

Follows the PAR paper's task suite: S5 and A5 word problems (each operation is a permutation of the symmetric or
alternating group on 5 elements; one query, the object at position 0) and swap-S5 (5 objects, each operation swaps
two positions or does nothing; five queries, scored by full-state accuracy). Paper protocol (:data:`PAPER_DEPTHS`):
S5 / A5 train on d <= 16 and test to 256 moves, swap-S5 on 32 to 512, 1,024 sequences per length.

State: 5 objects on 5 positions, starting from the identity (object i at position i). A move is a permutation π of
positions, applied as ``new[p] = old[π[p]]``; a transposition (i j) swaps the objects at positions i and j.
Query q asks which object is at position ``query_positions[q]``; its answer token is ``OBJ_BASE + state[q]``.

Token layout of one sequence (T = d + 2 + Q): ``[BOS, op_1, …, op_d, SEP, query_0, …, query_{Q-1}]``; answers are
read at the query tokens. Vocabulary: BOS 0, SEP 1, objects 2..6, query tokens 7..7+Q-1, then one token per move in
the canonical order of ``moves``. A pretrained parent reads them as words (``Task.words``): objects
:data:`OBJECT_WORDS`, queries :data:`POSITION_WORDS`, swap-S5's moves ``" stay"`` / ``" AB"`` … ``" DE"``, S5 and
A5's moves :data:`PERMUTATION_WORDS`.

Sampling walks the state as an index into the 120 permutations of 5 through a precomputed (120, M) transition table,
so each of the d steps is one vectorised gather over the n rows.

Tensor suffixes: B batch (rows), d depth, Q queries, M moves, P = 120 permutations of 5.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from par_ray.tasks.common import BOS_ID, BOS_WORD, NOUNS, SEP_WORD, DepthPreset, Episode, Task

NUM_OBJECTS = 5
SEP_ID = 1
OBJ_BASE = 2
QUERY_BASE = OBJ_BASE + NUM_OBJECTS

ALL_PERMUTATIONS = tuple(itertools.permutations(range(NUM_OBJECTS)))
"""The 120 permutations of 5 in ``itertools.permutations`` order (the identity first)."""

# The words a pretrained parent reads (Task.words): "<|endoftext|> AB stay CE …: A B C D E" asks which object sits
# at each position after the swaps, the answers are object names.
OBJECT_WORDS = (" apple", " ball", " cup", " dog", " egg")
"""Object i's name (the answers)."""
POSITION_WORDS = (" A", " B", " C", " D", " E")
"""Position p's name: the query asking which object is at p."""
PERMUTATION_WORDS = NOUNS[NUM_OBJECTS:NUM_OBJECTS + len(ALL_PERMUTATIONS)]
"""The name of each permutation of :data:`ALL_PERMUTATIONS` as an S5 / A5 move (a noun: no single token spells a
permutation of 5), the same word in both tasks."""


def parity(perm: tuple[int, ...]) -> int:
    """0 for an even permutation, 1 for an odd one (count of inversions mod 2)."""
    return sum(a > b for a, b in itertools.combinations(perm, 2)) % 2


def swap_moves() -> tuple[tuple[int, ...], ...]:
    """The identity followed by the 10 transpositions (i j), i < j in lexicographic order: (11, 5).

    The identity move is needed: with transpositions only, the parity of the state would be fixed by the length.
    """
    moves = [tuple(range(NUM_OBJECTS))]
    for i, j in itertools.combinations(range(NUM_OBJECTS), 2):
        perm = list(range(NUM_OBJECTS))
        perm[i], perm[j] = j, i
        moves.append(tuple(perm))
    return tuple(moves)


def swap_words() -> tuple[str, ...]:
    """The words of :func:`swap_moves`: ``" stay"`` for the identity, then the two swapped positions' names
    (``" AB"`` swaps positions A and B)."""
    names = "".join(w.strip() for w in POSITION_WORDS)
    return (" stay", *(f" {names[i]}{names[j]}" for i, j in itertools.combinations(range(NUM_OBJECTS), 2)))


def permutation_words(moves: tuple[tuple[int, ...], ...]) -> tuple[str, ...]:
    """The :data:`PERMUTATION_WORDS` of ``moves`` (each a permutation of range(5))."""
    return tuple(PERMUTATION_WORDS[ALL_PERMUTATIONS.index(tuple(m))] for m in moves)


class PermutationTask(Task):
    """A word problem whose moves are permutations of 5 positions, drawn uniformly and applied left to right.

    ``moves`` (M permutations of range(5)) are the move symbols in token order; ``query_positions`` (Q,) are the
    positions asked about; ``move_words`` (M,) the move names a pretrained parent reads (default: each move's
    :data:`PERMUTATION_WORDS`). Raises ``ValueError`` if a move is not a permutation of range(5), a query position
    is outside 0..4, or ``move_words`` is not one word per move.
    """

    op_width = 1  # one token per move: the serial layout RecentFirst and Filler rely on

    def __init__(
        self, name: str, moves: tuple[tuple[int, ...], ...], query_positions: tuple[int, ...], full_state_chance: float,
        move_words: tuple[str, ...] | None = None,
    ):
        bad_moves = [m for m in moves if tuple(sorted(m)) != tuple(range(NUM_OBJECTS))]
        bad_queries = [q for q in query_positions if not 0 <= q < NUM_OBJECTS]
        if bad_moves or bad_queries or not moves or not query_positions:
            raise ValueError(
                f"{name}: moves must be non-empty permutations of range({NUM_OBJECTS}) (bad: {bad_moves}); "
                f"query_positions must be non-empty, in 0..{NUM_OBJECTS - 1} (bad: {bad_queries})"
            )
        move_words = permutation_words(moves) if move_words is None else tuple(move_words)
        if len(move_words) != len(moves):
            raise ValueError(f"{name}: move_words must name each of the {len(moves)} moves, got {len(move_words)}")
        self.name = name
        self.moves = tuple(tuple(m) for m in moves)
        self.query_positions = tuple(query_positions)
        self.num_queries = len(query_positions)
        self.query_token_ids = tuple(range(QUERY_BASE, QUERY_BASE + self.num_queries))
        move_base = QUERY_BASE + self.num_queries
        self.move_token_ids = tuple(range(move_base, move_base + len(self.moves)))
        self.vocab_size = move_base + len(self.moves)
        self.answer_token_ids = tuple(range(OBJ_BASE, OBJ_BASE + NUM_OBJECTS))
        self.chance = 1.0 / NUM_OBJECTS
        self.full_state_chance = full_state_chance
        self.num_states = len(ALL_PERMUTATIONS)  # progress_ids: index into ALL_PERMUTATIONS
        self.words = (BOS_WORD, SEP_WORD, *OBJECT_WORDS, *(POSITION_WORDS[q] for q in self.query_positions),
                      *move_words)

        perms_PO = np.array(ALL_PERMUTATIONS, dtype=np.int64)
        moves_MO = np.array(self.moves, dtype=np.int64)
        index_of = {perm: i for i, perm in enumerate(ALL_PERMUTATIONS)}
        # new[p] = old[π[p]] for every (state, move) pair, looked up back to a state index.
        after_PMO = perms_PO[:, moves_MO]
        self._next_PM = np.array(
            [[index_of[tuple(row)] for row in per_move] for per_move in after_PMO.tolist()], dtype=np.int64
        )
        self._answer_PQ = OBJ_BASE + perms_PO[:, list(self.query_positions)]
        self._identity = index_of[tuple(range(NUM_OBJECTS))]

    def generate(self, rng: np.random.Generator, depth: int, n: int) -> Episode:
        """Draw ``n`` sequences of ``depth`` uniform moves; see :meth:`Task.sample` for shapes."""
        num_moves = len(self.moves)
        ops_dB = rng.integers(0, num_moves, size=(depth, n), dtype=np.int64)
        next_flat = self._next_PM.ravel()  # flat gather: faster than 2-D fancy indexing in the hot loop
        state_dB = np.empty((depth, n), dtype=np.int64)
        state_B = np.full(n, self._identity, dtype=np.int64)
        for k in range(depth):
            state_B = next_flat[state_B * num_moves + ops_dB[k]]
            state_dB[k] = state_B
        states_BdQ = np.take(self._answer_PQ, np.ascontiguousarray(state_dB.T), axis=0)

        q = self.num_queries
        input_ids_BT = np.empty((n, depth + 2 + q), dtype=np.int64)
        input_ids_BT[:, 0] = BOS_ID
        input_ids_BT[:, 1 : depth + 1] = ops_dB.T + self.move_token_ids[0]
        input_ids_BT[:, depth + 1] = SEP_ID
        input_ids_BT[:, depth + 2 :] = self.query_token_ids
        return Episode(
            input_ids=torch.from_numpy(input_ids_BT),
            read_positions=torch.arange(depth + 2, depth + 2 + q, dtype=torch.int64),
            states=torch.from_numpy(states_BdQ),
            depth=depth,
            op_positions=torch.arange(1, depth + 1, dtype=torch.int64),
            progress_ids=torch.from_numpy(np.ascontiguousarray(state_dB.T)),
        )


SWAP_S5 = PermutationTask("swap_s5", swap_moves(), query_positions=tuple(range(NUM_OBJECTS)), full_state_chance=1 / 120,
                          move_words=swap_words())
"""Swap-S5: identity + 10 transpositions, 5 queries, scored by full-state accuracy (chance 1/120)."""
S5 = PermutationTask("s5", ALL_PERMUTATIONS, query_positions=(0,), full_state_chance=1 / NUM_OBJECTS)
"""S5 word problem: all 120 permutations as moves, one query (position 0)."""
A5 = PermutationTask(
    "a5", tuple(p for p in ALL_PERMUTATIONS if parity(p) == 0), query_positions=(0,), full_state_chance=1 / NUM_OBJECTS
)
"""A5 word problem: the 60 even permutations as moves, one query (position 0)."""

PAPER_DEPTHS = {
    "swap_s5": DepthPreset(train_depth=32, min_train_depth=1, test_depths=(32, 64, 128, 256, 512),
                           source="PAR paper, task suite: train on 32 moves, test on 32…512 moves"),
    **{name: DepthPreset(train_depth=16, min_train_depth=1, test_depths=(16, 32, 64, 128, 256),
                         source="PAR paper, Fig. 1 and Tables 2, 5, 7: S5 / A5 trained on d <= 16, tested to 256 "
                                "(16x)")
       for name in ("s5", "a5")},
}
"""The paper's protocol for the permutation word problems: S5 / A5 train on d <= 16 and test to 256, swap-S5 on
d <= 32 to 512; 16× either way."""
