"""Paper D's report: what experiments/distance.py measured and decided, written out. results/distance.md (the
setup beside Paper D's, how the default was planned from its probe, the verdicts, one section per question,
every model's train.py command), the figure, README.md's table (summary), the probe's own page, and
decide_again, which decides recorded results again under the current rule (eval.py --render).

Anything the markdown says about how the run ran (its jobs and threads) is read from the recorded command, so
that a re-render writes what the run wrote.
"""
from __future__ import annotations

import argparse
import json
import re

from eval import plot_curves
from experiments.common import (ALIBI_SLOPE_HEADS, cpu_per_step, fmt, line_styles, probe_cell, probe_cost, probe_stretch_table,
                                probe_table,
                                seed_curve, spread, wrapped)
from experiments.distance import (DISTANCE_ENCODINGS, LEFT_OUT_PARTS, PAPER_D_FINDINGS, PRESETS, TRANSFER_MARGIN, claims,
                                  far_delay, model_argv, planned_models, probe_row, size_name)
from experiments.stats import FIT_BAR, LEFT_OUT, THRESHOLD, UNFIT, rule_text, short

STYLES = line_styles(DISTANCE_ENCODINGS)  # each encoding in one colour in every panel
NOPE_MIXED_UNFIT = "in the run at commit df12742 NoPE's mixed_copy models fitted on 0 of 6 seeds within 6000 steps"


def span(band: tuple[int, int]) -> str:
    return f"[{band[0]}, {band[1]}]"


def recorded_flag(command: str, flag: str) -> str | None:
    """The value the recorded command line gave --FLAG (None: not given)."""
    return m.group(1) if (m := re.search(rf"--{flag} (\S+)", command)) else None


# ---------------------------------------------------------------------------------------------------------
# The markdown: the setup beside Paper D's, the verdicts, then one section per question
# ---------------------------------------------------------------------------------------------------------


def verdict_block(result: dict) -> list[str]:
    """A finding's comparisons as a table (mean [adjusted interval] over the seeds that fitted), and its verdict."""
    table = ["| comparison (a gain that should be positive) | seeds | mean [interval] | verdict |",
             "|---|---:|---|---|"]
    for c in result["checks"]:
        interval = f" [{c['low']:+.3f}, {c['high']:+.3f}]" if "low" in c else ""
        mean = f"{c['mean']:+.3f}{interval}" if "mean" in c else "—"
        table.append(f"| {c['what']} | {len(c['per_unit'])} | {mean} | {short(c['verdict'])} |")
    return ["", *table, f"\n**Verdict: {result['verdict']}.**\n"]


