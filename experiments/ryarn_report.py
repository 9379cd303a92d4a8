"""The writing of the ryarn experiment (experiments/ryarn.py is the study: what it trains, measures and claims):
results/ryarn.md and its figure, results/ryarn-probe.md (the probe, and the default it plans), and decide_again
for python eval.py --experiment ryarn --render. The earlier design, fine-tuning at the pretrained length, is
results/ryarn-pretrained-length.md, an ablation told in docs/randomized-yarn.md.
"""
from __future__ import annotations

from eval import plot_curves
from experiments.common import fmt, line_styles, probe_cost, probe_table, seed_curve, spread, wrapped
from experiments.ryarn import (MODELS, PRESETS, PRETRAIN_TASK, READ_FACTORS, SOLVED_BAR, TARGETS, beyond_ft,
                               beyond_pre, claims, probe_tunes)
from experiments.stats import THRESHOLD, caption, rule_text, short


def decide_again(data: dict) -> dict:
    """The recorded results with their claims decided again under the current rule."""
    return {**data, "claims": claims(data)}


# ---------------------------------------------------------------------------------------------------------
# The probe, and the default it plans
# ---------------------------------------------------------------------------------------------------------


def cost_per_step(probe: dict) -> dict:
    """CPU seconds per step of each stage, as the probe measured them (its zero-shot readings not counted)."""
    fits = probe["fits"]
    pre_steps = sum(f["last"][0] for f in fits["pretraining"].values())
    ft_steps = sum(f["last"][0] for task in probe["targets"] for f in fits[task].values())
    return {"pretraining": probe["stage_cpu_s"]["pretraining"] / pre_steps,
            "fine-tuning": probe["stage_cpu_s"]["fine-tuning"] / ft_steps}


def planned_cost(probe: dict, setup: dict) -> dict:
    """What a preset costs at the probe's measured rates: CPU-minutes of pretraining (every base to its cap, the
    high side), fine-tuning, and reading every model (as many readings as the study makes), and the wall-clock
    minutes at 2 jobs."""
    per = cost_per_step(probe)
    bases, targets, lrs = len(setup["bases"]), len(TARGETS), len(setup["lrs"])
    tunes = targets * lrs * bases * len(probe_tunes(setup))
    # readings per target and base: the base (1 + factors), ft (1 + factors), rpe (1), yarn and every range (factors)
    factors = len(READ_FACTORS)
    reads = targets * bases * ((1 + factors) + lrs * ((1 + factors) + 1 + factors * (len(setup["ranges"]) + 1)))
    one_read = probe["stage_cpu_s"]["one reading of one model"] * setup["samples"] / probe["settings"]["samples"]
    minutes = {"pretraining": bases * setup["pretrain"] * per["pretraining"] / 60,
               "fine-tuning": tunes * setup["finetune"] * per["fine-tuning"] / 60,
               "reading": reads * one_read / 60}
    return {"models": bases + tunes, "readings": reads, "cpu_min": minutes,
            "wall_min_at_2_jobs": sum(minutes.values()) / 2}


