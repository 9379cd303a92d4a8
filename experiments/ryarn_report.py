"""The writing of the ryarn experiment (experiments/ryarn.py is the study: what it trains, measures and claims):
results/ryarn.md, the figure results/ryarn.png, the claims table of README.md and docs/randomized-yarn.md
(summary), and decide_again for python eval.py --experiment ryarn --render. How the design was chosen, design by
design, is told in docs/randomized-yarn.md; the results point there.
"""
from __future__ import annotations

import tasks
from eval import plot_curves
from experiments.common import beyond, fmt, line_styles, seed_curve, spread, wrapped
from experiments.ryarn import (CLAIMS, MODELS, MULTIPLES, PRESETS, TASK, TASK_OPTIONS, TEST_SEED, VALIDATION_SEED,
                               claims, fitted_models)
from experiments.stats import caption, detectable, rule_text, short

# The results' one line on how the design was chosen; the history itself is prose in the experiment's docs page.
DESIGN_HISTORY = ("How this design was chosen (five earlier designs, what each showed and what changed): "
                  "[docs/randomized-yarn.md](../docs/randomized-yarn.md#how-this-design-was-chosen).")


def decide_again(data: dict) -> dict:
    """The recorded results with their claims decided again from their numbers under the current rule and the
    fit bar of their preset (python eval.py --experiment ryarn --render)."""
    data = {**data, "fit_bar": PRESETS[data["scale"]]["fit_bar"]}
    data["claims"] = claims(data, data["fit_bar"])
    return data


def per_base(runs_by_base: list[list[list[float]]]) -> list[list[float]]:
    """One accuracy list per base: the mean over that base's fine-tuning seeds at each length."""
    return [[spread(values)["mean"] for values in zip(*runs)] for runs in runs_by_base]


def accuracy_table(by_method: dict, lengths: list[int]) -> list[str]:
    """Mean ± sd over bases (each base: the mean over its seeds) at each length, and beyond L."""
    rows = ["| method | " + " | ".join(map(str, lengths)) + " | beyond L |", "|---|" + "---:|" * (len(lengths) + 1)]
    for method, runs_by_base in by_method.items():
        bases = per_base(runs_by_base)
        cells = [fmt(list(a), ".3f", "sd") for a in zip(*bases)] + [fmt([beyond(a) for a in bases], ".3f", "sd")]
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return rows


def header(data: dict) -> list[str]:
    """The title, the command and what it cost, and the setup."""
    setup, L, s = data["settings"], data["settings"]["L"], data["settings"]["factor"]
    lengths = [m * L for m in MULTIPLES]
    runtime = data["runtime"]
    return [
        "# Randomized YaRN (Paper R, arXiv 2606.23687) on a small GPT", "",
        f"Command: `{data['command']}`  ",
        f"Runtime: {runtime['wall_s'] / 60:.1f} min wall clock, {runtime['cpu_s'] / 60:.1f} min of CPU time "
        f"({runtime['threads']} torch thread(s) in each of {runtime['jobs']} process(es) at once, "
        f"{runtime['cores']} cores, shared with other work).", "",
        f"**Setup.** Task `{TASK}` ({', '.join(f'{k}={v}' for k, v in TASK_OPTIONS.items())}; chance "
        f"1/{TASK_OPTIONS['values']}): facts key=value among filler, the queried key stated at least twice with "
        f"different values, answer its latest value. {len(setup['bases'])} RoPE GPTs ({setup['layers']} "
        f"layers, 2 heads, dim 64), the bases, are pretrained from seeds {', '.join(map(str, setup['bases']))} at "
        f"lengths {L // 2}..{L} with contiguous positions, so L = {L}, until held-out accuracy at L reaches "
        f"{setup['pretrain_bar']} (at most {setup['pretrain']} steps). Every method fine-tunes every base for "
        f"{setup['finetune']} steps at the same lengths, with seeds {', '.join(map(str, setup['seeds']))}. YaRN: "
        f"s = {s} over L (sL = {s * L}). Randomized positions: n sorted distinct ids from [0, M), M widening from "
        f"L to 2L in Paper R's stages (1, 1.25, 1.5, 2, 2 x L, equal stages), the default of train.py --llm too. "
        f"Test: contiguous positions at {', '.join(map(str, lengths))}, the same {setup['samples']} sequences per "
        f"length for every model, drawn from seed {TEST_SEED}, used nowhere in training or selection. \"Beyond "
        f"L\" is a model's mean test accuracy at {', '.join(map(str, lengths[1:]))}; the sampled range ends at "
        "2L, well inside that.", ""]


