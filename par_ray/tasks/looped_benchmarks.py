"""Prior looped-transformer benchmarks: ``parity`` and ``addition`` of Fan et al. 2024.

Source: Fan, Du, Ramchandran & Lee, "Looped Transformers for Length Generalization" (ICLR 2025, arXiv 2409.15647).
They cast each task as an n-RASP-L program P_pre ∘ (P')^T(n) ∘ P_post, run a looped decoder T(n) times and
supervise only its output after the last loop: T(n) = n for n-bit parity, T(n) = n + 1 for n-digit addition (their
loop body XORs the operands and carries their AND, i.e. binary operands); models are trained on lengths n ∈ [1, 20]
and tested on longer inputs (they report parity near-perfect past n = 40, addition still near-perfect at the
training maximum + 10). Here **depth d is their step count T(n)**, so R = ⌈d / c⌉ = T(n) iterations
at c = 1 and the extrapolation factor G compares like with like:

- ``parity``: d = n bits. Prompt ``[BOS, b_1, …, b_n, SEP, QUERY]`` (T = d + 3), one answer read at QUERY: the
  parity of the number of 1s. Progress target z_k = the parity of the first k bits (the running XOR: the state a
  left-to-right reader holds after k bits). Fan et al. supervise only z_d (``recipe.targets=final``).
- ``addition``: d = n + 1 for two n-digit binary operands, each written with a leading 0 to the n + 1 digits of their
  sum. Operation k is one token holding the k-th digit of both operands (least significant first, the direction
  the carry travels), so the prompt is ``[BOS, pair_1, …, pair_{n+1}, SEP, QUERY × (n + 1)]`` (T = 2d + 2) and the
  (n + 1) answers, read at the QUERY tokens, are the sum's digits, least significant first. Progress target z_k =
  (A + B) mod 2^k: the k lowest digits of the sum, written once both operands' k lowest digits are read, and 0
  above — the sum of the prompt truncated after k pairs, in the same convention. The last pair is always (0, 0)
  and writes the final carry, which is why the step count is n + 1. Depth 1 is the empty sum (n = 0, answer 0).
  Pairing the digits of both operands in one token, LSB-first order and one repeated QUERY placeholder per answer
  digit (like their padding of the output positions) are this framework's serialisation choices, made so that one
  operation is one token and Q = d grows with the input as in their full-output prediction.

Vocabulary: BOS 0, SEP 1, QUERY 2, digits 3.. (3 + base - 1) (the answers, and parity's input bits), then for
addition one token per digit pair (a, b) at ``PAIR_BASE + a·base + b``.

Tensor suffixes: B batch, d depth, Q queries (1 for parity, d for addition).
"""

from __future__ import annotations

import numpy as np
import torch

from par_ray.tasks.common import BOS_ID, BOS_WORD, SEP_WORD, DepthPreset, Episode, Task

SEP_ID = 1
QUERY_ID = 2
DIGIT_BASE = 3


class ParityTask(Task):
    """Parity of a uniform bit string (Fan et al. 2024): depth d = n bits, one query, chance 1/2."""

    op_width = 1  # one bit per token: the serial layout

    def __init__(self, name: str = "parity"):
        self.name = name
        self.answer_token_ids = (DIGIT_BASE, DIGIT_BASE + 1)
        self.bit_token_ids = self.answer_token_ids
        self.vocab_size = DIGIT_BASE + 2
        self.num_queries = 1
        self.chance = self.full_state_chance = 0.5
        self.words = (BOS_WORD, SEP_WORD, " parity", "0", "1")  # "<|endoftext|>01101: parity" -> "1"

    def generate(self, rng: np.random.Generator, depth: int, n: int) -> Episode:
        """Draw ``n`` strings of ``depth`` uniform bits; states (n, d, 1) are the running parities."""
        bits_Bd = rng.integers(0, 2, size=(n, depth), dtype=np.int64)
        parity_Bd = np.bitwise_xor.accumulate(bits_Bd, axis=1)
        ids_BT = np.empty((n, depth + 3), dtype=np.int64)
        ids_BT[:, 0] = BOS_ID
        ids_BT[:, 1 : depth + 1] = bits_Bd + DIGIT_BASE
        ids_BT[:, depth + 1] = SEP_ID
        ids_BT[:, depth + 2] = QUERY_ID
        return Episode(
            input_ids=torch.from_numpy(ids_BT),
            read_positions=torch.tensor([depth + 2], dtype=torch.int64),
            states=torch.from_numpy(parity_Bd[:, :, None] + DIGIT_BASE),
            depth=depth,
        )


