"""lengen: the building blocks of length generalization in transformers, and a small GPT made of them.

Read top to bottom (`python lengen.py` prints a short tour):
  1. rotary scalings (RoPE, PI, NTK, dynamic NTK, YaRN, dynamic YaRN)   -> (inv_freq, attention_scale)
  2. applying rotations (cos/sin in float64, the half-split layout of Hugging Face Llama models)
  3. position ids (contiguous, randomized, uniform stretch, PoSE) and a length curriculum
  4. positional encodings, grouped by where they act: the input, q/k rotation, the attention logits
  5. attention: softmax written out, the same in query blocks (fused SDPA without a bias), linear attention
  6. a small GPT that takes any encoding and any position ids
  7. a Hugging Face bridge: put any of these scalings into a Llama-family model
  8. speed paths: ALiBi through torch's fused kernel, the other biases through flex attention, and which runs

Nothing here imports the rest of the project, and importing it never imports transformers.
"""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # a torch without flex attention: bias encodings keep the block path (section 8)
    BlockMask = flex_attention = None

# ---------------------------------------------------------------------------------------------------------
# 1. Rotary scalings
#
# RoPE rotates pair i of every query and key by the angle p * theta_i at position p. A rotary scaling decides the
# frequencies theta_i (and an attention scale that multiplies cos and sin). Every scaling is a pure function with
# one signature, (dim, base, factor, original_len, length) -> (inv_freq, attention_scale): a float32 tensor of
# dim // 2 and a float, computed exactly as Hugging Face transformers computes it, so a model fine-tuned here
# means the same thing there. Each reads only the arguments its formula needs and checks them itself, so that one
# copied into another project (with rope_frequencies, which they all build on) still refuses a bad input with a
# reason. GPTConfig, config.json and the command line name the choice the same way (scaling="yarn", --scaling yarn).
# ---------------------------------------------------------------------------------------------------------


def rope_frequencies(dim: int, base: float = 10000.0, factor: float = 1.0, original_len: int | None = None,
                     length: int | None = None) -> tuple[torch.Tensor, float]:
    """RoPE (arXiv 2104.09864): theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1; no attention scale."""
    if not (isinstance(dim, int) and dim > 0 and dim % 2 == 0):
        raise ValueError(f"rotary dimension must be a positive even integer, got {dim}")
    if not base > 1:
        raise ValueError(f"rope base must be > 1 (frequencies are base^(-2i/dim)), got {base}")
    if not factor >= 1:
        raise ValueError(f"scaling factor must be >= 1 (it stretches the context), got {factor}")
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), 1.0


def pi_frequencies(dim: int, base: float, factor: float, original_len: int | None = None,
                   length: int | None = None) -> tuple[torch.Tensor, float]:
    """Position interpolation (arXiv 2306.15595): theta_i / s, the same as reading position p as p / s.
    Standalone with: rope_frequencies."""
    inv_freq, _ = rope_frequencies(dim, base, factor)
    return inv_freq / factor, 1.0


def ntk_frequencies(dim: int, base: float, factor: float, original_len: int | None = None,
                    length: int | None = None) -> tuple[torch.Tensor, float]:
    """NTK-aware scaling (bloc97, 2023; arXiv 2309.00071 sec. 3.1): base -> base * s^(dim / (dim - 2)).
    Standalone with: rope_frequencies."""
    if dim <= 2:
        raise ValueError(f"NTK rescales the base by s^(dim/(dim-2)): it needs a rotary dim > 2, got {dim}")
    rope_frequencies(dim, base, factor)  # checks dim, base and s before they enter the exponent
    return rope_frequencies(dim, base * factor ** (dim / (dim - 2)))


def dynamic_ntk_frequencies(dim: int, base: float, factor: float, original_len: int,
                            length: int | None = None) -> tuple[torch.Tensor, float]:
    """Dynamic NTK (arXiv 2309.00071 sec. 3.3): base -> base * (s*n/L - (s-1))^(dim/(dim-2)) at length n > L.
    At or below the original length L it is plain RoPE, so short inputs are read exactly as in pretraining.
    Standalone with: rope_frequencies, ntk_frequencies."""
    if not (original_len and original_len > 0):
        raise ValueError(f"dynamic NTK needs original_len > 0, the length the model was trained at, got {original_len}")
    ntk_frequencies(dim, base, factor)  # checks dim, base and s
    n = max(length or 0, original_len)
    return rope_frequencies(dim, base * (factor * n / original_len - (factor - 1)) ** (dim / (dim - 2)))


def yarn_frequencies(dim: int, base: float, factor: float, original_len: int, length: int | None = None, *,
                     beta_fast: float = 32.0, beta_slow: float = 1.0,
                     truncate: bool = True) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071): inv_freq_i = (theta_i / s)(1 - w_i) + theta_i w_i, scale a = 0.1 ln s + 1.

    w_i is 1 for fast pairs (more than beta_fast turns within the original length L: keep them, they carry
    local order), 0 for slow pairs (under beta_slow turns: interpolate them, they never completed a turn in
    pretraining) and a linear ramp over the pair index in between. Pair boundaries come from the number of
    turns r a pair makes in L:  corr(r) = dim * ln(L / (2 pi r)) / (2 ln base).
    Worked example: dim 128, base 1e4, L 4096, s 16 -> ramp from pair 20 to 46, a = 1.2773.
    Standalone with: rope_frequencies."""
    if not (original_len and original_len > 0):
        raise ValueError(f"YaRN needs original_len > 0, the length the model was trained at, got {original_len}")
    theta, _ = rope_frequencies(dim, base, factor)  # checks dim, base and s

    def correction_dim(turns: float) -> float:
        return dim * math.log(original_len / (2 * math.pi * turns)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # w_i: the weight of the original (extrapolated) frequency
    inv_freq = theta / factor * (1 - keep) + theta * keep
    scale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, scale


def dynamic_yarn_frequencies(dim: int, base: float, factor: float, original_len: int,
                             length: int | None = None) -> tuple[torch.Tensor, float]:
    """Dynamic YaRN (arXiv 2309.00071 sec. 3.3 applied to YaRN): YaRN with s' = max(s, n / L) at length n.

    With s = 1 (the reference code's default) it is plain RoPE up to the original length L and stretches only
    as far as the current input needs past it, so short inputs are read exactly as in pretraining (static YaRN
    changes them: a slower slow half and a larger attention scale). s > 1 is a model fine-tuned with YaRN x s:
    its own stretch is kept until n / L passes it, as the reference code's `finetuned` mode does.
    Standalone with: rope_frequencies, yarn_frequencies."""
    if not (original_len and original_len > 0):
        raise ValueError(f"dynamic YaRN needs original_len > 0, the length the model was trained at, "
                         f"got {original_len}")
    rope_frequencies(dim, base, factor)  # checks dim, base and s
    return yarn_frequencies(dim, base, max(factor, (length or 0) / original_len), original_len)


# name -> scaling: one signature, so a caller chooses a scaling from a string without knowing which
# arguments it reads.
SCALINGS = {"none": rope_frequencies, "pi": pi_frequencies, "ntk": ntk_frequencies,
             "dynamic_ntk": dynamic_ntk_frequencies, "yarn": yarn_frequencies,
             "dynamic_yarn": dynamic_yarn_frequencies}
DYNAMIC = ("dynamic_ntk", "dynamic_yarn")  # the scalings that read the current length


def scaling_frequencies(name: str, dim: int, base: float, factor: float = 1.0,
                        original_len: int | None = None, length: int = 0) -> tuple[torch.Tensor, float]:
    """Look a scaling up by name and call it (the scaling checks its own arguments)."""
    if name not in SCALINGS:
        raise ValueError(f"unknown rope scaling '{name}'; choose from {', '.join(SCALINGS)}")
    return SCALINGS[name](dim, base, factor, original_len, length)


# ---------------------------------------------------------------------------------------------------------
# 2. Applying rotations
# ---------------------------------------------------------------------------------------------------------


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, attention_scale: float = 1.0,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of p * theta_i for positions of shape (T,) or (B, T): returns two (..., T, dim) tensors.

    The phase is computed in float64: in float32, p * theta_0 at p = 1e6 is off by ~0.03 rad, enough to move
    attention at long context. YaRN's attention scale multiplies both cos and sin, so logits grow by scale^2."""
    phase = positions.to(torch.float64)[..., None] * inv_freq.to(torch.float64)  # (..., T, dim/2)
    phase = torch.cat((phase, phase), dim=-1)  # (..., T, dim): pair i is (i, i + dim/2)
    return (phase.cos() * attention_scale).to(dtype), (phase.sin() * attention_scale).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) pairwise in the half-split layout: pair i is (x[i], x[i + D/2]).

    This is the layout of Hugging Face Llama-family checkpoints, so their weights need no permutation.
    cos/sin are (T, D) or (B, T, D); a per-row position set gets a head axis here."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D)
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


