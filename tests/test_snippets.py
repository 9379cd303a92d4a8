"""The building blocks a user copies out of lengen.py run alone.

Each one's source, with the helpers its docstring names after "Standalone with:", is executed in a fresh
namespace that holds only lengen.py's own import lines (torch and math): it must give lengen's own result, and
refuse bad input with a ValueError that says why, as it does inside lengen.
"""
import inspect
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
             lengen.dynamic_ntk_frequencies, lengen.yarn_frequencies]


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


@pytest.mark.parametrize("schedule", [lengen.yarn_frequencies, lengen.dynamic_ntk_frequencies],
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
