"""The effective length and its interval (eval.effective_length), checked by simulation on known curves: numpy
draws the prompts right at each length, and the interval must cover the curve's true effective length at least
as often as it says (95 %)."""
import numpy as np
import pytest

import eval as E

LENGTHS = [1024, 2048, 4096, 8192, 16384]


def true_effective_length(scores, threshold):
    """The longest length up to which every true score is above the threshold (None: not even the shortest)."""
    above = None
    for n, p in zip(LENGTHS, scores):
        if p <= threshold:
            break
        above = n
    return above


def simulate(scores, prompts, threshold=0.5, runs=4000, seed=0):
    """(coverage, mean interval width in grid steps) of effective_length's 95 % interval over `runs` grids of
    `prompts` prompts per length, each prompt right with the length's true score."""
    rng = np.random.default_rng(seed)
    right = rng.binomial(prompts, scores, size=(runs, len(scores)))
    truth = true_effective_length(scores, threshold)
    steps = {None: -1, **{n: i for i, n in enumerate(LENGTHS)}}
    covered, widths = 0, []
    for counts in right:
        e = E.effective_length([{"length": n, "accuracy": k / prompts, "samples": prompts}
                                for n, k in zip(LENGTHS, counts)], threshold)
        covered += steps[e["low"]] <= steps[truth] <= steps[e["high"]]
        widths.append(steps[e["high"]] - steps[e["low"]])
    return covered / runs, float(np.mean(widths))


CURVES = {  # true scores at LENGTHS: steep and shallow falls, a score just above the threshold, and both ends
    "steep": [0.98, 0.97, 0.95, 0.2, 0.05],
    "shallow": [0.9, 0.8, 0.65, 0.5, 0.35],
    "just above": [0.95, 0.9, 0.55, 0.52, 0.3],
    "always above": [0.99, 0.97, 0.95, 0.9, 0.85],
    "below at once": [0.45, 0.3, 0.2, 0.1, 0.05],
    "hugging": [0.505, 0.505, 0.505, 0.505, 0.495],  # every length can miss: the union bound is nearly met
}


@pytest.mark.parametrize("name", CURVES)
@pytest.mark.parametrize("prompts", [10, 40])
def test_interval_covers_the_true_effective_length_at_its_stated_rate(name, prompts):
    """Bug caught (planted and watched failing): each length's plain 95 % Wilson interval (no Bonferroni over
    the five lengths) covered the 'hugging' curve's effective length in under 94.5 % of grids of 40 prompts; the
    interval read off the point estimates covered 2-5 % of them. The stated rate is 95 %; with 4000 grids its
    Monte Carlo error is 0.35 %, and the right bounds cover every curve here in >= 96 %."""
    coverage, _ = simulate(np.array(CURVES[name]), prompts)
    assert coverage >= 0.945


def test_more_prompts_narrow_the_interval():
    """The interval is not a fixed span of the grid: with 4x the prompts it is narrower on a shallow curve."""
    _, few = simulate(np.array(CURVES["shallow"]), 10, runs=500)
    _, many = simulate(np.array(CURVES["shallow"]), 160, runs=500)
    assert many < few - 0.5


def test_outcomes_at_the_ends_and_the_crossing():
    """Bug caught: an effective length that skips a dip (the longest length above the threshold anywhere, not the
    longest with every shorter one above too), and a slope measured per token instead of per doubling."""
    rows = lambda scores: [{"length": n, "accuracy": p, "samples": 50} for n, p in zip(LENGTHS, scores)]
    every = E.effective_length(rows([0.9] * 5), 0.5)
    assert every["length"] == 16384 and every["outcome"] == "above the threshold at every tested length"
    assert every["slope"] is None and every["high"] == 16384
    none = E.effective_length(rows([0.2, 0.9, 0.9, 0.9, 0.9]), 0.5)
    assert none["length"] is None and none["outcome"] == "below the threshold at the shortest length"
    e = E.effective_length(rows([1.0, 0.9, 0.7, 0.3, 0.9]), 0.5)
    assert e["length"] == 4096 and e["outcome"] == "crosses the threshold"
    assert e["slope"] == pytest.approx(0.4) and e["crossing"] == pytest.approx(4096 * 2 ** 0.5)
    line = E.describe_effective_length(every, 1024, 16384)
    assert ">= 16384" in line and "every tested length" in line
    assert "< 1024" in E.describe_effective_length(none, 1024, 16384)
