"""Tests of par_ray.tasks.looped_benchmarks (Fan et al. 2024 parity and addition) against independent references:
parity by counting 1s in each prefix string, addition by Python integers built from the decoded digit strings."""

from __future__ import annotations

import pytest

from par_ray.tasks import TASKS
from par_ray.tasks.looped_benchmarks import AdditionTask


@pytest.mark.parametrize("depth, seed, step", [(1, 0, 0), (7, 2, 3), (20, 1, 1), (33, 4, 0)])
def test_parity_matches_reference(depth, seed, step):
    task = TASKS["parity"]
    ep = task.sample(depth, 8, seed=seed, step=step)
    assert ep.input_ids.shape == (8, depth + 3) and ep.read_positions.tolist() == [depth + 2]
    for row in range(8):
        bits = "".join(str(int(t) - 3) for t in ep.input_ids[row, 1 : depth + 1])
        assert set(bits) <= {"0", "1"} and len(bits) == depth  # depth = n bits = Fan et al.'s T(n)
        for k in range(1, depth + 1):
            assert int(ep.states[row, k - 1, 0]) == 3 + bits[:k].count("1") % 2


def decode_operands(task, ids, depth):
    """(A, B) as Python ints from the digit-pair tokens (least significant first)."""
    a_digits, b_digits = [], []
    for token in ids[1 : depth + 1].tolist():
        a, b = divmod(token - task.pair_base, task.base)
        a_digits.append(a)
        b_digits.append(b)
    value = lambda digits: sum(d * task.base**j for j, d in enumerate(digits))  # noqa: E731
    assert a_digits[-1] == b_digits[-1] == 0  # the leading zero of both operands: depth = n + 1
    return value(a_digits), value(b_digits)


@pytest.mark.parametrize("task", [TASKS["addition"], AdditionTask("addition10", base=10)], ids=["binary", "decimal"])
@pytest.mark.parametrize("depth, seed, step", [(1, 0, 0), (2, 1, 0), (6, 3, 2), (21, 0, 5)])
def test_addition_matches_reference(task, depth, seed, step):
    ep = task.sample(depth, 8, seed=seed, step=step)
    base = task.base
    assert ep.input_ids.shape == (8, 2 * depth + 2)
    assert ep.read_positions.tolist() == list(range(depth + 2, 2 * depth + 2))
    assert (ep.input_ids[:, depth + 2 :] == 2).all()  # one repeated QUERY placeholder per answer digit
    for row in range(8):
        A, B = decode_operands(task, ep.input_ids[row], depth)
        assert A < base ** (depth - 1) and B < base ** (depth - 1)
        for k in range(1, depth + 1):
            z_k = (A + B) % base**k  # the k lowest digits of the sum: the truncated problem's answer
            digits = [(z_k // base**j) % base for j in range(depth)]
            assert [int(t) - 3 for t in ep.states[row, k - 1]] == digits, (row, k)
        final = sum((int(t) - 3) * base**j for j, t in enumerate(ep.states[row, -1]))
        assert final == A + B


def test_chance_and_vocabulary():
    parity, addition = TASKS["parity"], TASKS["addition"]
    assert parity.vocab_size == 5 and parity.chance == parity.full_state_chance == 0.5
    assert addition.vocab_size == 9 and addition.chance == 0.5 and addition.num_queries is None
    assert addition.full_state_chance == 0.0 and addition.full_state_chance_at(5) == 1 / 32
    assert [addition.pair_token(a, b) for a in (0, 1) for b in (0, 1)] == [5, 6, 7, 8]
    with pytest.raises(ValueError, match="base must be >= 2"):
        AdditionTask("bad", base=1)