def rule_section(data: dict) -> list[str]:
    n_test = data["settings"]["samples"]
    return [
        "## The rule (fixed before the run; the pooled primary estimate after it)", "",
        rule_text(units="each pretrained base (the mean over its fine-tuning seeds; the bases are the units)"), "",
        "**Primary** (named before the run, what isolates randomization): ryarn against trained YaRN and against "
        "YaRN at inference only, and the gain growing with length. Each is one gain per base, the mean over the "
        "learning rates of the grid at which both sides fitted on that base, matched rate by rate: one family. "
        "**Exploratory**: the same claims at each rate alone (a family), and the rest, each method at the rate "
        "with the best mean validation accuracy at L over the bases (ties: the smaller), another family. A base "
        "counts for a claim when it learned the task (validation accuracy at L >= "
        f"{data['fit_bar']}) and so did every fine-tune the claim compares on it. The pooled primary estimate "
        "replaced per-rate primary verdicts after this run (issue 48: one estimate over matched conditions, never "
        "a rate picked afterwards); the per-rate rows are kept below as exploratory.", "",
        f"**Independence.** The bases are pretrained from their own seeds, but every fine-tune used seed "
        f"{', '.join(map(str, data['settings']['seeds']))}: on every base the same training batches and the same "
        "draws of positions, so the fine-tuning seed's own variance is not in these intervals and no seed-level "
        f"verdict can be given (one seed). Every model is scored on the same {n_test} test sequences per length; "
        "the binomial "
        f"standard error of an accuracy over them is at most {0.5 / n_test ** 0.5:.3f} (a beyond-L mean over "
        f"{len(MULTIPLES) - 1} lengths: at most {0.5 / (n_test * (len(MULTIPLES) - 1)) ** 0.5:.3f}), against "
        "intervals of several hundredths below.", ""]


def gain_row(label: str, r: dict) -> str:
    """One comparison: gain per base, mean [adjusted interval], detectable at 80 % power, verdict."""
    per = ", ".join(f"{g:+.3f}" for g in r["per_unit"]) or "-"
    if "low" not in r:
        return f"| {label} | {per} | " + (f"{r['mean']:+.3f}" if "mean" in r else "-") + f" | - | **{r['verdict']}** |"
    sd = spread(r["per_unit"])["sd"]
    return (f"| {label} | {per} | {r['mean']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] | "
            f"{detectable(sd, len(r['per_unit']), r['level']):.3f} | **{r['verdict']}** |")


def matched_table(data: dict) -> list[str]:
    """The primary claims pooled over the grid's rates, then each at every rate (exploratory)."""
    primary = {n: c for n, c in data["claims"].items() if c["primary"]}
    head = ["| claim | gain per base | mean [adjusted interval] | detectable | verdict |", "|---|---|---|---:|---|"]
    rows = ["Primary, pooled over the rates: " + caption(primary), "", *head]
    rows += [gain_row(f"{n} ({c['better']} − {c['worse']})", c) for n, c in primary.items()]
    family = {f"{n} at {lr}": r for n, c in primary.items() for lr, r in c["by_rate"].items()}
    rows += ["", "Exploratory, each rate alone: " + caption(family), "", *head]
    rows += [gain_row(f"{n} at lr {lr}", r) for n, c in primary.items() for lr, r in c["by_rate"].items()]
    return rows


def claims_table(data: dict) -> list[str]:
    family = {name: r for name, r in data["claims"].items() if not r["primary"]}
    rows = [caption(family), "", "| claim | Paper R | gain per base | mean [adjusted interval] | verdict |",
            "|---|---|---|---|---|"]
    for name, result in family.items():
        per = ", ".join(f"{g:+.3f}" for g in result["per_unit"]) or "-"
        interval = f"{result['mean']:+.3f} [{result['low']:+.3f}, {result['high']:+.3f}]" if "low" in result \
            else f"{result['mean']:+.3f}" if "mean" in result else "-"
        rows.append(f"| {name} ({result['better']} − {result['worse']}) | {CLAIMS[name][0]} | {per} | {interval} | "
                    f"**{result['verdict']}** |")
    return rows


