"""The training step's loss, built once per stage from the recipe (par_ray.train.step.build_step_loss)."""

import pytest

from par_ray.config import RecipeConfig
from par_ray.halting import task_halt_tokens
from par_ray.tasks import get_task
from par_ray.train.step import build_step_loss


def _terms(loss) -> list[str]:
    return [t.__qualname__.split(".")[0] for t in loss.extras]


@pytest.mark.parametrize("recipe, terms, reads", [
    (RecipeConfig(), [], dict(halt_query=None, read_ops=False, state_change=False)),
    (RecipeConfig(halting=True), ["halting_term"], dict(read_ops=False, state_change=False)),
    (RecipeConfig(dense_targets=True), ["dense_term"], dict(halt_query=None, read_ops=True, state_change=False)),
    (RecipeConfig(dense_targets=True, fixed_point_weight=0.1, halting=True),
     ["halting_term", "dense_term", "fixed_point_term"], dict(read_ops=True, state_change=True)),
])
def test_terms_follow_the_recipe_in_a_fixed_order(recipe, terms, reads):
    task = get_task("swap_s5")
    halt = task_halt_tokens(task.vocab_size)
    loss = build_step_loss(recipe, task, halt=halt)
    assert _terms(loss) == terms
    for field, want in reads.items():
        assert getattr(loss, field) == want
    if recipe.halting:
        assert loss.halt_query == halt.query
    assert loss.state_offset == task.vocab_size  # default: dense class 0 right after the task's tokens


def test_halting_without_tokens_is_refused_when_the_loss_is_built():
    with pytest.raises(ValueError, match="recipe.halting"):
        build_step_loss(RecipeConfig(halting=True), get_task("swap_s5"))
