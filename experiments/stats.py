"""The one verdict rule every claims table is decided by, and what it rests on: p-values and intervals over a
handful of independent units from Student's t (eval.py's, which its LLM measurements use too).

    FIT_BAR, UNFIT                    when the models a claim rests on count as having learned their task
    THRESHOLD, rule, decide           a claimed gain over independent units, a table (family) at a time
    verdict, all_of, failed, short    claims made of several comparisons, and how a summary writes them
"""
from __future__ import annotations

from eval import t_interval, t_tail

# ---------------------------------------------------------------------------------------------------------
# Whether a claim can be tested at all: the fit bar
# ---------------------------------------------------------------------------------------------------------

# A claim about how models generalize cannot be tested on models that did not learn their task where nothing
# is extrapolated: whatever they do beyond it says how far training got. Such a claim gets this fourth verdict,
# never "not reproduced". Every experiment's verdicts pass through verdict() or unit_verdict() below, which
# take `fitted`: did the models the claim rests on reach the experiment's fit bar in distribution?
UNFIT = "undecided (models did not fit)"

# The one fit bar: a model has learned its task when its accuracy in distribution (at the longest training length
# L, on held-out sequences) reaches this. retrieval, distance and encodings gate their claims on it.
FIT_BAR = 0.9


def verdict(full: bool, some: bool, fitted: bool = True) -> str:
    """The verdict of a claim made of sub-claims: all of it holds, some of it, or none; undecided (UNFIT)
    when the models it rests on did not fit."""
    if not fitted:
        return UNFIT
    return "reproduced" if full else "partly reproduced" if some else "not reproduced"


# The smallest gain a claim of a gain counts as (5 accuracy points), fixed before the runs: see decide() below.
THRESHOLD = 0.05


# ---------------------------------------------------------------------------------------------------------
# The verdict on a gain replicated over independent units (seeds; pretrained bases), one table at a time
# ---------------------------------------------------------------------------------------------------------

ALPHA = 0.05  # the error rate of a whole table of comparisons (its family), split among them by Holm's rule
MIN_UNITS = 3  # fewer independent units give no verdict: 2 units' 95 % interval is mean +- 12.7 standard errors


def rule(per_unit: list[float], low: float, high: float, threshold: float) -> str:
    """The verdict on a claimed gain of at least `threshold`, from its value on each independent unit and its
    interval [low, high], already adjusted for the comparisons of its table (decide):
    - reproduced: the mean gain is >= threshold and the interval lies above 0;
    - reversed: the mirror image, the mean <= -threshold and the interval below 0;
    - smaller than claimed: the interval lies below the threshold, whatever its sign (a real but small gain,
      no gain, or a loss too small to call reversed), written with the effect: "smaller than claimed: +0.026
      [+0.007, +0.044], under +0.05";
    - undecided: anything else (the interval reaches the threshold and 0), or fewer than MIN_UNITS units.
    Why these: a mean alone, or "positive on every unit", passes noise far more often than the interval says
    (3-25 % of the time with 2-3 units and no true gain); an interval that excludes 0 alone calls a gain of
    +0.001 reproduced. Both conditions together, at the family's level, say "reproduced" for a true gain of 0
    at most ALPHA / 2 of the time (tests/test_verdicts.py simulates it)."""
    if len(per_unit) < MIN_UNITS:
        return "undecided"
    mean = sum(per_unit) / len(per_unit)
    if mean >= threshold and low > 0:
        return "reproduced"
    if mean <= -threshold and high < 0:
        return "reversed"
    if high < threshold:
        return f"smaller than claimed: {mean:+.3f} [{low:+.3f}, {high:+.3f}], under +{threshold:g}"
    return "undecided"