# The claims as README.md's table names them (experiments/common.py: rendered blocks).
SHORT = {"ryarn > yarn beyond L": "ryarn > yarn", "ryarn > zero-shot+yarn beyond L": "ryarn > zero-shot+yarn",
         "ryarn's gain over yarn grows with length": "gain over yarn grows", "ryarn > ft beyond L": "ryarn > ft",
         "ryarn > rpe beyond L": "ryarn > rpe", "the curriculum helps ryarn": "curriculum helps ryarn",
         "the curriculum helps rpe": "curriculum helps rpe", "ryarn costs accuracy at L, against ft": "cost at L, ft",
         "ryarn costs accuracy at L, against yarn": "cost at L, yarn",
         "zero-shot+yarn > ft beyond L": "zero-shot+yarn > ft", "zero-shot+yarn > rpe beyond L": "zero-shot+yarn > rpe"}


def summary(data: dict) -> str:
    """README.md's table: each claim, the bases it rests on, its mean [adjusted interval] and its verdict; the
    primary ones first, each pooled over the grid's learning rates."""
    rows = ["| claim (beyond L unless said; * primary, pooled over rates) | bases | mean [adjusted interval] | "
            "verdict |", "|---|---|---|---|"]
    for name, r in data["claims"].items():
        interval = f" [{r['low']:+.3f}, {r['high']:+.3f}]" if "low" in r else ""
        mean = f"{r['mean']:+.3f}{interval}" if "mean" in r else "-"
        label = f"**{SHORT[name]}** *" if r["primary"] else SHORT[name]
        rows.append(f"| {label} | {len(r['per_unit'])} | {mean} | {short(r['verdict'])} |")
    rates = ", ".join(f"{lr:g}" for lr in data["settings"]["lrs"])
    bases = data["base_validation"]
    return "\n".join(rows) + "\n\n" + wrapped(
        f"\\* each base's gain is its mean over the rates {rates}, both sides at each. The {len(bases)} bases stopped "
        f"pretraining at a fit check of {data['settings']['pretrain_bar']}; on the validation sequences they read "
        f"{min(bases):.3f}-{max(bases):.3f} at L.") + "\n"


def selection_section(data: dict) -> list[str]:
    """The learning-rate grid: validation accuracy at L (what chose) and beyond L (shown, never used to choose),
    means over the bases."""
    lrs = data["settings"]["lrs"]
    rows = ["## Learning rates", "",
            f"Every method of the grid fine-tuned every base at every rate; mean over the bases of the validation "
            f"accuracy at L (seed {VALIDATION_SEED}, {data['settings']['validation_samples']} sequences) / the test "
            "accuracy beyond L. Each method's chosen rate (best validation at L; ties: the smaller) is what the "
            "exploratory claims and the accuracy table use; beyond L chose nothing.", "",
            "| method | " + " | ".join(f"lr {lr:g}: at L / beyond L" for lr in lrs) + " | chosen |",
            "|---|" + "---|" * (len(lrs) + 1)]
    for method, grid in data["learning_rates"]["grid"].items():
        cells = [f"{grid[f'{lr:g}']['validation']:.3f} / {grid[f'{lr:g}']['beyond']:.3f}" for lr in lrs]
        rows.append(f"| {method} | " + " | ".join(cells) + f" | {data['learning_rates']['chosen'][method]:g} |")
    return rows + [""]


def fit_line(data: dict) -> str:
    fits = ", ".join(f"{b}: {v:.3f}" for b, v in zip(data["settings"]["bases"], data["base_validation"]))
    fitted = fitted_models(data, data["fit_bar"])
    unfit = [f"{m} on base {data['settings']['bases'][i]}" for m, by_base in fitted.items()
             for i, ok in enumerate(by_base) if not ok and data["base_validation"][i] >= data["fit_bar"]]
    under = sum(v < data["fit_bar"] for v in data["base_validation"])
    return (f"Validation accuracy at L of the bases (the fit bar is {data['fit_bar']}; {under} under it): "
            f"{fits}. Pretraining steps: {', '.join(map(str, data['pretrain_steps']))}. Fine-tunes at their chosen "
            f"rate under the bar on a base that fitted: {', '.join(unfit) or 'none'}.")


