"""The building blocks a user copies out of lengen.py run alone.

Each one's source, with the helpers its docstring names after "Standalone with:", is executed in a fresh
namespace that holds only lengen.py's own import lines (torch and math): it must give lengen's own result, and
refuse bad input with a ValueError that says why, as it does inside lengen.
"""
import inspect
import math
import re

import pytest
import torch

import lengen

# lengen.py's import lines: what a copied block may rely on (torch and math, nothing of the project)
HEADER = ("from __future__ import annotations\nimport math\n\nimport torch\nimport torch.nn as nn\n"
          "import torch.nn.functional as F\n")


def standalone(obj):
    """obj as it behaves when its block (and the helpers its docstring names) is pasted into a new file."""
    named = re.search(r"Standalone with: ([\w, ]+)\.", inspect.getdoc(obj) or "")
    helpers = [getattr(lengen, name.strip()) for name in named.group(1).split(",")] if named else []
    namespace = {}
    exec(HEADER + "\n\n".join(inspect.getsource(o) for o in helpers + [obj]), namespace)
    assert set(namespace) - {"__builtins__", "annotations"} == \
        {"math", "torch", "nn", "F", obj.__name__, *(h.__name__ for h in helpers)}
    return namespace[obj.__name__]


SCHEDULES = [lengen.rope_frequencies, lengen.pi_frequencies, lengen.ntk_frequencies,
             lengen.dynamic_ntk_frequencies, lengen.yarn_frequencies, lengen.dynamic_yarn_frequencies]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda f: f.__name__)
def test_every_rotary_schedule_runs_alone(schedule):
    """Bug caught: a schedule that calls a helper its docstring does not name (yarn_frequencies without
    rope_frequencies was a NameError once copied)."""
    copy = standalone(schedule)
    for args in [(64, 1e4, 4.0, 2048, 8192), (128, 5e5, 16.0, 4096, 1000), (16, 100.0, 1.0, 32, 64)]:
        inv_freq, scale = copy(*args)
        want_freq, want_scale = schedule(*args)
        assert torch.equal(inv_freq, want_freq) and scale == want_scale


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("args, why", [
    ((63, 1e4, 2.0, 2048), "even"),
    ((64, 1.0, 2.0, 2048), "base"),
    ((64, 1e4, 0.5, 2048), "factor"),
])
def test_every_rotary_schedule_checks_its_own_input(schedule, args, why):
    """Bug caught: checks that lived only in the dispatcher (scaling_frequencies), so a copied schedule took
    factor 0.5 (shrinking the context) or an odd rotary dim without a word."""
    for fn in (schedule, standalone(schedule)):
        with pytest.raises(ValueError, match=why):
            fn(*args)


@pytest.mark.parametrize("schedule", [lengen.yarn_frequencies, lengen.dynamic_ntk_frequencies,
                                      lengen.dynamic_yarn_frequencies],
                         ids=lambda f: f.__name__)
def test_schedules_that_need_the_original_length_say_so(schedule):
    """yarn_frequencies(64, 1e4, 4, None) was a TypeError deep inside the formula."""
    with pytest.raises(ValueError, match="original_len"):
        standalone(schedule)(64, 1e4, 4.0, None)


@pytest.mark.parametrize("sampler", [lengen.randomized_positions, lengen.stretch_positions, lengen.pose_positions],
                         ids=lambda f: f.__name__)
def test_position_samplers_run_alone(sampler):
    copy = standalone(sampler)
    for batch, length, top in [(3, 16, 40), (2, 50, 10 ** 6)]:
        ours = copy(batch, length, top, torch.Generator().manual_seed(5))
        assert torch.equal(ours, sampler(batch, length, top, torch.Generator().manual_seed(5)))
    with pytest.raises(ValueError, match="below the sequence length"):
        copy(1, 20, 10)


def test_the_curriculum_runs_alone():
    copy = standalone(lengen.LengthCurriculum)
    for shape in lengen.LengthCurriculum.SHAPES:
        ours, theirs = copy(32, 256, 100, shape), lengen.LengthCurriculum(32, 256, 100, shape)
        assert [ours(step) for step in range(0, 120, 7)] == [theirs(step) for step in range(0, 120, 7)]
    with pytest.raises(ValueError, match="start <= end"):
        copy(256, 32, 100)


@pytest.mark.parametrize("name, make", [
    ("ALiBi", lambda cls: cls(6)),
    ("T5Bias", lambda cls: cls(4)),
    ("KerpleLog", lambda cls: cls(4)),
    ("FIRE", lambda cls: cls(4, threshold=16.0)),
])
def test_logit_biases_run_alone_from_plain_arguments(name, make):
    """Built from plain numbers (no GPTConfig), with the same weights, a copied bias equals lengen's at uneven
    per-row positions."""
    ours, theirs = make(standalone(getattr(lengen, name))), make(getattr(lengen, name))
    ours.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        for p in theirs.parameters():  # T5's table starts at zero: give every bias something to show
            p.add_(torch.randn_like(p) * 0.1)
    ours.load_state_dict(theirs.state_dict())
    positions = torch.tensor([[0, 3, 4, 9, 30, 31], [2, 5, 17, 18, 19, 60]])
    assert torch.equal(ours.bias(positions, positions), theirs.bias(positions, positions))