# ---------------------------------------------------------------------------------------------------------
# 3. Position ids
#
# A model is trained on short sequences; what it sees of "length" is only the position ids. Every sampler takes
# (batch, length, max_position, generator) and returns a LongTensor (batch, length) of sorted, distinct ids in
# [0, max_position), so the relative order of tokens is always kept.
# ---------------------------------------------------------------------------------------------------------


def contiguous_positions(batch: int, length: int, max_position: int | None = None,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """0, 1, ..., length - 1 for every row: what a model sees at inference (max_position is not needed)."""
    return torch.arange(length).expand(batch, length)


def randomized_positions(batch: int, length: int, max_position: int,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """Randomized positions (arXiv 2305.16843): each row a uniform random sorted subset of [0, max_position).

    For example, batch 1, length 4, max_position 16 may give tensor([[2, 5, 6, 13]]).
    Two exact methods. With max_position <= 4 * length, rank random keys over the whole range. Otherwise draw
    integers and redraw duplicates until none remain: the procedure treats every id alike, so every subset is
    equally likely, and it costs O(length), not O(max_position) (64 x 4096 ids out of 1e6 in milliseconds)."""
    if max_position < length:
        raise ValueError(f"max_position {max_position} is below the sequence length {length}: "
                         "positions must be distinct")
    if max_position > 2 ** 53:
        raise ValueError(f"max_position {max_position:.4g} is above 2^53: ids beyond it are not exact numbers")
    if max_position <= 4 * length:
        keys = torch.rand(batch, max_position, generator=generator)
        return keys.argsort(dim=1)[:, :length].sort(dim=1).values
    ids = torch.randint(0, max_position, (batch, length), generator=generator)
    while True:
        ids = ids.sort(dim=1).values
        dup = torch.zeros_like(ids, dtype=torch.bool)
        dup[:, 1:] = ids[:, 1:] == ids[:, :-1]
        if not dup.any():
            return ids
        ids[dup] = torch.randint(0, max_position, (int(dup.sum()),), generator=generator)


def stretch_positions(batch: int, length: int, max_position: int,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniform stretch ("virtual length"): ids floor(t * V / L) with V ~ U[L, max_position] per row.

    Example: L 4, V 10 -> [0, 2, 5, 7]. Spacing is even within a row; only the row's span is random."""
    if max_position < length:
        raise ValueError(f"max_position {max_position} is below the sequence length {length}: "
                         "positions must be distinct")
    if max_position > 2 ** 53:
        raise ValueError(f"max_position {max_position:.4g} is above 2^53: ids beyond it are not exact numbers")
    virtual = length + torch.rand(batch, 1, generator=generator, dtype=torch.float64) * (max_position - length)
    return (torch.arange(length, dtype=torch.float64) * virtual / length).floor().long()


def pose_positions(batch: int, length: int, max_position: int,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """PoSE (arXiv 2309.10400), two chunks: ids 0..c-1, then c+u .. L-1+u with a random skip u.

    Example: L 6, cut c 2, skip 7 -> [0, 1, 9, 10, 11, 12]. Both chunks stay contiguous, so local order looks
    exactly as at inference, while the skip exposes relative distances up to max_position - 1."""
    if max_position < length:
        raise ValueError(f"max_position {max_position} is below the sequence length {length}: "
                         "positions must be distinct")
    if max_position > 2 ** 53:
        raise ValueError(f"max_position {max_position:.4g} is above 2^53: ids beyond it are not exact numbers")
    cut = torch.randint(1, max(length, 2), (batch, 1), generator=generator)
    skip = torch.randint(0, max_position - length + 1, (batch, 1), generator=generator)
    t = torch.arange(length).expand(batch, length)
    return torch.where(t < cut, t, t + skip)


POSITION_SAMPLERS = {"contiguous": contiguous_positions, "randomized": randomized_positions,
                     "stretch": stretch_positions, "pose": pose_positions}


class LengthCurriculum:
    """The range positions are drawn from, widened during training: curriculum(step) -> max_position.

    Randomized YaRN (arXiv 2606.23687) grows it from the training length to a larger range, so the model
    meets far-away positions only after it has learned the task nearby. The curriculum a secondary summary of
    it reports, for data under 8K tokens: 8K -> 10K -> 12K -> 16K -> 16K, five equal stages at 0, 1/4, 1/2, 1
    and 1 of the way from start to end, so the last two fifths hold the top ("paper-r"). "linear" grows
    evenly, "step" climbs `stages` equal stairs, the last at `end`, "cosine" slowly at both ends. Every shape
    equals start at step 0 and end from `steps` on. (A shape is how the range grows; a rotary "scaling" above
    is something else.)"""

    SHAPES = ("paper-r", "linear", "step", "cosine")
    PAPER_R_STAGES = (0.0, 0.25, 0.5, 1.0, 1.0)  # 8K, 10K, 12K, 16K, 16K as fractions of the way 8K -> 16K

    def __init__(self, start: int, end: int, steps: int, shape: str = "linear", stages: int = 4):
        if shape not in self.SHAPES:
            raise ValueError(f"unknown curriculum shape '{shape}'; choose from {', '.join(self.SHAPES)}")
        if not 0 < start <= end:
            raise ValueError(f"curriculum needs 0 < start <= end, got {start}:{end}")
        if steps < 1 or stages < 2:
            raise ValueError(f"curriculum needs steps >= 1 and stages >= 2, got {steps} and {stages}")
        self.start, self.end, self.steps, self.shape, self.stages = start, end, steps, shape, stages

    def __call__(self, step: int) -> int:
        t = min(max(step / self.steps, 0.0), 1.0)
        if self.shape == "paper-r":
            stages = self.PAPER_R_STAGES
            t = stages[min(int(t * len(stages)), len(stages) - 1)]
        elif self.shape == "step":
            t = min(1.0, math.floor(t * self.stages) / (self.stages - 1))
        elif self.shape == "cosine":
            t = (1 - math.cos(math.pi * t)) / 2
        return int(round(self.start + (self.end - self.start) * t))


# ---------------------------------------------------------------------------------------------------------
# 4. Positional encodings, grouped by where they act
#
# Each encoding answers three questions, and acts in exactly one place:
#   embed(positions)         -> (B|1, T, dim) added to the token embeddings, or None    (NoPE, learned, sinusoidal)
#   rotary(positions)        -> (cos, sin) that rotate q and k, or None                     (RoPE, any scaling)
#                               or (cos_q, sin_q, cos_k, sin_k) when q and k differ          (xPos)
#   bias(q_pos, k_pos)       -> (B|1, H, Tq, Tk) added to the attention logits, or None     (ALiBi, T5, KERPLE, FIRE)
# and a bias encoding also writes its formula per logit, as flex attention's score_mod:
#   score_mod(positions)     -> f(score, b, h, i, j) = score + bias of head h, query i, key j, batch row b
# with positions (B, T), one row per batch row; (T,) or (B, T) elsewhere. Each bias is one function of d = i - j
# (alibi_bias, t5_bucket, kerple_bias, fire_input), called by bias() on a grid and by score_mod on one logit's 0-d
# tensors (T5's and KERPLE's on a table of the bias by distance, read once a logit), so the two agree by
# construction. The GPT computes embed and rotary once per forward for all layers; a bias is built a block of
# queries at a time (section 5) or in a compiled kernel (section 8), never all T x T at once.
# ---------------------------------------------------------------------------------------------------------


class PositionalEncoding(nn.Module):
    """The common interface. `acts_on` names the one place an encoding acts: "input", "qk", "logits" or None."""

    acts_on: str | None = None

    def embed(self, positions: torch.Tensor) -> torch.Tensor | None:
        return None

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        return None

    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        return None

    def score_mod(self, positions: torch.Tensor):
        """bias() one logit at a time, for flex attention; positions (B, T) long. Equal to bias() in value."""
        return None

    def after_step(self) -> None:
        """Called by the trainer after each optimizer step: where an encoding keeps its parameters in range."""


class NoPE(PositionalEncoding):
    """No position signal at all (arXiv 2203.16634). A causal decoder can still count, since its mask breaks
    the symmetry between tokens: that is why NoPE is a real contender on distance tasks."""


class LearnedAbsolute(PositionalEncoding):
    """A learned table of max_len vectors added to the input (GPT-2). Rows never reached in training get no
    gradient and stay as initialised (N(0, 0.02)); the trainer keeps them out of weight decay."""

    acts_on = "input"

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.table = nn.Embedding(max_len, dim)
        nn.init.normal_(self.table.weight, std=0.02)

    def embed(self, positions):
        if int(positions.max()) >= self.table.num_embeddings:
            raise ValueError(f"position {int(positions.max())} is beyond the learned table of "
                             f"{self.table.num_embeddings} rows (raise max_len)")
        return self.table(positions if positions.dim() == 2 else positions[None])


class Sinusoidal(PositionalEncoding):
    """Fixed sinusoids added to the input (arXiv 1706.03762): sin/cos of p * 10000^(-2i/d), d = dim."""

    acts_on = "input"

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("inv_freq", rope_frequencies(dim, 10000.0)[0], persistent=False)

    def embed(self, positions):
        phase = (positions if positions.dim() == 2 else positions[None]).double()[..., None] * self.inv_freq.double()
        return torch.cat((phase.sin(), phase.cos()), dim=-1).float()  # (B|1, T, dim)


class Rotary(PositionalEncoding):
    """RoPE with any scaling: rotates q and k so that <R_m q, R_n k> = <q, R_(n-m) k> (arXiv 2104.09864).

    The logit then depends on n - m alone: shifting every position by the same amount changes nothing.
    dynamic_ntk and dynamic_yarn recompute their frequencies from the largest position in each call."""

    acts_on = "qk"

    def __init__(self, head_dim: int, base: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                 original_len: int | None = None):
        super().__init__()
        self.head_dim, self.base, self.scaling = head_dim, base, scaling
        self.factor, self.original_len = factor, original_len
        inv_freq, self.attention_scale = scaling_frequencies(scaling, head_dim, base, factor, original_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache = None  # (positions, (cos, sin)) of the last call

    def rotary(self, positions):
        # cos/sin depend only on the position set: reuse them while it repeats (contiguous training, evaluation)
        cached = self._cache
        if cached is not None and cached[0].shape == positions.shape and cached[0].device == positions.device \
                and torch.equal(cached[0], positions):
            return cached[1]
        inv_freq, scale = self.inv_freq, self.attention_scale
        if self.scaling in DYNAMIC:
            inv_freq, scale = SCALINGS[self.scaling](self.head_dim, self.base, self.factor, self.original_len,
                                                     int(positions.max()) + 1)
        cos_sin = rotary_cos_sin(positions, inv_freq.to(positions.device), scale)
        self._cache = (positions.clone(), cos_sin)
        return cos_sin


class XPos(Rotary):
    """xPos (arXiv 2212.10554): RoPE that also shrinks the logit with the offset, a per-pair exponential decay.

    Pair i scales q at position n by zeta_i^(n/B) and k at position m by zeta_i^(-m/B), so their dot product
    gains zeta_i^((n - m)/B): a factor of the offset alone, below 1 for n > m. zeta_i = (2i/D + gamma) /
    (1 + gamma) with gamma 0.4 and B 512: the fast pairs decay most (head dim 32: zeta_0 = 0.286, zeta_15 =
    0.955; at offset 256, zeta_0^(1/2) = 0.53). Only n - m matters, so the scales are taken about the middle of
    each row's positions, which keeps them near 1 (at 16K tokens, zeta_0^(+-16) = 2e-9 .. 5e8, inside float32).
    Beyond a span of 56,463 positions they would leave float32 (q * scale overflows): refused (max_span)."""

    def __init__(self, head_dim: int, base: float = 10000.0, gamma: float = 0.4, scale_base: float = 512.0):
        super().__init__(head_dim, base)
        zeta = (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim + gamma) / (1 + gamma)
        self.register_buffer("zeta", zeta, persistent=False)
        self.scale_base = scale_base
        # The widest span of positions in a row whose scales stay below 1e30 in float32 (whose limit is 3e38,
        # and q and k multiply them): zeta_0^(-span / 2B) = 1e30, span = 56,463 for gamma 0.4 and B 512.
        self.max_span = int(2 * scale_base * math.log(1e30) / -math.log(float(zeta[0])))

    def rotary(self, positions):
        cos, sin = super().rotary(positions)
        span = int((positions.amax(-1) - positions.amin(-1)).max()) if positions.numel() else 0
        if span > self.max_span:
            raise ValueError(f"xPos: positions spanning {span} overflow float32 (its scales reach zeta^(span/2B); "
                             f"at most {self.max_span} here)")
        centred = positions.double() - (positions.amax(-1, keepdim=True) + positions.amin(-1, keepdim=True)) / 2
        scale = self.zeta.to(positions.device) ** (centred[..., None] / self.scale_base)  # (..., T, D/2)
        scale = torch.cat((scale, scale), dim=-1).to(cos.dtype)  # (..., T, D) in the half-split layout
        return cos * scale, sin * scale, cos / scale, sin / scale


def distances(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """(B|1, Tq, Tk) float distances i - j from each query position i to each key position j."""
    distance = (q_positions[..., :, None] - k_positions[..., None, :]).float()
    return distance if distance.dim() == 3 else distance[None]


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi slopes (arXiv 2108.12409): 2^(-8h/H) for h = 1..H when H is a power of two; otherwise the
    reference rule: the slopes of the largest power of two below H, then every other slope of twice that."""
    def power_of_two(n):
        return [2 ** (-8 * h / n) for h in range(1, n + 1)]

    if math.log2(heads).is_integer():
        return torch.tensor(power_of_two(heads))
    closest = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_two(closest) + power_of_two(2 * closest)[0::2][: heads - closest])


def alibi_bias(distance: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """ALiBi (arXiv 2108.12409): -m_h * d at distance d = i - j, for head slopes m_h (alibi_slopes) broadcast
    against d; a key ahead (d < 0) counts as d = 0. Head 0 of 4 (m = 1/4) at d = 5: -1.25."""
    return -slopes * distance.clamp(min=0)


class ALiBi(PositionalEncoding):
    """A linear penalty on the logits: head h adds alibi_bias(i - j, m_h) = -m_h * (i - j), query i, key j.
    Standalone with: PositionalEncoding, distances, alibi_slopes, alibi_bias."""

    acts_on = "logits"

    def __init__(self, heads: int, slope_heads: int | None = None):
        """slope_heads: take the slopes the paper gives that many heads, evenly spaced over these: ALiBi(2, 8) has
        1/2 and 1/32, the 1st and 5th of 1/2, 1/4, ..., 1/256. The paper's rule for 2 heads, 1/16 and 1/256, is
        nearly flat over a short window; its experiments use 8 heads or more. Default: heads (the paper's rule)."""
        super().__init__()
        slope_heads = slope_heads or heads
        if slope_heads % heads:
            raise ValueError(f"ALiBi: the slopes of {slope_heads} heads do not space evenly over {heads} heads "
                             "(give a multiple of the head count)")
        self.register_buffer("slopes", alibi_slopes(slope_heads)[::slope_heads // heads], persistent=False)

    def bias(self, q_positions, k_positions):  # (B|1, H, Tq, Tk)
        return alibi_bias(distances(q_positions, k_positions)[:, None], self.slopes[:, None, None])

    def score_mod(self, positions):
        return lambda score, b, h, i, j: score + alibi_bias(positions[b, i] - positions[b, j], self.slopes[h])


def t5_bucket(distance: torch.Tensor, buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bucket of the distance d = i - j (arXiv 1910.10683), elementwise; the bias is table[bucket, head].

    All B buckets are for d >= 0 (a decoder never looks ahead; d < 0 counts as 0). Short distances get one
    bucket each and longer ones share log-spaced buckets up to max_distance, beyond which all share the last:
        bucket(d) = d                                                                 for d < B/2
                  = min(B - 1, B/2 + floor(ln(2d / B) / ln(2 max_distance / B) * B/2))  otherwise
    Worked example, B 32, max_distance 128: d 15 -> 15, 16 -> 16, 20 -> 17, 32 -> 21, 64 -> 26, 127 and 1000 -> 31."""
    distance, exact = distance.clamp(min=0).long(), buckets // 2
    log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = (exact + log_ratio * (buckets - exact)).long().clamp(max=buckets - 1)
    return torch.where(distance < exact, distance, far)


class T5Bias(PositionalEncoding):
    """T5's relative bias (arXiv 1910.10683): a learned scalar per head for each bucket of the distance i - j
    (t5_bucket). The table starts at zero: an untrained model attends as NoPE does.
    Standalone with: PositionalEncoding, distances, t5_bucket."""

    acts_on = "logits"

    def __init__(self, heads: int, buckets: int = 32, max_distance: int = 128):
        super().__init__()
        if max_distance <= buckets // 2:
            raise ValueError(f"T5 bias: max_distance {max_distance} must exceed buckets / 2 = {buckets // 2}, "
                             "where the log-spaced buckets start")
        self.buckets, self.max_distance = buckets, max_distance
        self.table = nn.Parameter(torch.zeros(buckets, heads))

    def bias(self, q_positions, k_positions):
        bucket = t5_bucket(distances(q_positions, k_positions), self.buckets, self.max_distance)
        return self.table[bucket].movedim(-1, -3)  # (B|1, Tq, Tk, H) -> (B|1, H, Tq, Tk)

    def score_mod(self, positions):  # the bias at distances 0..top (max_distance): every farther one shares the last
        top = self.max_distance
        per_distance = self.table[t5_bucket(torch.arange(top + 1, device=positions.device), self.buckets, top)]
        return lambda score, b, h, i, j: score + per_distance[(positions[b, i] - positions[b, j]).clamp(0, top), h]


def kerple_bias(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """KERPLE's logarithmic kernel (arXiv 2205.09921): -r1_h * ln(1 + r2_h * d) at distance d = i - j, the
    per-head rates broadcast against d; a key ahead (d < 0) counts as d = 0. r1 2, r2 1, d e - 1: -2."""
    return -r1 * torch.log1p(r2 * distance.clamp(min=0))


class KerpleLog(PositionalEncoding):
    """KERPLE, logarithmic (arXiv 2205.09921): head h adds kerple_bias(i - j) = -r1_h ln(1 + r2_h (i - j)), r1, r2 > 0.

    Like ALiBi a penalty that grows with the distance (ALiBi is its limit r2 -> 0 with r1 r2 = m), but only
    logarithmically, so far keys stay reachable; both rates are learned. As in the paper's code, r1 and r2 start
    uniform in (0, 2) and (0, 1) and never go below 0.01. That code clamps the stored values in place before each
    forward (a rate pushed under 0.01 is reset to it and keeps learning); here the trainer does so after each
    optimizer step (after_step), leaving the forward a pure function of the weights (an in-place edit of a
    parameter inside it is what torch.compile and FSDP would have to special-case). The forward clamps too, so
    weights from anywhere act within range; on trained weights that clamp changes nothing.
    Standalone with: PositionalEncoding, distances, kerple_bias."""

    acts_on = "logits"

    def __init__(self, heads: int, floor: float = 1e-2):
        super().__init__()
        self.r1, self.r2, self.floor = nn.Parameter(2 * torch.rand(heads)), nn.Parameter(torch.rand(heads)), floor

    def bias(self, q_positions, k_positions):  # (B|1, H, Tq, Tk)
        r1, r2 = (r.clamp(min=self.floor)[:, None, None] for r in (self.r1, self.r2))  # (H, 1, 1)
        return kerple_bias(distances(q_positions, k_positions)[:, None], r1, r2)

    def score_mod(self, positions):  # the bias at every distance a row's ids hold, one table lookup a logit
        r1, r2 = self.r1.clamp(min=self.floor), self.r2.clamp(min=self.floor)
        top = int((positions.amax(-1) - positions.amin(-1)).max())  # the widest row's span, not across rows
        per_distance = kerple_bias(torch.arange(top + 1, device=positions.device)[:, None].to(r2.dtype), r1, r2)
        return lambda score, b, h, i, j: score + per_distance[(positions[b, i] - positions[b, j]).clamp(0, top), h]

    @torch.no_grad()
    def after_step(self):
        self.r1.clamp_(min=self.floor)
        self.r2.clamp_(min=self.floor)


def fire_input(distance: torch.Tensor, query: torch.Tensor, c: torch.Tensor, threshold=None) -> torch.Tensor:
    """What FIRE's learned f reads (arXiv 2310.04418): psi(d) / psi(max(L, i)), psi(x) = ln(c x + 1), at distance
    d = i - j (d < 0 counts as 0) from a query at position i, broadcast; threshold L None: psi(d) alone.
    c 0.1, L 512: a key 100 before the query at 1000 reads ln 11 / ln 101 = 0.52."""
    x = torch.log1p(c * distance.clamp(min=0))
    return x if threshold is None else x / torch.log1p(c * torch.maximum(query.float(), threshold))


class FIRE(PositionalEncoding):
    """FIRE (arXiv 2310.04418): a learned function of the distance, as a fraction of the query's position.

        bias(i, j) = f(psi(i - j) / psi(max(L, i))),   psi(x) = ln(c x + 1),   f: an MLP 1 -> 32 -> H (ReLU)
    A query past the threshold L sees every key's distance as a fraction in [0, 1] of its own position, so a
    longer input asks f only for values it met in training ("progressive interpolation"); below L, the
    distance counts as such. c (from 0.1) and L are learned, L as a multiple of its initial value, as in the
    paper's code; that code starts L at 512, here it starts at the training length when the config has one,
    so that the normalisation is in play at this scale. Dividing by psi(i) makes FIRE depend on the absolute
    query position: unlike the other biases it is not shift-invariant, by design (normalise=False makes it so).
    bias() and score_mod share fire_input (the psi ratio), not f: bias() runs the MLP module, score_mod unrolls
    it one hidden unit at a time (a compiled score_mod holds no vectors); tests/test_flex.py checks they agree.
    Standalone with: PositionalEncoding, distances, fire_input."""

    acts_on = "logits"

    def __init__(self, heads: int, width: int = 32, c: float = 0.1, threshold: float = 512.0, normalise: bool = True):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, heads))
        self.c, self.threshold_scale = nn.Parameter(torch.tensor(c)), nn.Parameter(torch.tensor(1.0))
        self.register_buffer("threshold", torch.tensor(threshold), persistent=False)
        self.normalise = normalise

    def bias(self, q_positions, k_positions):
        threshold = (self.threshold_scale * self.threshold).abs() if self.normalise else None
        x = fire_input(distances(q_positions, k_positions), q_positions[..., :, None], self.c.abs(), threshold)
        # f is applied a slab of query rows at a time: its hidden layer is `width` numbers per (query, key)
        rows = max(1, 2 ** 22 // (x.shape[0] * x.shape[2] * self.mlp[0].out_features))
        return torch.cat([self.mlp(x[:, i:i + rows, :, None]) for i in range(0, x.shape[1], rows)],
                         dim=1).movedim(-1, -3)  # (B|1, Tq, Tk, H) -> (B|1, H, Tq, Tk)

    def score_mod(self, positions):
        c, threshold = self.c.abs(), (self.threshold_scale * self.threshold).abs() if self.normalise else None
        (w1, b1), (w2, b2) = (self.mlp[0].weight[:, 0], self.mlp[0].bias), (self.mlp[2].weight, self.mlp[2].bias)

        def fire(score, b, h, i, j):
            x = fire_input(positions[b, i] - positions[b, j], positions[b, i], c, threshold)
            f = b2[h]
            for unit in range(w1.shape[0]):  # f's hidden layer one unit at a time: a kernel has no vectors here
                f = f + w2[h, unit] * torch.relu(w1[unit] * x + b1[unit])
            return score + f
        return fire


# name -> encoding class (the command line's --encoding); make_encoding builds one for a GPTConfig
ENCODINGS = {"nope": NoPE, "learned": LearnedAbsolute, "sinusoidal": Sinusoidal, "rope": Rotary, "xpos": XPos,
             "alibi": ALiBi, "t5": T5Bias, "kerple": KerpleLog, "fire": FIRE}
BIASES = tuple(name for name, cls in ENCODINGS.items() if cls.acts_on == "logits")  # alibi, t5, kerple, fire


def make_encoding(config: "GPTConfig") -> PositionalEncoding:
    """The one place a GPTConfig becomes an encoding: each class itself takes plain numbers, so that it can be
    copied into a project that has no GPTConfig."""
    head_dim = config.dim // config.heads
    return {
        "nope": lambda: NoPE(), "learned": lambda: LearnedAbsolute(config.max_len, config.dim),
        "sinusoidal": lambda: Sinusoidal(config.dim),
        "rope": lambda: Rotary(head_dim, config.rope_base, config.scaling, config.factor, config.original_len),
        "xpos": lambda: XPos(head_dim, config.rope_base), "t5": lambda: T5Bias(config.heads),
        "alibi": lambda: ALiBi(config.heads, config.alibi_slope_heads), "kerple": lambda: KerpleLog(config.heads),
        # FIRE's threshold L starts at the training length (see FIRE); the paper's code starts it at 512
        "fire": lambda: FIRE(config.heads, threshold=float(config.original_len or 512)),
    }[config.encoding]()


# ---------------------------------------------------------------------------------------------------------
# 5. Attention: plain softmax, query blocks, linear attention
#
# All three take q, k, v (B, H, T, D) and are causal. First the definition, softmax(q k^T / sqrt(D) + bias), every
# logit written out; then the same as a forward runs it: torch's fused causal kernel without a bias (it never builds
# the logits), with a bias blocks of queries that see the keys up to their last query, fewer as T grows so that a
# block's scores stay near 4M numbers (memory ~linear); last, linear attention, the control. Faster paths for a
# bias (ALiBi through the fused kernel, flex attention): section 8.
# ---------------------------------------------------------------------------------------------------------


def attention_with_weights(q, k, v, bias_fn=None, positions=None):
    """softmax(q k^T / sqrt(D) + bias) v under the causal mask, also returning the logits and the weights
    (B, H, T, T): the definition the other paths must equal, and the GPT's analysis path (return_attention).
    bias_fn(q_pos, k_pos) -> (B|1, H, T, T), as an encoding's bias. Quadratic in memory: for short sequences."""
    T = q.shape[2]
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    if bias_fn is not None:
        logits = logits + bias_fn(positions, positions)
    logits = logits.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    weights = logits.softmax(dim=-1)
    return weights @ v, logits, weights


def _causal_mask(start: int, stop: int, device) -> torch.Tensor:
    """(stop - start, stop) booleans: query start + i may see key j iff j <= start + i."""
    return torch.arange(stop, device=device)[None, :] <= torch.arange(start, stop, device=device)[:, None]


def query_blocks(q: torch.Tensor, query_block: int):
    """(start, stop) of each block of queries: at most query_block, and at most ~2^22 scores per block."""
    B, H, T, _ = q.shape
    block = min(query_block, max(16, 2 ** 22 // (B * H * T)))
    return [(start, min(start + block, T)) for start in range(0, T, block)]


def softmax_attention(q, k, v, bias_fn=None, positions=None, query_block: int = 1024) -> torch.Tensor:
    """attention_with_weights' output through torch's scaled_dot_product_attention: one fused causal call
    without a bias; with one, bias_fn(q_pos, k_pos) added as a float mask, block by block. Returns (B, H, T, D)."""
    if bias_fn is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = []
    for start, stop in query_blocks(q, query_block):
        mask = bias_fn(positions[..., start:stop], positions[..., :stop]).to(q.dtype)
        mask = mask.masked_fill(~_causal_mask(start, stop, q.device), float("-inf"))
        out.append(F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], attn_mask=mask))
    return torch.cat(out, dim=2)


def linear_attention(q, k, v, normalised: bool = False, query_block: int = 1024) -> torch.Tensor:
    """Causal linear attention: out_i = sum_{j<=i} s_ij v_j, with no softmax.
    Unnormalised, s_ij = q_i . k_j / sqrt(D): the control of arXiv 2607.18759, where a longer input simply adds
    more terms. Normalised (arXiv 2006.16236), s_ij = phi(q_i) . phi(k_j) with phi = elu + 1 >= 0, and the
    output is divided by sum_j s_ij."""
    if normalised:
        q, k = F.elu(q) + 1, F.elu(k) + 1
    scale = 1.0 if normalised else 1.0 / math.sqrt(q.shape[-1])
    out = []
    for start, stop in query_blocks(q, query_block):
        scores = (q[:, :, start:stop] @ k[:, :, :stop].transpose(-2, -1)) * scale  # (B, H, Tq, stop)
        scores = scores * _causal_mask(start, stop, q.device)
        block = scores @ v[:, :, :stop]
        if normalised:
            block = block / (scores.sum(dim=-1, keepdim=True) + 1e-6)
        out.append(block)
    return torch.cat(out, dim=2)


# ---------------------------------------------------------------------------------------------------------
# 6. GPT
# ---------------------------------------------------------------------------------------------------------


@dataclass
class GPTConfig:
    vocab_size: int
    layers: int = 2
    heads: int = 2
    dim: int = 64
    no_mlp: bool = False                   # attention-only blocks
    encoding: str = "rope"                 # one of ENCODINGS
    rope_base: float = 10000.0
    alibi_slope_heads: int | None = None   # ALiBi: the slopes the paper gives this many heads, spaced over these
    scaling: str = "none"                  # a key of SCALINGS (RoPE only)
    factor: float = 1.0                    # the scaling factor s
    original_len: int | None = None    # the length L the scaling stretches (YaRN, dynamic NTK and YaRN)
    attention: str = "softmax"             # "softmax" | "linear"
    linear_normalised: bool = False        # linear attention: divide by the sum of (positive) scores
    max_len: int = 1024                    # rows of a learned table: the longest position ever evaluated
    dropout: float = 0.0
    query_block: int = 1024                # at most this many queries per attention block

    def __post_init__(self):
        choose = {"encoding": ENCODINGS, "scaling": tuple(SCALINGS), "attention": ("softmax", "linear")}
        for field, options in choose.items():
            if getattr(self, field) not in options:
                raise ValueError(f"unknown {field} '{getattr(self, field)}'; choose from {', '.join(options)}")
        if min(self.layers, self.heads, self.dim, self.max_len, self.query_block) < 1:
            raise ValueError("layers, heads, dim, max_len and query_block must all be >= 1")
        if self.encoding == "sinusoidal" and self.dim % 2:
            raise ValueError(f"sinusoidal encodings pair sin and cos: dim {self.dim} must be even")
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not divisible by heads {self.heads}")
        if self.factor < 1:
            raise ValueError(f"scaling factor must be >= 1, got {self.factor}")
        if self.scaling != "none" and self.encoding != "rope":
            raise ValueError(f"scaling '{self.scaling}' rescales rotary frequencies; it needs encoding 'rope'")
        if self.encoding in ("rope", "xpos") and (self.dim // self.heads) % 2:
            raise ValueError(f"{self.encoding} rotates pairs: head dim {self.dim // self.heads} must be even")
        if self.attention == "linear" and ENCODINGS[self.encoding].acts_on == "logits":
            raise ValueError(f"{self.encoding} adds a bias inside softmax; with linear attention it would add a "
                             "score of its own instead of reweighting the keys")
        if self.attention == "linear" and self.linear_normalised and self.encoding in ("rope", "xpos"):
            raise ValueError("normalised linear attention needs non-negative scores; rotating phi(q), phi(k) "
                             "breaks that")


@dataclass(frozen=True)
class PositionInfo:
    """What attention needs of a forward's positions, built once in GPT.forward and shared by every layer."""
    ids: torch.Tensor | None = None               # (T,) or (B, T)
    rope: tuple[torch.Tensor, ...] | None = None  # (cos, sin) for q and k, or xPos's (cos_q, sin_q, cos_k, sin_k)
    bias: Callable | None = None                  # bias(q_pos, k_pos) -> (B|1, H, Tq, Tk): a logit bias
    score_mod: Callable | None = None             # the bias as flex attention's score_mod: this forward takes flex
    alibi: tuple | None = None                    # (slopes, blocks) from attention_path: ALiBi's fused path


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config, self.heads = config, config.heads
        self.qkv = nn.Linear(config.dim, 3 * config.dim, bias=False)
        self.proj = nn.Linear(config.dim, config.dim, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, pos: PositionInfo = PositionInfo(), return_attention=False):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        if pos.rope is not None:
            q, k = apply_rotary(q, *pos.rope[:2]), apply_rotary(k, *pos.rope[-2:])
        cfg, analysis = self.config, None
        if cfg.attention == "linear":
            y = linear_attention(q, k, v, cfg.linear_normalised, cfg.query_block)
        elif return_attention:
            y, logits, weights = attention_with_weights(q, k, v, pos.bias, pos.ids)
            analysis = {"logits": logits, "weights": weights}
        elif pos.alibi is not None:
            y = alibi_attention(q, k, v, pos.alibi[0], pos.ids, pos.alibi[1])
        elif pos.score_mod is not None:
            y = flex_softmax_attention(q, k, v, pos.score_mod)
        else:
            y = softmax_attention(q, k, v, pos.bias, pos.ids, cfg.query_block)
        y = self.dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)))
        return y, analysis


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) unless attention-only."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(config.dim), CausalSelfAttention(config)
        self.mlp = None
        if not config.no_mlp:
            self.ln2 = nn.LayerNorm(config.dim)
            self.mlp = nn.Sequential(nn.Linear(config.dim, 4 * config.dim), nn.GELU(),
                                     nn.Linear(4 * config.dim, config.dim), nn.Dropout(config.dropout))

    def forward(self, x, pos: PositionInfo = PositionInfo(), return_attention=False):
        y, analysis = self.attn(self.ln1(x), pos, return_attention)
        x = x + y
        if self.mlp is not None:
            x = x + self.mlp(self.ln2(x))
        return x, analysis


class GPT(nn.Module):
    """A decoder-only transformer whose position signal comes from `positions`, not from the token index.

    forward(idx (B, T), positions (T,) or (B, T) = 0..T-1) -> logits (B, T, vocab). Randomized training and
    contiguous inference are the same call with different positions. return_attention=True also returns, per
    layer, {"logits", "weights"} (B, H, T, T) of softmax attention (None for linear attention)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab_size, config.dim)
        self.pos = make_encoding(config)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab_size, bias=False)
        for name, p in self.named_parameters():  # an encoding initialises its own parameters
            if p.dim() == 2 and not name.startswith("pos."):
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, return_attention: bool = False):
        B, T = idx.shape
        positions = torch.arange(T, device=idx.device) if positions is None else positions.to(idx.device)
        if positions.shape[-1] != T:
            raise ValueError(f"positions have length {positions.shape[-1]}, the input has {T} tokens")
        x = self.tok(idx)  # (B, T, C)
        added = self.pos.embed(positions)
        if added is not None:
            x = x + added.to(x.dtype)
        x = self.drop(x)
        bias = self.pos.bias if self.pos.acts_on == "logits" else None
        score_mod = alibi = None  # a bias's speed paths (section 8), unless return_attention writes out every logit
        if bias is not None and not return_attention:
            path = self._attention_path(T, positions)
            score_mod = self.pos.score_mod(positions.expand(B, T)) if path.name == "flex" else None
            alibi = path.alibi
        pos = PositionInfo(positions, self.pos.rotary(positions), bias, score_mod, alibi)  # rotary: once, every layer
        layers = []
        for block in self.blocks:
            x, analysis = block(x, pos, return_attention)
            layers.append(analysis)
        logits = self.head(self.ln_f(x))
        return (logits, layers) if return_attention else logits

    def attention_path(self, length: int, positions: torch.Tensor | None = None) -> tuple[str, str]:
        """("fused" | "flex" | "blocks" | "linear", why) for a forward of `length` tokens (at `positions`, default
        0..length-1) here and now."""
        return self._attention_path(length, positions)[:2]

    def _attention_path(self, length: int, positions: torch.Tensor | None) -> AttentionPath:
        """attention_path with what the forward hands that path (fused ALiBi's slopes and blocks)."""
        if self.config.attention == "linear":
            return AttentionPath("linear", "linear attention")
        return attention_path(self.pos, length, self.head.weight.device, torch.is_grad_enabled(),
                              self.config.dim // self.config.heads, positions, self.head.weight.dtype)


# ---------------------------------------------------------------------------------------------------------
# 7. Hugging Face bridge
# ---------------------------------------------------------------------------------------------------------


def patch_hf_rope(model: nn.Module, inv_freq: torch.Tensor, attention_scale: float) -> int:
    """Point every rotary module of a Hugging Face Llama-family model (Llama, Qwen2, Mistral, SmolLM...) at a
    lengen scaling. Returns how many modules were patched.

        inv_freq, scale = lengen.yarn_frequencies(64, 1e5, factor=4, original_len=8192)
        lengen.patch_hf_rope(model, inv_freq, scale)
        model(input_ids, position_ids=lengen.randomized_positions(1, n, 32768))

    Those modules hold `inv_freq` and `attention_scaling` and compute cos/sin from the position_ids passed to
    the model's forward, so setting the two is all it takes. rope_type becomes "default" so that no dynamic
    update overwrites the patch."""
    patched = 0
    for module in model.modules():
        if not isinstance(getattr(module, "inv_freq", None), torch.Tensor):
            continue
        if module.inv_freq.shape != inv_freq.shape:
            raise ValueError(f"{type(module).__name__} has {module.inv_freq.numel()} frequencies, the scaling "
                             f"{inv_freq.numel()}: build it with the model's head dim")
        new = inv_freq.to(device=module.inv_freq.device, dtype=torch.float32)
        module.inv_freq = new.clone()
        if hasattr(module, "original_inv_freq"):
            module.original_inv_freq = new.clone()
        module.attention_scaling = float(attention_scale)
        module.rope_type = "default"
        patched += 1
    if not patched:
        raise ValueError(f"{type(model).__name__} has no rotary module with an inv_freq buffer to patch")
    return patched


# ---------------------------------------------------------------------------------------------------------
# 8. Speed paths
#
# Last because nothing above needs them to be understood (the GPT looks these up only when it calls them): each
# computes what softmax_attention computes with a bias (section 5), without building a logit. ALiBi goes through
# torch's fused kernel, its bias as one more head dimension, in training and evaluation; the other biases go
# through flex attention, their score_mod (section 4) in one compiled kernel, for long evaluations.
# attention_path, at the end, says which path a forward takes and why, and hands the GPT what that path needs.
# ---------------------------------------------------------------------------------------------------------


# ALiBi through the fused kernel. Its logit is q_i.k_j / sqrt(D) - m (p_i - p_j), and for any reference r
#     q_i.k_j / sqrt(D) - m (p_i - p_j) = [q_i, sqrt(D)] . [k_j, m (p_j - r)] / sqrt(D)  -  m (p_i - r),
# where the last term is the same for every key of query i, so softmax ignores it: the bias is one more head
# dimension, and torch's fused kernel runs ALiBi at any position ids, with its backward, never building a logit.
# float32 keeps a logit to ~6e-8 of its size, so r is the middle of a block of queries spanning at most
# ALIBI_SPAN / m_max positions: a key that matters (near its query) carries |m (p_j - r)| of about ALIBI_SPAN / 2
# at most, and the output stays within ~4e-6 of every logit written out (tests/test_alibi_fused.py). Ids so
# sparse that blocks would hold under ALIBI_MIN_BLOCK queries on average keep softmax_attention's bias blocks (or
# flex), and attention_path says so.
ALIBI_SPAN, ALIBI_MIN_BLOCK = 64.0, 16


def alibi_blocks(positions: torch.Tensor, top_slope: float, span: float = ALIBI_SPAN) -> list[tuple[int, int]] | None:
    """(start, stop) blocks of queries, each within span / top_slope positions of its first query in every row
    of positions (T,) or (B, T); None when they would hold fewer than ALIBI_MIN_BLOCK queries on average."""
    rows = positions.reshape(-1, positions.shape[-1]).contiguous()
    T, blocks, start = rows.shape[-1], [], 0
    while start < T and len(blocks) <= T // ALIBI_MIN_BLOCK:
        reach = rows[:, start:start + 1] + span / top_slope
        stop = max(start + 1, int(torch.searchsorted(rows, reach, right=True).min()))
        blocks.append((start, stop))
        start = stop
    return blocks if start == T else None


# CPU's flash kernel also returns each query's log-sum-exp (a private aten op; None where torch lacks it). With
# it, a later block needs no float mask: see alibi_attention.
_FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _merges_by_lse(device, grad_enabled: bool) -> bool:
    """Whether alibi_attention runs its later blocks as two flash calls merged (_before_and_within): on CPU,
    where torch has the kernel, and without gradients (autograd does not flow through the log-sum-exp)."""
    return not grad_enabled and torch.device(device).type == "cpu" and _FLASH_WITH_LSE is not None


def _before_and_within(q, k, v, start: int, scale: float) -> torch.Tensor:
    """A block of queries whose first one sits at key index `start`, against keys k[:, :, :start + len(q)]: the
    keys before the block, all visible, and the block's own, a square causal corner. One flash call each, no
    mask; each output o is normalised over its own keys, and its log-sum-exp l is that normaliser's log. Merged:
    softmax over both sets = (e^l1 o1 + e^l2 o2) / (e^l1 + e^l2) = o2 + sigmoid(l1 - l2) (o1 - o2)."""
    o1, l1 = _FLASH_WITH_LSE(q, k[:, :, :start], v[:, :, :start], 0.0, False, scale=scale)
    o2, l2 = _FLASH_WITH_LSE(q, k[:, :, start:], v[:, :, start:], 0.0, True, scale=scale)
    return o2 + torch.sigmoid(l1 - l2).to(o1.dtype)[..., None] * (o1 - o2)


def alibi_attention(q, k, v, slopes: torch.Tensor, positions: torch.Tensor, blocks) -> torch.Tensor:
    """ALiBi's softmax attention (alibi_bias added to the logits) through scaled_dot_product_attention, with the
    bias as one more head dimension (derived above); blocks from alibi_blocks. v gets a zero column, since the
    fused kernels want one head size for q, k and v. Block 0 is plain causal; a later block's queries see every
    key up to their own: without gradients on CPU, two unmasked calls merged (_before_and_within); otherwise
    one call with a corner of one float mask (the log-sum-exp has no gradient). Returns (B, H, T, D)."""
    B, H, T, D = q.shape
    q = torch.cat((q, q.new_full((B, H, T, 1), math.sqrt(D))), dim=-1)
    v = torch.cat((v, v.new_zeros(B, H, T, 1)), dim=-1)
    keys = None if torch.is_grad_enabled() else torch.cat((k, k.new_empty(B, H, T, 1)), dim=-1)  # see below
    merge = _merges_by_lse(q.device, torch.is_grad_enabled())
    positions = positions.reshape(-1, 1, T)  # (B|1, 1, T)
    scale, corner, out = 1 / math.sqrt(D), None, []
    for start, stop in blocks:
        middle = (positions[..., start:start + 1] + positions[..., stop - 1:stop]) // 2  # r
        offset = (slopes[:, None] * (positions[..., :stop] - middle)).to(k.dtype)  # (B|1, H, stop)
        if keys is None:  # autograd keeps every block's keys: a copy each
            key = torch.cat((k[:, :, :stop], offset.expand(B, H, stop)[..., None]), dim=-1)
        else:  # no gradients: one copy of the keys, its last column rewritten for each block
            key = keys[:, :, :stop]
            key[..., D] = offset
        if start == 0:
            block = F.scaled_dot_product_attention(q[:, :, :stop], key, v[:, :, :stop], is_causal=True, scale=scale)
        elif merge:
            block = _before_and_within(q[:, :, start:stop], key, v[:, :, :stop], start, scale)
        else:
            if corner is None:  # the last `rows` queries against all T keys, causal: each block reads a corner
                rows = max(b - a for a, b in blocks)
                corner = torch.zeros(rows, T, dtype=q.dtype, device=q.device).masked_fill(
                    ~_causal_mask(T - rows, T, q.device), float("-inf"))
            mask = corner[corner.shape[0] - (stop - start):, T - stop:]
            block = F.scaled_dot_product_attention(q[:, :, start:stop], key, v[:, :, :stop], attn_mask=mask,
                                                   scale=scale)
        out.append(block[..., :D])
    return torch.cat(out, dim=2)


# Flex attention: a logit bias in one compiled kernel, for a forward with a bias, no gradients and a long input.
FLEX_BLOCK = 128  # flex attention's tile: the causal mask skips tiles above the diagonal, needs none below
# Tokens from which a forward with a bias and no gradients takes flex (one model's own: model.pos.flex_from).
# Measured by `eval.py --bench` (docs/speed.md): flex is faster for every bias from 4096, so one number serves all.
FLEX_FROM = 4096


@functools.lru_cache(maxsize=16)  # every layer of a forward asks for the same one
def causal_block_mask(length: int, device) -> "BlockMask":
    """The causal mask as flex attention's BlockMask, written from its tiles (create_block_mask would evaluate
    the mask at all T x T pairs): query tile r sees key tiles 0..r-1 whole, and tile r through the mask."""
    tiles = -(-length // FLEX_BLOCK)
    r = torch.arange(tiles, device=device, dtype=torch.int32)
    full = torch.where(r[None, :] < r[:, None], r[None, :], 0)  # (tiles, tiles): row r lists 0..r-1, then pads
    diagonal = torch.where(r[None, :] == 0, r[:, None], 0)       # row r lists r, then pads
    return BlockMask.from_kv_blocks(torch.ones_like(r)[None, None], diagonal[None, None], r[None, None],
                                    full[None, None], FLEX_BLOCK, lambda b, h, i, j: i >= j, (length, length))


@functools.cache
def compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)


def flex_softmax_attention(q, k, v, score_mod) -> torch.Tensor:
    """Causal softmax attention with a score_mod, in one compiled kernel. Returns (B, H, T, D).
    Each encoding and shape compiles once. Past torch's default of 8 compiles per function, torch would run
    flex attention uncompiled, which builds every logit (17 GB at 32K tokens and 4 heads): hence the limit."""
    with torch._dynamo.config.patch(cache_size_limit=64):  # the limit's name in every torch with flex attention
        return compiled_flex_attention()(q, k, v, score_mod=score_mod,
                                         block_mask=causal_block_mask(q.shape[2], q.device))


@functools.cache
def flex_unavailable(device_type: str) -> str | None:
    """Why compiled flex attention cannot run on this kind of device (None: it can). Tried once per process on
    a tiny input, so that a missing C++ compiler or Triton, or a torch too old for some part of the call, shows
    here and not in the middle of an evaluation."""
    if flex_attention is None:
        return f"torch {torch.__version__} has no flex attention"
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1" or torch._dynamo.config.disable:  # torch.compile is a no-op
        return "torch.compile is switched off (TORCHDYNAMO_DISABLE): flex attention would build every logit"
    x = torch.zeros(1, 1, FLEX_BLOCK + 1, 16, device=device_type)
    try:
        with torch.no_grad():
            flex_softmax_attention(x, x, x, lambda score, b, h, i, j: score - (i - j))
    except Exception as error:  # no compiler, no Triton, a CPU without AVX2: whatever it is, not here
        first_line = str(error).partition("\n")[0][:90]
        return f"flex attention does not compile here: {type(error).__name__}: {first_line}"
    return None


class AttentionPath(NamedTuple):
    """Which path a forward's attention takes, why, and what the forward hands that path beyond q, k and v."""
    name: str                   # "fused" | "flex" | "blocks" | "linear"
    why: str
    alibi: tuple | None = None  # fused ALiBi: (slopes, blocks of queries), what alibi_attention takes


def attention_path(encoding: "PositionalEncoding", length: int, device, grad_enabled: bool,
                   head_dim: int = 16, positions: torch.Tensor | None = None,
                   dtype: torch.dtype = torch.float32) -> AttentionPath:
    """How softmax attention runs a forward of `length` tokens at `positions` (default 0..length-1) in a model of
    `dtype`, and why:
    "fused" (torch's SDPA: no bias, or ALiBi's as one more head dimension), "flex" (the encoding's score_mod,
    compiled) or "blocks" (the bias built a block of queries at a time). Flex is for long evaluations. Training
    stays on blocks: compiled flex attention runs inference only on CPU, and a training run meets many short
    lengths, each of which would compile (~10-20 s) to save milliseconds."""
    if encoding.acts_on != "logits":
        return AttentionPath("fused", "no bias")
    if isinstance(encoding, ALiBi):
        blocks, why_not = fused_alibi_blocks(encoding, length, device, positions, dtype)
        if blocks is not None:
            return AttentionPath("fused", "ALiBi's bias as one more head dimension (alibi_attention); blocks after "
                                 "the first " + ("merged by log-sum-exp" if _merges_by_lse(device, grad_enabled)
                                                 else "with a float mask's corner"), (encoding.slopes, blocks))
        path, why = bias_path(encoding, length, device, grad_enabled, head_dim)
        return AttentionPath(path, f"{why_not}; {why}")
    return AttentionPath(*bias_path(encoding, length, device, grad_enabled, head_dim))


def bias_path(encoding: "PositionalEncoding", length: int, device, grad_enabled: bool, head_dim: int):
    """attention_path for a bias that does not go through the fused kernel: flex or blocks."""
    if grad_enabled:
        return "blocks", "gradients: compiled flex attention is inference-only on CPU, and a compile per shape"
    flex_from = getattr(encoding, "flex_from", FLEX_FROM)
    if length < flex_from:
        return "blocks", f"under {flex_from} tokens (FLEX_FROM), blocks are faster"
    if torch.device(device).type == "cuda" and head_dim < 16:
        return "blocks", f"head dim {head_dim}: flex attention's CUDA kernels need at least 16"
    why_not = flex_unavailable(torch.device(device).type)
    return ("blocks", why_not) if why_not else ("flex", "a bias, no gradients, a long input")


def fused_alibi_blocks(encoding: ALiBi, length: int, device, positions: torch.Tensor | None,
                       dtype: torch.dtype = torch.float32) -> tuple[list[tuple[int, int]] | None, str | None]:
    """(alibi_blocks, None) where ALiBi can take alibi_attention, else (None, why not): in a 16-bit model, or
    under autocast to one, the extra dimension would round the bias to ~1e-3 of ALIBI_SPAN; ids too sparse would
    need blocks of a few queries."""
    device_type = torch.device(device).type
    autocast = torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) != torch.float32
    if autocast or dtype not in (torch.float32, torch.float64):
        return None, "16 bits (the model's or autocast's): the bias would round in one more head dimension"
    positions = torch.arange(length) if positions is None else positions
    blocks = alibi_blocks(positions, float(encoding.slopes.max()))
    if blocks is None:
        return None, (f"ids too sparse: fused ALiBi would need blocks under {ALIBI_MIN_BLOCK} queries "
                      f"(ALIBI_SPAN {ALIBI_SPAN:g} / slope {float(encoding.slopes.max()):g} positions each)")
    return blocks, None


# ---------------------------------------------------------------------------------------------------------
# python lengen.py: a tour, drawn as text
# ---------------------------------------------------------------------------------------------------------


def tour() -> None:
    """YaRN's ramp over the rotary pairs of one small example, one randomized position draw, and ALiBi's bias at
    the positions drawn."""
    dim, base, factor, original_len = 16, 10000.0, 4.0, 2048
    theta, _ = rope_frequencies(dim, base)
    inv_freq, scale = yarn_frequencies(dim, base, factor, original_len)
    print(f"YaRN (section 1), dim {dim}, base {base:g}, factor {factor:g}, original length L {original_len}: a pair\n"
          f"making over 32 turns in L is kept, under 1 interpolated (its frequency / {factor:g}), ramped in between;\n"
          "w is the weight of the original frequency.\n"
          "pair  wavelength  turns in L  wavelength after     w")
    counts = {"kept": 0, "ramped": 0, "interpolated": 0}
    for i, (old, new) in enumerate(zip(theta.tolist(), inv_freq.tolist())):
        w = (new - old / factor) / (old - old / factor)
        what = "kept" if new == old else "interpolated" if new == old / factor else "ramped"
        counts[what] += 1
        print(f"{i:4d} {2 * math.pi / old:11.1f} {original_len * old / (2 * math.pi):11.2f} {2 * math.pi / new:17.1f}"
              f"  {w:4.2f} {'#' * round(10 * w):10s} {what}")
    print(", ".join(f"{what} {n}" for what, n in counts.items()) + f"; attention scale {scale:.4f}")

    length, max_position = 8, 32
    ids = randomized_positions(1, length, max_position, torch.Generator().manual_seed(0))[0]
    print(f"\nRandomized positions (section 3): {length} tokens at sorted distinct ids in [0, {max_position}): "
          f"{ids.tolist()}\n" + "".join("#" if p in ids.tolist() else "." for p in range(max_position)))

    alibi = ALiBi(4)
    print(f"\nALiBi (section 4) at those ids, head 0 of 4, slope m {float(alibi.slopes[0]):g}: the bias "
          "-m (p_i - p_j)\nof query p_i (rows) and key p_j (columns); keys ahead are masked (blank)")
    for i, row in enumerate(alibi.bias(ids, ids)[0, 0].tolist()):
        print(f"{int(ids[i]):3d} |" + "".join(f"{b + 0.0:7.2f}" for b in row[:i + 1]))  # + 0.0: no "-0.00"


if __name__ == "__main__":
    tour()