def plan(probe: dict) -> list[str]:
    """How the default is planned from the probe: the pretraining cap and the fine-tuning budget against the steps
    the probe needed, and the default's and --full's predicted cost."""
    default, full = PRESETS["default"], PRESETS["full"]
    pre = [f["steps_to_fit"] for f in probe["fits"]["pretraining"].values()]
    tunes = [f["steps_to_fit"] for task in probe["targets"] for f in probe["fits"][task].values()]
    unfit = [f"{m} on {task}" for task in probe["targets"] for m, f in probe["fits"][task].items()
             if f["steps_to_fit"] is None]
    cap = probe["settings"]["probe_finetune"]
    out = ["## The default this plans", "",
           f"Pretraining: at most {default['pretrain']} steps, stopped at {default['pretrain_bar']} on the mix (the "
           f"probe's bases: {', '.join(str(s) if s else 'not within the cap' for s in pre)}); the results list "
           f"each base's pretraining accuracy. Fine-tuning: {default['finetune']} steps for every model at "
           f"{', '.join(f'{lr:g}' for lr in default['lrs'])}, never stopped at a bar: the probe's slowest fitted "
           f"fine-tune needed {max((s for s in tunes if s), default='-')}, and "
           + (f"{', '.join(unfit)} did not fit within its {cap} steps" if unfit else
              f"every one fitted within its {cap} steps")
           + " (the budget must cover the slowest arm; one that still does not fit leaves its claims undecided, "
           "models did not fit)."]
    for name, setup in (("default", default), ("--full", full)):
        cost = planned_cost(probe, setup)
        parts = ", ".join(f"{k} {v:.0f}" for k, v in cost["cpu_min"].items())
        out += ["", f"`{name}`: {len(setup['bases'])} bases, {cost['models']} models, {cost['readings']} readings: "
                    f"{sum(cost['cpu_min'].values()):.0f} CPU-min ({parts}), so about "
                    f"{cost['wall_min_at_2_jobs']:.0f} min wall at --jobs 2 --threads 1 on 2 free cores (pretraining "
                    "counted to its cap: the high side)."]
    return out


def probe_markdown(data: dict) -> str:
    setup, L_ft, L_pre = data["settings"], data["settings"]["ft_len"][1], data["settings"]["pre_len"][1]
    bases = list(data["zero_shot"])
    per = cost_per_step(data)
    out = ["# Randomized YaRN on a small GPT: the probe", "", probe_cost(data), "",
           f"Measured per stage: pretraining {1000 * per['pretraining']:.1f} CPU-s per 1000 steps (lengths "
           f"{setup['pre_len'][0]}..{L_pre}), fine-tuning {1000 * per['fine-tuning']:.1f} CPU-s per 1000 steps "
           f"(lengths {setup['ft_len'][0]}..{L_ft}); reading one model once (every test length and both validation "
           f"lengths, {setup['samples']} sequences each): {data['stage_cpu_s']['one reading of one model']:.1f} CPU-s.",
           "", f"**What it measures.** {len(bases)} bases ({setup['layers']}-layer RoPE GPTs) pretrained on "
           f"`{PRETRAIN_TASK}` at L_pre = {L_pre} until held-out accuracy at L_pre reaches {setup['pretrain_bar']} "
           f"(checked every 500 steps, at most {setup['pretrain']}); their zero-shot accuracy on each target; on "
           f"{bases[0]}, every method fine-tuned at lr {setup['lrs'][0]:g} on each target at L_ft = {L_ft} until "
           f"its held-out accuracy at L_ft reaches {setup['fit_bar']} (checked every 100 steps, at most "
           f"{setup['probe_finetune']}). That check is train.py's: rpe and ryarn are read with random positions "
           "over their whole range, as they train (the default's gate reads every model with contiguous positions "
           "at L_ft). Nothing beyond L_ft is measured after fine-tuning: the probe plans the budget, never by "
           "results.", "",
           "## Pretraining", ""]
    out += probe_table({"steps to the bar": data["fits"]["pretraining"]}, list(data["fits"]["pretraining"]), "base")
    out += ["", "## Zero-shot accuracy on the targets (before any fine-tuning)", "",
            "| base | " + " | ".join(f"{t} at {n}" for t in data["targets"] for n in (L_ft, L_pre)) + " |",
            "|---|" + "---:|" * (2 * len(data["targets"]))]
    out += [f"| {b} | " + " | ".join(f"{data['zero_shot'][b][t][str(n)]:.3f}" for t in data["targets"]
                                    for n in (L_ft, L_pre)) + " |" for b in bases]
    out += ["", f"Chance: latest_recall 1/{TARGETS['latest_recall']['values']}, multi_hop "
                f"1/{TARGETS['multi_hop']['keys']} over keys (1/2 between the chains' ends).", "",
            f"## Fine-tuning at L_ft on {bases[0]}: steps to fit", ""]
    out += probe_table({t: data["fits"][t] for t in data["targets"]}, list(data["fits"][next(iter(data["targets"]))]),
                       "method")
    out += ["", "## The design, target by target", "",
            f"A target is refused where a base already reaches {SOLVED_BAR} zero-shot at L_ft, or no method fits it "
            "at L_ft within the probe's cap.", ""]
    out += [f"- `{task}`: **{verdict}**" for task, verdict in data["design"].items()]
    return "\n".join(out + [""] + plan(data)) + "\n"


