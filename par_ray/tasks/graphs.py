"""Graph reachability: ``reachability``, the negative control of the task suite (no canonical intermediate state).

Follows the PAR paper's task suite, where graph reachability is the control on which progress alignment has nothing
to align to. Instances are a "two chains" connectivity probe — graph connectivity, for which Sanford, Hsu &
Telgarsky 2024, "Transformers, parallel computation, and logarithmic depth" (ICML 2024, arXiv 2402.09268) give
logarithmic upper and (conditional) lower bounds on transformer depth: a directed graph made of two disjoint chains
of d edges each over distinct random node labels, its 2d edges listed in random order, and a query pair (s, t) with
s the head of one chain and t the tail of the same chain ("yes") or of the other ("no"), each with probability 1/2.

Depth d = the number of hops from s to the end of its chain (the path length in a "yes" instance); R = ⌈d / c⌉. A
model that advances a frontier one edge per iteration needs d iterations; one that doubles pointers needs ⌈log2 d⌉.

Progress targets: the prompt lists edges as an unordered set, so no prefix of it is a smaller instance and there is
no canonical state "after k operations". ``states`` holds **the final answer repeated**: z_k = z_d for every k. So
every recipe trains on final answers only here: ``par`` (progress targets) and ``final_answer`` give the same loss,
the hold schedule keeps z_d throughout, the fixed-depth / more-iterations / untied baselines are unchanged, and a
chain-of-thought trace of the states is the answer written d times (no intermediate content). Reachability within k
hops would be a well-defined alternative, but it is a BFS curriculum, not a prefix of the prompt, and would give
PAR a signal the control is meant to lack. A task-aware recipe should not read intermediate states here.

Token layout (T = 4d + 5): ``[BOS, u_1, v_1, …, u_2d, v_2d, SEP, s, t, QUERY]`` (edge u → v), the answer read at
QUERY. Vocabulary: BOS 0, SEP 1, QUERY 2, NO 3, YES 4, nodes 5..5 + N - 1 with N = 258 node labels, enough for two
chains of up to 128 edges (``max_depth``).

Tensor suffixes: B batch, d depth, E = 2d edges, N node labels, Q = 1 query.
"""

from __future__ import annotations

import numpy as np
import torch

from par_ray.tasks.common import BOS_ID, BOS_WORD, NOUNS, SEP_WORD, DepthPreset, Episode, Task

SEP_ID = 1
QUERY_ID = 2
NO_ID = 3
YES_ID = 4
NODE_BASE = 5


class ReachabilityTask(Task):
    """Is t reachable from s, in two disjoint random chains of d edges over ``num_nodes`` labels? Chance 1/2.

    ``max_depth = num_nodes // 2 - 1`` (two chains of d + 1 distinct nodes). Raises ``ValueError`` for
    ``num_nodes < 4`` or more nodes than ``NOUNS`` has words.
    """

    op_width = None  # edges are a set, not a serial list of operations: no RecentFirst / Filler

    def __init__(self, name: str, num_nodes: int):
        if num_nodes < 4:
            raise ValueError(f"{name}: num_nodes must be >= 4, got {num_nodes}")
        self.name, self.num_nodes = name, num_nodes
        self.max_depth = num_nodes // 2 - 1
        self.node_token_ids = tuple(range(NODE_BASE, NODE_BASE + num_nodes))
        self.answer_token_ids = (NO_ID, YES_ID)
        self.vocab_size = NODE_BASE + num_nodes
        self.num_queries = 1
        self.chance = self.full_state_chance = 0.5
        if num_nodes > len(NOUNS):
            raise ValueError(f"{name}: at most {len(NOUNS)} node labels have words (NOUNS), got {num_nodes}")
        # "<|endoftext|> apple ball cup dog …: apple dog path" asks whether dog is reachable from apple
        self.words = (BOS_WORD, SEP_WORD, " path", " false", " true", *NOUNS[:num_nodes])

    def generate(self, rng: np.random.Generator, depth: int, n: int) -> Episode:
        """Draw ``n`` graphs of two ``depth``-edge chains; states (n, d, 1) all equal the final answer."""
        d = depth
        nodes_BN = rng.random((n, self.num_nodes)).argsort(axis=1)[:, : 2 * d + 2] + NODE_BASE  # distinct labels
        chain_a, chain_b = nodes_BN[:, : d + 1], nodes_BN[:, d + 1 :]
        src_BE = np.concatenate([chain_a[:, :-1], chain_b[:, :-1]], axis=1)
        dst_BE = np.concatenate([chain_a[:, 1:], chain_b[:, 1:]], axis=1)
        order_BE = rng.random((n, 2 * d)).argsort(axis=1)
        src_BE, dst_BE = np.take_along_axis(src_BE, order_BE, 1), np.take_along_axis(dst_BE, order_BE, 1)
        yes_B = rng.integers(0, 2, size=n)
        target_B = np.where(yes_B == 1, chain_a[:, -1], chain_b[:, -1])

        ids_BT = np.empty((n, 4 * d + 5), dtype=np.int64)
        ids_BT[:, 0] = BOS_ID
        ids_BT[:, 1 : 4 * d + 1 : 2] = src_BE
        ids_BT[:, 2 : 4 * d + 1 : 2] = dst_BE
        ids_BT[:, 4 * d + 1] = SEP_ID
        ids_BT[:, 4 * d + 2] = chain_a[:, 0]
        ids_BT[:, 4 * d + 3] = target_B
        ids_BT[:, 4 * d + 4] = QUERY_ID
        answer_B = np.where(yes_B == 1, YES_ID, NO_ID).astype(np.int64)
        return Episode(
            input_ids=torch.from_numpy(ids_BT),
            read_positions=torch.tensor([4 * d + 4], dtype=torch.int64),
            states=torch.from_numpy(np.repeat(answer_B[:, None, None], d, axis=1)),
            depth=depth,
        )


REACHABILITY = ReachabilityTask("reachability", num_nodes=258)
"""Graph reachability over 258 node labels (depth ≤ 128); one yes/no query, chance 1/2."""

PAPER_DEPTHS = {
    "reachability": DepthPreset(
        train_depth=16, min_train_depth=1, test_depths=(16, 32, 64, 128),
        source="our choice: 8x the train depth (the local preset's range), capped at max_depth = 128 by the "
               "258-label node vocabulary; the PAR paper's own depths for this task were not available to us",
    )
}
"""Paper preset of ``reachability``: d_train 16, tests to 8× (128 hops, the node vocabulary's limit)."""