def setup_section(data: dict, jobs: int, threads: int) -> list[str]:
    """What was run and on what; the task as measured; Paper D's setup beside this run's."""
    setup = data["settings"]
    machine = data.get("machine", "a machine distance.json does not record")
    width, layers, heads = setup["width"], setup["layers"], setup["heads"]
    md = ["# Distance generalization (Paper D, arXiv 2609.11913)\n",
          f"`{data['command']}` took {data['runtime_s'] / 60:.1f} minutes on {machine}, {jobs} model(s) at a time, "
          f"{threads} torch thread(s) each"
          + (f"; its models' own training took {data['training_cpu_s'] / 60:.1f} CPU-min, a model reused from an "
             "earlier invocation of this command included" if "training_cpu_s" in data else "")
          + ". Every number below "
          "comes from that run; per-delay curves of every seed are in `distance.json`.\n",
          "Paper D asks whether a positional encoding helps a transformer copy tokens across delays it never saw "
          "in training, at a fixed context length. A delay copy episode (task C) is m source tokens, a control "
          "token, d filler tokens, the control token again, then the m source tokens; selective copy (task S) "
          "reproduces only the even-valued source tokens. **d is the number of filler tokens strictly between the "
          "two control tokens** (C-to-C distance minus 1), so in task C every source token is reproduced "
          f"m + d + 2 positions later; Paper D does not say which it counts. Accuracy: teacher-forced, per "
          f"reproduced token, {setup['samples']} windows per delay (chance is about 1/{setup['symbols']}).\n",
          "## Setup: Paper D and this run\n",
          "| | Paper D | here |", "|---|---|---|",
          f"| window T | 256 | {setup['window']} |",
          f"| data tokens | 128 | {setup['symbols']} |",
          f"| m (tokens copied) | 10 | {setup['m']} |",
          f"| C and S training band (A) | [15, 25] | {span(setup['band'])} |",
          f"| delays evaluated | 1..120 | 0..{setup['top']}"
          + (" (4 x the band's top)" if setup["top"] == 4 * setup["band"][1] else "") + " |",
          f"| diversity d_max (B) | 5, 10, 20, 30, 50 | {', '.join(map(str, setup['diversity'])) or LEFT_OUT} |",
          f"| S bands in transfer (C) | [25, 35], [45, 55] | {span(setup['adjacent'])}, {span(setup['separated'])} |",
          f"| model | 8 layers x 512, 8 heads | {layers} layers x {width}, {heads} heads |",
          f"| sizes in the size sweep (layers x width) | smaller than 8 x 512 (sizes not in our sources) | "
          f"{', '.join(size_name(s) for s in setup['sizes'])} |",
          "| MLP, dropout | ReLU, 0.1 | GELU, none (lengen's GPT; train.py has no dropout flag) |",
          f"| steps x batch | 40K x 64 | {training_text(setup)}, x {setup['batch']} |",
          "| lr, warm-up, weight decay | 3e-4, 3K, 0.05 (AdamW) | "
          f"{setup['lr']:g}, {setup['warmup']}, {setup['wd']:g} (AdamW, "
          "cosine decay to a tenth over the " + ("budget) |" if "budget" in setup else "cap) |"),
          "| loss mask | R tokens, control tokens, first 18 positions | everything but reproduced tokens whose "
          "source lies inside the window (exact, instead of the first 18) |",
          f"| seeds | best of 5 | (A) {setup['seeds']}, size {setup['size_seeds']}, (B) {setup['diversity_seeds']}, "
          f"(C) {setup['transfer_seeds']}; "
          "mean ± sd and the best seed (highest cumulative accuracy) |",
          *([f"| ALiBi's slopes | the paper's rule for 8 heads | the {data['alibi_slope_heads']}-head slopes, "
             f"evenly spaced over {heads} heads (the rule for {heads} heads is nearly flat over this window) |"]
            if "alibi_slope_heads" in data else []),
          f"| encodings | NoPE, RoPE, ALiBi | all three in size and (A); (B) "
          f"{', '.join(setup['diversity_encodings']) or LEFT_OUT}; (C) "
          f"{', '.join(setup['transfer_encodings']) or LEFT_OUT} |"]
    if data["scale"] != "full":
        md.append("\nWhere a part has fewer than 3 seeds or fewer than the three encodings, that is a cut made to "
                  "fit the time budget (or, for an encoding, what its probe said: see how this design was chosen), "
                  "not a finding; `--full` runs every part with 5 seeds and all three encodings, at Paper D's sizes "
                  "(a GPU helps).")
    return md


def budget_text(setup: dict) -> str:
    """'6000 steps' when every task has that budget, else each task's: 'delay_copy 6000, mixed_copy 8000'."""
    steps = setup["budget"]
    if len(set(steps.values())) == 1:
        return f"{next(iter(steps.values()))} steps"
    return ", ".join(f"{task} {n}" for task, n in steps.items()) + " steps"


def training_text(setup: dict) -> str:
    """How long each model trained: its task's budget, whatever its encoding (issue 51), or, in results recorded
    before it, until it fitted or the cap."""
    if "budget" not in setup:
        return (f"until it fits (>= {FIT_BAR} on held-out windows at its training delays, checked every "
                f"{setup['every']} steps) or {setup['steps']}")
    return (f"{budget_text(setup)} for every model, whatever its encoding; fitted: >= {FIT_BAR} on held-out windows "
            f"at its training delays at the last step (checked every {setup['every']} steps, the curves over "
            "training)")


def design_section(data: dict) -> list[str]:
    """How the default was planned: its probe's table (results/distance-probe.json, copied into the results when
    the run began) and what was read from it (plan)."""
    if "probe" not in data:
        return []
    probe, setup = data["probe"], data["settings"]
    rows = [probe_row(e, s) for e in DISTANCE_ENCODINGS for s in probe["settings"]["sizes"]]
    return ["\n## How this design was chosen\n", "Before the run, from `results/distance-probe.md`: seed 0 of "
            "(A)'s models at every size, trained " + (f"{budget_text(probe['settings'])} each" if "budget" in
                                                      probe["settings"] else "until it fits its band or "
                                                      f"{probe['settings']['steps']} steps") + "; "
            "nothing outside the band measured. " + probe_cost(probe) + "\n",
            *probe_table(probe["fits"], rows, "model"),
            "", plan(probe, setup) + " " + full_cost(probe, setup)]


def step_flops(setup: dict) -> int:
    """A training step's matrix FLOPs up to a constant: batch x window tokens, each through `layers` layers of
    12 width^2 (projections and MLP) + 2 window x width (attention scores and their use)."""
    width, window = setup["width"], setup["window"]
    return setup["batch"] * window * setup["layers"] * (12 * width ** 2 + 2 * window * width)