# ---------------------------------------------------------------------------------------------------------
# The results
# ---------------------------------------------------------------------------------------------------------


def per_base(by_lr: dict) -> list[list[float]]:
    """One accuracy list per base: the mean over the learning rates at each length."""
    runs = list(by_lr.values())
    return [[spread(values)["mean"] for values in zip(*(run[b] for run in runs))] for b in range(len(runs[0]))]


def length_label(n: int, setup: dict) -> str:
    marks = {setup["ft_len"][1]: " (L_ft)", setup["pre_len"][1]: " (L_pre)",
             setup["factor"] * setup["pre_len"][1]: " (s L_pre)"}
    return f"{n}{marks.get(n, '')}"


def accuracy_table(arms: dict, data: dict) -> list[str]:
    """Mean ± sd over bases (each base: the mean over the rates) at each length, beyond L_ft and beyond L_pre."""
    labels = [length_label(n, data["settings"]) for n in data["lengths"]]
    rows = ["| method | " + " | ".join(labels) + " | beyond L_ft | beyond L_pre |",
            "|---|" + "---:|" * (len(labels) + 2)]
    for arm, by_lr in arms.items():
        bases = per_base(by_lr)
        cells = [fmt(list(a), ".3f", "sd") for a in zip(*bases)]
        cells += [fmt([beyond_ft(a) for a in bases], ".3f", "sd"), fmt([beyond_pre(a) for a in bases], ".3f", "sd")]
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    return rows


def claims_table(results: dict, primary: bool) -> list[str]:
    family = {f"{t}: {n}": r for t, by in results.items() for n, r in by.items() if r["primary"] == primary}
    rows = [caption(family), "", "| target | claim | gain per base | mean [adjusted interval] | verdict |",
            "|---|---|---|---|---|"]
    for key, r in family.items():
        task, name = key.split(": ", 1)
        per = ", ".join(f"{g:+.3f}" for g in r["per_unit"]) or "-"
        rows.append(f"| {task} | {name} | {per} | {estimate(r)} | **{r['verdict']}** |")
    return rows


def estimate(r: dict) -> str:
    """'+0.123 [+0.045, +0.201]': a decided gain and its adjusted interval; '-' where nothing was measured."""
    return (f"{r['mean']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]" if "low" in r else
            f"{r['mean']:+.3f}" if "mean" in r else "-")


def beyond_pre_by_method(data: dict, task: str) -> str:
    """'ft 0.412, yarn 0.530, ...': each method's mean accuracy beyond L_pre over bases, on one target."""
    return ", ".join(f"{arm} {spread([beyond_pre(a) for a in per_base(by_lr)])['mean']:.3f}"
                     for arm, by_lr in data["accuracy"][task].items())


def summary(data: dict) -> str:
    """README.md's block: the primary claims on both targets with their verdicts, and Wu et al.'s prediction
    against the measurement."""
    rows = ["| target | primary claim | mean [adjusted interval] | verdict |", "|---|---|---|---|"]
    rows += [f"| {task} | {name} | {estimate(r)} | {short(r['verdict'])} |"
             for task, by in data["claims"].items() for name, r in by.items() if r["primary"]]
    wu = "; ".join(f"`{task}` {estimate(r)} ({short(r['verdict'])})" for task in data["targets"]
                   for r in [data["claims"][task]["ft+yarn > ft beyond L_pre"]])
    return "\n".join(rows) + "\n\n" + wrapped(f"Wu et al.'s prediction, ft+yarn − ft beyond L_pre: {wu}.") + "\n"


