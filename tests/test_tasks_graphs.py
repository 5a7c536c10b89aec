"""Tests of par_ray.tasks.graphs against an independent reference: the edge list decoded into an adjacency dict and
searched depth-first from s; the instance structure (two disjoint chains of d edges); the repeated-answer states."""

from __future__ import annotations

import pytest

from par_ray.tasks import TASKS
from par_ray.tasks.graphs import ReachabilityTask


def reachable(edges, s, t):
    seen, stack = {s}, [s]
    while stack:
        u = stack.pop()
        for v in edges.get(u, []):
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return t in seen


@pytest.mark.parametrize("depth, seed, step", [(1, 0, 0), (3, 2, 1), (12, 1, 4), (50, 3, 0)])
def test_answers_match_reference(depth, seed, step):
    task = TASKS["reachability"]
    ep = task.sample(depth, 16, seed=seed, step=step)
    assert ep.input_ids.shape == (16, 4 * depth + 5) and ep.read_positions.tolist() == [4 * depth + 4]
    for row in range(16):
        ids = ep.input_ids[row].tolist()
        pairs = list(zip(ids[1 : 4 * depth + 1 : 2], ids[2 : 4 * depth + 1 : 2]))
        edges = {}
        for u, v in pairs:
            edges.setdefault(u, []).append(v)
        s, t = ids[4 * depth + 2], ids[4 * depth + 3]
        assert ids[4 * depth + 1] == 1 and ids[4 * depth + 4] == 2
        # Two disjoint chains of `depth` edges: 2d edges over 2d + 2 distinct nodes, in- and out-degree <= 1.
        nodes = {x for edge in pairs for x in edge}
        assert len(pairs) == 2 * depth and len(nodes) == 2 * depth + 2 and all(len(v) == 1 for v in edges.values())
        assert len({v for _, v in pairs}) == 2 * depth
        hops, u = 0, s
        while u in edges:
            u, hops = edges[u][0], hops + 1
        assert hops == depth and t not in edges  # s heads a chain of d hops; t is a chain's tail
        answer = task.answer_token_ids[int(reachable(edges, s, t))]
        assert (ep.states[row, :, 0] == answer).all()  # the final answer repeated: no intermediate state


def test_labels_balanced_and_vocabulary():
    task = TASKS["reachability"]
    assert task.vocab_size == 263 and task.max_depth == 128 and task.op_width is None
    answers = task.sample(8, 4096, seed=1).states[:, -1, 0]
    assert abs((answers == task.answer_token_ids[1]).double().mean().item() - 0.5) < 0.03
    with pytest.raises(ValueError, match="num_nodes must be >= 4"):
        ReachabilityTask("bad", num_nodes=3)