def markdown(data: dict) -> str:
    s, lengths = data["settings"]["factor"], data["lengths"]
    out = header(data) + [DESIGN_HISTORY, ""] + rule_section(data) + [fit_line(data), ""]
    out += ["## Primary claims, pooled over matched learning rates", ""] + matched_table(data)
    out += ["", "## Exploratory claims, each method at its chosen rate", ""] + claims_table(data)
    out += ["", f"## `{TASK}`: test accuracy by length at the chosen rates (mean ± sd over bases)", ""]
    out += accuracy_table(data["accuracy"], lengths)
    out += ["", "Methods: " + "; ".join(f"`{m}`: {what}" for m, what in MODELS.items()) + ".", ""]
    out += selection_section(data)
    out += ["## How far to randomize: the top of the range (ryarn)", ""]
    if len(data["sweep"]) > 2:
        out += [f"The same recipe with the range widened to {', '.join(f'{r}L' for r in data['settings']['ranges'])}"
                f" (fine-tuning seed {data['settings']['seeds'][0]} on every base); and the 2L models read at "
                f"inference with a larger factor s' = {2 * s}.", ""]
    else:
        out += [f"The 2L models read at inference with a larger factor s' = {2 * s}; wider ranges are in --full.", ""]
    out += accuracy_table(data["sweep"], lengths)
    sweep = {name: spread([beyond(a) for a in per_base(runs)])["mean"] for name, runs in data["sweep"].items()}
    best = max(sweep, key=sweep.get)
    out += ["", f"Best beyond L: `{best}` ({sweep[best]:.3f}).", ""]
    if data["controls"]:
        out += ["## Controls: copy and fixed-offset retrieval", "",
                "Both define the answer by position, which is what random gaps take away: in copy the i-th output "
                "is the token exactly n + 1 places back, in retrieval the token exactly k places back. Randomized "
                "positions are not expected to help here. Bases "
                f"{', '.join(map(str, data['settings']['control_bases']))}, one fine-tuning seed, each method at "
                "its chosen rate from the main task.", ""]
        for task, by_method in data["controls"].items():
            out += [f"### {task} (chance 1/{tasks.task_options(task)['symbols']})", ""]
            out += accuracy_table(by_method, lengths) + [""]
    out += [f"Every number: `results/ryarn.json`; every model's own command, to retrain it alone: its `commands` "
            f"({len(data['commands'])} models). Figure: `results/ryarn.png`."]
    return "\n".join(out) + "\n"


def styles(data: dict) -> dict[str, dict]:
    """Every label the figure draws, each alike in every panel: the methods, then the sweep's variants ("ryarn,
    range 2L" is the ryarn model itself). Dashed: not fine-tuned; thick: the method Paper R proposes."""
    sweep = [name for name in data["sweep"] if name != "ryarn, range 2L"]
    out = line_styles(list(MODELS) + sweep, {"zero-shot": {"ls": "--"}, "zero-shot+yarn": {"ls": "--"},
                                              "ryarn": {"lw": 2.5}})
    return out | {"ryarn, range 2L": out["ryarn"]}


def figure(data: dict):
    L, lengths = data["settings"]["L"], data["lengths"]
    style = styles(data)

    def draw(plt):
        panels = [(f"{TASK}: every method", data["accuracy"]), ("ryarn: the top of the range, and s'", data["sweep"])]
        panels += [(f"control: {task}", by) for task, by in data["controls"].items()]
        fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4))
        for ax, (title, by_method) in zip(axes, panels):
            curves = {m: seed_curve("length", lengths, per_base(runs)) for m, runs in by_method.items()}
            plot_curves(ax, curves, "length", (L // 2, L), styles=style)
            ax.axvline(2 * L, color="grey", ls=":", lw=1)  # the top of the sampled range
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.set_title(title, fontsize=9)
        fig.suptitle(f"Randomized YaRN on a small GPT (L = {L}, s = {data['settings']['factor']}; each method at its "
                     "chosen rate)\ndotted: top of the sampled range; lines: mean over bases, bands: min-max",
                     fontsize=10)
        fig.tight_layout()
        return fig

    return draw
