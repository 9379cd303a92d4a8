"""Bias encodings through flex attention: each score_mod equals its bias, the compiled path equals the block
path, and attention_path chooses between them (and falls back) as lengen.py says.

The fast tests run flex attention uncompiled (it then builds every logit, which is fine at a few hundred tokens);
the slow ones compile it, as a long evaluation does.
"""
import pytest
import torch

import lengen as L

flex_attention = pytest.importorskip("torch.nn.attention.flex_attention").flex_attention

pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")

LENGTH = 300  # not a multiple of FLEX_BLOCK: the last tile is cut short


def uneven_positions(batch: int, length: int) -> torch.Tensor:
    """Randomized ids, different in every row, with gaps up to hundreds: what a randomized model evaluates on."""
    return L.randomized_positions(batch, length, 4 * length, generator=torch.Generator().manual_seed(1))


def trained_looking(encoding: str) -> L.GPT:
    """A model whose encoding's parameters are far from their initial values (T5's table starts at zero), with
    a KERPLE rate under its floor and a negative FIRE c (both read through a clamp or an abs). Head dim 16:
    the least flex attention's CUDA kernels take."""
    torch.manual_seed(0)
    model = L.GPT(L.GPTConfig(vocab_size=16, layers=2, heads=4, dim=64, encoding=encoding, original_len=64,
                              max_len=4 * LENGTH)).eval()
    with torch.no_grad():
        for p in model.pos.parameters():
            p.add_(torch.randn_like(p) * 0.5)
        if encoding == "kerple":
            model.pos.r2[0] = -0.5
        if encoding == "fire":
            model.pos.c.fill_(-0.1)
    return model


@pytest.mark.parametrize("encoding", L.BIASES)
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


def test_t5_with_its_own_buckets_and_the_settings_it_refuses():
    """T5's score_mod reads a table of max_distance + 1 distances: exact when every farther distance shares
    the last bucket, which holds when the log-spaced buckets start below max_distance; other settings are
    refused. Bug caught: a table cut at max_distance for settings where bucket(max_distance) is not the last."""
    t5 = L.T5Bias(heads=2, buckets=8, max_distance=20)
    with torch.no_grad():
        t5.table.copy_(torch.randn(8, 2))
    q, k, v = (torch.randn(1, 2, LENGTH, 8, generator=torch.Generator().manual_seed(s)) for s in range(3))
    positions = uneven_positions(1, LENGTH)
    flex = flex_attention(q, k, v, score_mod=t5.score_mod(positions), block_mask=L.causal_block_mask(LENGTH, "cpu"))
    assert (flex - L.softmax_attention(q, k, v, t5.bias, positions, query_block=64)).abs().max() < 1e-5
    with pytest.raises(ValueError, match="max_distance 16 must exceed buckets / 2 = 16"):
        L.T5Bias(heads=2, buckets=32, max_distance=16)


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
    """Bug caught: flex chosen with gradients on (CPU flex kernels have no backward), for a short input, for a
    CUDA head dim under 16, or where it cannot compile; a bias-free encoding sent anywhere but torch's fused
    kernel; linear attention reported as softmax; a threshold read from anywhere but the one constant, FLEX_FROM
    (or the one model's own `pos.flex_from` that the benchmarks and tests set), or a threshold moved from the 4096
    that `eval.py --bench` measured (docs/speed.md) without a new measurement."""
    monkeypatch.setattr(L, "flex_unavailable", lambda device_type: None)
    kerple, rope = L.KerpleLog(4), L.Rotary(8)
    assert L.attention_path(rope, 10 ** 5, "cpu", grad_enabled=False)[0] == "fused"
    assert L.FLEX_FROM == 4096  # measured: flex is faster for every bias from there (docs/speed.md)
    assert not any(hasattr(cls, "flex_from") for cls in L.ENCODINGS.values())  # the constant is the one place
    threshold = 4096
    sparse = torch.arange(threshold) * 1000
    for encoding in (L.ALiBi(4), L.T5Bias(4), kerple, L.FIRE(4)):  # ALiBi at ids too sparse for its fused path
        assert L.attention_path(encoding, threshold, "cpu", False, 16, sparse).name == "flex"
        taken, why, _ = L.attention_path(encoding, threshold - 1, "cpu", False, 16, sparse[1:])
        assert taken == "blocks" and f"under {threshold} tokens" in why and "FLEX_FROM" in why
    monkeypatch.setattr(L, "FLEX_FROM", 64)
    assert L.attention_path(kerple, 64, "cpu", grad_enabled=False)[0] == "flex"
    pinned = L.KerpleLog(4)
    pinned.flex_from = 65  # this encoding alone
    assert L.attention_path(pinned, 64, "cpu", grad_enabled=False)[0] == "blocks"
    assert L.attention_path(kerple, 64, "cpu", grad_enabled=False)[0] == "flex"
    assert L.attention_path(kerple, 10 ** 5, "cpu", grad_enabled=True)[0] == "blocks"
    assert L.attention_path(kerple, 10 ** 5, "cuda", grad_enabled=False, head_dim=8)[0] == "blocks"
    assert L.attention_path(kerple, 10 ** 5, "cuda", grad_enabled=False, head_dim=16)[0] == "flex"
    linear = L.GPT(L.GPTConfig(vocab_size=4, encoding="rope", attention="linear"))
    assert linear.attention_path(10 ** 5)[0] == "linear"
    monkeypatch.setattr(L, "flex_unavailable", lambda device_type: "no compiler")
    assert L.attention_path(kerple, 10 ** 5, "cpu", grad_enabled=False) == ("blocks", "no compiler", None)


