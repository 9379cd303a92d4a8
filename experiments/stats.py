"""The one verdict rule every claims table is decided by, and what it rests on: p-values and intervals over a
handful of independent units from Student's t (eval.py's, which its LLM measurements use too).

    FIT_BAR, UNFIT                    when the models a claim rests on count as having learned their task
    THRESHOLD, rule, decide           a claimed gain over independent units, a table (family) at a time: each
                                      label says which way the estimate points and what its interval excludes
    t_power, detectable, units_needed what a design can find: the noncentral t
    verdict, all_of, failed, short    claims made of several comparisons, and how a summary writes them
"""
from __future__ import annotations

import math

from eval import sample_sd, t_critical, t_interval, t_tail

# ---------------------------------------------------------------------------------------------------------
# Whether a claim can be tested at all: the fit bar
# ---------------------------------------------------------------------------------------------------------

# A claim about how models generalize cannot be tested on models that did not learn their task where nothing
# is extrapolated: whatever they do beyond it says how far training got. Such a claim gets this fourth verdict,
# never "not reproduced". Every experiment's verdicts pass through verdict() or decide() below, which
# take `fitted`: did the models the claim rests on reach the experiment's fit bar in distribution?
UNFIT = "undecided (models did not fit)"
# A claim a preset does not train the models for (it stays in another preset, --full): no verdict, and not in
# the preset's family of comparisons.
LEFT_OUT = "not in this preset"

# The one fit bar: a model has learned its task when its accuracy in distribution (at the longest training length
# L, on held-out sequences) reaches this. retrieval, distance and encodings gate their claims on it.
FIT_BAR = 0.9


def verdict(full: bool, some: bool, fitted: bool = True) -> str:
    """The verdict of a claim made of sub-claims: all of it holds, some of it, or none; undecided (UNFIT)
    when the models it rests on did not fit."""
    if not fitted:
        return UNFIT
    return "reproduced" if full else "partly reproduced" if some else "not reproduced"


# The claimed size where a paper gives no number in this project's units: a gain of 5 accuracy points, fixed
# before the runs. A claim whose paper gives its own size is decided against that size (rule, below).
THRESHOLD = 0.05


# ---------------------------------------------------------------------------------------------------------
# The verdict on a gain replicated over independent units (seeds; pretrained bases), one table at a time
# ---------------------------------------------------------------------------------------------------------

ALPHA = 0.05  # the error rate of a whole table of comparisons (its family), shared out among them (Bonferroni)
MIN_UNITS = 3  # fewer independent units give no verdict: 2 units' 95 % interval is mean +- 12.7 standard errors
POWER = 0.8    # "detectable": the smallest true gain an interval excludes 0 for this often

# Every label says which way the estimate points and what the interval excludes. A claim of a gain of at least
# `size` is decided by where its interval [low, high] lies against 0 and the size:
REPRODUCED = "reproduced"                                 # low >= size: the whole interval at or above the size
BELOW_SIZE = "positive, below the claimed size"           # 0 < low, high < size: a gain, smaller than claimed
POSITIVE = "positive, claimed size not excluded"          # 0 < low < size <= high: a gain, of a size still open
NO_EFFECT = "no effect shown"                             # low <= 0 <= high < size: spans 0, excludes the size
UNDECIDED = "undecided"                                   # low <= 0 and high >= size: spans 0 and the size
REVERSED = "reversed"                                     # high < 0: the whole interval below 0
LABELS = (REPRODUCED, BELOW_SIZE, POSITIVE, NO_EFFECT, UNDECIDED, REVERSED)


