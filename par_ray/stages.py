"""Stages: a trial is a list of stages run in order by the one training loop (PAR, then a short fine-tuning stage).

The paper fine-tunes after PAR training: positional stretch with s_max ramped 1 → 8 (§3.4), and the post-hoc halting
read-out trained with the rest of the model frozen (§3, "Learned Halting", comparison arm). Each
:class:`~par_ray.config.StageConfig` has its own steps, recipe and frozen parts; the global step counts across stages
(the LR schedule, reports and checkpoints use it), and the map global step → (stage, step in stage) is pure, so a run
resumed from any checkpoint, mid-stage included, continues in the right stage.

One optimizer for the whole trial: a frozen parameter keeps its AdamW state and simply gets no update (its gradient is
dropped before the optimizer step, so AdamW skips it: no momentum, no weight decay), which needs no re-wrapping under
DDP or FSDP2. DeepSpeed owns its gradients, so frozen stages are refused for it (``config.halting_and_stage_errors``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from par_ray.config import FROZEN_PARTS, RecipeConfig, StageConfig, TrialConfig, stage_steps
from par_ray.recipes import stage_recipe

FROZEN_PREFIXES: dict[str, tuple[str, ...] | None] = {
    "none": None,
    "all_but_coda": ("coda.", "norm."),
}
"""Parameter-name prefixes (of ``LoopedLM.named_parameters``) that stay trainable; ``None`` = everything.
``all_but_coda``: the coda layers and the final norm, i.e. the readout path minus the (possibly tied) lm_head."""
assert set(FROZEN_PREFIXES) == set(FROZEN_PARTS)


@dataclass(frozen=True)
class Stage:
    """A resolved stage: global steps [start, end), the recipe it trains with and what it freezes."""

    index: int
    start: int
    end: int
    recipe: RecipeConfig
    frozen: str

    @property
    def steps(self) -> int:
        return self.end - self.start


def resolve_stages(cfg: TrialConfig) -> list[Stage]:
    """The trial's stages with global step bounds (``config.stage_steps``); the stage with neither ``steps`` nor
    ``share`` gets what the others leave of ``train.steps``. Assumes ``cfg`` validated (``par_ray.trial.validate``);
    ``par_ray.trial.resolve`` calls it once per trial."""
    total = cfg.train.steps
    fixed = sum(stage_steps(s, total) for s in cfg.stages)
    out, start = [], 0
    for i, s in enumerate(cfg.stages):
        n = stage_steps(s, total) or total - fixed
        out.append(Stage(i, start, start + n, stage_recipe(cfg, s), s.frozen))
        start += n
    return out


def stage_at(stages: list[Stage], step: int) -> tuple[Stage, int]:
    """(stage, step within it) of global step ``step`` (0-based). ``ValueError`` past the last stage."""
    for s in stages:
        if s.start <= step < s.end:
            return s, step - s.start
    raise ValueError(f"step: {step} is outside the trial's stages [0, {stages[-1].end if stages else 0})")


def frozen_parameters(model: nn.Module, frozen: str) -> list[nn.Parameter]:
    """Parameters of ``model`` (an unwrapped ``LoopedLM``, or FSDP2's in-place sharded one) that ``frozen`` freezes.

    A parameter shared by a trainable and a frozen module (tied embeddings) is listed under its first name, so with
    ``all_but_coda`` the tied ``lm_head``/``embed_tokens`` matrix is frozen. ``ValueError`` for an unknown ``frozen``.
    """
    if frozen not in FROZEN_PREFIXES:
        raise ValueError(f"stages[].frozen: {frozen!r} is not one of {list(FROZEN_PREFIXES)}")
    keep = FROZEN_PREFIXES[frozen]
    if keep is None:
        return []
    return [p for name, p in model.named_parameters() if not name.startswith(keep)]


__all__ = ["FROZEN_PREFIXES", "Stage", "StageConfig", "frozen_parameters", "resolve_stages", "stage_at"]
