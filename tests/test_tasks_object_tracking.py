"""Tests of par_ray.tasks.object_tracking against an independent reference: the operations decoded to words and
replayed on a dict object → location in a plain loop."""

from __future__ import annotations

import pytest

from par_ray.tasks import TASKS
from par_ray.tasks.object_tracking import ObjectTrackingTask


def decode(task, ids, depth):
    """The prompt's operations as ("move", obj, loc) / ("swap", obj, obj) tuples."""
    ops = []
    for k in range(depth):
        verb, x, y = (int(t) for t in ids[1 + 3 * k : 4 + 3 * k])
        obj = task.object_token_ids.index(x)
        if verb == 2:
            ops.append(("move", obj, task.answer_token_ids.index(y)))
        else:
            assert verb == 3
            ops.append(("swap", obj, task.object_token_ids.index(y)))
    return ops


@pytest.mark.parametrize("depth, seed, step", [(1, 0, 0), (4, 5, 2), (13, 1, 7), (30, 2, 0)])
def test_states_match_reference(depth, seed, step):
    task = TASKS["object_tracking"]
    ep = task.sample(depth, 8, seed=seed, step=step)
    for row in range(8):
        where = {obj: obj for obj in range(4)}  # object i starts at location i
        for k, (verb, a, b) in enumerate(decode(task, ep.input_ids[row], depth)):
            if verb == "move":
                where[a] = b
            else:
                assert a != b
                where[a], where[b] = where[b], where[a]
            expected = [task.answer_token_ids[where[obj]] for obj in range(4)]
            assert ep.states[row, k].tolist() == expected, (row, k)
        assert ep.input_ids[row, 3 * depth + 1] == 1
        assert ep.input_ids[row, 3 * depth + 2 :].tolist() == list(task.object_token_ids)  # "where is obj_q?"
    assert ep.read_positions.tolist() == list(range(3 * depth + 2, 3 * depth + 6))


def test_operation_mix_and_vocabulary():
    task = TASKS["object_tracking"]
    assert task.vocab_size == 13 and task.num_queries == 4 and task.op_width == 3
    assert task.chance == pytest.approx(1 / 5) and task.full_state_chance == pytest.approx(1 / 625)
    ids = task.sample(64, 256, seed=0).input_ids[:, 1 : 1 + 3 * 64].reshape(-1, 3)
    moves = ids[:, 0] == 2
    assert abs(moves.double().mean().item() - 1 / 3) < 0.02
    assert ids[moves, 2].unique().tolist() == list(task.answer_token_ids)  # every location is a MOVE target
    assert (ids[~moves, 1] != ids[~moves, 2]).all()  # SWAP pairs are distinct objects


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="need 2 <= num_objects <= num_locations"):
        ObjectTrackingTask("bad", num_objects=5, num_locations=4, move_prob=0.5)
    with pytest.raises(ValueError, match="move_prob"):
        ObjectTrackingTask("bad", num_objects=2, num_locations=4, move_prob=1.5)
