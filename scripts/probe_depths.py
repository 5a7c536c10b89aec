"""Probe a trained model: full-state accuracy for every depth 1..D and for every iteration k at one depth.

    python scripts/probe_depths.py runs/par-s0 --max-depth 32

Loads the run's final model with ``par_ray.train.checkpoint.load_trained`` (``RUN``: a run directory of ``python -m
par_ray.train`` or any checkpoint directory, written by any strategy: ddp, fsdp, deepspeed), on this process, and
samples prompts as training fed them (``par_ray.train.checkpoint.trained_task``: a pretrained parent reads the task's
words through its tokenizer, ``par_ray.prompts``; a random-init model the compact task ids).
Shows where a learned solution stops: the depth curve (does accuracy decay smoothly or fall off a cliff right past
d_train?) and, at a fixed depth, whether iteration k really holds z_k (the progress-aligned target). The diagnosis
line separates the two failures of docs/experiments.md, experiment 5: *prompt length* (the trained iterations
k <= d_train / c already fail on the longer prompt) and *iteration count* (they hold, iterations past them do not).
For models trained with dense progress targets it also reports the frontier after each iteration (the longest
prefix of operation positions whose whole state is read right in >= 90 % of sequences) and its speed in operations
per iteration (least-squares slope while the frontier advances, up to its first maximum). ``--slack 1,1.5,2`` adds
full-state accuracy with f × ⌈d/c⌉ iterations (test-time slack; docs/experiments.md, experiment 9).
"""

import argparse

import torch

from par_ray.cli_args import exit_with, positive_floats, positive_int
from par_ray.train.checkpoint import load_trained, trained_task
from par_ray.trial import resolve


def build_parser() -> argparse.ArgumentParser:
    """This script's argument parser, built without running anything (grouped flags, one example)."""
    p = argparse.ArgumentParser(
        prog="python scripts/probe_depths.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Probe a trained model: accuracy at every depth, and at every iteration at one depth.",
        epilog="Prints the depth curve, the per-iteration accuracy and a diagnosis line: does the model fail\n"
               "on prompt length or on iteration count?\n"
               "\nexample:\n  python scripts/probe_depths.py runs/par-s0 --max-depth 32")
    p.add_argument("run", help="run directory of python -m par_ray.train, or any checkpoint directory")
    probe = p.add_argument_group("what to probe")
    probe.add_argument("--max-depth", type=positive_int, default=32,
                       help="depth curve from 1 to this depth (default 32)")
    probe.add_argument("--iteration-depth", type=positive_int, default=16,
                       help="the depth whose per-iteration accuracy is shown (default 16)")
    probe.add_argument("-n", type=positive_int, default=256, help="sequences per depth (default 256)")
    probe.add_argument("--slack", type=positive_floats, default=(),
                       help="comma-separated factors f (e.g. 1,1.5,2,3): also print full-state accuracy after R = "
                            "f·⌈d/c⌉ iterations at depths d_train × 1, 2, 3, 4, 6, 8 (test-time slack: does the "
                            "model compute the right answer with more iterations than operations?)")
    return p


