"""Every lengen rotary schedule equals Hugging Face's own, at Llama-like geometries (skipped without transformers).

The geometries are real ones, where YaRN's ramp lies strictly inside the pairs, so that beta_fast and beta_slow
both decide frequencies (at a tiny geometry the fast boundary clamps to pair 0 and beta_fast is invisible).
"""
import math

import pytest
import torch

import lengen as L

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

# (head dim, rope base, original context L): SmolLM2-135M, and Llama 3's 8B geometry
GEOMETRIES = [(64, 1e5, 8192), (128, 5e5, 8192)]


def hf_config(dim, base, context, **rope):
    """A Llama config (no weights) with 2 heads of `dim` and the given rope settings, as HF's rope functions
    read it: the context L is max_position_embeddings, unless YaRN names an original one."""
    return transformers.LlamaConfig(hidden_size=2 * dim, num_attention_heads=2, head_dim=dim,
                                    max_position_embeddings=context, rope_parameters={"rope_theta": base, **rope})


def hf_frequencies(config, seq_len=None):
    """Hugging Face's (inv_freq, attention scale) for config's rope_type."""
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)


def yarn_boundaries(dim, base, context, beta):
    """The pair index where a pair makes `beta` turns within the original context (arXiv 2309.00071)."""
    return dim * math.log(context / (2 * math.pi * beta)) / (2 * math.log(base))


@pytest.mark.parametrize("dim, base, context", GEOMETRIES)
def test_plain_rope_equals_hf(dim, base, context):
    """Bug caught: RoPE's exponent off (e.g. base^(-i/dim) over every index, or 2i/(dim - 2))."""
    ours, scale = L.rope_frequencies(dim, base)
    theirs, their_scale = hf_frequencies(hf_config(dim, base, context, rope_type="default"))
    assert torch.allclose(ours, theirs, rtol=1e-6) and scale == their_scale == 1.0


@pytest.mark.parametrize("dim, base, context", GEOMETRIES)
def test_pi_equals_hf_linear(dim, base, context):
    """Bug caught: position interpolation multiplying the frequencies by s instead of dividing."""
    ours, scale = L.pi_frequencies(dim, base, 4.0)
    theirs, their_scale = hf_frequencies(hf_config(dim, base, context, rope_type="linear", factor=4.0))
    assert torch.allclose(ours, theirs, rtol=1e-6) and scale == their_scale