def beyond(data: dict) -> str:
    """docs/randomized-yarn.md's block: each method's mean accuracy beyond L_pre, every base counted (fitted or
    not), on each target."""
    lines = [f"- `{task}`: {beyond_pre_by_method(data, task)}" for task in data["targets"]]
    return (f"Mean test accuracy beyond L_pre (at {', '.join(str(n) for n in data['lengths'][3:])}), over all "
            f"{len(data['settings']['bases'])} bases, fitted or not:\n\n" + "\n".join(lines) + "\n")


def header(data: dict) -> list[str]:
    setup, rt = data["settings"], data["runtime"]
    L_ft, L_pre, s = setup["ft_len"][1], setup["pre_len"][1], setup["factor"]
    ranges = ", ".join(map(str, setup["ranges"]))
    return [
        "# Randomized YaRN (Paper R, arXiv 2606.23687) on a small GPT, in Paper R's regime", "",
        f"Command: `{data['command']}`  ",
        f"Runtime: {rt['wall_s'] / 60:.1f} min wall clock, {rt['cpu_s'] / 60:.1f} min of CPU time ({rt['threads']} "
        f"torch thread(s) in each of {rt['jobs']} process(es), {rt['cores']} cores).", "",
        f"**Regime.** {len(setup['bases'])} bases ({setup['layers']}-layer RoPE GPTs, 2 heads, dim 64), each a unit, "
        f"pretrained with contiguous positions on `{PRETRAIN_TASK}` (copy, reverse, shift; the targets' 25 token ids, "
        f"never their question) at lengths {setup['pre_len'][0]}..{L_pre}: L_pre = {L_pre}. Fine-tuning teaches "
        f"each target at lengths {setup['ft_len'][0]}..{L_ft}: L_ft = {L_ft} = L_pre / {L_pre // L_ft}, "
        f"{setup['finetune']} steps at every rate of {', '.join(f'{lr:g}' for lr in setup['lrs'])}, the seed of a "
        f"base's fine-tunes differing from base to base and shared by its methods. YaRN: original length L_pre, "
        f"s = {s} (s L_pre = {s * L_pre}). Randomized positions (rpe, ryarn): n sorted distinct ids from [0, M), "
        f"M widened from L_ft to the top of the range in the stages a secondary digest gives Paper R; the abstract "
        f"says only \"a larger position range\" giving \"out-of-distribution positional representations\", so "
        f"the top is swept: {ranges} (the first is the primary ryarn and rpe's). Every YaRN-read arm is read at s' in "
        f"{', '.join(f'{f:g}' for f in data['read_factors'])}, the better mean validation accuracy at "
        f"{data['validation_length']} (not a test length; seed {data['validation_seed']}) chosen per arm and "
        f"target. Test: contiguous positions at {', '.join(map(str, data['lengths']))}, {setup['samples']} "
        f"sequences per length from seed {data['test_seed']}, the same for every model.", "",
        "**Before the run (Wu, Liu, Jadbabaie, arXiv 2607.07678).** " + "; ".join(
            f"`{t}`: {p}" for t, p in data["prediction"].items()) + ". Read as ft+yarn − ft beyond L_pre.", ""]


def rule(data: dict) -> list[str]:
    return [
        "## The rule (fixed before the run)", "",
        f"A gain is measured on each base: at each learning rate with both sides fine-tuned at it, then the mean "
        f"over the rates where every side fitted (validation accuracy at L_ft >= {data['fit_bar']}); never the best "
        "rate afterwards. **Primary**, named before the run: " + ", ".join(data["primary"]) + ", on both targets: "
        "one family. Everything else is exploratory, another family.", "",
        rule_text(THRESHOLD, units="each pretrained base (the bases are the units; fine-tuning seeds vary per base)"),
        ""]


