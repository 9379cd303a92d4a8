"""Position ids reach the model, and change its output exactly as each encoding's formula says.

The shift tests in test_lengen.py cannot see an encoding that ignores the ids it is given: RoPE or ALiBi
computed from 0..T-1 is just as shift-invariant. Here a one-layer GPT is written out by hand, in float64, from
its own weights and the formulas of the papers, and compared with the GPT's forward at ids that are no shift of
0..T-1, so only an encoding that uses exactly those ids can match it.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import lengen as L

# Two rows with different, uneven ids (per-row positions, as randomized training feeds them), reaching past the
# original length 16 that the scalings below stretch.
POSITIONS = torch.tensor([[0, 3, 4, 9, 17, 18, 40, 41], [2, 5, 11, 12, 30, 31, 33, 60]])
TOKENS = torch.tensor([[1, 7, 3, 3, 9, 0, 12, 5], [4, 4, 8, 1, 15, 2, 6, 11]])


def one_layer_gpt(encoding, **settings):
    """A one-layer, attention-only GPT with 2 heads of dim 8, whose attention depends strongly on position.

    At the default init (std 0.02) every attention logit is near 0, so any position signal moves the output
    by about 1e-6 and a wrong one would hide inside the tolerance; weights of std 0.5 make it move by O(1).
    """
    torch.manual_seed(0)
    config = L.GPTConfig(vocab_size=16, layers=1, heads=2, dim=16, no_mlp=True, encoding=encoding,
                         max_len=64, **settings)
    model = L.GPT(config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() == 2:
                weight.normal_(0, 0.5)
    return model


def rotate(u, angle, scale):
    """Rotate each pair (u[a], u[a + D/2]) of a vector by angle[a] (Hugging Face's half-split layout), times
    YaRN's attention scale."""
    half = u.shape[-1] // 2
    x, y = u[:half], u[half:]
    c, s = torch.cos(angle), torch.sin(angle)
    return scale * torch.cat((x * c - y * s, x * s + y * c))


def t5_bucket(d, buckets=32, max_distance=128):
    """T5's bucket of a causal distance d >= 0: exact below buckets/2, then log-spaced, the last bucket for
    every distance from max_distance on (arXiv 1910.10683)."""
    exact = buckets // 2
    if d < exact:
        return d
    return min(buckets - 1, exact + int(math.log(d / exact) / math.log(max_distance / exact) * (buckets - exact)))


def by_hand(model, idx, positions):
    """The GPT's forward for one layer, token by token, from the formulas: what model(idx, positions) must give."""
    cfg = model.config
    B, T = idx.shape
    H, D = cfg.heads, cfg.dim // cfg.heads
    w = {name: p.detach().double() for name, p in model.named_parameters()}
    x = w["tok.weight"][idx]  # (B, T, C)
    if cfg.encoding == "learned":  # row p of the table for position p
        x = x + w["pos.table.weight"][positions]
    if cfg.encoding == "sinusoidal":  # sin(p w_i) then cos(p w_i), w_i = 10000^(-2i/d) (arXiv 1706.03762)
        rates = torch.tensor([10000.0 ** (-2 * i / cfg.dim) for i in range(cfg.dim // 2)], dtype=torch.float64)
        phase = positions.double()[..., None] * rates
        x = x + torch.cat((phase.sin(), phase.cos()), -1)
    h = F.layer_norm(x, (cfg.dim,), w["blocks.0.ln1.weight"], w["blocks.0.ln1.bias"])
    q, k, v = (h @ w["blocks.0.attn.qkv.weight"].T).split(cfg.dim, -1)
    if cfg.encoding in ("rope", "xpos"):
        if cfg.scaling == "none":  # theta_a = base^(-2a/D) (arXiv 2104.09864)
            theta = torch.tensor([cfg.rope_base ** (-2 * a / D) for a in range(D // 2)], dtype=torch.float64)
            scale = 1.0
        else:  # the scalings themselves are checked against Hugging Face's in test_hf_schedules.py
            longest = int(positions.max()) + 1  # dynamic NTK and YaRN read the longest position of the call
            theta, scale = L.SCALINGS[cfg.scaling](D, cfg.rope_base, cfg.factor, cfg.original_len, longest)
            theta = theta.double()
    slopes = [2.0 ** (-8 * (head + 1) / H) for head in range(H)]  # ALiBi, H a power of two (arXiv 2108.12409)
    zeta = [(2 * a / D + 0.4) / 1.4 for a in range(D // 2)]  # xPos, gamma 0.4 (arXiv 2212.10554)

    def decay(p):  # xPos: pair a of a query at p scaled by zeta_a^(p / 512), of a key by zeta_a^(-p / 512)
        return torch.tensor([z ** (float(p) / 512) for z in zeta] * 2, dtype=torch.float64)

    def relative(head, d, query):  # the logit biases, from their formulas; d = p_i - p_j >= 0
        if cfg.encoding == "alibi":  # a penalty growing with the distance p_i - p_j to the key
            return -slopes[head] * d
        if cfg.encoding == "t5":  # a learned scalar per head and distance bucket (arXiv 1910.10683)
            return float(w["pos.table"][t5_bucket(d), head])
        if cfg.encoding == "kerple":  # -r1 ln(1 + r2 d), rates held >= 0.01 (arXiv 2205.09921)
            r1, r2 = (max(float(w[f"pos.{r}"][head]), 0.01) for r in ("r1", "r2"))
            return -r1 * math.log(1 + r2 * d)
        if cfg.encoding == "fire":  # f(psi(d) / psi(max(L, p_i))), psi(x) = ln(cx + 1) (arXiv 2310.04418)
            c, threshold = abs(float(w["pos.c"])), abs(float(w["pos.threshold_scale"])) * cfg.original_len
            x = math.log(c * d + 1) / math.log(c * max(threshold, float(query)) + 1)
            hidden = (w["pos.mlp.0.weight"][:, 0] * x + w["pos.mlp.0.bias"]).clamp(min=0)
            return float(w["pos.mlp.2.weight"][head] @ hidden + w["pos.mlp.2.bias"][head])
        return 0.0

    out = torch.zeros(B, T, cfg.dim, dtype=torch.float64)
    for b in range(B):
        for head in range(H):
            cols = slice(head * D, (head + 1) * D)
            for i in range(T):
                qi = q[b, i, cols]
                if cfg.encoding in ("rope", "xpos"):
                    qi = rotate(qi, positions[b, i] * theta, scale)
                if cfg.encoding == "xpos":
                    qi = qi * decay(positions[b, i])
                logits = []
                for j in range(i + 1):  # causal: keys up to the query
                    kj = k[b, j, cols]
                    if cfg.encoding in ("rope", "xpos"):
                        kj = rotate(kj, positions[b, j] * theta, scale)
                    if cfg.encoding == "xpos":
                        kj = kj * decay(-positions[b, j])
                    logit = float(qi @ kj) / math.sqrt(D)
                    logits.append(logit + relative(head, int(positions[b, i] - positions[b, j]), positions[b, i]))
                weights = torch.tensor(logits, dtype=torch.float64).softmax(0)
                out[b, i, cols] = weights @ v[b, : i + 1, cols]
    x = x + out @ w["blocks.0.attn.proj.weight"].T
    x = F.layer_norm(x, (cfg.dim,), w["ln_f.weight"], w["ln_f.bias"])
    return x @ w["head.weight"].T


ENCODINGS = [  # (encoding, GPTConfig settings)
    ("rope", {}),
    ("rope", dict(scaling="pi", factor=4.0)),
    ("rope", dict(scaling="ntk", factor=4.0)),
    ("rope", dict(scaling="yarn", factor=4.0, original_len=16)),
    ("rope", dict(scaling="dynamic_ntk", factor=4.0, original_len=16)),
    ("rope", dict(scaling="dynamic_yarn", factor=1.0, original_len=16)),
    ("alibi", {}),
    ("xpos", {}),
    ("t5", {}),
    ("kerple", {}),
    ("fire", dict(original_len=16)),  # the threshold L starts at 16: queries past it are normalised
    ("learned", {}),
    ("sinusoidal", {}),
]


@pytest.mark.parametrize("encoding, settings", ENCODINGS,
                         ids=[f"{e}-{s.get('scaling', 'plain')}" for e, s in ENCODINGS])
def test_forward_at_given_positions_equals_the_formula(encoding, settings):
    """Bug caught: an encoding that never sees the ids it is given, e.g. a GPT that rotates by 0..T-1 (or
    builds ALiBi's bias, the learned rows, the sinusoids from 0..T-1) whatever positions are passed; or one
    that misuses them: ALiBi with the wrong sign, per-row ids applied to the wrong row, dynamic NTK sized from
    the token count instead of the largest position, YaRN's attention scale left out."""
    model = one_layer_gpt(encoding, **settings)
    with torch.no_grad():
        given = model(TOKENS, POSITIONS)
        contiguous = model(TOKENS)
    assert torch.allclose(given.double(), by_hand(model, TOKENS, POSITIONS), atol=1e-4)
    # and the ids matter: the same tokens at 0..T-1 give another output (so the equality above is no accident)
    assert (given - contiguous).abs().max() > 0.1


def test_nope_ignores_positions():
    """Bug caught: a position signal leaking into NoPE (e.g. an encoding registered under the wrong name).
    It is also the control for the test above: the hand-written layer without any encoding is the GPT."""
    model = one_layer_gpt("nope")
    with torch.no_grad():
        assert torch.equal(model(TOKENS, POSITIONS), model(TOKENS))
        assert torch.allclose(model(TOKENS).double(), by_hand(model, TOKENS, POSITIONS), atol=1e-4)


def test_alibi_bias_is_minus_slope_times_distance():
    """Bug caught: ALiBi's sign flipped (+m_h (i - j) rewards distant keys instead of penalising them), query
    and key positions swapped, or the slopes applied to the wrong heads. Checked against a slow loop."""
    H = 4
    slopes = [2.0 ** (-8 * h / H) for h in range(1, H + 1)]  # 1/4, 1/16, 1/64, 1/256
    alibi = L.ALiBi(H)
    bias = alibi.bias(POSITIONS, POSITIONS)  # (B, H, T, T)
    B, T = POSITIONS.shape
    assert bias.shape == (B, H, T, T)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(T):
                    distance = max(0, int(POSITIONS[b, i] - POSITIONS[b, j]))  # keys ahead: 0, not a reward
                    assert float(bias[b, h, i, j]) == pytest.approx(-slopes[h] * distance)
    # The sign, stated directly: among the keys a query sees (j <= i), the farther key gets the lower logit.
    causal = bias[..., torch.ones(T, T, dtype=torch.bool).tril()]
    assert torch.all(causal <= 0)
    assert torch.all(bias[:, :, -1, 1:] > bias[:, :, -1, :-1])  # the last query: penalties shrink towards itself
