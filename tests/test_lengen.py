"""lengen.py against slow references and worked numbers."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lengen as L


# --- 1. scalings ----------------------------------------------------------------------------------------

def yarn_range(dim, base, L_, beta):
    return dim * math.log(L_ / (2 * math.pi * beta)) / (2 * math.log(base))


@pytest.mark.parametrize("dim, base, L_, s, low, high, scale", [
    (128, 1e4, 4096, 16, 20, 46, 1.2773),   # worked by hand from the YaRN formulas (arXiv 2309.00071)
    (128, 1e6, 32768, 4, 23, 40, 1.1386),
])
def test_yarn_worked_numbers(dim, base, L_, s, low, high, scale):
    assert math.floor(yarn_range(dim, base, L_, 32)) == low
    assert math.ceil(yarn_range(dim, base, L_, 1)) == high
    inv_freq, a = L.yarn_frequencies(dim, base, s, L_)
    assert a == pytest.approx(scale, abs=1e-4)
    theta, _ = L.rope_frequencies(dim, base)
    i = torch.arange(dim // 2)
    # pairs below `low` keep theta exactly, pairs from `high` on are exactly theta / s, between is a ramp
    assert torch.equal(inv_freq[i <= low], theta[i <= low])
    assert torch.allclose(inv_freq[i >= high], theta[i >= high] / s, rtol=1e-6)
    between = (i > low) & (i < high)
    w = 1 - (i[between] - low).float() / (high - low)
    assert torch.allclose(inv_freq[between], theta[between] / s * (1 - w) + theta[between] * w, rtol=1e-6)
    assert torch.all(inv_freq <= theta * (1 + 1e-6)) and torch.all(inv_freq >= theta / s * (1 - 1e-6))
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (dim // 2,)


def test_yarn_no_truncate_and_factor_one():
    inv_freq, a = L.yarn_frequencies(64, 1e4, 1.0, 2048)
    assert a == 1.0 and torch.allclose(inv_freq, L.rope_frequencies(64, 1e4)[0])
    f_trunc, _ = L.yarn_frequencies(64, 1e4, 8, 2048, truncate=True)
    f_exact, _ = L.yarn_frequencies(64, 1e4, 8, 2048, truncate=False)
    assert not torch.equal(f_trunc, f_exact)


def test_rope_pi_ntk_formulas():
    dim, base = 16, 500.0
    theta, a = L.rope_frequencies(dim, base)
    assert a == 1.0
    assert torch.allclose(theta, torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)]))
    pi, _ = L.pi_frequencies(dim, base, 4.0)
    assert torch.allclose(pi, theta / 4)
    ntk, _ = L.ntk_frequencies(dim, base, 4.0)
    b2 = base * 4.0 ** (dim / (dim - 2))
    assert torch.allclose(ntk, torch.tensor([b2 ** (-2 * i / dim) for i in range(dim // 2)]))
    assert ntk[0] == theta[0] and ntk[-1] < theta[-1]  # NTK keeps the fastest pair, slows the rest


def test_dynamic_ntk_is_rope_up_to_original_length():
    theta, _ = L.rope_frequencies(32, 1e4)
    for n in (1, 100, 256):
        f, _ = L.dynamic_ntk_frequencies(32, 1e4, 4.0, 256, n)
        assert torch.equal(f, theta)
    longer, _ = L.dynamic_ntk_frequencies(32, 1e4, 4.0, 256, 1024)
    assert torch.all(longer[1:] < theta[1:])


def reference_dynamic_yarn(dim, base, original_len, length, finetuned_factor=1.0):
    """Dynamic YaRN written out from the YaRN reference code (jquesnelle/yarn,
    LlamaDynamicYaRNScaledRotaryEmbedding), in float64 and plain Python: plain RoPE with scale 1 until the input
    passes max(s, 1) * L positions; past it, YaRN with the factor n / L: pairs below `low` keep theta, pairs above
    `high` take theta / factor, a linear ramp over the pair index between; cos and sin multiplied by
    0.1 ln(factor) + 1."""
    theta = [base ** (-2 * i / dim) for i in range(dim // 2)]
    factor = max(finetuned_factor, length / original_len)
    if factor <= 1:
        return theta, 1.0
    turns_at = [dim * math.log(original_len / (2 * math.pi * r)) / (2 * math.log(base)) for r in (32, 1)]
    low, high = max(math.floor(turns_at[0]), 0), min(math.ceil(turns_at[1]), dim - 1)
    high = high + 0.001 if low == high else high
    out = []
    for i, t in enumerate(theta):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep theta, 1: interpolate
        out.append(t / factor * ramp + t * (1 - ramp))
    return out, 0.1 * math.log(factor) + 1.0


@pytest.mark.parametrize("dim, base, context", [(64, 1e5, 8192), (32, 1e4, 256), (16, 100.0, 32)])
@pytest.mark.parametrize("ratio", [0.25, 1.0, 1.0001, 1.5, 3.5, 16.0])
@pytest.mark.parametrize("factor", [1.0, 4.0])
def test_dynamic_yarn_equals_the_reference_formula(dim, base, context, ratio, factor):
    """Bug caught (each planted and watched failing): the factor fixed at s whatever the length (static YaRN),
    the factor n / L applied inside the original context too (below 1: a compression), and the ramp's
    boundaries taken from the current length n instead of the original L."""
    n = max(1, round(ratio * context))
    ours, scale = L.dynamic_yarn_frequencies(dim, base, factor, context, n)
    want, want_scale = reference_dynamic_yarn(dim, base, context, n, factor)
    assert torch.allclose(ours.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6)
    assert scale == pytest.approx(want_scale, rel=1e-12)
    if factor == 1.0 and n <= context:  # inside the pretrained context: plain RoPE, read as in pretraining
        assert torch.equal(ours, L.rope_frequencies(dim, base)[0]) and scale == 1.0


def test_scaling_registry_and_errors():
    assert set(L.SCALINGS) == {"none", "pi", "ntk", "dynamic_ntk", "yarn", "dynamic_yarn"}
    with pytest.raises(ValueError, match="unknown rope scaling"):
        L.scaling_frequencies("linear", 16, 1e4, 2.0)
    with pytest.raises(ValueError, match=">= 1"):
        L.scaling_frequencies("yarn", 16, 1e4, 0.5, 64)
    with pytest.raises(ValueError, match="original_len"):
        L.scaling_frequencies("yarn", 16, 1e4, 2.0)


# --- 2. rotations -----------------------------------------------------------------------------------------

def test_apply_rotary_equals_explicit_pair_rotations():
    torch.manual_seed(0)
    B, H, T, D = 2, 3, 5, 8
    x = torch.randn(B, H, T, D)
    pos = torch.tensor([0, 3, 7, 100, 2000])
    inv_freq, _ = L.rope_frequencies(D, 10000.0)
    out = L.apply_rotary(x, *L.rotary_cos_sin(pos, inv_freq))
    expected = torch.empty_like(x)
    for t in range(T):
        for i in range(D // 2):
            angle = float(pos[t]) * float(inv_freq[i])
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[..., t, i], x[..., t, i + D // 2]  # half-split pair (i, i + D/2)
            expected[..., t, i] = c * a - s * b
            expected[..., t, i + D // 2] = s * a + c * b
    assert torch.allclose(out, expected, atol=1e-5)


def test_rotation_logit_depends_on_offset_only():
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    inv_freq, _ = L.rope_frequencies(16, 10000.0)

    def logit(m, n):
        cq = L.rotary_cos_sin(torch.tensor([m]), inv_freq)
        ck = L.rotary_cos_sin(torch.tensor([n]), inv_freq)
        return float((L.apply_rotary(q, *cq) * L.apply_rotary(k, *ck)).sum())

    assert logit(5, 2) == pytest.approx(logit(1005, 1002), abs=1e-4)
    assert logit(5, 2) != pytest.approx(logit(5, 3), abs=1e-3)


def test_cos_sin_accurate_at_one_million():
    inv_freq, _ = L.rope_frequencies(64, 10000.0)
    pos = torch.tensor([1_000_000, 999_999])
    cos, sin = L.rotary_cos_sin(pos, inv_freq)
    phase = pos.double()[:, None] * inv_freq.double()[None]
    ref = torch.cat((phase, phase), -1)
    assert torch.allclose(cos.double(), ref.cos(), atol=1e-4)
    assert torch.allclose(sin.double(), ref.sin(), atol=1e-4)
    naive = (pos.float()[:, None] * inv_freq[None]).cos()  # float32 phase: what goes wrong without float64
    assert (naive.double() - ref[:, :32].cos()).abs().max() > 1e-3


def test_attention_scale_multiplies_cos_and_sin():
    inv_freq, a = L.yarn_frequencies(16, 1e4, 8.0, 64)
    cos, sin = L.rotary_cos_sin(torch.arange(10), inv_freq, a)
    assert torch.allclose(cos ** 2 + sin ** 2, torch.full_like(cos, a ** 2), atol=1e-5)


# --- 3. positions -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("M", [40, 64, 1000, 1_000_000])
def test_randomized_positions_sorted_distinct_in_range_reproducible(M):
    g = torch.Generator().manual_seed(3)
    p = L.randomized_positions(32, 16, M, g)
    assert p.dtype == torch.int64 and p.shape == (32, 16)
    assert torch.all(p[:, 1:] > p[:, :-1]) and p.min() >= 0 and p.max() < M
    again = L.randomized_positions(32, 16, M, torch.Generator().manual_seed(3))
    assert torch.equal(p, again)
    assert not torch.equal(p, L.randomized_positions(32, 16, M, torch.Generator().manual_seed(4)))


@pytest.mark.parametrize("M", [24, 200])  # both code paths: ranking keys, and redrawing duplicates
def test_randomized_positions_uniform(M):
    n, rows = 8, 20000
    p = L.randomized_positions(rows, n, M, torch.Generator().manual_seed(0))
    counts = torch.bincount(p.flatten(), minlength=M).double()
    expected = rows * n / M
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # M - 1 degrees of freedom; mean M - 1, sd sqrt(2(M - 1)): 5 sd is a generous, still-failing bound
    assert chi2 < (M - 1) + 5 * math.sqrt(2 * (M - 1))
    # uniform over subsets, not only over ids: the smallest id of a subset has P(min >= j) = C(M-j, n)/C(M, n)
    j = M // 4
    assert float((p[:, 0] >= j).double().mean()) == pytest.approx(math.comb(M - j, n) / math.comb(M, n), abs=0.02)


def test_randomized_positions_refuses_short_range():
    with pytest.raises(ValueError, match="below the sequence length"):
        L.randomized_positions(1, 10, 9)


def test_stretch_and_pose_positions():
    g = torch.Generator().manual_seed(0)
    s = L.stretch_positions(64, 10, 100, g)
    gaps = s[:, 1:] - s[:, :-1]
    assert torch.all(gaps >= 1) and s[:, 0].eq(0).all() and s.max() < 100
    assert s[:, -1].max() > 50  # rows reach far
    p = L.pose_positions(64, 10, 100, g)
    assert torch.all(p[:, 1:] > p[:, :-1]) and p[:, 0].eq(0).all() and p.max() < 100
    jumps = (p[:, 1:] - p[:, :-1] > 1).sum(1)
    assert torch.all(jumps <= 1) and jumps.sum() > 0  # two contiguous chunks, one skip between them


def test_pose_draws_reach_every_id_up_to_the_top():
    """Issue 53: PoSE's skip u is drawn from [0, max_position - L] inclusive, so the last chunk can end at
    max_position - 1, and its cut c from [1, L - 1], so every id below max_position is drawn. Bugs caught: a
    skip drawn from [0, max_position - L) (the top id never drawn: the range is one short of what it says), a
    cut that never leaves the first chunk one token long, or never L - 1."""
    length, top = 4, 10
    p = L.pose_positions(4000, length, top, torch.Generator().manual_seed(0))
    assert set(p.flatten().tolist()) == set(range(top))
    assert int(p[:, -1].max()) == top - 1  # the last chunk reaches the top id
    first_chunk = (p == torch.arange(length)).cumprod(1).sum(1)  # where the contiguous start ends: the cut
    cuts = set(first_chunk[first_chunk < length].tolist())  # a row with skip 0 shows no cut
    assert cuts == set(range(1, length))


@pytest.mark.parametrize("shape", ["paper-r", "linear", "step", "cosine"])
def test_curriculum(shape):
    c = L.LengthCurriculum(32, 256, 100, shape)
    values = [c(s) for s in range(0, 130)]
    assert values[0] == 32 and all(v == 256 for v in values[100:])
    assert all(b >= a for a, b in zip(values, values[1:]))
    assert len(set(values)) > 2


def test_curriculum_shapes_and_errors():
    assert L.LengthCurriculum(0 + 10, 50, 10, "linear")(5) == 30
    step = L.LengthCurriculum(10, 50, 100, "step", stages=4)  # 4 stairs, the last one at `end`
    assert [step(s) for s in (0, 24, 25, 50, 75, 99, 100)] == [10, 10, 23, 37, 50, 50, 50]
    assert L.LengthCurriculum(10, 50, 100, "cosine")(25) < 20  # slow start
    with pytest.raises(ValueError):
        L.LengthCurriculum(10, 50, 10, "exponential")
    with pytest.raises(ValueError):
        L.LengthCurriculum(60, 50, 10)


# --- 4. encodings -----------------------------------------------------------------------------------------

def test_alibi_slopes():
    assert torch.allclose(L.alibi_slopes(8), torch.tensor([2.0 ** -h for h in range(1, 9)]))
    # 6 heads: the 4-head slopes, then every other slope of the 8-head set
    assert torch.allclose(L.alibi_slopes(6), torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]))


def test_learned_table_guard():
    m = L.GPT(L.GPTConfig(vocab_size=8, encoding="learned", max_len=16))
    m(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="beyond the learned table"):
        m(torch.zeros(1, 17, dtype=torch.long))


def make(encoding, attention="softmax", **kw):
    torch.manual_seed(0)
    cfg = L.GPTConfig(vocab_size=12, layers=2, heads=2, dim=32, encoding=encoding, attention=attention,
                      max_len=2048, **kw)
    return L.GPT(cfg).eval()


@pytest.mark.parametrize("encoding, invariant", [
    ("rope", True), ("nope", True), ("alibi", True), ("xpos", True), ("t5", True), ("kerple", True),
    ("learned", False), ("sinusoidal", False)])
def test_shift_equivariance_of_whole_gpt(encoding, invariant):
    model = make(encoding)
    idx = torch.randint(0, 12, (2, 20), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(20)
    with torch.no_grad():
        diff = (model(idx, pos) - model(idx, pos + 1000)).abs().max()
    assert (diff < 1e-5) == invariant, float(diff)


def test_rope_equivariant_under_random_per_row_positions():
    model = make("rope", scaling="yarn", factor=4.0, original_len=64)
    idx = torch.randint(0, 12, (3, 16))
    pos = L.randomized_positions(3, 16, 256, torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(model(idx, pos), model(idx, pos + 777), atol=1e-5)


# --- 5. attention -----------------------------------------------------------------------------------------

def test_linear_attention_equals_loop_definition():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4) for _ in range(3))
    out = L.linear_attention(q, k, v, query_block=3)
    ref = torch.zeros_like(v)
    for i in range(7):
        for j in range(i + 1):
            ref[:, :, i] += (q[:, :, i] * k[:, :, j]).sum(-1, keepdim=True) / 2.0 * v[:, :, j]
    assert torch.allclose(out, ref, atol=1e-5)
    phi = lambda x: torch.nn.functional.elu(x) + 1  # noqa: E731
    norm = L.linear_attention(q, k, v, normalised=True, query_block=3)
    for i in (0, 4, 6):
        s = torch.stack([(phi(q[:, :, i]) * phi(k[:, :, j])).sum(-1) for j in range(i + 1)], -1)
        expected = (s[..., None] * v[:, :, : i + 1]).sum(-2) / s.sum(-1, keepdim=True)
        assert torch.allclose(norm[:, :, i], expected, atol=1e-4)


@pytest.mark.parametrize("with_bias", [False, True])
def test_blocked_softmax_equals_weights_path(with_bias):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 37, 8) for _ in range(3))
    pos = torch.arange(37)
    bias_fn = L.ALiBi(4).bias if with_bias else None
    blocked = L.softmax_attention(q, k, v, bias_fn, pos, query_block=8)
    full, logits, weights = L.attention_with_weights(q, k, v, bias_fn, pos)
    assert torch.allclose(blocked, full, atol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 37), atol=1e-5)
    assert torch.all(weights.triu(1) == 0)


@pytest.mark.parametrize("encoding", L.ENCODINGS)
def test_blocked_gpt_equals_unblocked_for_every_encoding(encoding):
    idx = torch.randint(0, 12, (2, 37), generator=torch.Generator().manual_seed(0))
    blocked = make(encoding, query_block=8)
    with torch.no_grad():
        explicit, _ = blocked(idx, return_attention=True)  # every logit written out, no blocks
        assert torch.allclose(blocked(idx), explicit, atol=1e-5)
    if L.ENCODINGS[encoding].acts_on != "logits":  # biases belong inside softmax; refused with linear
        linear_blocked, linear_whole = make(encoding, "linear", query_block=8), make(encoding, "linear")
        with torch.no_grad():
            assert torch.allclose(linear_blocked(idx), linear_whole(idx), atol=1e-5)


def test_query_blocks_bound_memory():
    q = torch.empty(1, 4, 32768, 1)
    blocks = L.query_blocks(q, 1024)
    assert blocks[0] == (0, 32) and blocks[-1][1] == 32768  # 4 heads x 32 queries x 32768 keys = 2^22 scores
    assert all(b[0] == a[1] for a, b in zip(blocks, blocks[1:]))
    assert L.query_blocks(torch.empty(1, 1, 100, 1), 8)[:2] == [(0, 8), (8, 16)]


COMBOS = [(e, "softmax") for e in L.ENCODINGS] + [(e, "linear") for e in ("nope", "learned", "sinusoidal", "rope", "xpos")]


@pytest.mark.parametrize("encoding, attention", COMBOS)
def test_causal(encoding, attention):
    model = make(encoding, attention, query_block=8)
    idx = torch.randint(0, 12, (2, 20), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 12
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :12], b[:, :12], atol=1e-5)
    assert not torch.allclose(a[:, 12:], b[:, 12:], atol=1e-3)


@pytest.mark.parametrize("encoding, attention", COMBOS)
def test_trains(encoding, attention):
    model = make(encoding, attention).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 12, (8, 12), generator=g)
    y = torch.roll(x, 1, dims=1)  # predict the previous token: needs position information or counting
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # it fits a batch it sees 40 times


def test_return_attention_gives_every_layer_and_head():
    model = make("alibi")
    idx = torch.randint(0, 12, (2, 9))
    with torch.no_grad():
        logits, layers = model(idx, return_attention=True)
        assert torch.allclose(logits, model(idx), atol=1e-5)  # the analysis path computes the same model
    assert len(layers) == 2 and layers[0]["weights"].shape == (2, 2, 9, 9)
    assert torch.allclose(layers[1]["weights"].sum(-1), torch.ones(2, 2, 9), atol=1e-5)


def test_nonsense_combinations_refused():
    for kw, reason in [
        (dict(encoding="sine"), "unknown encoding"),
        (dict(scaling="yarn", factor=4, original_len=64, encoding="alibi"), "needs encoding 'rope'"),
        (dict(attention="linear", encoding="alibi"), "bias inside softmax"),
        (dict(attention="linear", linear_normalised=True, encoding="rope"), "non-negative"),
        (dict(factor=0.5), ">= 1"),
        (dict(dim=30, heads=4), "divisible"),
        (dict(encoding="rope", scaling="yarn", factor=2.0), "original_len"),
        (dict(heads=0), ">= 1"),
        (dict(encoding="sinusoidal", dim=31, heads=1), "must be even"),
        (dict(encoding="rope", dim=4, heads=2, scaling="ntk", factor=2.0), "rotary dim > 2"),
        (dict(encoding="rope", rope_base=1.0), "base must be > 1"),
    ]:
        with pytest.raises(ValueError, match=reason):
            L.GPT(L.GPTConfig(vocab_size=8, **kw))


def test_learned_rows_never_reached_stay_as_initialised():
    model = make("learned")
    before = model.pos.table.weight.detach().clone()
    opt = torch.optim.AdamW([{"params": [model.pos.table.weight], "weight_decay": 0.0},
                             {"params": [p for n, p in model.named_parameters() if not n.startswith("pos.")]}],
                            lr=1e-2)
    for _ in range(5):
        loss = model(torch.randint(0, 12, (4, 24))).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = model.pos.table.weight.detach()
    assert not torch.equal(after[:24], before[:24])
    assert torch.equal(after[24:], before[24:])


# --- python lengen.py -------------------------------------------------------------------------------------

def test_python_lengen_prints_a_tour_of_what_the_functions_give():
    """`python lengen.py` draws YaRN's ramp per rotary pair (dim 16, base 1e4, s 4, L 2048), one randomized draw
    and ALiBi's bias at those ids. Bug caught: a tour that no longer runs, or whose pairs, counts, ids or biases
    drifted from the functions it shows."""
    out = subprocess.run([sys.executable, "lengen.py"], cwd=Path(__file__).parent.parent, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    theta, _ = L.rope_frequencies(16, 1e4)
    inv_freq, scale = L.yarn_frequencies(16, 1e4, 4.0, 2048)
    whats = ["kept" if new == old else "interpolated" if new == old / 4 else "ramped"
             for old, new in zip(theta.tolist(), inv_freq.tolist())]
    assert "dim 16, base 10000, factor 4, original length L 2048" in out
    rows = re.findall(r"^ +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) #* *(kept|ramped|interpolated)$", out, re.M)
    assert [row[-1] for row in rows] == whats and [int(row[0]) for row in rows] == list(range(8))
    for (_, wavelength, turns, after, w, _), old, new in zip(rows, theta.tolist(), inv_freq.tolist()):
        assert float(wavelength) == round(2 * math.pi / old, 1) and float(after) == round(2 * math.pi / new, 1)
        assert float(turns) == round(2048 / (2 * math.pi / old), 2)
        assert float(w) == pytest.approx((new - old / 4) / (old - old / 4), abs=0.005)  # weight of the original
    turns = [2048 * old / (2 * math.pi) for old in theta.tolist()]  # over 32 turns in L kept, under 1 interpolated
    counts = (sum(n > 32 for n in turns), 8 - sum(n > 32 or n < 1 for n in turns), sum(n < 1 for n in turns))
    assert counts == (whats.count("kept"), whats.count("ramped"), whats.count("interpolated")) == (3, 3, 2)
    assert "kept 3, ramped 3, interpolated 2; attention scale %.4f" % scale in out

    ids = L.randomized_positions(1, 8, 32, torch.Generator().manual_seed(0))[0].tolist()
    assert f"[0, 32): {ids}\n" + "".join("#" if p in ids else "." for p in range(32)) + "\n" in out

    grid = re.findall(r"^ *(\d+) \|(.*)$", out, re.M)
    assert [int(p) for p, _ in grid] == ids
    for i, (_, row) in enumerate(grid):  # -m (p_i - p_j), m = 1/4 for head 0 of 4, keys ahead blank
        assert [float(b) for b in row.split()] == [-(ids[i] - ids[j]) / 4 for j in range(i + 1)]