def main(argv: list[str] | None = None) -> None:
    """Load the run's final model and print the probe's tables."""
    p = build_parser()
    args = p.parse_args(argv)
    try:
        trained = load_trained(args.run)
    except FileNotFoundError as e:  # not a checkpoint or run directory: one line, exit 2
        p.error(str(e))
    cfg, model = trained.config, trained.model
    task = trained_task(cfg)  # the prompts as training rendered them (pretrained parent: its tokenizer's words)
    c = cfg.recipe.ops_per_iteration
    with torch.no_grad():
        row = []
        for d in range(1, args.max_depth + 1):
            ep = task.sample(d, args.n, seed=cfg.eval.seed + 1)
            out = model.iterate(ep.input_ids, ep.read_positions, -(-d // c), read="last")
            row.append((out.logits_KBQV[-1].argmax(-1) == ep.states[:, -1]).all(-1).float().mean().item())
        print("depth:    " + " ".join(f"{d:>4}" for d in range(1, args.max_depth + 1)))
        print("accuracy: " + " ".join(f"{a:4.2f}" for a in row))
        d = args.iteration_depth
        ep = task.sample(d, args.n, seed=cfg.eval.seed + 2)
        out = model.iterate(ep.input_ids, ep.read_positions, -(-d // c), read="all")
        pred = out.logits_KBQV.argmax(-1)  # (K, B, Q)
        hits = [(pred[k - 1] == ep.states[:, min(c * k, d) - 1]).all(-1).float().mean().item() for k in out.iterations]
        print(f"\nat depth {d}: does iteration k hold z_min(ck,d)?")
        print("k:        " + " ".join(f"{k:>4}" for k in out.iterations))
        print("accuracy: " + " ".join(f"{a:4.2f}" for a in hits))
        print("state rms:" + " ".join(f"{r:4.2f}" for r in out.state_rms_R.tolist()))
        if cfg.recipe.targets == "progress":  # elsewhere the queries are not trained on z_k before the end
            print(diagnosis(hits, cfg.task.train_depth, c))
        if cfg.recipe.dense_targets:
            base_vocab = resolve(cfg).vocab.dense_offset  # dense classes come after it
            frontier = frontier_by_iteration(model, ep, -(-d // c), base_vocab)
            print(f"\nat depth {d}: frontier (operations whose state is right in >= 90 % of sequences) per iteration")
            print("k:        " + " ".join(f"{k:>4}" for k in range(1, len(frontier) + 1)))
            print("frontier: " + " ".join(f"{f:>4}" for f in frontier))
            print(f"frontier speed: {frontier_speed(frontier):.2f} operations per iteration (c = {c})")
            print(frontier_diagnosis(frontier, cfg.task.train_depth, c, d))
        if args.slack:
            factors = args.slack
            print(f"\ntest-time slack: full-state accuracy after R = f × ceil(d/c) iterations ({args.n} sequences)")
            print("depth " + " ".join(f"{f'f={f:g}':>7}" for f in factors))
            for m in (1, 2, 3, 4, 6, 8):
                d = m * cfg.task.train_depth
                ep = task.sample(d, args.n, seed=cfg.eval.seed)
                accs = []
                for f in factors:
                    out = model.iterate(ep.input_ids, ep.read_positions, max(1, round(f * -(-d // c))), read="last")
                    accs.append((out.logits_KBQV[-1].argmax(-1) == ep.states[:, -1]).all(-1).float().mean().item())
                print(f"{d:>5} " + " ".join(f"{a:7.3f}" for a in accs))


def diagnosis(hits: list[float], train_depth: int, c: int, ok: float = 0.9) -> str:
    """One line naming the failure: accuracy of iterations k <= ceil(d_train / c) vs the ones past them."""
    n_trained = -(-train_depth // c)
    trained, beyond = hits[:n_trained], hits[n_trained:]
    msg = f"diagnosis: iterations 1..{n_trained} (trained counts) mean {sum(trained) / len(trained):.2f}"
    if beyond:
        msg += f"; iterations {n_trained + 1}..{len(hits)} mean {sum(beyond) / len(beyond):.2f}"
    if min(trained) < ok:
        return msg + " -> prompt-length failure (the trained iterations already fail on this longer prompt)"
    if beyond and min(beyond) < ok:
        return msg + " -> iteration-count failure (trained iterations hold, later ones do not)"
    return msg + " -> no failure at this depth"


def frontier_diagnosis(frontier: list[int], train_depth: int, c: int, depth: int) -> str:
    """One line naming the failure from the frontier: behind already within the trained iteration counts (prompt
    length), or on time there but stalling afterwards (iteration count)."""
    n_trained = -(-train_depth // c)
    at_trained = frontier[min(n_trained, len(frontier)) - 1]
    msg = f"diagnosis: frontier {at_trained} after iteration {n_trained}, {frontier[-1]} of {depth} at the end"
    if at_trained < min(c * n_trained, depth):
        return msg + " -> prompt-length failure (behind within the trained iteration counts)"
    if frontier[-1] < depth:
        return msg + " -> iteration-count failure (on time while k <= d_train / c, stalls after)"
    return msg + " -> no failure at this depth"


@torch.no_grad()
def frontier_by_iteration(model, ep, R: int, class_offset: int, ok: float = 0.9) -> list[int]:
    """Frontier after each iteration 1..R: the longest j such that operation positions 1..j all read the right
    whole state (``Episode.progress_ids``) in >= ``ok`` of the sequences."""
    out = model.iterate(ep.input_ids, ep.op_positions, R, read="all")
    acc_KD = (out.logits_KBQV.argmax(-1) == (ep.progress_ids + class_offset)).float().mean(1)
    frontier = []
    for row in acc_KD:
        bad = torch.nonzero(row < ok)
        frontier.append(int(bad[0]) if len(bad) else row.numel())
    return frontier


def frontier_speed(frontier: list[int]) -> float:
    """Least-squares slope of the frontier against the iteration while it advances: from iteration 1 up to the first
    iteration where it reaches its maximum (a frontier that stalls short of d is not averaged with its stall)."""
    peak = frontier.index(max(frontier)) + 1
    pts = [(k, f) for k, f in enumerate(frontier[:peak], start=1)]
    if len(pts) < 2:
        return float("nan")
    mk = sum(k for k, _ in pts) / len(pts)
    mf = sum(f for _, f in pts) / len(pts)
    var = sum((k - mk) ** 2 for k, _ in pts)
    return sum((k - mk) * (f - mf) for k, f in pts) / var


if __name__ == "__main__":
    exit_with(main)