def decide(family: dict[str, list[float]], threshold: float, fitted: dict[str, bool] | None = None,
           alpha: float = ALPHA) -> dict[str, dict]:
    """Every claim of one results table at once: {name: per-unit gains} -> {name: {per_unit, mean, low, high,
    p, level, family, verdict}}. A claim whose models did not fit (fitted[name] False) or that has no unit left
    is UNFIT; one with fewer than MIN_UNITS units is undecided.

    Holm's adjustment over the table's m comparisons (all of them, measured or not): order the measured ones
    by their two-sided p-value for "no gain" (a t-test over units); the one of rank r (0, 1, ...) is tested at
    level alpha / (m - r) as long as every one before it was rejected, and once one is not, every later one
    keeps that one's level, so none of them is rejected either. Each interval is the t-interval at its level
    (1 - level confidence): it excludes 0 exactly when Holm rejects "no gain" for it."""
    fitted, m, out = fitted or {}, len(family), {}
    measured = {}
    for name, values in family.items():
        values = [float(v) for v in values]
        if not fitted.get(name, True) or not values:  # measured or not, no verdict: the mean is shown as it is
            out[name] = {"per_unit": values, "family": m, "verdict": UNFIT,
                         **({"mean": sum(values) / len(values)} if values else {})}
        elif len(values) < MIN_UNITS:
            out[name] = {"per_unit": values, "mean": sum(values) / len(values), "family": m,
                         "verdict": f"undecided ({len(values)} unit(s): {MIN_UNITS} needed)"}
        else:
            measured[name] = values
    level, rejecting = alpha / m if m else alpha, True
    for rank, name in enumerate(sorted(measured, key=lambda n: p_value(measured[n]))):
        p = p_value(measured[name])
        if rejecting:
            level = alpha / (m - rank)
            rejecting = p <= level
        mean, low, high = t_interval(measured[name], level)
        out[name] = {"per_unit": measured[name], "mean": mean, "low": low, "high": high, "p": p, "level": level,
                     "family": m, "verdict": rule(measured[name], low, high, threshold)}
    return {name: out[name] for name in family}


def p_value(values: list[float]) -> float:
    """Two-sided p-value of "the mean gain is 0" from a t-test over independent units (n - 1 degrees of freedom)."""
    n = len(values)
    mean = sum(values) / n
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    if sd == 0:
        return 0.0 if mean else 1.0
    return t_tail(mean / (sd / n ** 0.5), n - 1)


def unit_verdict(per_unit, threshold: float, fitted: bool = True) -> dict:
    """One claimed gain alone: a table of one comparison (decide)."""
    return decide({"claim": list(per_unit)}, threshold, {"claim": fitted})["claim"]


def caption(family: dict[str, dict], alpha: float = ALPHA) -> str:
    """What a table's verdicts rest on, for the line above it: the family and its adjusted levels."""
    m = len(family)
    levels = sorted({r["level"] for r in family.values() if "level" in r})
    shown = ", ".join(f"{1 - v:.4g}" for v in levels) or "none measured"
    return (f"One family of {m} comparison(s), Holm-adjusted at {alpha:g} over the table: each interval is the "
            f"t-interval over independent units at its adjusted confidence ({shown}).")


def failed(outcome: str) -> bool:
    """Whether a verdict says the claim does not hold (as opposed to: holds, or cannot be told)."""
    return outcome.startswith(("not reproduced", "reversed", "smaller than claimed"))


def short(outcome: str) -> str:
    """A verdict as a summary table writes it: "smaller than claimed: +0.026 [...], under +0.05" ->
    "smaller than claimed" (the numbers stand in their own column)."""
    return outcome.split(": ")[0] if outcome.startswith("smaller than claimed") else outcome


def all_of(verdicts: list[str]) -> str:
    """The verdict of a claim that needs every one of several comparisons ("X beats each of Y and Z"): each
    comparison reproduced -> reproduced; one decidedly failing -> the claim fails (partly, where another
    holds); otherwise some comparison is open, and so is the claim: undecided, or UNFIT where none could
    be measured on fitted models."""
    if any(failed(v) for v in verdicts):
        return verdict(False, "reproduced" in verdicts)
    if verdicts and all(v == "reproduced" for v in verdicts):
        return "reproduced"
    return UNFIT if verdicts and all(v == UNFIT for v in verdicts) else "undecided"
