"""Bias encodings through flex attention: each score_mod equals its bias, the compiled path equals the block
path, and attention_path chooses between them (and falls back) as lengen.py says.

The fast tests run flex attention uncompiled (it then builds every logit, which is fine at a few hundred tokens);
the slow ones compile it, as a long evaluation does.
"""
import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

import lengen as L

pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")

BIASES = [name for name, cls in L.ENCODINGS.items() if cls.acts_on == "logits"]
LENGTH = 300  # not a multiple of FLEX_BLOCK: the last tile is cut short


def uneven_positions(batch: int, length: int) -> torch.Tensor:
    """Randomized ids, different in every row, with gaps up to hundreds: what a randomized model evaluates on."""
    return L.randomized_positions(batch, length, 4 * length, generator=torch.Generator().manual_seed(1))


def trained_looking(encoding: str, **config) -> L.GPT:
    """A model whose encoding's parameters are far from their initial values (T5's table starts at zero)."""
    torch.manual_seed(0)
    model = L.GPT(L.GPTConfig(vocab_size=16, layers=2, heads=4, dim=32, encoding=encoding, original_len=64,
                              max_len=4 * LENGTH, **config)).eval()
    with torch.no_grad():
        for p in model.pos.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return model


@pytest.mark.parametrize("encoding", BIASES)
def test_each_score_mod_equals_its_bias_at_uneven_per_row_positions(encoding):
    """Bug caught: a score_mod whose formula differs from bias() (a sign, a missing clamp or floor, T5's table
    cut short of its last bucket, FIRE's normalisation by the key's position instead of the query's), or one
    that reads batch row 0's positions for every row."""
    pos = trained_looking(encoding).pos
    q, k, v = (torch.randn(2, 4, LENGTH, 8, generator=torch.Generator().manual_seed(s)) for s in range(3))
    positions = uneven_positions(2, LENGTH)
    with torch.no_grad():
        flex = flex_attention(q, k, v, score_mod=pos.score_mod(positions),
                              block_mask=L.causal_block_mask(LENGTH, "cpu"))
        blocks = L.softmax_attention(q, k, v, pos.bias, positions, query_block=64)
    assert (flex - blocks).abs().max() < 1e-5


def test_the_causal_block_mask_is_the_causal_mask():
    """Query tile r computes key tiles 0..r, all whole but the diagonal one; and without a bias, flex attention
    with this mask equals torch's causal attention at a length that ends inside a tile. Bug caught: a tile
    marked whole that straddles the diagonal, the diagonal tile left out (each query would skip its nearest
    keys: uncompiled flex attention does not show it, since it applies the mask everywhere), a tile above it."""
    mask, tiles = L.causal_block_mask(LENGTH, "cpu"), -(-LENGTH // L.FLEX_BLOCK)
    assert torch.equal(mask.to_dense()[0, 0], torch.ones(tiles, tiles, dtype=torch.int32).tril())
    assert mask.full_kv_num_blocks[0, 0].tolist() == list(range(tiles))  # whole: every tile left of the diagonal
    q, k, v = (torch.randn(1, 2, LENGTH, 8, generator=torch.Generator().manual_seed(s)) for s in range(3))
    flex = flex_attention(q, k, v, block_mask=L.causal_block_mask(LENGTH, "cpu"))
    assert (flex - torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max() < 1e-5


def test_attention_path_says_which_path_and_why(monkeypatch):
    """Bug caught: flex chosen for a training step (CPU flex kernels have no backward), for a short input, or
    where it cannot compile; a bias-free encoding sent anywhere but torch's fused kernel."""
    monkeypatch.setattr(L, "flex_unavailable", lambda device_type: None)
    alibi, rope = L.ALiBi(4), L.Rotary(8)
    assert L.attention_path(rope, 10 ** 5, "cpu", training=False)[0] == "fused"
    assert L.attention_path(alibi, L.FLEX_MIN_LEN, "cpu", training=False)[0] == "flex"
    assert L.attention_path(alibi, L.FLEX_MIN_LEN - 1, "cpu", training=False)[0] == "blocks"
    assert L.attention_path(alibi, 10 ** 5, "cpu", training=True)[0] == "blocks"
    monkeypatch.setattr(L, "flex_unavailable", lambda device_type: "no compiler")
    assert L.attention_path(alibi, 10 ** 5, "cpu", training=False) == ("blocks", "no compiler")


def test_a_failed_compile_becomes_a_reason_and_the_forward_falls_back(monkeypatch):
    """Where flex attention cannot compile (here: a compiler that raises), flex_unavailable returns one line
    saying why, and a long forward takes the block path. Bug caught: the compile error escaping into the
    evaluation, or the failure not remembered (a compile tried, and failing, in every forward)."""
    calls = []

    def broken_compile(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("C++ compile error\nmore detail")

    monkeypatch.setattr(L, "compiled_flex_attention", lambda: broken_compile)
    L.flex_unavailable.cache_clear()
    try:
        reason = L.flex_unavailable("cpu")
        assert reason.startswith("flex attention does not compile here: RuntimeError: C++ compile error")
        assert "\n" not in reason
        monkeypatch.setattr(L, "FLEX_MIN_LEN", 64)
        model, idx = trained_looking("alibi"), torch.randint(0, 16, (1, 100))
        with torch.no_grad():
            assert model.attention_path(100) == ("blocks", reason)
            model(idx)
            model(idx)
        assert len(calls) == 1  # tried once per process
    finally:
        L.flex_unavailable.cache_clear()


@pytest.mark.slow
@pytest.mark.parametrize("encoding", BIASES)
def test_compiled_flex_gpt_equals_the_block_path(encoding, monkeypatch):
    """The whole GPT, compiled flex attention against the block path, at uneven per-row positions, 2 layers.
    Bug caught: the GPT handing the score_mod positions of the wrong shape (a (T,) row for a batch of two),
    or the compiled kernel disagreeing with the formula it was given."""
    if why_not := L.flex_unavailable("cpu"):
        pytest.skip(why_not)
    model, idx = trained_looking(encoding), torch.randint(0, 16, (2, LENGTH), generator=torch.Generator())
    positions = uneven_positions(2, LENGTH)
    with torch.no_grad():
        monkeypatch.setattr(L, "FLEX_MIN_LEN", LENGTH)
        assert model.attention_path(LENGTH)[0] == "flex"
        flex = model(idx, positions)
        monkeypatch.setattr(L, "FLEX_MIN_LEN", LENGTH + 1)
        assert model.attention_path(LENGTH)[0] == "blocks"
        blocks = model(idx, positions)
    assert (flex - blocks).abs().max() < 1e-4