@pytest.mark.parametrize("dim, base, context", GEOMETRIES)
@pytest.mark.parametrize("length", ["half", "at", "one past", "3.5x"])
def test_dynamic_ntk_equals_hf_dynamic(dim, base, context, length):
    """Bug caught: dynamic NTK's base rescaled at every length (it must be plain RoPE up to L), or with the
    length ratio n/L misplaced, e.g. s^(dim/(dim-2)) regardless of n."""
    n = {"half": context // 2, "at": context, "one past": context + 1, "3.5x": 7 * context // 2}[length]
    ours, scale = L.dynamic_ntk_frequencies(dim, base, 4.0, context, n)
    theirs, their_scale = hf_frequencies(hf_config(dim, base, context, rope_type="dynamic", factor=4.0), seq_len=n)
    assert torch.allclose(ours, theirs, rtol=1e-6) and scale == their_scale
    plain, _ = L.rope_frequencies(dim, base)
    assert torch.equal(ours, plain) == (n <= context)


@pytest.mark.parametrize("dim, base, context", GEOMETRIES)
@pytest.mark.parametrize("length", ["half", "at", "one past", "3.5x", "16x"])
def test_dynamic_yarn_equals_hf_yarn_at_the_current_stretch(dim, base, context, length):
    """Bug caught: dynamic YaRN stretching inside the original context, or by a fixed factor at every length.

    Hugging Face has no dynamic YaRN (transformers 5.x: linear, dynamic NTK, yarn, longrope, llama3); at length
    n it must equal Hugging Face's YaRN with factor max(1, n / L), the original context L setting its ramp."""
    n = {"half": context // 2, "at": context, "one past": context + 1, "3.5x": 7 * context // 2,
         "16x": 16 * context}[length]
    ours, scale = L.dynamic_yarn_frequencies(dim, base, 1.0, context, n)
    stretch = max(1.0, n / context)
    theirs, their_scale = hf_frequencies(hf_config(dim, base, context, rope_type="yarn", factor=stretch,
                                                   original_max_position_embeddings=context))
    assert torch.allclose(ours, theirs, rtol=1e-6) and scale == pytest.approx(their_scale, rel=1e-6)


@pytest.mark.parametrize("dim, base, context", GEOMETRIES)
def test_ntk_equals_hf_dynamic_at_the_same_stretch(dim, base, context):
    """Bug caught: NTK-aware scaling with the wrong exponent (base * s instead of base * s^(dim/(dim-2))).

    Hugging Face has no static NTK-aware schedule; its dynamic one at length n is exactly the static one with
    s' = s n / L - (s - 1). With s = 2 at n = 2L that is s' = 3."""
    ours, scale = L.ntk_frequencies(dim, base, 3.0)
    theirs, their_scale = hf_frequencies(hf_config(dim, base, context, rope_type="dynamic", factor=2.0),
                                         seq_len=2 * context)
    assert torch.allclose(ours, theirs, rtol=1e-6) and scale == their_scale


@pytest.mark.parametrize("dim, base, context", GEOMETRIES)
@pytest.mark.parametrize("factor", [4.0, 16.0])
@pytest.mark.parametrize("beta_fast, beta_slow", [(32.0, 1.0), (16.0, 2.0)])
def test_yarn_equals_hf_with_interior_boundaries(dim, base, context, factor, beta_fast, beta_slow):
    """Bug caught: either YaRN boundary computed wrongly (beta_fast ignored, floor and ceil swapped, turns
    counted over the target length instead of the original one), the ramp running the wrong way, or the
    attention scale 0.1 ln s + 1 missing."""
    low = math.floor(yarn_boundaries(dim, base, context, beta_fast))
    high = math.ceil(yarn_boundaries(dim, base, context, beta_slow))
    assert 0 < low and high < dim // 2 - 1  # both boundaries interior: neither clamp hides a mistake
    ours, scale = L.yarn_frequencies(dim, base, factor, context, beta_fast=beta_fast, beta_slow=beta_slow)
    config = hf_config(dim, base, int(factor * context), rope_type="yarn", factor=factor,
                       original_max_position_embeddings=context, beta_fast=beta_fast, beta_slow=beta_slow)
    theirs, their_scale = hf_frequencies(config)
    assert torch.allclose(ours, theirs, rtol=1e-6)
    assert scale == pytest.approx(their_scale, rel=1e-12) and scale > 1
    # the boundaries are where the schedule changes: pairs up to low kept, from high on divided by s
    theta, _ = L.rope_frequencies(dim, base)
    assert torch.equal(ours[: low + 1], theta[: low + 1]) and not torch.equal(ours[: low + 2], theta[: low + 2])
    assert torch.allclose(ours[high:], theta[high:] / factor) and not torch.allclose(ours[high - 1], theta[high - 1] / factor)


def test_gpt_with_dynamic_ntk_rotates_as_hf_dynamic():
    """Bug caught: a GPT with dynamic NTK that sizes its frequencies from the number of tokens (or from L, or
    once at construction) rather than from the largest position id, as Hugging Face's dynamic rotary does.

    16 tokens at ids reaching 3.5 L: only the largest id tells the model how far the input stretches."""
    dim, base, context = 64, 1e4, 2048
    gpt = L.GPT(L.GPTConfig(vocab_size=8, layers=1, heads=2, dim=2 * dim, rope_base=base,
                            scaling="dynamic_ntk", factor=4.0, original_len=context))
    plain = L.GPT(L.GPTConfig(vocab_size=8, layers=1, heads=2, dim=2 * dim, rope_base=base))
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 2, 16, dim).unbind(0)  # (B, H, T, D)
    for top in (context, 7 * context // 2):  # inside the original context, then far beyond it
        positions = L.randomized_positions(1, 16, top, torch.Generator().manual_seed(top))
        positions[0, -1] = top - 1
        hf_rotary = LlamaRotaryEmbedding(hf_config(dim, base, context, rope_type="dynamic", factor=4.0))
        cos, sin = hf_rotary(q, positions)
        theirs = apply_rotary_pos_emb(q, k, cos, sin)
        ours = [L.apply_rotary(x, *gpt.pos.rotary(positions)) for x in (q, k)]
        unscaled = [L.apply_rotary(x, *plain.pos.rotary(positions)) for x in (q, k)]
        # Hugging Face computes the phase in float32 (up to ~5e-4 rad off at 7K); lengen in float64
        for a, b, c in zip(ours, theirs, unscaled):
            assert torch.allclose(a, b, atol=2e-3)
            assert (a - c).abs().max() > 0.1 if top > context else torch.equal(a, c)
