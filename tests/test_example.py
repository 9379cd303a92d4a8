"""example.py, the first file a learner runs: it must run as shipped, and its two models must have learned."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_example_trains_both_models_and_prints_their_accuracy_at_1x_to_8x():
    """Bugs caught: an example that no longer runs against the library (a renamed argument), or whose models
    learn nothing (accuracy at the training length near chance, 1/8)."""
    out = subprocess.run([sys.executable, "example.py"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split() == ["positions", "16", "32", "64", "128"]
    table = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in lines[2:]}
    assert set(table) == {"contiguous", "randomized"}
    for positions, accuracy in table.items():
        assert len(accuracy) == 4 and all(0 <= a <= 1 for a in accuracy)
        assert accuracy[0] > 0.5, f"{positions}: {accuracy[0]} at the training length: it learned nothing"
