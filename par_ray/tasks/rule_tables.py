"""Rule-table chains: ``rule_table``, a fixed table of rules applied one after another to a state.

Follows the PAR paper's task suite (rule-table chains), in the form of a semiautomaton as in Liu et al. 2023,
"Transformers Learn Shortcuts to Automata" (ICLR 2023, arXiv 2210.10749): a finite set of states, a fixed table
``δ(rule, state) → state`` shared by every sequence, and a prompt that names the rules to apply in order. The state
after each rule is well defined: z_k = δ(r_k, z_{k-1}) from the fixed start z_0 = state 0.

The table is data (``RULE_TABLE``): 6 rules over 6 states, each rule a permutation of the states, together
generating the whole symmetric group S6 (720 elements; a test checks this). Permutation rules are a deliberate
choice: a rule that merges states loses information, at the extreme a constant rule is a reset after which earlier
rules no longer matter, and resets are the "memory" atoms of Liu et al.'s constant-depth shortcuts. With permutation
rules
every rule of the prefix matters, the group is the non-solvable S6 (for which Liu et al. give only O(log T)-depth
shortcuts, against O(1) for solvable ones), and the final state tends to uniform, so chance is 1/6.

Depth d = the number of rules in the prompt; R = ⌈d / c⌉ iterations; z_k (the PAR progress target of iteration k,
with c = 1) is the state after the first k rules.

Token layout (T = d + 3): ``[BOS, rule_1, …, rule_d, SEP, QUERY]``, the answer read at QUERY. Vocabulary: BOS 0,
SEP 1, QUERY 2, states 3..8 (the answers), rules 9..14.

Tensor suffixes: B batch, d depth, Q = 1 query, K states, M rules.
"""

from __future__ import annotations

import numpy as np
import torch

from par_ray.tasks.common import BOS_ID, BOS_WORD, SEP_WORD, DepthPreset, Episode, Task

SEP_ID = 1
QUERY_ID = 2
STATE_BASE = 3

STATE_WORDS = (" red", " green", " blue", " yellow", " black", " white", " orange", " brown")
"""State names a pretrained parent reads (the first K): "<|endoftext|> flip spin …: state" asks for the colour."""
RULE_WORDS = (" shift", " flip", " turn", " spin", " roll", " jump", " slide", " push")
"""Rule names (the first M)."""

RULE_TABLE = (
    (2, 1, 5, 0, 4, 3),
    (4, 2, 5, 3, 0, 1),
    (1, 5, 2, 3, 0, 4),
    (5, 3, 4, 1, 2, 0),
    (5, 1, 0, 3, 4, 2),
    (2, 5, 0, 1, 4, 3),
)
"""``RULE_TABLE[r][s]``: the state after rule r is applied in state s (6 rules × 6 states). Drawn once as random
permutations (``numpy.random.default_rng(20261130)``, the first draw whose 6 rules are distinct, all move state 0
and together generate S6) and frozen here as data."""


class RuleTableTask(Task):
    """Chains of rules from a fixed table ``table[r][s]`` (M rules × K states), applied from state 0.

    Raises ``ValueError`` if the table is empty, ragged, or maps a state outside 0..K-1.
    """

    op_width = 1  # one token per rule: the serial layout

    def __init__(self, name: str, table: tuple[tuple[int, ...], ...]):
        num_states = len(table[0]) if table else 0
        if not table or any(len(row) != num_states or not all(0 <= s < num_states for s in row) for row in table):
            raise ValueError(f"{name}: table must be a non-empty M × K table of states in 0..K-1, got {table!r}")
        self.name = name
        self.table = tuple(tuple(row) for row in table)
        self.num_states, self.num_rules = num_states, len(table)
        self.num_queries = 1
        self.answer_token_ids = tuple(range(STATE_BASE, STATE_BASE + num_states))
        self.rule_token_ids = tuple(range(STATE_BASE + num_states, STATE_BASE + num_states + self.num_rules))
        self.vocab_size = self.rule_token_ids[-1] + 1
        self.chance = self.full_state_chance = 1.0 / num_states
        if num_states > len(STATE_WORDS) or self.num_rules > len(RULE_WORDS):
            raise ValueError(f"{name}: at most {len(STATE_WORDS)} states and {len(RULE_WORDS)} rules have words")
        self.words = (BOS_WORD, SEP_WORD, " state", *STATE_WORDS[:num_states], *RULE_WORDS[:self.num_rules])
        self._next_KM = np.array(self.table, dtype=np.int64).T.copy()  # [state, rule] → next state

    def generate(self, rng: np.random.Generator, depth: int, n: int) -> Episode:
        """Draw ``n`` chains of ``depth`` uniform rules; see :meth:`Task.sample` for shapes (Q = 1)."""
        rules_dB = rng.integers(0, self.num_rules, size=(depth, n), dtype=np.int64)
        state_B = np.zeros(n, dtype=np.int64)
        state_dB = np.empty((depth, n), dtype=np.int64)
        for k in range(depth):
            state_B = self._next_KM[state_B, rules_dB[k]]
            state_dB[k] = state_B
        ids_BT = np.empty((n, depth + 3), dtype=np.int64)
        ids_BT[:, 0] = BOS_ID
        ids_BT[:, 1 : depth + 1] = rules_dB.T + self.rule_token_ids[0]
        ids_BT[:, depth + 1] = SEP_ID
        ids_BT[:, depth + 2] = QUERY_ID
        return Episode(
            input_ids=torch.from_numpy(ids_BT),
            read_positions=torch.tensor([depth + 2], dtype=torch.int64),
            states=torch.from_numpy(np.ascontiguousarray(state_dB.T[:, :, None]) + STATE_BASE),
            depth=depth,
        )


RULE_TABLE_TASK = RuleTableTask("rule_table", RULE_TABLE)
"""Rule-table chains: 6 permutation rules over 6 states (``RULE_TABLE``), one query (the state), chance 1/6."""

PAPER_DEPTHS = {
    "rule_table": DepthPreset(
        train_depth=32, min_train_depth=1, test_depths=(32, 64, 128, 256, 512),
        source="the PAR paper's state-tracking protocol (train 32, test 32…512, as for S5/A5/swap-S5); the "
               "paper's own depths for this family were not available to us",
    )
}
"""Paper preset of ``rule_table``: the state-tracking protocol of ``permutations.PAPER_DEPTHS``."""