def test_the_gpt_takes_flex_only_without_gradients_and_without_analysis(monkeypatch):
    """With flex attention made to fail, a long forward that needs gradients, or that returns every attention
    weight, still runs (blocks); one under no_grad reaches flex. Bug caught: the GPT deciding by model.training
    instead of grad mode (an eval-mode forward with gradients would meet a kernel with no backward), or taking
    flex with return_attention=True (which needs the weights flex never builds)."""
    def flex_called(*args):
        raise AssertionError("flex attention was called")

    monkeypatch.setattr(L, "flex_unavailable", lambda device_type: None)
    monkeypatch.setattr(L, "flex_softmax_attention", flex_called)
    monkeypatch.setattr(L, "FLEX_FROM", 64)
    model, idx = trained_looking("kerple"), torch.randint(0, 16, (1, 100))
    model(idx).sum().backward()  # eval mode, gradients on
    with torch.no_grad():
        model(idx, return_attention=True)
        with pytest.raises(AssertionError, match="flex attention was called"):
            model(idx)


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
        monkeypatch.setattr(L, "FLEX_FROM", 64)
        model, idx = trained_looking("kerple"), torch.randint(0, 16, (1, 100))
        with torch.no_grad():
            assert model.attention_path(100) == ("blocks", reason)
            model(idx)
            model(idx)
        assert len(calls) == 1  # tried once per process
    finally:
        L.flex_unavailable.cache_clear()


@pytest.mark.slow
@pytest.mark.parametrize("encoding", L.BIASES)
def test_compiled_flex_gpt_equals_the_block_path(encoding, monkeypatch):
    """The whole GPT, compiled flex attention against the block path, at uneven per-row positions and at the
    default (T,) positions shared by a batch of two; flex attention counted once per layer. Bug caught: the GPT
    handing the score_mod a (T,) row for a batch of two, a block dropping the score_mod (the block path would
    run, unseen), or the compiled kernel disagreeing with the formula it was given."""
    if why_not := L.flex_unavailable("cpu"):
        pytest.skip(why_not)
    model, idx = trained_looking(encoding), torch.randint(0, 16, (2, LENGTH), generator=torch.Generator())
    calls, flex_attention_of_lengen = [], L.flex_softmax_attention
    monkeypatch.setattr(L, "flex_softmax_attention", lambda *args: calls.append(1) or flex_attention_of_lengen(*args))
    spread = 1000 if encoding == "alibi" else 1  # ALiBi takes flex only at ids too sparse for its fused path
    for positions in (uneven_positions(2, LENGTH) * spread, torch.arange(LENGTH) * spread if spread > 1 else None):
        with torch.no_grad():
            model.pos.flex_from = LENGTH
            flex = model(idx, positions)
            model.pos.flex_from = LENGTH + 1
            blocks = model(idx, positions)
        assert (flex - blocks).abs().max() < 1e-4
    assert len(calls) == 2 * model.config.layers


def test_flex_calls_may_compile_more_shapes_than_torchs_default(monkeypatch):
    """Every (encoding, shape) compiles once; torch's default limit of 8 compiles per function, once reached,
    runs flex attention uncompiled, building all T x T logits (17 GB at 32K tokens): an evaluation over many
    lengths and encodings in one process must not meet it. Bug caught: the limit left at torch's default."""
    seen = []
    monkeypatch.setattr(L, "compiled_flex_attention",
                        lambda: lambda *args, **kwargs: seen.append(torch._dynamo.config.recompile_limit))
    q, default = torch.zeros(1, 1, LENGTH, 8), torch._dynamo.config.recompile_limit
    L.flex_softmax_attention(q, q, q, None)
    assert seen == [64] and torch._dynamo.config.recompile_limit == default  # raised for the call alone


def test_torch_compile_switched_off_keeps_the_blocks(monkeypatch):
    """#35 item 12: under TORCHDYNAMO_DISABLE=1 (torch's debugging switch) torch.compile returns the function
    as it is, and flex attention uncompiled builds every logit (a T5 model at 8192 tokens: 10.9 GB instead of
    0.46). Bug caught: flex chosen because the compile 'succeeded' without compiling."""
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    L.flex_unavailable.cache_clear()
    try:
        reason = L.flex_unavailable("cpu")
        assert reason is not None and "TORCHDYNAMO_DISABLE" in reason
        assert L.attention_path(L.T5Bias(4), 8192, "cpu", grad_enabled=False) == ("blocks", reason, None)
    finally:
        L.flex_unavailable.cache_clear()