def full_cost(probe: dict, setup: dict) -> str:
    """What --full would cost on this machine: its models and caps, at the probe's measured CPU time per step
    scaled by FLOPs. An estimate on the high side: a tiny model's step carries overheads (Python, small kernels)
    that a large one's matrices amortise."""
    full = PRESETS["full"]
    models = len(list(planned_models(full)))
    per_step = cpu_per_step(probe) * step_flops(full) / step_flops(setup)
    steps = max(full["budget"].values())
    return (f"`--full` ({models} models at {full['layers']} x {full['width']}, window {full['window']}, up to "
            f"{steps:,} steps each) is a GPU's job: by FLOPs a step there is "
            f"{step_flops(full) / step_flops(setup):,.0f}x one here, about {per_step * steps / 3600:,.0f} "
            "CPU-hours a model at the probe's measured cost per step (on the high side: a tiny model's step carries "
            "overheads a large one amortises).")


def plan(probe: dict, setup: dict) -> str:
    """What the default took from its probe: one cap for every model, which of the probe's sizes the size sweep
    leaves out, and which encodings (B) and (C) leave out, and why (the probe's numbers at (A)'s size)."""
    fits, main = probe["fits"], size_name((setup["layers"], setup["width"]))
    cap = setup["budget"]["delay_copy"] if "budget" in setup else setup["steps"]
    cell = {t: {e: fits[t][probe_row(e, (setup["layers"], setup["width"]))] for e in DISTANCE_ENCODINGS}
            for t in fits}
    why = "; ".join(f"{t}: " + ", ".join(f"{e} {probe_cell(c)}" for e, c in by.items()) for t, by in cell.items())
    text = f"At (A)'s size, {main}, the probe's steps to fit (or the last check) were {why}. " + (
        f"Every model trains to the same cap, {cap} steps, and stops as soon as it fits" if "budget" not in setup
        else f"Every model of a task trains the same budget, {budget_text(setup)}, whatever its encoding, and is "
             "judged at its last step") + (": (A) and the size sweep train every encoding, including the cells "
                                          "that did not fit in the probe (the size question is about exactly that)."
                                          if len(setup["sizes"]) > 1 else ": (A) trains every encoding.")

    def first(c):  # the first step at the bar of a model that fitted (a probe of the budget: at its end)
        return c.get("first_fit", c["steps_to_fit"]) if c["steps_to_fit"] is not None else None

    def slower(e, kept):  # (B) is delay copy alone
        steps = first(cell["delay_copy"][e])
        others = max(first(cell["delay_copy"][k]) or cap for k in kept)
        return (f"{e} fitted delay copy in {steps} steps, against at most {others} for the others (cut for time)"
                if steps else f"{e} did not fit delay copy within {cap} steps on the probe's seed")

    def unfit_s(e, kept):  # (C)'s mixed model learns selective copy too
        steps = first(cell["selective_copy"][e])
        if steps is None:
            return f"{e} did not fit selective copy within {cap} steps on the probe's seed, and (C)'s mixed model " \
                   "learns it too"
        return f"{e} needed {steps} of {cap} steps to fit selective copy alone, and " + \
            (NOPE_MIXED_UNFIT if e == "nope" else "(C)'s mixed model learns it beside delay copy (cut for time)")

    left_out = [size_name(s) for s in probe["settings"]["sizes"] if tuple(s) not in map(tuple, setup["sizes"])]
    if left_out and len(setup["sizes"]) == 1:
        text += (f" There is no size sweep: {', '.join(left_out)} are cut for time, after the early-stopping "
                 "design's results had been seen, and the probe's fits at every size are all this run says of size.")
    elif left_out:
        text += (f" The size sweep leaves out {', '.join(left_out)} of the probe's sizes (cut for time; the width "
                 "ladder stays, as in `--full`).")
    if len(setup["diversity"]) == 2:
        text += (f" (B) trains d_max {setup['diversity'][0]} and {setup['diversity'][1]} only, the two its "
                 "comparisons read (the values between them cut for time).")
    if not setup["diversity_encodings"] and not setup["transfer_encodings"]:
        text += f" (B) and (C) are {LEFT_OUT}: {left_out_why(probe, setup)}."
    for part, key, reason in (("(B)", "diversity_encodings", slower), ("(C)", "transfer_encodings", unfit_s)):
        kept = setup[key]
        left = [e for e in DISTANCE_ENCODINGS if e not in kept]
        if kept and left:
            text += f" {part} trains {', '.join(kept)} only: " + "; ".join(reason(e, kept) for e in left) + "."
    return text + " `--full` trains every encoding in every part."


def left_out_why(probe: dict, setup: dict) -> str:
    """Why (B) and (C) are left out of the default: what their models (LEFT_OUT_PARTS, as the default had them)
    would add at (A)'s budget, from the probe's cost per step, against the hour (A) already takes."""
    def count(plan):  # distinct models (JSON's lists or tuples alike)
        return len({json.dumps(key) for key in planned_models(plan)})
    more = count({**setup, **LEFT_OUT_PARTS}) - count(setup)
    minutes = more * cpu_per_step(probe) * setup["budget"]["delay_copy"] / 60 / 2
    return (f"at this budget (A) alone takes the hour; as the default had them (RoPE and ALiBi, 3 seeds, (C)'s "
            f"models alone being (A)'s), they would add {more} models, about {minutes:.0f} min on 2 cores at the "
            "probe's cost per step: fewer parts, rather than models trained less (`--full` and `--quick` keep "
            "them)")


