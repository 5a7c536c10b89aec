"""LoopedLM: a pretrained decoder retrofitted into prelude → weight-tied core (iterated R times) → coda.

Progress-Aligned Recurrence (PAR), paper §3:

    e    = prelude(x)                                  run once
    s_0  = e
    s_k  = core(W · [e ; s_{k-1}])          k = 1..R    W ∈ R^{h×2h}, initialised W = [0 | I]  (Eq. 1)
           (+ conv(s_{k-1}), a causal depthwise convolution of width 4, with ``position_scheme="conv"``)
    s_k ← s_k · rms(s_1).detach() / rms(s_k)            RMS norm anchoring, per token            (§3.3)
    s_k ← s_k + σ · rms(s_1) · ε,  ε ~ N(0, I)          state noise, training only (``recipe.state_noise``)
    y_k  = lm_head(norm(coda(s_k)))[read positions]     readout after any iteration k

With ``W = [0 | I]`` and ``s_0 = e``, one iteration computes core(prelude(x)) and the readout coda(·) — exactly the
parent model's forward pass (``tests/test_looped.py`` asserts this in float32).

The parent's layers are reused, never restated: they are called through ``backbones.run_decoder_layer``. Model code
never mentions DDP, FSDP or DeepSpeed (STYLE rule 10); wrapping lives in ``par_ray/train/strategies.py``.

Tensor suffixes: B batch, T tokens, H hidden size, Q read positions (queries), V vocabulary, K iterations read out,
N = K·B sequences of a batched read-out.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.profiler import record_function
from transformers import PreTrainedModel

from par_ray.model.backbones import causal_mask, run_decoder_layer


POSITION_SCHEMES = ("rope", "none", "conv")
CONV_WIDTH = 4
"""Width of the causal state convolution of ``position_scheme="conv"`` (FPRM's kernel size)."""


def default_split(num_layers: int) -> tuple[int, int, int]:
    """(prelude, core, coda) in thirds; the remainder goes to the core first, then the coda (24 → 8/8/8)."""
    third, rest = divmod(num_layers, 3)
    return third, third + (1 if rest >= 1 else 0), third + (1 if rest >= 2 else 0)


def validate_split(split: tuple[int, int, int], num_layers: int) -> tuple[int, int, int]:
    """``split`` if it is three non-negative ints with core >= 1 summing to ``num_layers``; else ``ValueError``."""
    ok = len(split) == 3 and all(isinstance(n, int) and n >= 0 for n in split) and split[1] >= 1
    if not ok or sum(split) != num_layers:
        raise ValueError(f"backbone.split: {tuple(split)} must be three non-negative integers (prelude, core, coda) "
                         f"with core >= 1 summing to the parent's {num_layers} layers")
    return tuple(split)


def token_rms(x_BTH: torch.Tensor) -> torch.Tensor:
    """Root mean square over the hidden dimension: (B, T, H) -> (B, T, 1), computed in float32."""
    return x_BTH.float().pow(2).mean(-1, keepdim=True).sqrt()


@dataclass
class LoopedOutput:
    """What :meth:`LoopedLM.iterate` returns."""

    logits_KBQV: torch.Tensor | None
    """Readout logits of the iterations listed in ``iterations``: (K, B, Q, V); ``None`` when :meth:`LoopedLM.iterate`
    was given ``reduce`` (then ``reduced_K`` holds what it kept of them)."""
    iterations: list[int]
    """1-based iteration index k of each row of ``logits_KBQV``."""
    state_rms_R: torch.Tensor
    """Mean (over batch and tokens) RMS of the state after each iteration 1..R, (R,), detached: shows drift."""
    state_change_KBT: torch.Tensor | None = None
    """With ``state_change=True``: ||s_k - s_{k-1}||² / ||s_1||² per token for each read-out iteration k, (K, B, T),
    with autograd where s_k has it (0 for k = 1, whose s_0 = e is not a state)."""
    reduced_K: torch.Tensor | None = None
    """With ``reduce``: ``reduce(k, logits_BQV)`` of each read-out iteration k, stacked: (K, ...)."""


class LoopedLM(nn.Module):
    """A parent causal LM split into prelude / core / coda with an adapter and optional RMS anchoring.

    Args:
        parent: a transformers ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` (its modules are reused, not copied,
            except the untied core copies).
        split: (prelude, core, coda) layer counts; ``None`` = :func:`default_split`.
        anchoring: RMS norm anchoring after every iteration (§3.3).
        tied: share one core across iterations (PAR). ``False`` builds ``untied_copies`` independent copies of the
            core, initialised from the parent's (the deeper-model baseline); iteration k uses copy min(k, copies).
        untied_copies: number of core copies when ``tied=False`` (usually the train depth).
        position_scheme: ``rope`` (the parent's rotary embedding), ``none`` (no positional encoding, NoPE) or ``conv``
            (NoPE attention plus a causal depthwise convolution of width :data:`CONV_WIDTH` over the state, added to
            the adapter's output every iteration: each token reads its 3 left neighbours' states at fixed offsets,
            whatever the prompt length — FPRM, arXiv 2606.18206; a par_ray option for random-init parents).
        adapter_alpha: α of the adapter init ``W = [α·I | I]``; 0 (the paper's) makes R = 1 the parent exactly.
        attention_window: 0 = full causal attention (the parent's). w > 0: prelude and core layers attend to the
            last w tokens only (itself included), so one iteration moves information at most (w - 1) × core layers
            positions and tokens far from the start cannot see it: a length-independent local rule is what is left
            to learn. The coda keeps full causal attention (it only reads out). A par_ray option for random-init
            parents (docs/experiments.md, experiment 8).
        coda_window: the same for the coda (0 = full causal attention, the parent's). A read-out that only sees the
            last w tokens reads the answer at a fixed offset from the last operation, whatever the prompt length;
            the queries can then no longer reach a frontier far from them, so use it with ``recipe.targets=done``
            (docs/experiments.md, experiment 9).
    Raises:
        ValueError: a split that does not match the parent's layer count, an unknown position scheme.
    """

    def __init__(
        self,
        parent: PreTrainedModel,
        split: tuple[int, int, int] | None = None,
        anchoring: bool = True,
        tied: bool = True,
        untied_copies: int = 8,
        position_scheme: str = "rope",
        adapter_alpha: float = 0.0,
        attention_window: int = 0,
        coda_window: int = 0,
    ):
        super().__init__()
        if position_scheme not in POSITION_SCHEMES:
            raise ValueError(f"backbone.position_scheme: {position_scheme!r} is not one of {list(POSITION_SCHEMES)}")
        base = parent.model
        layers = list(base.layers)
        n_pre, n_core, _ = validate_split(split, len(layers)) if split is not None else default_split(len(layers))
        self.config = parent.config
        self.split = (n_pre, n_core, len(layers) - n_pre - n_core)
        self.anchoring = anchoring
        self.position_scheme = position_scheme
        if attention_window < 0:
            raise ValueError(f"backbone.attention_window: must be >= 0 (0 = full causal), got {attention_window}")
        self.attention_window = attention_window
        if coda_window < 0:
            raise ValueError(f"backbone.coda_window: must be >= 0 (0 = full causal), got {coda_window}")
        self.coda_window = coda_window
        hidden = parent.config.hidden_size

        self.embed_tokens = base.embed_tokens
        self.rotary_emb = base.rotary_emb
        self.prelude = nn.ModuleList(layers[:n_pre])
        self.core = nn.ModuleList(layers[n_pre:n_pre + n_core])
        self.coda = nn.ModuleList(layers[n_pre + n_core:])
        self.norm = base.norm
        self.lm_head = parent.lm_head  # may share its weight with embed_tokens (tied word embeddings)
        # Untied baseline: copies 2..N of the core; copy 1 is `self.core` itself, so R=1 is still the parent.
        self.untied = nn.ModuleList(
            [copy.deepcopy(self.core) for _ in range(untied_copies - 1)] if not tied else []
        )
        # Adapter W·[e; s] with W = [0 | I]: the first iteration sees s_0 = e, i.e. exactly the parent's input.
        # W = [α·I | I] (α > 0) re-injects e from the start, for random-init parents.
        self.adapter = nn.Linear(2 * hidden, hidden, bias=False, dtype=parent.dtype,
                                 device=parent.lm_head.weight.device)
        with torch.no_grad():
            self.adapter.weight.zero_()
            self.adapter.weight[:, hidden:].copy_(torch.eye(hidden))
            self.adapter.weight[:, :hidden].copy_(adapter_alpha * torch.eye(hidden))

        # Causal depthwise convolution over the state (position_scheme="conv"): left-padded so token t sees t-3..t.
        self.state_conv = (
            nn.Conv1d(hidden, hidden, CONV_WIDTH, groups=hidden, bias=False, dtype=parent.dtype,
                      device=parent.lm_head.weight.device) if position_scheme == "conv" else None
        )

    @property
    def tied(self) -> bool:
        return len(self.untied) == 0

    # ---------------------------------------------------------------------------------------------------------------
    def _positions(self, x_BTH: torch.Tensor, stretch: float,
                   offset: int = 0) -> tuple[tuple[torch.Tensor, torch.Tensor], object]:
        """Rotary (cos, sin) for position ids (t + ``offset``) × ``stretch`` and the causal mask; shared by all three
        stages."""
        T = x_BTH.shape[1]
        position_ids = ((torch.arange(T, device=x_BTH.device, dtype=torch.float32) + offset) * stretch)[None]
        if self.position_scheme in ("none", "conv"):
            head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
            cos = torch.ones(1, T, head_dim, device=x_BTH.device, dtype=x_BTH.dtype)
            pos = (cos, torch.zeros_like(cos))
        else:
            pos = self.rotary_emb(x_BTH, position_ids)
        return pos, causal_mask(self.config, x_BTH)

    def _local(self, mask, x_BTH: torch.Tensor, window: int | None = None):
        """The causal ``mask`` narrowed to the last ``window`` tokens (default ``attention_window``, the prelude's and
        core's; the coda's is ``coda_window``); 0 leaves the parent's mask."""
        window = self.attention_window if window is None else window
        if not window:
            return mask
        T = x_BTH.shape[1]
        i_T = torch.arange(T, device=x_BTH.device)
        far_TT = (i_T[:, None] - i_T[None, :]) >= window
        if mask is None:  # an implementation that relies on is_causal: spell the banded causal mask out (True = see)
            return ((i_T[:, None] >= i_T[None, :]) & ~far_TT)[None, None].expand(x_BTH.shape[0], 1, T, T)
        if mask.dtype == torch.bool:
            return mask & ~far_TT
        return mask.masked_fill(far_TT, torch.finfo(mask.dtype).min)

    @staticmethod
    def _stack(layers: nn.ModuleList, x_BTH, pos, mask) -> torch.Tensor:
        for layer in layers:
            x_BTH = run_decoder_layer(layer, x_BTH, pos, mask)
        return x_BTH

    def _conv(self, s_BTH: torch.Tensor) -> torch.Tensor:
        """Causal depthwise convolution over the token axis: (B, T, H) -> (B, T, H), token t mixes t-3..t."""
        x_BHT = nn.functional.pad(s_BTH.transpose(1, 2), (CONV_WIDTH - 1, 0))
        return self.state_conv(x_BHT).transpose(1, 2)

    def _core_for(self, k: int) -> nn.ModuleList:
        """Core layers used by iteration k (1-based): the shared core, or untied copy min(k, copies)."""
        if self.tied or k == 1:
            return self.core
        return self.untied[min(k, len(self.untied) + 1) - 2]

    def readout(self, state_BTH: torch.Tensor, read_positions_Q: torch.Tensor, pos, mask) -> torch.Tensor:
        """Coda → final norm → lm_head at the read positions: (B, T, H) -> logits (B, Q, V); stacked states
        (K, B, T, H) -> (K, B, Q, V), their K·B rows through the coda as one batch (``mask`` built for K·B rows).

        The one readout path used by training, evaluation and halting alike. Only the read rows are kept, so the
        coda's last layer is computed at those rows alone (its keys/values still come from all T positions; see
        ``backbones.run_decoder_layer``'s ``rows_Q``): the logits equal the full computation's to float32 round-off.
        ``read_positions_Q`` may be any positions, in any order. lm_head runs over the unflattened (K, B, Q, H), so the
        logits are a tensor of their own, not a view of (K·B, Q, V) ones: FSDP2 warns of a root module whose output is
        a view (an in-place op on it would skip the pre-backward all-gather), and ``iterate`` returns these.
        """
        lead = state_BTH.shape[:-2]
        state_BTH = state_BTH.flatten(0, -3)
        if len(self.coda) == 0:
            h_BQH = state_BTH[:, read_positions_Q]
        else:
            h_BTH = self._stack(self.coda[:-1], state_BTH, pos, mask)
            h_BQH = run_decoder_layer(self.coda[-1], h_BTH, pos, mask, rows_Q=read_positions_Q)
        return self.lm_head(self.norm(h_BQH.unflatten(0, lead)))

    def iterate(
        self,
        input_ids_BT: torch.Tensor,
        read_positions_Q: torch.Tensor,
        R: int,
        grad_window: int | None = None,
        stretch: float = 1.0,
        read: str | tuple[int, ...] = "window",
        state_change: bool = False,
        reduce: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
        position_offset: int = 0,
        state_noise: float = 0.0,
        noise_seed: int | None = None,
    ) -> LoopedOutput:
        """Run the prelude once and the core R times; read out selected iterations.

        Args:
            input_ids_BT: (B, T) token ids.
            read_positions_Q: (Q,) positions to read answers at.
            R: number of core iterations (>= 1).
            grad_window: only the last ``grad_window`` iterations run with autograd (earlier ones under
                ``torch.no_grad``, so activation memory grows with the window, not with R). ``None`` = all R.
            stretch: positional stretch factor s: position ids × s in prelude, core and coda alike (§3.4).
            read: which iterations to read out: ``window`` (those in the gradient window), ``last`` (iteration R
                only), ``all`` (1..R), or a tuple of iterations in 1..R (the best-R evaluation of
                ``par_ray.evaluation.accuracy_by_depth``).
            state_change: also return each read iteration's per-token relative state change (the fixed-point loss
                of ``recipe.fixed_point_weight``).
            reduce: ``(k, logits_BQV) -> tensor``, applied to each read-out iteration's logits as soon as they
                exist; only its result is kept (``LoopedOutput.reduced_K``, ``logits_KBQV`` is then ``None``). An
                evaluation that reads every one of R iterations then holds one iteration's (B, Q, V) logits at a
                time, not R of them (halting evaluation at R_max = 1,024 on a 152k vocabulary: 0.47 GB, not 478 GB).
            position_offset: added to every position id before the stretch (training only, ``recipe.position_offset``;
                0 = the parent's positions).
            state_noise: σ ≥ 0; after iterations 1..R−1 (after anchoring; the read-out reads the state before its
                noise) every token's state gets Gaussian noise of standard deviation σ × its first-iteration RMS
                before it enters the next iteration, so the core must pull perturbed states back (training only,
                ``recipe.state_noise``; 0 = off).
            noise_seed: seed of the state noise's generator on the state's device, so a step's noise is a pure
                function of (trial seed, step) (``None``: torch's global generator).
        Returns: :class:`LoopedOutput` with logits (K, B, Q, V), or with ``reduce`` their reductions.
        Raises: ValueError for R < 1, grad_window < 1, state_noise < 0 or an unknown ``read``.

        Read-outs that run with autograd (the training step's: the gradient window's) run together after the last
        iteration, as one :meth:`readout` over the K·B stacked states (:meth:`_read_stacked`): one coda call per
        layer instead of K, the same logits and gradients to float32 round-off. Read-outs without autograd (an
        evaluation's, iterations before the gradient window) and every read-out with ``reduce`` run as soon as their
        iteration exists, so an evaluation holds one iteration's read-out at a time.

        The prelude, the iterations before the gradient window, those inside it and the read-outs run under the
        ``torch.profiler`` labels ``par_ray.prelude``, ``par_ray.core_no_grad``, ``par_ray.core_grad`` and
        ``par_ray.readout`` (``benchmarks/bench_long_problems.py``).
        """
        if R < 1:
            raise ValueError(f"R: must be >= 1, got {R}")
        if grad_window is not None and grad_window < 1:
            raise ValueError(f"grad_window: must be >= 1, got {grad_window}")
        if isinstance(read, tuple) and not (read and all(1 <= k <= R for k in read)):
            raise ValueError(f"read: iterations {read!r} must be non-empty, each in 1..R={R}")
        if not isinstance(read, tuple) and read not in ("window", "last", "all"):
            raise ValueError(f"read: {read!r} is not one of ['window', 'last', 'all'] or a tuple of iterations")
        if state_noise < 0:
            raise ValueError(f"state_noise: must be >= 0, got {state_noise}")
        window = R if grad_window is None else min(grad_window, R)
        first_grad = R - window + 1  # 1-based first iteration that runs with autograd
        to_read = sorted(set(read)) if isinstance(read, tuple) else {
            "window": range(first_grad, R + 1), "last": range(R, R + 1), "all": range(1, R + 1)}[read]

        x_BTH = self.embed_tokens(input_ids_BT)
        pos, mask = self._positions(x_BTH, stretch, position_offset)
        local = self._local(mask, x_BTH)
        mask = self._local(mask, x_BTH, self.coda_window)  # the coda's (read-out) mask
        with record_function("par_ray.prelude"):
            e_BTH = self._stack(self.prelude, x_BTH, pos, local)
        noise_gen = None
        if state_noise and noise_seed is not None:
            noise_gen = torch.Generator(device=e_BTH.device).manual_seed(noise_seed)
        s_BTH = e_BTH
        ref_rms_BT1 = None
        logits, rms, change = [], [], []
        batched = []  # states of the read-outs that run with autograd, read out together after the loop
        for k in range(1, R + 1):
            grad_ctx = contextlib.nullcontext() if k >= first_grad else torch.no_grad()
            with grad_ctx:
                prev_BTH = s_BTH
                with record_function("par_ray.core_grad" if k >= first_grad else "par_ray.core_no_grad"):
                    # the core's input keeps the residual stream's dtype (the prelude's output): under autocast
                    # over float32 parameters the state between iterations stays float32, as the parent's
                    # residual stream does; only the matmuls run in bf16 (docs/experiments.md §39)
                    u_BTH = self.adapter(torch.cat([e_BTH, s_BTH], dim=-1)).to(e_BTH.dtype)
                    if self.state_conv is not None:
                        u_BTH = u_BTH + self._conv(s_BTH)
                    s_BTH = self._stack(self._core_for(k), u_BTH, pos, local)
                    if k == 1:
                        ref_rms_BT1 = token_rms(s_BTH).detach()  # stop-gradient on the anchoring reference
                    elif self.anchoring:
                        s_BTH = (s_BTH.float() * (ref_rms_BT1 / token_rms(s_BTH).clamp_min(1e-12))).to(s_BTH.dtype)
                rms.append(token_rms(s_BTH).mean().detach())
                if k in to_read:
                    if reduce is None and torch.is_grad_enabled():
                        batched.append(s_BTH)
                    else:
                        with record_function("par_ray.readout"):
                            logits_BQV = self.readout(s_BTH, read_positions_Q, pos, mask)
                            logits.append(logits_BQV if reduce is None else reduce(k, logits_BQV))
                        del logits_BQV  # freed before the next iteration's read-out
                    if state_change:
                        diff_BT = (s_BTH.float() - prev_BTH.float()).pow(2).mean(-1) / ref_rms_BT1[..., 0].pow(2)
                        change.append(diff_BT if k > 1 else torch.zeros_like(diff_BT))
                if state_noise and k < R:  # the next iteration starts from a perturbed state
                    eps_BTH = torch.randn(s_BTH.shape, generator=noise_gen, device=s_BTH.device, dtype=torch.float32)
                    s_BTH = (s_BTH.float() + state_noise * ref_rms_BT1 * eps_BTH).to(s_BTH.dtype)
        if reduce is not None:
            return LoopedOutput(None, list(to_read), torch.stack(rms), torch.stack(change) if state_change else None,
                                torch.stack(logits))
        logits_KBQV = torch.stack(logits) if logits else None
        if batched:  # after any read-out without autograd: those are of earlier iterations (before the window)
            with record_function("par_ray.readout"):
                window_KBQV = self._read_stacked(batched, read_positions_Q, pos)
            logits_KBQV = window_KBQV if logits_KBQV is None else torch.cat([logits_KBQV, window_KBQV])
        return LoopedOutput(logits_KBQV, list(to_read), torch.stack(rms), torch.stack(change) if state_change else None)

    def _read_stacked(self, states: list[torch.Tensor], read_positions_Q: torch.Tensor, pos) -> torch.Tensor:
        """The read-outs of K iterations as one :meth:`readout` over their stacked states: K × (B, T, H) ->
        logits (K, B, Q, V).

        The K states go through the coda as one batch of N = K·B sequences: one call per coda layer and one lm_head
        matmul instead of K, and every row equals its own :meth:`readout` to float32 round-off, forward and
        backward (``tests/test_looped.py``, ``tests/test_step.py``). The coda's mask is built for the N rows as
        :meth:`iterate` builds it for B (the same layout, so compiled layers see the same kind of call, only a
        larger batch). Backward then runs the K read-outs first, as one batch, and keeps the (K, B, T, H) gradient
        of the stacked states until the earliest read iteration's backward (``par_ray.planner``).
        """
        states_KBTH = states[0][None] if len(states) == 1 else torch.stack(states)
        states_NTH = states_KBTH.flatten(0, 1)
        mask = self._local(causal_mask(self.config, states_NTH), states_NTH, self.coda_window)
        return self.readout(states_KBTH, read_positions_Q, pos, mask)

    def decode(self, input_ids_BT: torch.Tensor, cache) -> torch.Tensor:
        """One iteration (R = 1) over new tokens with transformers' KV cache: (B, T) -> next-token logits (B, T, V).

        The chain-of-thought baseline's greedy decoding (``par_ray.cot``): the first call passes the prompt to an
        empty ``transformers.DynamicCache`` (prefill, causal mask), each later call one token (B, 1) at position
        ``cache.get_seq_length()``. Every layer runs once, so each caches under its own ``layer_idx``; the logits
        equal :meth:`iterate` with R = 1 read out at every position (``tests/test_baselines.py``).
        Raises: ValueError for the untied baseline, ``position_scheme="conv"``, an attention window, or more than one
        new token after the prefill.
        """
        if not self.tied or self.state_conv is not None or self.attention_window or self.coda_window:
            raise ValueError("decode: cached decoding needs a tied core, position_scheme 'rope' or 'none' and no "
                             "attention window")
        start, T = cache.get_seq_length(), input_ids_BT.shape[1]
        if start and T != 1:
            raise ValueError(f"decode: after the prefill, one token per call; got {T}")
        x_BTH = self.embed_tokens(input_ids_BT)
        pos, mask = self._positions(x_BTH, 1.0)
        if start:  # the new token sees every cached position: no mask; rotary at its absolute position
            mask = None
            if self.position_scheme == "rope":
                pos = self.rotary_emb(x_BTH, torch.full((1, 1), float(start), device=x_BTH.device))
        e_BTH = x_BTH
        for layer in self.prelude:
            e_BTH = run_decoder_layer(layer, e_BTH, pos, mask, cache=cache)
        s_BTH = self.adapter(torch.cat([e_BTH, e_BTH], dim=-1))  # s_0 = e; anchoring is the identity at k = 1
        for layer in (*self.core, *self.coda):
            s_BTH = run_decoder_layer(layer, s_BTH, pos, mask, cache=cache)
        return self.lm_head(self.norm(s_BTH))

    def forward(self, input_ids_BT, read_positions_Q=None, R=1, grad_window=None, stretch=1.0, read="window",
                state_change=False, cache=None, reduce=None, position_offset=0, state_noise=0.0, noise_seed=None):
        """Alias of :meth:`iterate` so wrappers (DDP, FSDP, DeepSpeed) that call ``forward`` see the same thing; with
        a ``cache``, :meth:`decode` (through ``forward`` too, so sharded parameters are gathered by the wrapper)."""
        if cache is not None:
            return self.decode(input_ids_BT, cache)
        return self.iterate(input_ids_BT, read_positions_Q, R, grad_window, stretch, read, state_change, reduce,
                            position_offset, state_noise, noise_seed)


def build_looped(backbone_cfg, recipe_cfg, vocab_size: int | None = None, dtype: torch.dtype = torch.float32,
                 device: str | torch.device | None = None) -> LoopedLM:
    """Build the parent from ``backbone_cfg`` and retrofit it per ``recipe_cfg`` (anchoring, tied/untied).

    ``vocab_size`` shrinks the vocabulary of random-init shapes to the task's (ignored for pretrained checkpoints,
    whose vocabulary is fixed). The untied baseline gets ``recipe_cfg.max_iterations`` core copies.
    """
    from par_ray.model import backbones

    overrides = {} if backbone_cfg.pretrained or vocab_size is None else {"vocab_size": vocab_size}
    parent = backbones.load(backbone_cfg.name, backbone_cfg.pretrained, dtype=dtype, device=device,
                            attn_implementation=backbone_cfg.attn_implementation, **overrides)
    return LoopedLM(parent, split=backbone_cfg.split, anchoring=recipe_cfg.anchoring, tied=recipe_cfg.tied,
                    untied_copies=recipe_cfg.max_iterations, position_scheme=backbone_cfg.position_scheme,
                    adapter_alpha=backbone_cfg.adapter_alpha, attention_window=backbone_cfg.attention_window,
                    coda_window=backbone_cfg.coda_window)
