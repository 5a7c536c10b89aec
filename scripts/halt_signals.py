"""Probe a trained halting model: stop on the halting read-out, or on the last operation's "pending" read-out.

    python scripts/halt_signals.py RUN [RUN ...] --depths 6,12,24

Two stopping signals, each put through the same k-of-n rules (``par_ray.evaluation.k_of_n_stops``) on the same test
sets as ``par_ray.evaluation.halting_by_depth`` (``eval.seed``, step 0), R_max as it sets it for these depths
(``par_ray.evaluation.halt_max_iterations``: 2 × ⌈largest depth / c⌉):

- ``query``: P(Yes) of the halting query through the coda (paper §3, "Learned Halting"; what the trial's
  ``halt_acc_d{D}`` metrics report).
- ``pending``: 1 − P(pending) of the dense read-out at the *last operation* (``recipe.dense_pending``: a position past
  iteration k's frontier is trained on the "pending" class, so the last operation stops being pending exactly when
  the model has computed every operation). No extra parameters and no halting loss: it asks the model's own progress
  read-out whether it is done. A par_ray diagnostic, not the paper's halting (docs/experiments.md §14).

Prints, per run, signal, rule and depth: accuracy at the rule's R vs oracle stopping R* = ⌈d/c⌉ (%), the gap in
points, the mean of R − R*, and the never-halted share; ``--out`` writes the rows as JSON. Needs a model trained
with ``recipe.halting`` (post-hoc or joint) and, for ``pending``, ``recipe.dense_pending``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import torch

from par_ray.evaluation import halt_max_iterations, k_of_n_stops
from par_ray.halting import halt_tokens, p_yes, with_halt_query
from par_ray.model import load_trained
from par_ray.objectives import dense_class_offset
from par_ray.stages import uses_halting
from par_ray.tasks import build_task

RULES = ((6, 8, 0.5), (1, 1, 0.5), (6, 8, 0.7))
"""The paper's rule, the first crossing, and the stricter threshold."""


def signals(run: str, depths: list[int], n: int) -> list[dict]:
    """Rows of the table for one trained run (see the module docstring)."""
    trained = load_trained(run)
    cfg, model = trained.config, trained.model
    if not uses_halting(cfg):
        raise ValueError(f"{run}: trained without recipe.halting, so it has no halting query to read")
    if not (cfg.recipe.dense_targets and cfg.recipe.dense_pending):
        raise ValueError(f"{run}: the pending signal needs recipe.dense_targets and recipe.dense_pending")
    task = build_task(cfg.task)
    halt = halt_tokens(task, cfg.backbone)
    pending_id = dense_class_offset(task, cfg) + task.num_states  # the class after the dense state classes
    c = cfg.recipe.ops_per_iteration
    R_max = halt_max_iterations(dataclasses.replace(cfg.eval, depths=tuple(depths), halt_max_iterations=0), c)
    rows = []
    with torch.no_grad():
        for d in depths:
            ep = with_halt_query(task.sample(d, n, seed=cfg.eval.seed, step=0), halt.query)
            reads_Q = torch.cat([ep.read_positions, ep.op_positions[-1:]])  # answers, halting query, last op
            logits_RBQV = model.iterate(ep.input_ids, reads_Q, R_max, read="all").logits_KBQV
            right_RB = (logits_RBQV[:, :, :-2].argmax(-1) == ep.states[:, -1]).all(-1)
            R_star = math.ceil(d / c)
            oracle = right_RB[R_star - 1].float().mean().item()
            p = {"query": p_yes(logits_RBQV[:, :, -2], halt),
                 "pending": 1.0 - logits_RBQV[:, :, -1].float().softmax(-1)[..., pending_id]}
            for signal, p_RB in p.items():
                R_XB, halted_XB = k_of_n_stops(p_RB, RULES)
                for (k, nn, tau), R_B, halted_B in zip(RULES, R_XB, halted_XB):
                    acc = right_RB.gather(0, (R_B - 1)[None])[0].float().mean().item()
                    rows.append({"run": run, "step": trained.step, "seed": cfg.train.seed, "signal": signal,
                                 "rule": f"{k} of {nn}, τ {tau}", "depth": d, "halt_acc": 100 * acc,
                                 "oracle_acc": 100 * oracle, "gap": 100 * (oracle - acc),
                                 "dR_mean": (R_B - R_star).double().mean().item(),
                                 "never_halted": 100 * (~halted_B).double().mean().item()})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run or checkpoint directories (par_ray.model.load_trained)")
    ap.add_argument("--depths", default="6,12,24", help="comma-separated test depths")
    ap.add_argument("-n", type=int, default=256, help="sequences per depth")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", help="write the rows as JSON to this path")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [r for run in args.runs for r in signals(run, [int(d) for d in args.depths.split(",")], args.n)]
    print("| seed | signal | rule | depth | halting (%) | oracle (%) | gap (pts) | R − R* | never halted (%) |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['seed']} | {r['signal']} | {r['rule']} | {r['depth']} | {r['halt_acc']:.1f} | "
              f"{r['oracle_acc']:.1f} | {r['gap']:.1f} | {r['dR_mean']:+.1f} | {r['never_halted']:.1f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