def verdicts_section(data: dict) -> list[str]:
    md = ["\n## Verdicts\n", "| question | Paper D | verdict |", "|---|---|---|"]
    md += [f"| {name} | {PAPER_D_FINDINGS[name]} | **{r['verdict']}** |" for name, r in data["verdicts"].items()]
    md.append(f"\nEach question is made of comparisons below, each a gain in accuracy measured per seed, seed s of "
              "one model against seed s of the other, on the seeds where both fitted their training band (train.py's "
              f"fit check, accuracy >= {FIT_BAR}); *{UNFIT}* when one fitted on fewer than two thirds of its seeds. "
              + ("The size comparisons measure fitting itself, so they count every seed. " if "size" in data["verdicts"]
                 else "")
              + rule_text(THRESHOLD, "this project's +0.05: Paper D reports curves, not a gap in these units",
                          "each seed (seed s against seed s)") + " " + data["caption"] + " A question is "
              "reproduced when each of its comparisons is, fails (partly) when one fails, and is undecided "
              "otherwise.\n")
    return md


def fitted_at(result: dict) -> str:
    """Each seed's in-range accuracy at its last step, the fit check's, marked where it is below the bar: '0.99,
    0.87 (unfit)'; in results recorded before issue 51, each seed's step to fit, '—' where it did not within
    the cap: '2600, —, 3100'."""
    if "fit_at_end" in result:
        return ", ".join(f"{a:.2f}" + ("" if s is not None else " (unfit)")
                         for a, s in zip(result["fit_at_end"], result["steps_to_fit"]))
    return ", ".join("—" if s is None else str(s) for s in result["steps_to_fit"])


def fitted_header(setup: dict) -> str:
    """fitted_at's column: the in-range accuracy every model ended at, or (before issue 51) the step it fitted."""
    return "in range at the end (fit check)" if "budget" in setup else "fitted at"


def size_section(data: dict) -> list[str]:
    setup = data["settings"]
    if "size" not in data["verdicts"]:  # a sweep of one size: the probe measured the sizes
        return ["## Size\n", wrapped(f"Paper D: {PAPER_D_FINDINGS['size']}. Not asked here: this run trains one "
                                      f"size, {size_name(setup['sizes'][0])}; the probe (above) measures fitting at "
                                      "every size of its sweep, one seed each, which decides nothing.") + "\n"]
    fitted = ("at the end: each seed's fit check after its budget, marked (unfit) below the bar" if "budget" in setup
              else f"fitted: the seeds whose model reached the bar, and at which step (— not within the cap of "
                   f"{setup['steps']})")
    md = ["## Size\n", f"Paper D: {PAPER_D_FINDINGS['size']}. Here: C trained on {span(setup['band'])}, "
          f"{setup['size_seeds']} seed(s) at each size (layers x width). In range: mean accuracy over the training "
          f"band (mean ± sd over seeds); {fitted}.\n",
          "| size | " + " | ".join(f"{e} in range | {e} {fitted_header(setup)}" for e in DISTANCE_ENCODINGS) + " |",
          "|---:|" + "---:|" * 2 * len(DISTANCE_ENCODINGS)]
    for name, runs in data["size"].items():
        cells = [f"{fmt(runs[e]['in_mean'], form='sd')} | {fitted_at(runs[e])}" for e in DISTANCE_ENCODINGS]
        md.append(f"| {name} | " + " | ".join(cells) + " |")
    return md + verdict_block(data["verdicts"]["size"])


def ordering_section(data: dict, task: str, label: str) -> list[str]:
    """(A) on one task: every encoding in range, out of range, its best seed, and at a few delays."""
    setup, runs = data["settings"], data["A"][task]
    lo, hi = setup["band"]
    shown = sorted({0, lo - 1, lo, hi, hi + 1, 2 * hi, 3 * hi, 4 * hi} & set(range(setup["top"] + 1)))
    md = [f"## ({label})\n", f"Paper D: {PAPER_D_FINDINGS[label]}. Here: trained on {span(setup['band'])}, "
          f"{setup['seeds']} seed(s) per encoding; mean ± sd over seeds, and the best seed.\n",
          f"| encoding | {fitted_header(setup)} | in range | out-of-range sum | best seed: in range, out-of-range sum | " +
          " | ".join(f"d={d}" for d in shown) + " |", "|---|---|---:|---:|---:|" + "---:|" * len(shown)]
    for e in DISTANCE_ENCODINGS:
        r, b = runs[e], runs[e]["best_seed"]
        cells = [fmt([seed[r["delays"].index(d)] for seed in r["per_seed"]], form="sd") for d in shown]
        md.append(f"| {e} | {fitted_at(r)} | {fmt(r['in_mean'], form='sd')} | {fmt(r['out_sum'], '.1f', 'sd')} | "
                  f"{r['in_mean'][b]:.2f}, {r['out_sum'][b]:.1f} | " + " | ".join(cells) + " |")
    return md + verdict_block(data["verdicts"][label])