def rule(per_unit: list[float], low: float, high: float, size: float) -> str:
    """The label of a claimed gain of at least `size`, from its value on each independent unit and its interval
    [low, high], already widened for its family (decide). Where the interval spans 0 the label says which side
    the estimate (the mean) is on: "no effect shown, estimate +0.012". Fewer than MIN_UNITS units: undecided,
    whatever the interval. A size of 0 (the LLM's log p: any gain is the claim) needs low > 0 to reproduce, and
    then "no effect shown" cannot occur."""
    mean = sum(per_unit) / len(per_unit)
    if len(per_unit) < MIN_UNITS:
        return f"{UNDECIDED} ({len(per_unit)} unit(s): {MIN_UNITS} needed)"
    if low >= size and low > 0:
        return REPRODUCED
    if low > 0:
        return BELOW_SIZE if high < size else POSITIVE
    if high < 0:
        return REVERSED
    return f"{NO_EFFECT if high < size else UNDECIDED}, estimate {mean:+.3f}"


def decide(family: dict[str, list[float]], size: float, fitted: dict[str, bool] | None = None,
           alpha: float = ALPHA) -> dict[str, dict]:
    """Every claim of one results table at once: {name: per-unit gains} -> {name: {per_unit, mean, low, high,
    p, level, family, verdict}}. A claim whose models did not fit (fitted[name] False) or that has
    no unit is UNFIT. A unit that is not a finite number is refused: it would read as a certain gain.

    Simultaneous intervals: each of the table's m comparisons (measured or not) gets the t-interval over its
    units at confidence 1 - alpha / m. All m cover their true gains at once with probability >= 1 - alpha
    (Bonferroni), so every statement a label makes, against 0 or against the size, in either direction, is
    wrong somewhere in the table at most alpha of the time (tests/test_verdicts.py simulates each label)."""
    fitted, m, out = fitted or {}, len(family), {}
    level = alpha / max(m, 1)
    for name, values in family.items():
        values = [float(v) for v in values]
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if bad:
            raise ValueError(f"{name}: unit {bad[0]} is {values[bad[0]]}, not a gain; a run failed or was not "
                             "measured")
        if not fitted.get(name, True) or not values:  # measured or not, no verdict: the mean is shown as it is
            out[name] = {"per_unit": values, "family": m, "verdict": UNFIT,
                         **({"mean": sum(values) / len(values)} if values else {})}
            continue
        mean, low, high = t_interval(values, level)
        row = {"per_unit": values, "mean": mean, "family": m, "level": level}
        if len(values) >= MIN_UNITS:
            row |= {"low": low, "high": high, "p": p_value(values)}
        out[name] = row | {"verdict": rule(values, low, high, size)}
    return out


def p_value(values: list[float]) -> float:
    """Two-sided p-value of "the mean gain is 0" from a t-test over independent units (n - 1 degrees of freedom)."""
    n = len(values)
    mean = sum(values) / n
    sd = sample_sd(values)
    if sd == 0:
        return 0.0 if mean else 1.0
    return t_tail(mean / (sd / n ** 0.5), n - 1)


# ---------------------------------------------------------------------------------------------------------
# Power: the noncentral t, and the smallest gain a design detects
# ---------------------------------------------------------------------------------------------------------


def t_power(effect: float, sd: float, n: int, level: float) -> float:
    """P(the level-`level` two-sided t-interval over n units lies above 0) when the true mean gain is `effect`
    and the units' sd is `sd`: P(T' > t_crit), T' noncentral t with n - 1 degrees of freedom and noncentrality
    effect sqrt(n) / sd. T' = (Z + ncp) / S with S^2 ~ chi^2_df / df, so the power is the mean over S of
    P(Z > t_crit S - ncp), integrated by Simpson's rule over S's density."""
    df, c = n - 1, t_critical(level, n - 1)
    ncp = effect * n ** 0.5 / sd
    steps, top = 4000, 1.0 + 12.0 / df ** 0.5
    width = top / steps

    def density(s):  # of S = sqrt(chi^2_df / df)
        if s <= 0:
            return 0.0
        return math.exp(math.log(2) + (df / 2) * math.log(df / 2) - math.lgamma(df / 2) + (df - 1) * math.log(s)
                        - df * s * s / 2)
    total = 0.0
    for i in range(steps + 1):
        s = i * width
        weight = 1 if i in (0, steps) else 4 if i % 2 else 2
        total += weight * density(s) * 0.5 * math.erfc((c * s - ncp) / math.sqrt(2))
    return total * width / 3