class AdditionTask(Task):
    """Addition of two uniform (n = d - 1)-digit numbers in ``base`` (Fan et al. 2024: base 2), with d queries.

    ``full_state_chance`` is 0, the limit as d grows; the exact chance of guessing all d digits at depth d is
    ``base ** -d`` (:meth:`full_state_chance_at`), below 1 % from d = 7 in base 2. Raises ``ValueError`` for
    ``base < 2``.
    """

    op_width = 1  # one digit pair per token: the serial layout

    def __init__(self, name: str = "addition", base: int = 2):
        if base < 2:
            raise ValueError(f"{name}: base must be >= 2, got {base}")
        self.name, self.base = name, base
        self.answer_token_ids = tuple(range(DIGIT_BASE, DIGIT_BASE + base))
        self.pair_base = DIGIT_BASE + base
        self.vocab_size = self.pair_base + base * base
        self.num_queries = None  # Q = d: the answers grow with the input, as in Fan et al.
        self.chance = 1.0 / base
        self.full_state_chance = 0.0
        # base 2 (Fan et al.'s): a digit pair (a, b) names which operand has a 1 there, "<|endoftext|> first both
        # neither:===" -> "1", "0", "0"; other bases have no words (no pretrained rendering)
        self.words = (BOS_WORD, SEP_WORD, "=", "0", "1", " neither", " second", " first", " both") if base == 2 else ()

    def full_state_chance_at(self, depth: int) -> float:
        """``base ** -depth``: every one of the d digits guessed uniformly."""
        return float(self.base) ** -depth

    def pair_token(self, a: int, b: int) -> int:
        """Token id of the digit pair (a, b)."""
        return self.pair_base + a * self.base + b

    def generate(self, rng: np.random.Generator, depth: int, n: int) -> Episode:
        """Draw ``n`` pairs of uniform (depth - 1)-digit operands; states (n, d, d), see the module docstring."""
        base = self.base
        a_Bd = np.zeros((n, depth), dtype=np.int64)
        b_Bd = np.zeros((n, depth), dtype=np.int64)
        a_Bd[:, : depth - 1] = rng.integers(0, base, size=(n, depth - 1))
        b_Bd[:, : depth - 1] = rng.integers(0, base, size=(n, depth - 1))
        sum_Bd = np.empty((n, depth), dtype=np.int64)  # digits of A + B, least significant first
        carry_B = np.zeros(n, dtype=np.int64)
        for j in range(depth):
            total_B = a_Bd[:, j] + b_Bd[:, j] + carry_B
            sum_Bd[:, j], carry_B = total_B % base, total_B // base
        # z_k keeps the k lowest digits of the sum and 0 above: states[:, k-1, j] = sum[j] if j < k else 0.
        written_dQ = np.tril(np.ones((depth, depth), dtype=bool))
        states_BdQ = np.where(written_dQ[None], sum_Bd[:, None, :], 0) + DIGIT_BASE

        ids_BT = np.empty((n, 2 * depth + 2), dtype=np.int64)
        ids_BT[:, 0] = BOS_ID
        ids_BT[:, 1 : depth + 1] = self.pair_base + a_Bd * base + b_Bd
        ids_BT[:, depth + 1] = SEP_ID
        ids_BT[:, depth + 2 :] = QUERY_ID
        return Episode(
            input_ids=torch.from_numpy(ids_BT),
            read_positions=torch.arange(depth + 2, 2 * depth + 2, dtype=torch.int64),
            states=torch.from_numpy(states_BdQ),
            depth=depth,
        )


PARITY = ParityTask("parity")
"""Fan et al.'s parity: depth = n bits = T(n)."""
ADDITION = AdditionTask("addition", base=2)
"""Fan et al.'s binary addition: depth = n + 1 = T(n) for n-digit operands; d answers (the sum's digits)."""

_FAN = "Fan et al. 2024 (arXiv 2409.15647) §6: trained on n in [1, 20]"
PAPER_DEPTHS = {
    "parity": DepthPreset(train_depth=20, min_train_depth=1, test_depths=(20, 30, 40, 50),
                          source=_FAN + "; tests n = 20…50 span their reported range (near-perfect past n = 40); "
                                        "depth = n"),
    "addition": DepthPreset(train_depth=21, min_train_depth=2, test_depths=(21, 31, 41),
                            source=_FAN + "; tests n = 20, 30, 40 (they report the training maximum + 10); "
                                          "depth = n + 1"),
}
"""Paper presets: Fan et al.'s training lengths (n ≤ 20), tests at n = 20…50 (parity) and 20…40 (addition), our
choice of points within the range they report, converted to depth = T(n)."""
