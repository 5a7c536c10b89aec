"""Probe a trained model: full-state accuracy for every depth 1..D and for every iteration k at one depth.

    python scripts/probe_depths.py runs/par-s0 --max-depth 32

Loads the run's final model with ``par_ray.model.load_trained`` (``RUN`` is a run directory of ``python -m
par_ray.train`` or any checkpoint directory, written by any strategy: ddp, fsdp, deepspeed), on this process.
Shows where a learned solution stops: the depth curve (does accuracy decay smoothly or fall off a cliff right past
d_train?) and, at a fixed depth, whether iteration k really holds z_k (the progress-aligned target).
"""

import argparse

import torch

from par_ray.model import load_trained
from par_ray.tasks import build_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--max-depth", type=int, default=32)
    p.add_argument("--iteration-depth", type=int, default=16)
    p.add_argument("-n", type=int, default=256)
    args = p.parse_args()
    trained = load_trained(args.run)
    cfg, model = trained.config, trained.model
    task = build_task(cfg.task)
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


if __name__ == "__main__":
    main()