def detectable(sd: float, n: int, level: float, power: float = POWER) -> float:
    """The smallest true gain whose interval (n units of spread sd, at `level`) lies above 0 with probability
    `power`: the effect a design can be expected to find, not the interval's half-width (which is found only
    half of the time). By bisection on t_power, which grows with the effect."""
    if sd == 0:
        return 0.0
    low, high = 0.0, sd
    while t_power(high, sd, n, level) < power:
        low, high = high, 2 * high
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if t_power(middle, sd, n, level) < power else (low, middle)
    return high


def units_needed(effect: float, sd: float, level: float, power: float = POWER, most: int = 10 ** 4) -> int | None:
    """The fewest independent units whose interval at `level` excludes 0 with probability `power` when the
    true gain is `effect` and the units' sd is `sd` (None: more than `most`)."""
    n = max(MIN_UNITS, 2)
    while n <= most and t_power(effect, sd, n, level) < power:
        n = n + 1 if n < 64 else int(n * 1.1)
    return n if n <= most else None


# ---------------------------------------------------------------------------------------------------------
# A table's caption, and claims made of several comparisons
# ---------------------------------------------------------------------------------------------------------


def caption(family: dict[str, dict], alpha: float = ALPHA, size_from: str = "this project's +0.05") -> str:
    """What a table's verdicts rest on, for the line above it: the family, its level and the claimed size."""
    m = len(family)
    return (f"One family of {m} comparison(s) at {alpha:g} over the table: each interval is the t-interval over "
            f"independent units at {1 - alpha / max(m, 1):.4g} confidence (Bonferroni: all {m} hold at once with "
            f"probability >= {1 - alpha:g}). Claimed size: {size_from}.")


def rule_text(size: float = THRESHOLD, size_from: str = "this project's +0.05: the paper gives no number in these "
              "units", units: str = "independent units") -> str:
    """The rule as a results file states it, for a claimed gain of at least `size`, and where that size comes
    from."""
    return (f"**The rule** (experiments/stats.py, fixed before the run): a gain is measured on {units}; its "
            "interval is the t-interval over them at confidence 1 - 0.05 / m, m the comparisons of its table, so "
            "that every statement a table makes, against 0 or against the size, in either direction, holds at once "
            f"with probability >= 95 % (Bonferroni). Claimed size: {size:+g} ({size_from}). **reproduced**: the "
            "whole interval at or above the size; **positive, below the claimed size**: above 0, below the size; "
            "**positive, claimed size not excluded**: above 0, reaching the size; **no effect shown**: spans 0, "
            "below the size; **undecided**: spans 0 and the size (both of these say which side the estimate is "
            "on); **reversed**: below 0. Fewer than 3 units: undecided; a model under the fit bar: "
            f"{UNFIT}. *detectable*: the smallest true gain whose interval would lie above 0 with {POWER:.0%} "
            "power at the table's level (noncentral t, at the units' observed spread).")


def failed(outcome: str) -> bool:
    """Whether a verdict says the claimed gain does not hold at its size (as opposed to: holds, or cannot be
    told): not reproduced, reversed, a gain below the size, or no effect where the size is excluded."""
    return outcome.startswith(("not reproduced", "partly reproduced", REVERSED, BELOW_SIZE, NO_EFFECT))


def short(outcome: str) -> str:
    """A verdict as a summary table writes it: the label without its estimate (which has its own column)."""
    return outcome.split(", estimate")[0]


def all_of(verdicts: list[str]) -> str:
    """The verdict of a claim that needs every one of several comparisons ("X beats each of Y and Z"): each
    comparison reproduced -> reproduced; one decidedly failing -> the claim fails (partly, where another
    holds); otherwise some comparison is open, and so is the claim: undecided, or UNFIT where none could
    be measured on fitted models."""
    if any(failed(v) for v in verdicts):
        return verdict(False, REPRODUCED in verdicts)
    if verdicts and all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return UNFIT if verdicts and all(v == UNFIT for v in verdicts) else UNDECIDED