def mean_curve(result: dict, key: str) -> tuple[list[int], list[float]]:
    """An over_seeds result's curve over training, `key` "in_range" or "out_of_range": the steps of its checks
    and the mean over seeds at each (every seed trains the same budget, so all are checked at the same steps)."""
    curves = result["curves"]
    return curves[0]["steps"], [spread(values)["mean"] for values in zip(*(c[key] for c in curves))]


def first_at_bar(curve: dict) -> int | None:
    """The index of the first check of a model's curve that reached the fit bar in range (None: none did)."""
    return next((i for i, a in enumerate(curve["in_range"]) if a >= FIT_BAR), None)


def rankings(runs: dict) -> str:
    """The order of the encodings by mean out-of-range accuracy over training, each order with the step from
    which it held: 'from step 100 alibi > nope ≈ rope; from step 1500 nope > alibi > rope'. Two encodings are
    ordered only when their means differ by more than TRANSFER_MARGIN (a seed's accuracy at one delay has a
    standard error of a few points), so noise at chance level does not read as a ranking that flips."""
    steps = mean_curve(next(iter(runs.values())), "out_of_range")[0]
    far = {e: mean_curve(r, "out_of_range")[1] for e, r in runs.items()}
    out, last = [], None
    for i, step in enumerate(steps):
        ranked, groups = sorted(far, key=lambda e: -far[e][i]), []
        for a, b in zip([None] + ranked, ranked):  # a new group where the gap is past the margin
            if a is None or far[a][i] - far[b][i] > TRANSFER_MARGIN:
                groups.append([])
            groups[-1].append(b)
        order = " > ".join(" ≈ ".join(sorted(g, key=list(far).index)) for g in groups)
        order = order if len(groups) > 1 else f"all within {TRANSFER_MARGIN}"
        if order != last:
            out.append(f"from step {step} {order}")
            last = order
    return "; ".join(out)


