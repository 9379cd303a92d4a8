"""Each encoding's defaults are its paper's (or its paper's reference code's) values, pinned here with the
source, so that a changed default is a decision and not a slip. Where an experiment departs from a default,
its results file says so and why.

- ALiBi (Press et al., 2108.12409): head h of H gets slope 2^(-8h/H); 8 heads: 1/2, 1/4, ..., 1/256.
- T5 (Raffel et al., 1910.10683): 32 buckets, log-spaced beyond 16, up to a max distance of 128.
- KERPLE log (Chi et al., 2205.09921, its code): r1 ~ U(0, 2), r2 ~ U(0, 1), both kept >= 0.01.
- FIRE (Li et al., 2310.04418, its code): an MLP 1 -> 32 -> H, c from 0.1, the threshold L from 512.
- xPos (Sun et al., 2212.10554): zeta_i = (2i/D + 0.4) / 1.4, scale base 512.
"""
import inspect

import pytest
import torch

import eval
import lengen as L
import train


def defaults(cls) -> dict:
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_alibi_takes_the_papers_slopes_for_its_heads():
    """Bug caught: ALiBi's slopes from another rule (2^(-h), or 2^(-8h/H) with h from 0), or the module
    ignoring the head count it is given."""
    assert L.ALiBi(8).slopes.tolist() == [2.0 ** -h for h in range(1, 9)]
    assert L.ALiBi(2).slopes.tolist() == [2.0 ** -4, 2.0 ** -8]  # 2 heads: nearly flat over a short window


def test_alibi_with_fewer_heads_takes_the_eight_head_slopes_evenly_spaced(tmp_path):
    """The experiments' small models have 2-4 heads, and the paper's rule then gives slopes near 0 (1/16, 1/256):
    --alibi-slope-heads 8 takes the slopes of its 8-head models instead, spread over the heads. Bug caught: the
    first H of the eight (1/2, 1/4: no head that looks far), or the setting lost between train.py and eval.py."""
    assert L.ALiBi(2, slope_heads=8).slopes.tolist() == [2.0 ** -1, 2.0 ** -5]
    assert L.ALiBi(4, slope_heads=8).slopes.tolist() == [2.0 ** -1, 2.0 ** -3, 2.0 ** -5, 2.0 ** -7]
    assert L.ALiBi(8, slope_heads=8).slopes.tolist() == L.ALiBi(8).slopes.tolist()
    run = train.run(["--task", "shift", "--encoding", "alibi", "--alibi-slope-heads", "8", "--train-len", "6:8",
                     "--steps", "1", "--batch", "2", "--eval-samples", "0", "--quiet", "--out", str(tmp_path / "a")])
    assert eval.load_run(run["run"])[0].pos.slopes.tolist() == [2.0 ** -1, 2.0 ** -5]


def test_t5_kerple_fire_xpos_defaults_are_their_papers():
    """Bug caught: a default moved away from its paper's value (a bucket count, an initial rate, FIRE's MLP
    width, c or threshold, xPos's gamma or scale base) without the change being a decision."""
    assert defaults(L.T5Bias) == {"buckets": 32, "max_distance": 128}
    t5 = L.T5Bias(2)
    assert (t5.buckets, t5.max_distance, tuple(t5.table.shape)) == (32, 128, (32, 2))
    assert defaults(L.KerpleLog) == {"floor": 1e-2}
    torch.manual_seed(0)
    kerple = L.KerpleLog(4096)  # enough heads that the draws show their ranges
    assert 0 < kerple.r1.min() and 1.99 < kerple.r1.max() < 2 and 0 < kerple.r2.min() and 0.99 < kerple.r2.max() < 1
    assert defaults(L.FIRE) == {"width": 32, "c": 0.1, "threshold": 512.0, "normalise": True}
    fire = L.FIRE(2)
    assert [m.out_features for m in fire.mlp if isinstance(m, torch.nn.Linear)] == [32, 2]
    assert (fire.c.item(), fire.threshold.item()) == (pytest.approx(0.1), 512.0)
    assert defaults(L.XPos) == {"base": 10000.0, "gamma": 0.4, "scale_base": 512.0}
    xpos = L.XPos(32)
    assert xpos.scale_base == 512.0
    assert xpos.zeta.tolist() == pytest.approx([(2 * i / 32 + 0.4) / 1.4 for i in range(16)])


def test_every_experiments_alibi_takes_the_eight_head_slopes():
    """Each experiment that trains ALiBi (encodings, distance, retrieval's control) gives its 1-4 head models the
    8-head slopes. Bug caught: one experiment left on the paper's rule for its few heads, where ALiBi is nearly
    NoPE (2 heads: 1/16, 1/256; 4 heads: down to 1/256)."""
    import types

    from experiments import distance, encodings, retrieval
    args = types.SimpleNamespace(device="cpu", threads=1)
    argvs = [encodings.model_argv("shift", "alibi", p, 0, encodings.PRESETS["default"], "runs", "cpu")
             for p in encodings.POSITIONS]
    argvs += [distance.model_argv(distance.PRESETS["default"], "default", args, "delay_copy", "alibi", 0, (3, 5))]
    argvs += [m[3] for m in retrieval.planned_models(retrieval.PRESETS["default"]) if "alibi" in m[3]]
    assert len(argvs) == 3 + len(retrieval.PRESETS["default"]["seeds"])
    for argv in argvs:
        assert argv[argv.index("--alibi-slope-heads") + 1] == "8"
        model = L.GPT(L.GPTConfig(vocab_size=8, heads=int(argv[argv.index("--heads") + 1]) if "--heads" in argv else 2,
                                  dim=64, encoding="alibi", alibi_slope_heads=8))
        assert model.pos.slopes.max() == 0.5  # the steepest head looks at the last few tokens
