"""Object tracking: ``object_tracking``, objects moved between locations by templated operations.

Follows the PAR paper's task suite (object tracking) in the templated form of Kim & Schuster 2023, "Entity Tracking
in Language Models" (ACL 2023, arXiv 2305.02363): a few objects in a few places, a sequence of operations written
from fixed templates, and questions asking where each object is at the end. Here the templates are
three tokens each:

- ``MOVE x l``: object x goes to location l (no change if it is already there);
- ``SWAP x y``: objects x and y (x ≠ y) exchange locations (no change if they share one).

Start: object i at location i (4 objects, 5 locations, so one location starts empty). Each operation is a MOVE
with probability 1/3 (object and location uniform) and otherwise a SWAP (ordered pair of distinct objects,
uniform). Both kinds are doubly stochastic on the 5⁴ joint states, so the joint state tends to uniform and chance is
1/5 per object and 5⁻⁴ = 1/625 for the whole state; SWAPs make every operation since an object's last MOVE matter.

Depth d = the number of operations; z_k (the PAR progress target of iteration k, with c = 1) is every object's
location after the first k operations; the queries ask for all 4 (scored by full-state accuracy).

Token layout (T = 3d + 2 + 4): ``[BOS, (VERB, arg, arg) × d, SEP, obj_0, obj_1, obj_2, obj_3]``; the queries are
the object tokens themselves ("where is obj_q?"), the answers are location tokens. Vocabulary: BOS 0, SEP 1,
MOVE 2, SWAP 3, objects 4..7, locations 8..12.

Tensor suffixes: B batch, d depth, Q = O objects (queries), L locations.
"""

from __future__ import annotations

import numpy as np
import torch

from par_ray.tasks.common import BOS_ID, BOS_WORD, SEP_WORD, DepthPreset, Episode, Task

SEP_ID = 1
MOVE_ID = 2
SWAP_ID = 3
OBJ_BASE = 4

OBJECT_WORDS = (" apple", " ball", " cup", " key", " coin", " ring", " pen", " hat")
"""Object names a pretrained parent reads (the first ``num_objects``): "<|endoftext|> move apple box swap ball cup
…: apple ball cup key" asks where each object is; the answers are location names."""
LOCATION_WORDS = (" box", " bag", " desk", " shelf", " drawer", " table", " chair", " bed", " car", " room")
"""Location names (the first ``num_locations``)."""


class ObjectTrackingTask(Task):
    """``num_objects`` objects on ``num_locations`` locations (object i starts at location i), moved by MOVE/SWAP
    operations; a MOVE with probability ``move_prob``.

    Raises ``ValueError`` unless 2 <= num_objects <= num_locations and 0 <= move_prob <= 1, or when there are more
    objects or locations than :data:`OBJECT_WORDS` / :data:`LOCATION_WORDS` name.
    """

    op_width = 3  # VERB, arg, arg: the serial layout with three tokens per operation

    def __init__(self, name: str, num_objects: int, num_locations: int, move_prob: float):
        if not 2 <= num_objects <= num_locations or not 0.0 <= move_prob <= 1.0:
            raise ValueError(f"{name}: need 2 <= num_objects <= num_locations and 0 <= move_prob <= 1, got "
                             f"num_objects={num_objects}, num_locations={num_locations}, move_prob={move_prob}")
        self.name = name
        self.num_objects, self.num_locations, self.move_prob = num_objects, num_locations, move_prob
        self.object_token_ids = tuple(range(OBJ_BASE, OBJ_BASE + num_objects))
        self.answer_token_ids = tuple(range(OBJ_BASE + num_objects, OBJ_BASE + num_objects + num_locations))
        self.query_token_ids = self.object_token_ids
        self.num_queries = num_objects
        self.vocab_size = self.answer_token_ids[-1] + 1
        self.chance = 1.0 / num_locations
        self.full_state_chance = float(num_locations) ** -num_objects
        if num_objects > len(OBJECT_WORDS) or num_locations > len(LOCATION_WORDS):
            raise ValueError(f"{name}: at most {len(OBJECT_WORDS)} objects and {len(LOCATION_WORDS)} locations have "
                             f"words, got {num_objects} and {num_locations}")
        self.words = (BOS_WORD, SEP_WORD, " move", " swap", *OBJECT_WORDS[:num_objects],
                      *LOCATION_WORDS[:num_locations])

    def generate(self, rng: np.random.Generator, depth: int, n: int) -> Episode:
        """Draw ``n`` sequences of ``depth`` operations; see :meth:`Task.sample` for shapes (Q = num_objects)."""
        O, L = self.num_objects, self.num_locations
        is_move_dB = rng.random((depth, n)) < self.move_prob
        x_dB = rng.integers(0, O, size=(depth, n))
        loc_dB = rng.integers(0, L, size=(depth, n))
        y_dB = (x_dB + rng.integers(1, O, size=(depth, n))) % O  # uniform over the objects other than x

        rows = np.arange(n)
        loc_BQ = np.tile(np.arange(O, dtype=np.int64), (n, 1))
        states_BdQ = np.empty((n, depth, O), dtype=np.int64)
        for k in range(depth):
            x, y, move = x_dB[k], y_dB[k], is_move_dB[k]
            at_x, at_y = loc_BQ[rows, x], loc_BQ[rows, y]
            loc_BQ[rows, x] = np.where(move, loc_dB[k], at_y)
            loc_BQ[rows, y] = np.where(move, at_y, at_x)
            states_BdQ[:, k] = loc_BQ

        ids_BT = np.empty((n, 3 * depth + 2 + O), dtype=np.int64)
        ids_BT[:, 0] = BOS_ID
        ops_BdW = ids_BT[:, 1 : 3 * depth + 1].reshape(n, depth, 3)  # a view: writes land in ids_BT
        ops_BdW[:, :, 0] = np.where(is_move_dB, MOVE_ID, SWAP_ID).T
        ops_BdW[:, :, 1] = (x_dB + OBJ_BASE).T
        ops_BdW[:, :, 2] = np.where(is_move_dB, loc_dB + self.answer_token_ids[0], y_dB + OBJ_BASE).T
        ids_BT[:, 3 * depth + 1] = SEP_ID
        ids_BT[:, 3 * depth + 2 :] = self.object_token_ids
        return Episode(
            input_ids=torch.from_numpy(ids_BT),
            read_positions=torch.arange(3 * depth + 2, 3 * depth + 2 + O, dtype=torch.int64),
            states=torch.from_numpy(states_BdQ + self.answer_token_ids[0]),
            depth=depth,
        )


OBJECT_TRACKING = ObjectTrackingTask("object_tracking", num_objects=4, num_locations=5, move_prob=1 / 3)
"""Object tracking: 4 objects, 5 locations, MOVE 1/3 · SWAP 2/3; 4 queries, chance 1/5, full-state chance 1/625."""

PAPER_DEPTHS = {
    "object_tracking": DepthPreset(
        train_depth=32, min_train_depth=1, test_depths=(32, 64, 128, 256, 512),
        source="the PAR paper's state-tracking protocol (train 32, test 32…512, as for S5/A5/swap-S5); the "
               "paper's own depths for this family were not available to us",
    )
}
"""Paper preset of ``object_tracking``: the state-tracking protocol of ``permutations.PAPER_DEPTHS``."""
