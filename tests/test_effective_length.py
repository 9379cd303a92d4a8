"""The effective length and its interval (llm_eval.effective_length), checked by simulation on known curves: numpy
draws the prompts right at each length, and the interval must cover the curve's true effective length at least
as often as it says (95 %)."""
import numpy as np
import pytest

import llm_eval as E

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


def test_sequential_sampling_keeps_the_full_grids_side_of_the_threshold(monkeypatch):
    """--sequential (llm_eval.evaluate_llm_grid with settle=threshold) stops a length once its side of the threshold
    is settled. Bug caught (each planted and watched failing): stopping when the pooled score merely reaches the
    threshold ('>=' for '>' in llm_eval.settled: a length at exactly 0.5 read as above it), and counting one depth's
    prompts instead of the round's. On simulated cells, each length falls on the side the full grid puts it,
    the effective length is the full grid's, each cell scores a prefix of the full grid's prompts, and it saves
    prompts where the score is far from the threshold."""
    import random

    def fake_scores(model, tokenizer, task, length, seeds, options, device="cpu", bf16=False, cache=None):
        p = TRUE[length]
        return [{"seed": s, "right": random.Random(f"{length} {options['depth']} {s}").random() < p,
                 "logprob": 0.0, "rank": None} for s in seeds]

    monkeypatch.setattr(E, "score_prompts", fake_scores)
    saved = 0
    for trial in range(40):
        rng = random.Random(trial)
        TRUE = dict(zip(LENGTHS, sorted((rng.random() for _ in LENGTHS), reverse=True)))
        threshold, samples = rng.choice([0.5, 0.3, 0.8]), rng.choice([4, 10])
        grid = dict(task="passkey", lengths=LENGTHS, depths=[0, 0.5, 1], samples=samples)
        full = E.evaluate_llm_grid(None, None, **grid)
        quick = E.evaluate_llm_grid(None, None, **grid, settle=threshold)
        for a, b in zip(full, quick):
            assert (a["length"], a["depth"]) == (b["length"], b["depth"]) and b["planned"] == samples
            assert [p["seed"] for p in b["prompts"]] == [p["seed"] for p in a["prompts"]][:b["samples"]]
        for a, b in zip(E.pooled(full), E.pooled(quick)):
            assert (a["accuracy"] > threshold) == (b["accuracy"] > threshold), (trial, a, b)
        assert E.effective_length(E.pooled(full), threshold)["length"] == \
            E.effective_length(E.pooled(quick), threshold)["length"]
        saved += sum(a["samples"] - b["samples"] for a, b in zip(full, quick))
    assert saved > 0


def test_settled_is_exact_at_the_edges(monkeypatch):
    """4 planned prompts, threshold 0.5: 3 right is above whatever the fourth says; 2 right of 4 is not above;
    2 wrong of 4 can no longer get above; 1 right, 1 wrong of 2 is open. On a grid of 3 depths x 10 prompts
    (30 a length), a length always wrong stops after 5 rounds (15 wrong), one always right after 6 (18 right,
    more than 15). Bug caught (planted, watched failing): a round counted as one prompt, so a length always
    wrong never stopped."""
    monkeypatch.setattr(E, "score_prompts", lambda model, tok, task, n, seeds, options, device="cpu", bf16=False,
                        cache=None: [{"right": n == 1024, "logprob": 0.0, "rank": None} for _ in seeds])
    cells = E.evaluate_llm_grid(None, None, "passkey", [1024, 2048], [0, 0.5, 1], 10, settle=0.5)
    assert [c["samples"] for c in cells] == [6, 6, 6, 5, 5, 5]
    assert E.settled(3, 3, 4, 0.5) and not E.settled(2, 3, 4, 0.5)
    assert E.settled(0, 2, 4, 0.5) and not E.settled(1, 2, 4, 0.5)
    assert E.settled(2, 4, 4, 0.5) and E.settled(3, 4, 4, 0.5)  # all scored: always settled