def curves_section(data: dict) -> list[str]:
    """(A) over training (results from issue 51 on): per task and encoding, where its in-range accuracy ended
    and how it moved over the last quarter (flat where the budget suffices), when it first reached the bar, and
    its out-of-range accuracy then and at the end; and the order of the encodings out of range at every check,
    so a reader sees whether a ranking holds across training or flips."""
    setup = data["settings"]
    if "budget" not in setup:
        return []
    far = far_delay(setup, setup["band"])
    md = ["## (A) over training\n", f"Every model trained {budget_text(setup)}; at every check (each "
          f"{setup['every']} steps) its in-range accuracy (the fit check: held-out windows at its training delays) "
          f"and its accuracy at delay {far}, out of range (64 windows, on C alone): the figure's last row. "
          "Means over seeds; 'last quarter': in range from the check at three quarters of the budget to the last, "
          "flat where the budget suffices; 'first at the bar': each seed's first check at the bar (— none).\n",
          f"| task | encoding | in range at the end | last quarter | first at the bar | at delay {far}: then | "
          "at the end |", "|---|---|---:|---:|---:|---:|---:|"]
    for task, runs in data["A"].items():
        for e, r in runs.items():
            firsts = [first_at_bar(c) for c in r["curves"]]
            when = ", ".join("—" if i is None else str(c["steps"][i]) for c, i in zip(r["curves"], firsts))
            then = [c["out_of_range"][i] for c, i in zip(r["curves"], firsts) if i is not None]
            end = [c["out_of_range"][-1] for c in r["curves"]]
            in_range = mean_curve(r, "in_range")[1]
            start = in_range[min(len(in_range) - 1, 3 * len(in_range) // 4)]
            md.append(f"| {task} | {e} | {fmt(r['fit_at_end'], form='sd')} | {start:.2f} -> {in_range[-1]:.2f} "
                      f"({in_range[-1] - start:+.2f}) | {when} | "
                      + (f"{spread(then)['mean']:.2f}" if then else "—") + f" | {spread(end)['mean']:.2f} |")
    md.append("")
    md += [f"Out of range over training, {task}: {rankings(runs)}." for task, runs in data["A"].items()]
    return md + [""]


def diversity_section(data: dict) -> list[str]:
    setup = data["settings"]
    if not data["B"]:
        return ["## (B) Diversity\n", f"Paper D: {PAPER_D_FINDINGS['B']}. {LEFT_OUT.capitalize()}: see how this "
                "design was chosen.\n"]
    md = ["## (B) Diversity\n", f"Paper D: {PAPER_D_FINDINGS['B']}. Here: C trained on [0, d_max], evaluated at "
          f"0..{setup['top']}; sums of accuracy over the delays inside and outside [0, d_max], "
          f"{setup['diversity_seeds']} seed(s).\n",
          "| encoding | d_max | in-range sum | out-of-range sum | out / in | out-of-range mean |"
          + (f" {fitted_header(setup)} |" if "budget" in setup else ""),
          "|---|---:|---:|---:|---:|---:|" + ("---:|" if "budget" in setup else "")]
    for e, by_max in data["B"].items():
        for d_max, r in by_max.items():
            unseen = setup["top"] - d_max
            md.append(f"| {e} | {d_max} | {fmt(r['in_sum'], '.1f', 'sd')} | {fmt(r['out_sum'], '.1f', 'sd')} | "
                      f"{fmt(r['ratio'], form='sd')} | {spread(r['out_sum'])['mean'] / unseen:.2f} |"
                      + (f" {fitted_at(r)} |" if "budget" in setup else ""))
    return md + verdict_block(data["verdicts"]["B"])


def sign(x: float) -> str:
    return "positive" if x > TRANSFER_MARGIN else "negative" if x < -TRANSFER_MARGIN else "none"


def transfer_section(data: dict) -> list[str]:
    setup = data["settings"]
    if not data["C"]:
        return ["## (C) Transfer\n", f"Paper D: {PAPER_D_FINDINGS['C']}. {LEFT_OUT.capitalize()}: see how this "
                "design was chosen.\n"]
    md = ["## (C) Transfer\n", f"Paper D: {PAPER_D_FINDINGS['C']}. Here: mixed_copy trains C on "
          f"{span(setup['band'])} together with S on {span(setup['adjacent'])} (adjacent) or "
          f"{span(setup['separated'])} "
          "(separated), half the episodes each; C alone is the (A) model with the same seed. "
          + ("Each trains its task's budget and is judged on its own mix (the mixed model: C and S together) at "
             "the end" if "budget" in setup else "Each trains until it fits its own mix (the mixed model: C and S "
                                                 "together) or the cap")
          + "; both are measured on C. Cells: C's mean accuracy change "
          f"(mixed minus alone) in each region, {setup['transfer_seeds']} seed(s).\n",
          "| setting | encoding | C alone in range | C range | unseen (all) | below | between | S range | beyond |"
          + (" fit check at the end: alone; mixed |" if "budget" in setup else ""),
          "|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if "budget" in setup else "")]
    for setting, by_encoding in data["C"].items():
        for e, r in by_encoding.items():
            cells = [f"{r['regions'][n]:+.2f} ({sign(r['regions'][n])})" if n in r["regions"] else "—"
                     for n in ("C range", "unseen", "below", "between", "S range", "beyond")]
            if "budget" in setup:
                cells.append(f"{fitted_at(r['alone'])}; {fitted_at(r['mixed'])}")
            md.append(f"| {setting} | {e} | {spread(r['alone']['in_mean'])['mean']:.2f} | " + " | ".join(cells) + " |")
    return md + verdict_block(data["verdicts"]["C"])


def commands_section(data: dict, threads: int) -> list[str]:
    """Every model's train.py command line, as run() trained it (model_argv over planned_models): any cell can
    be retrained from it, or trained again with another --seed."""
    setup = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
             for k, v in data["settings"].items()}  # JSON's lists back to the tuples planned_models keys on
    args = argparse.Namespace(device=recorded_flag(data["command"], "device") or "cpu", threads=threads)
    commands = ["python train.py " + " ".join(model_argv(setup, data["scale"], args, *key))
                for key in dict.fromkeys(planned_models(setup))]
    return ["", f"## Every model's train.py command ({len(commands)})", "",
            "<details><summary>One line a model, in the order run() trains them; each writes the folder its --out "
            "names</summary>", "", "```", *commands, "```", "", "</details>"]


def markdown(data: dict) -> str:
    """results/distance.md: setup and every change from Paper D, then per question the paper's finding, our
    numbers and the verdict its sub-claims give; last, every model's train.py command. A probe's record (it has
    "fits") gets its own page."""
    if "fits" in data:
        return probe_markdown(data)
    jobs, threads = (int(recorded_flag(data["command"], flag) or 1) for flag in ("jobs", "threads"))
    md = setup_section(data, jobs, threads) + design_section(data) + verdicts_section(data) + size_section(data)
    md += ordering_section(data, "delay_copy", "A, delay copy") + ordering_section(data, "selective_copy",
                                                                                   "A, selective copy")
    md += curves_section(data) + diversity_section(data) + transfer_section(data) + commands_section(data, threads)
    return "\n".join(md) + "\n"


def probe_markdown(data: dict) -> str:
    """results/distance-probe.md: the probe's cost, what it trained, and how each model fitted (a table); for a
    probe of the budget (every model trained all its steps), also how its in-range accuracy moved over the last
    quarter of training, what the default's budget is planned from."""
    setup = data["settings"]
    rows = [probe_row(e, s) for e in DISTANCE_ENCODINGS for s in setup["sizes"]]
    budgeted = "budget" in setup
    steps = budget_text(setup) if budgeted else f"{setup['steps']} steps"
    md = ["# Paper D's probe: steps to fit the training band, one seed a model", "", probe_cost(data), "",
          f"(A)'s models (window {setup['window']}, m {setup['m']}, {setup['symbols']} symbols, delays "
          f"{span(setup['band'])}, {setup['heads']} heads, lr {setup['lr']:g} with cosine decay over "
          f"{steps}; ALiBi with the {ALIBI_SLOPE_HEADS}-head slopes) at every size of the sweep "
          "(layers x width), seed 0, trained " + (
              f"every step of {steps}, its accuracy on held-out windows at the band's delays checked every "
              f"{setup['every']} steps; nothing outside the band is measured. The last check's accuracy, and "
              f"the first step at the bar ({FIT_BAR}):" if budgeted else
              f"until accuracy >= {FIT_BAR} on held-out windows at the band's delays (checked every "
              f"{setup['every']} steps) or {steps}; nothing outside the band is measured. Steps to fit, or the "
              "last check's accuracy:"), "", *probe_table(data["fits"], rows, "model")]
    if budgeted:
        md += ["", *probe_stretch_table(data["fits"], rows, "model")]
    return "\n".join(md + ["", "Every model's train.py command: `results/distance-probe.json`."]) + "\n"


# ---------------------------------------------------------------------------------------------------------
# The figure: each encoding in one colour in every panel
# ---------------------------------------------------------------------------------------------------------


def encoding_lines(ax, series: dict[str, tuple[list, list]], ms: float = 6) -> None:
    """One line per encoding, series[encoding] = (xs, ys), in the encoding's own colour."""
    for e, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", ms=ms, label=e, **STYLES[e])


def size_panel(ax, setup: dict, size: dict) -> None:
    names = list(size)  # in the order the sweep lists them
    if len(names) == 1:  # no sweep: nothing to draw
        ax.axis("off")
        ax.text(0.5, 0.5, f"size: not asked here\n(one size, {names[0]};\nthe probe fits every size)",
                ha="center", va="center", transform=ax.transAxes)
        return
    encoding_lines(ax, {e: (list(range(len(names))), [spread(size[n][e]["in_mean"])["mean"] for n in names])
                        for e in DISTANCE_ENCODINGS})
    ax.set(xticks=range(len(names)), xticklabels=names, ylim=(-0.02, 1.02), xlabel="size (layers x width)",
           ylabel="in-range accuracy",
           title=f"size: C on {span(setup['band'])}, mean of {setup['size_seeds']} seed(s)")
    ax.legend(fontsize=8)


def diversity_panel(ax, part_b: dict, field: str, title: str) -> None:
    """(B): a sum over delays (mean over seeds) against d_max."""
    encoding_lines(ax, {e: (list(by_max), [spread(r[field])["mean"] for r in by_max.values()])
                        for e, by_max in part_b.items()})
    ax.set(xlabel="d_max (trained on [0, d_max])", title=title)
    ax.legend(fontsize=8)


def transfer_panel(ax, setup: dict, by_encoding: dict, setting: str, band: tuple[float, float]) -> None:
    """(C): C's accuracy change (mixed minus alone) at every delay, with where C and S trained."""
    encoding_lines(ax, {e: (r["alone"]["delays"], r["delta"]) for e, r in by_encoding.items()}, ms=3)
    ax.axhline(0, color="black", lw=0.8)
    ax.axvspan(*band, color="grey", alpha=0.2, lw=0, label="C trained")
    ax.axvspan(setup[setting][0] - 0.5, setup[setting][1] + 0.5, color="tab:purple", alpha=0.15, lw=0,
               label="S trained")
    ax.set(ylim=(-1.02, 1.02), xlabel="delay", ylabel="C accuracy: mixed - alone",
           title=f"(C) transfer, S {setting} {span(setup[setting])}")
    ax.legend(fontsize=8)


def over_training_panels(axes, setup: dict, part_a: dict) -> None:
    """(A) over training: per task, in-range and out-of-range accuracy against the step, each encoding's mean
    over seeds with a band of one sd, the bar drawn in the in-range panels."""
    panels = [(task, key) for task in part_a for key in ("in_range", "out_of_range")]
    for ax, (task, key) in zip(axes, panels):
        curves = {e: seed_curve("step", r["curves"][0]["steps"], [c[key] for c in r["curves"]], band="sd")
                  for e, r in part_a[task].items()}
        plot_curves(ax, curves, "step", log_x=False, styles=STYLES)
        if key == "in_range":
            ax.axhline(FIT_BAR, color="black", lw=0.8, ls=":")
        where = f"in range {span(setup['band'])}" if key == "in_range" else f"delay {far_delay(setup, setup['band'])}"
        ax.set_title(f"(A) {task.replace('_', ' ')} over training: {where}")


def figure(data: dict):
    """Size, (A) for C and S, (B) out-of-range sum and ratio against d_max, (C) C's change per delay, and (A)'s
    best seed on C, as Paper D plots it (the parts the preset trains), then (A) over training. None for a probe's
    record (it has "fits"): it draws nothing."""
    if "fits" in data:
        return None
    setup, part_a = data["settings"], data["A"]
    band = (setup["band"][0] - 0.5, setup["band"][1] + 0.5)  # shade whole delays, so a one-delay band shows too

    over_training = "budget" in setup  # results from issue 51 on: every model's curve over training

    def a_panel(task, label):
        def draw_a(ax):
            curves = {e: seed_curve("delay", r["delays"], r["per_seed"], band="sd") for e, r in part_a[task].items()}
            plot_curves(ax, curves, "delay", band, log_x=False, styles=STYLES)
            ax.set_title(f"{label}, mean ± sd of {setup['seeds']} seed(s)")
        return draw_a

    def best_seed(ax):
        encoding_lines(ax, {e: (r["delays"], r["best"]) for e, r in part_a["delay_copy"].items()}, ms=3)
        ax.axvspan(*band, color="grey", alpha=0.2, lw=0, label="trained")
        ax.set(ylim=(-0.02, 1.02), xlabel="delay", ylabel="accuracy", title="(A) delay copy, best seed")
        ax.legend(fontsize=8)

    # the panels in reading order, four to a row; a part the preset leaves out has none
    panels = [lambda ax: size_panel(ax, setup, data["size"]), a_panel("delay_copy", "(A) delay copy"),
              a_panel("selective_copy", "(A) selective copy")]
    if data["B"]:
        panels += [lambda ax: diversity_panel(ax, data["B"], "out_sum", "(B) out-of-range sum"),
                   lambda ax: diversity_panel(ax, data["B"], "ratio", "(B) out-of-range / in-range")]
    if data["C"]:
        panels += [lambda ax, s=s: transfer_panel(ax, setup, data["C"][s], s, band) for s in ("adjacent", "separated")]
    panels.append(best_seed)

    def draw(plt):
        rows = -(-len(panels) // 4) + over_training
        fig, axes = plt.subplots(rows, 4, figsize=(18, 4 * rows), squeeze=False)
        if over_training:
            over_training_panels(axes[-1], setup, part_a)
        for ax, panel in zip(axes.flat, panels):
            panel(ax)
        fig.suptitle(f"Distance generalization (Paper D) at small scale: window {setup['window']}, m {setup['m']}, "
                     f"{setup['symbols']} symbols; {'(A)-(C)' if data['B'] or data['C'] else '(A)'} at {setup['layers']} "
                     f"layers x {setup['width']}; every "
                     "model trained " + (budget_text(setup) if over_training else f"until it fits or {setup['steps']} "
                                                                                    "steps"))
        fig.tight_layout()
        return fig

    return draw


def summary(data: dict) -> str:
    """README.md's table: each of Paper D's questions, how many of its comparisons are reproduced, its verdict."""
    rows = ["| question (Paper D) | comparisons reproduced | verdict |", "|---|---|---|"]
    for name, r in data["verdicts"].items():
        held = sum(c["verdict"] == "reproduced" for c in r["checks"])
        rows.append(f"| {name} | {held} of {len(r['checks'])} | {short(r['verdict'])} |")

    def said(c):
        interval = f" [{c['low']:+.3f}, {c['high']:+.3f}]" if "low" in c else ""
        what = c["what"].replace(" at unseen delays", "").replace(" - ", " − ")
        return f"{what} {c['mean']:+.3f}{interval} ({short(c['verdict'])})"
    a = "; ".join(f"{task.split(', ')[1]}: " + ", ".join(said(c) for c in data["verdicts"][task]["checks"])
                  for task in ("A, delay copy", "A, selective copy"))
    return "\n".join(rows) + "\n\n" + wrapped(f"(A) at unseen delays, {a}.") + "\n"


def decide_again(data: dict) -> dict:
    """The recorded results with their claims decided again from their numbers under the current rule
    (eval.py --render)."""
    measured = {part: data[part] for part in ("size", "A", "B", "C")}
    data = dict(data)
    data["verdicts"], data["caption"] = claims(data["settings"], measured)
    return data
