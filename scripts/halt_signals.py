"""Probe a trained halting model: stop on the halting read-out, or on the last operation's "pending" read-out.

    python scripts/halt_signals.py RUN [RUN ...] --depths 6,12,24

Two stopping signals, each put through the same k-of-n rules (``par_ray.evaluation.k_of_n_stops``), read in one
``par_ray.evaluation.halting_by_depth`` pass with ``pending_id`` (its test sets: ``eval.seed``, step 0; R_max as
``par_ray.evaluation.halt_max_iterations`` sets it for these depths: 2 × ⌈largest depth / c⌉). A trial trained with
``recipe.dense_pending`` logs the same two signals for its own rules (``halt_acc_d{D}``, ``halt_acc_d{D}_pending``,
…: ``par_ray.evaluation.halting_metrics``); this script reads them for any depths and the rules below:

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

import torch

from par_ray.cli_args import exit_with, positive_int, positive_ints
from par_ray.evaluation import halting_by_depth
from par_ray.halting import halt_tokens
from par_ray.tasks import build_task
from par_ray.train.checkpoint import load_trained
from par_ray.trial import resolve

RULES = ((6, 8, 0.5), (1, 1, 0.5), (6, 8, 0.7))
"""The paper's rule, the first crossing, and the stricter threshold."""


class NoHaltingSignal(ValueError):
    """The run was trained without a read-out this script compares (the halting query, the pending class)."""


def signals(run: str, depths: list[int], n: int) -> list[dict]:
    """Rows of the table for one trained run (see the module docstring): one ``halting_by_depth`` pass with
    ``pending_id``, the rules :data:`RULES` (the first as the primary rule), all ``n`` sequences in one chunk."""
    trained = load_trained(run)
    cfg, model = trained.config, trained.model
    trial = resolve(cfg)
    if not trial.halting:
        raise NoHaltingSignal(f"{run}: trained without recipe.halting, so it has no halting query to read")
    task = build_task(cfg.task)
    pending_id = trial.vocab.pending_id  # the class after the dense state classes
    if pending_id is None:
        raise NoHaltingSignal(f"{run}: the pending signal needs recipe.dense_targets and recipe.dense_pending")
    c = cfg.recipe.ops_per_iteration
    (k0, n0, tau0), *extra = RULES
    # halt_max_iterations 0: R_max = 2 × ⌈largest of these depths / c⌉, whatever the trial evaluated with
    eval_cfg = dataclasses.replace(cfg.eval, depths=tuple(depths), num_sequences=n, batch_size=n, halt_k=k0,
                                   halt_n=n0, halt_tau=tau0, halt_rules=tuple(extra), halt_max_iterations=0)
    # a dense-pending model is random-init: its halting tokens are the task's (no tokenizer)
    res = halting_by_depth(model, task, eval_cfg, c, halt_tokens(task), torch.device("cpu"),
                           pending_id=pending_id)
    rows = []
    for d in depths:
        v = res[d]
        by_signal = {"query": {RULES[0]: v, **v["rules"]}, "pending": v["pending"]}
        for signal, by_rule in by_signal.items():
            for k, nn, tau in RULES:
                r = by_rule[(k, nn, tau)]
                rows.append({"run": run, "step": trained.step, "seed": cfg.train.seed, "signal": signal,
                             "rule": f"{k} of {nn}, τ {tau}", "depth": d, "halt_acc": 100 * r["halt_acc"],
                             "oracle_acc": 100 * v["oracle_acc"], "gap": 100 * (v["oracle_acc"] - r["halt_acc"]),
                             "dR_mean": r["dR_mean"], "never_halted": 100 * r["never_halted"]})
    return rows


def build_parser() -> argparse.ArgumentParser:
    """This script's argument parser, built without running anything (grouped flags, one example)."""
    ap = argparse.ArgumentParser(
        prog="python scripts/halt_signals.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Probe a trained halting model: stop on the halting read-out or on the pending read-out.",
        epilog="Prints one row per run, signal, stopping rule and depth: halting vs oracle accuracy and\n"
               "the iterations it used.\n"
               "\nexample:\n  python scripts/halt_signals.py runs/halt-s0 --depths 6,12,24")
    ap.add_argument("runs", nargs="+", help="run or checkpoint directories (par_ray.train.checkpoint.load_trained)")
    probe = ap.add_argument_group("what to probe")
    probe.add_argument("--depths", type=positive_ints, default=(6, 12, 24), help="comma-separated test depths")
    probe.add_argument("-n", type=positive_int, default=256, help="sequences per depth")
    probe.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    out = ap.add_argument_group("output")
    out.add_argument("--out", help="write the rows as JSON to this path")
    return ap


def main(argv: list[str] | None = None) -> None:
    """Probe each run and print the table; ``--out`` writes the rows as JSON."""
    ap = build_parser()
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        rows = [r for run in args.runs for r in signals(run, list(args.depths), args.n)]
    except (FileNotFoundError, NoHaltingSignal) as e:  # no run there, or one trained without what it reads: one line
        ap.error(str(e))
    print("| seed | signal | rule | depth | halting (%) | oracle (%) | gap (pts) | R − R* | never halted (%) |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['seed']} | {r['signal']} | {r['rule']} | {r['depth']} | {r['halt_acc']:.1f} | "
              f"{r['oracle_acc']:.1f} | {r['gap']:.1f} | {r['dR_mean']:+.1f} | {r['never_halted']:.1f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    exit_with(main)
