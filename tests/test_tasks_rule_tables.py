"""Tests of par_ray.tasks.rule_tables against an independent reference: the table read as letter-to-letter rules
and applied in a plain loop, plus the table's properties (bijective rules generating all of S6)."""

from __future__ import annotations

import pytest

from par_ray.tasks import TASKS
from par_ray.tasks.rule_tables import RULE_TABLE, RuleTableTask

LETTERS = "ABCDEF"


def reference_rules():
    """Rule r as a dict letter → letter, read from the table's rows."""
    return [{LETTERS[s]: LETTERS[nxt] for s, nxt in enumerate(row)} for row in RULE_TABLE]


@pytest.mark.parametrize("depth, seed, step", [(1, 0, 0), (5, 3, 1), (17, 1, 9), (40, 2, 4)])
def test_states_match_reference(depth, seed, step):
    task = TASKS["rule_table"]
    ep = task.sample(depth, 6, seed=seed, step=step)
    rules = reference_rules()
    for row in range(6):
        assert ep.input_ids[row, depth + 1] == 1 and ep.input_ids[row, depth + 2] == 2  # SEP, QUERY
        state = "A"
        for k in range(depth):
            rule = int(ep.input_ids[row, 1 + k]) - task.rule_token_ids[0]
            state = rules[rule][state]
            assert int(ep.states[row, k, 0]) == task.answer_token_ids[LETTERS.index(state)], (row, k)
    assert ep.read_positions.tolist() == [depth + 2]


def test_table_is_bijective_and_generates_s6():
    assert all(sorted(row) == list(range(6)) for row in RULE_TABLE) and len(set(RULE_TABLE)) == 6
    group, frontier = {tuple(range(6))}, [tuple(range(6))]
    while frontier:  # closure of the rules under composition
        g = frontier.pop()
        for rule in RULE_TABLE:
            composed = tuple(rule[g[s]] for s in range(6))
            if composed not in group:
                group.add(composed)
                frontier.append(composed)
    assert len(group) == 720  # the whole symmetric group S6


def test_vocabulary_and_every_rule_drawn():
    task = TASKS["rule_table"]
    assert task.vocab_size == 15 and task.answer_token_ids == tuple(range(3, 9))
    assert task.rule_token_ids == tuple(range(9, 15)) and task.chance == task.full_state_chance == pytest.approx(1 / 6)
    assert task.sample(4, 512, seed=0).input_ids[:, 1:5].unique().tolist() == list(task.rule_token_ids)


def test_bad_table_is_rejected():
    with pytest.raises(ValueError, match="table must be a non-empty M × K table"):
        RuleTableTask("bad", ((0, 1), (0, 2)))
    with pytest.raises(ValueError, match="table must be"):
        RuleTableTask("bad", ())
