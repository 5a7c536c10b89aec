"""Probe a trained model: full-state accuracy for every depth 1..D and for every iteration k at one depth.

    python scripts/probe_depths.py runs/par-s0 --max-depth 32

Reads ``RUN/result.json`` (the resolved config) and ``RUN/final/state.pt`` written by ``python -m par_ray.train``.
Shows where a learned solution stops: the depth curve (does accuracy decay smoothly or fall off a cliff right past
d_train?) and, at a fixed depth, whether iteration k really holds z_k (the progress-aligned target).
"""

import argparse
import json
import os

import torch

from par_ray.config import from_flat
from par_ray.model.looped import build_looped
from par_ray.tasks import build_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--max-depth", type=int, default=32)
    p.add_argument("--iteration-depth", type=int, default=16)
    p.add_argument("-n", type=int, default=256)
    args = p.parse_args()
    cfg = from_flat(json.load(open(os.path.join(args.run, "result.json")))["config"])
    task = build_task(cfg.task)
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=task.vocab_size)
    model.load_state_dict(torch.load(os.path.join(args.run, "final", "state.pt"), weights_only=True)["model"])
    model.eval()
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