def formula_alone(formula):
    """formula pasted into a new file that imports torch and math, and nothing else of lengen but the one helper
    (at most) its docstring names after "Standalone with:"."""
    named = re.search(r"Standalone with: ([\w, ]+)\.", inspect.getdoc(formula) or "")
    helpers = [getattr(lengen, name.strip()) for name in named.group(1).split(",")] if named else []
    assert len(helpers) <= 1
    namespace = {}
    exec("import math\n\nimport torch\n\n\n" + "\n\n".join(inspect.getsource(o) for o in helpers + [formula]),
         namespace)
    assert set(namespace) - {"__builtins__"} == {"math", "torch", formula.__name__, *(h.__name__ for h in helpers)}
    return namespace[formula.__name__]


POSITIONS = torch.tensor([[0, 3, 4, 9, 30, 31], [2, 5, 17, 18, 19, 60]])  # uneven, a different set per row
FLOOR = 0.01  # KerpleLog's default floor on its rates


def kerple_rates(kerple):
    return (r.clamp(min=FLOOR)[:, None, None] for r in (kerple.r1, kerple.r2))


def fire_bias(fire_input, fire, distance):  # FIRE's f, the class's own MLP, on what fire_input gives it
    x = fire_input(distance, POSITIONS[:, :, None], fire.c.abs(), (fire.threshold_scale * fire.threshold).abs())
    return fire.mlp(x[..., None]).movedim(-1, -3)


# formula, its docstring's worked example as (formula -> (got, want)), the class, and the class's bias() from
# the formula alone (formula, class instance, distances (B, T, T) -> (B, H, T, T))
FORMULAS = [
    (lengen.alibi_bias, lambda f: (f(torch.tensor(5.0), lengen.alibi_slopes(4)[0]), -1.25),  # head 0 of 4, d 5
     lambda: lengen.ALiBi(6), lambda f, enc, d: f(d[:, None], lengen.alibi_slopes(6)[:, None, None])),
    (lengen.t5_bucket, lambda f: (f(torch.tensor([15, 16, 20, 32, 64, 127, 1000])).tolist(),
                                  [15, 16, 17, 21, 26, 31, 31]),
     lambda: lengen.T5Bias(4), lambda f, enc, d: enc.table[f(d, 32, 128)].movedim(-1, -3)),
    (lengen.kerple_bias, lambda f: (f(torch.tensor(math.e - 1), torch.tensor(2.0), torch.tensor(1.0)), -2.0),
     lambda: lengen.KerpleLog(4), lambda f, enc, d: f(d[:, None], *kerple_rates(enc))),
    (lengen.fire_input, lambda f: (f(torch.tensor(100), torch.tensor(1000), torch.tensor(0.1), torch.tensor(512.0)),
                                   math.log(11) / math.log(101)),
     lambda: lengen.FIRE(4, threshold=16.0), fire_bias),
]


@pytest.mark.parametrize("formula, worked, make, as_bias", FORMULAS, ids=[case[0].__name__ for case in FORMULAS])
def test_each_bias_formula_runs_alone_and_is_the_class_bias(formula, worked, make, as_bias):
    """Each bias's formula is one function that runs pasted alone with torch and math, gives its docstring's
    worked example (FIRE's: ln 11 / ln 101, the docstring's 0.52), reads a key ahead (d < 0, masked in a
    decoder) as d = 0, and is exactly what its class's bias() computes at uneven per-row positions (the
    class's score_mod calls the same function: tests/test_flex.py). Bug caught: a formula that leans on a
    helper it does not name, a sign or rate slipped in the one place both paths read (test_flex cannot see it:
    bias and score_mod would agree), ALiBi's bias giving keys ahead a positive bias (-m (i - j) > 0 for j > i)."""
    copy = formula_alone(formula)
    got, want = worked(copy)
    assert got == pytest.approx(want, abs=1e-6)
    torch.manual_seed(0)
    encoding = make()
    with torch.no_grad():
        for p in encoding.parameters():  # T5's table starts at zero: give every bias something to show
            p.add_(torch.randn_like(p) * 0.1)
        distance = (POSITIONS[:, :, None] - POSITIONS[:, None, :]).float()  # (B, T, T), < 0 for keys ahead
        ours = as_bias(copy, encoding, distance)
        assert torch.equal(ours, encoding.bias(POSITIONS, POSITIONS))
        assert torch.equal(ours, as_bias(copy, encoding, distance.clamp(min=0)))


def test_alibi_copies_out_as_its_slopes_and_one_function():
    """What docs/encodings.md promises: alibi_slopes and alibi_bias, pasted into a file with torch and math,
    are the whole of ALiBi's bias."""
    namespace = {}
    exec("import math\n\nimport torch\n\n\n" + inspect.getsource(lengen.alibi_slopes) + "\n\n"
         + inspect.getsource(lengen.alibi_bias), namespace)
    assert set(namespace) - {"__builtins__"} == {"math", "torch", "alibi_slopes", "alibi_bias"}
    distance = (POSITIONS[:, :, None] - POSITIONS[:, None, :]).float()
    ours = namespace["alibi_bias"](distance[:, None], namespace["alibi_slopes"](6)[:, None, None])
    assert torch.equal(ours, lengen.ALiBi(6).bias(POSITIONS, POSITIONS))


def test_patch_hf_rope_runs_alone():
    class RotaryModule(torch.nn.Module):  # what a Hugging Face rotary embedding holds
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", torch.ones(32))
            self.attention_scaling, self.rope_type = 1.0, "default"

    model = torch.nn.Sequential(RotaryModule(), RotaryModule())
    inv_freq, scale = lengen.yarn_frequencies(64, 1e5, 4.0, 8192)
    assert standalone(lengen.patch_hf_rope)(model, inv_freq, scale) == 2
    assert all(torch.equal(m.inv_freq, inv_freq) and m.attention_scaling == scale for m in model)