def markdown(data: dict) -> str:
    if "zero_shot" in data:
        return probe_markdown(data)
    out = header(data) + rule(data)
    pre = ", ".join(str(r["steps_to_fit"]) if r["steps_to_fit"] else
                    f"{r['last'][1]:.2f} at {r['last'][0]}" if r["last"][1] is not None else f"{r['last'][0]} steps"
                    for r in data["pretraining"])
    out += [f"Pretraining on the mix, by base: steps to {data['settings']['pretrain_bar']}, or the last check "
            f"(a base under the bar still counts: the claims are about what fine-tuning does to it): {pre}.", ""]
    if "probe" in data:
        probe = data["probe"]
        out += ["## How this design was planned", "", "From [results/ryarn-probe.md](ryarn-probe.md): " +
                probe_cost(probe) + " Its verdict on the design: " +
                "; ".join(f"`{t}` {v}" for t, v in probe["design"].items()) + ".", ""]
    if data.get("design_changes"):
        out += ["## Changed after seeing measured accuracies", ""] + [f"- {c}" for c in data["design_changes"]] + [""]
    out += ["## Primary claims", ""] + claims_table(data["claims"], True)
    out += ["", "## Exploratory claims", ""] + claims_table(data["claims"], False)
    wu = [f"`{t}` ({data['prediction'][t]}): ft+yarn − ft beyond L_pre {estimate(r)}, {r['verdict']}"
          for t in data["targets"] for r in [data["claims"][t]["ft+yarn > ft beyond L_pre"]]]
    out += ["", "Wu et al.'s prediction against the measurement: " + "; ".join(wu) + "."]
    for task in data["targets"]:
        out += ["", f"## `{task}`: test accuracy by length (mean ± sd over bases; each base the mean over rates)", ""]
        out += accuracy_table(data["accuracy"][task], data)
        chosen = ", ".join(f"{arm} {k}" for arm, k in data["chosen_factors"][task].items())
        out += ["", f"Inference factors chosen on validation: {chosen}."]
    out += ["", "Methods: " + "; ".join(f"`{m}`: {what}" for m, what in MODELS.items()) + ".", "",
            "The earlier design, fine-tuning at the pretrained length (a regime Paper R does not claim): "
            "[results/ryarn-pretrained-length.md](ryarn-pretrained-length.md), told in "
            "[docs/randomized-yarn.md](../docs/randomized-yarn.md).", "",
            f"Every number: `results/ryarn.json`; every model's own command: its `commands` "
            f"({len(data['commands'])} models). Figure: `results/ryarn.png`."]
    return "\n".join(out) + "\n"


def figure(data: dict):
    if "zero_shot" in data:  # a probe draws nothing
        return None
    setup, lengths = data["settings"], data["lengths"]
    arms = list(next(iter(data["accuracy"].values())))
    style = line_styles(arms, {"zero-shot": {"ls": "--"}, "zero-shot+yarn": {"ls": "--"}, "ryarn": {"lw": 2.5}})

    def draw(plt):
        fig, axes = plt.subplots(1, len(data["targets"]), figsize=(5.2 * len(data["targets"]), 4.4))
        for ax, task in zip(axes, data["targets"]):
            curves = {arm: seed_curve("length", lengths, per_base(by_lr))
                      for arm, by_lr in data["accuracy"][task].items()}
            plot_curves(ax, curves, "length", (setup["ft_len"][0], setup["ft_len"][1]), styles=style)
            ax.axvline(setup["pre_len"][1], color="grey", ls=":", lw=1)  # L_pre
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.set_title(task, fontsize=9)
        fig.suptitle(f"Randomized YaRN, L_ft = {setup['ft_len'][1]}, L_pre = {setup['pre_len'][1]} (dotted), "
                     f"s = {setup['factor']}; mean over bases of the mean over rates, band min-max", fontsize=10)
        fig.tight_layout()
        return fig

    return draw
