"""The writing of the encodings experiment (experiments/encodings.py, the study): results/encodings.md and its
heatmaps, the probe's results/encodings-probe.md, the claims decided again from recorded numbers (--render), and
the claims table README.md and docs/every-encoding.md render from results/encodings.json (summary()).

Read top to bottom: the tables of the grid; how the default grid was chosen from its probe; markdown(); the
README/docs table; the heatmaps; the probe's markdown; decide_again().
"""
from __future__ import annotations

import train
from experiments.common import (ALIBI_SLOPE_HEADS, beyond, cpu_per_step, fitted, fmt, line_styles, probe_cost,
                                probe_stretch_table, probe_table, spread, wrapped)
from experiments.encodings import (ENCODINGS, MIN_SEEDS, MULTIPLES, PAPER, PRESETS, cell_fitted, chance, claims, label,
                                   planned, predicted_cpu_s, rows)
from experiments.stats import FIT_BAR, LEFT_OUT, THRESHOLD, UNFIT, rule_text, short

# ---------------------------------------------------------------------------------------------------------
# The grid's tables, and how the default grid was chosen
# ---------------------------------------------------------------------------------------------------------

def budget_text(setup: dict) -> str:
    """'8000 steps' when every task of the grid has that budget, else each task's: 'reverse 8000, shift 4000'."""
    steps = {t: setup["budget"][t] for t in setup["tasks"]}
    if len(set(steps.values())) == 1:
        return f"{next(iter(steps.values()))} steps"
    return ", ".join(f"{t} {n}" for t, n in steps.items()) + " steps"


def grid(data: dict, at, ended: bool = False) -> list[str]:
    """One row per variant, one column per task: mean ± sd over seeds of at(accuracies), and with `ended` the
    mean accuracy at L each cell's models ended training at (the fit check's) in parentheses; a cell that did
    not fit is marked †, one not run (planned() left it out) 'not run', and the row's mean is over its fitted
    cells."""
    tasks_ = data["settings"]["tasks"]
    out = ["| encoding | " + " | ".join(f"{t} ({chance(t):.2f})" for t in tasks_) + " | mean of fitted |",
           "|---|" + "---:|" * (len(tasks_) + 1)]
    for row in rows(data["settings"]):
        cells, kept = [], []
        for t in tasks_:
            values = [at(a) for a in data["accuracy"][t][row]]
            ok = cell_fitted(data["steps_to_fit"], t, row)
            end = f" ({spread(data['fit_at_end'][t][row])['mean']:.2f})" if ended and values else ""
            cells.append(fmt(values, form="sd") + end + ("" if ok else " †") if values else "not run")
            kept += [values] if ok else []
        mean = fmt([sum(v) / len(v) for v in zip(*kept)], form="sd") if kept else "—"
        out.append(f"| {row} | " + " | ".join(cells) + f" | **{mean}** |")
    return out


def steps_grid(data: dict) -> list[str]:
    tasks_ = data["settings"]["tasks"]
    out = ["| encoding | " + " | ".join(tasks_) + " | cells fitted |", "|---|" + "---:|" * (len(tasks_) + 1)]
    for row in rows(data["settings"]):
        per_task = [data["steps_to_fit"][t][row] for t in tasks_]
        cells = [", ".join("—" if s is None else str(s) for s in per_seed) or "not run" for per_seed in per_task]
        count = sum(cell_fitted(data["steps_to_fit"], t, row) for t in tasks_)
        out.append(f"| {row} | " + " | ".join(cells) + f" | {count} of {len(tasks_)} |")
    return out


def first_at_bar(curve: dict) -> int | None:
    """The step of a model's first check at the fit bar at L (None: none reached it)."""
    return next((step for step, a in zip(curve["steps"], curve["in_range"]) if a >= FIT_BAR), None)


def over_training_grid(data: dict) -> list[str]:
    """Per cell, mean over seeds: accuracy at L at the end of training (the fit check), and at 8L (few
    sequences) at each seed's first check at the bar and at the end: '0.99; 8L 0.41 -> 0.35'. Whether a
    model trained on past the bar extrapolates as it did when it first got there."""
    tasks_ = data["settings"]["tasks"]
    out = ["| encoding | " + " | ".join(tasks_) + " |", "|---|" + "---:|" * len(tasks_)]
    for row in rows(data["settings"]):
        cells = []
        for t in tasks_:
            curves = data["curves"][t][row]
            if not curves:
                cells.append("not run")
                continue
            firsts = [first_at_bar(c) for c in curves]
            then = [c["out_of_range"][c["steps"].index(f)] for c, f in zip(curves, firsts) if f is not None]
            end = spread([c["out_of_range"][-1] for c in curves])["mean"]
            cells.append(f"{spread(data['fit_at_end'][t][row])['mean']:.2f}; "
                         + (f"{data['curve_at']}: {spread(then)['mean']:.2f} -> {end:.2f}" if then else
                            f"{data['curve_at']}: never at the bar -> {end:.2f}"))
        out.append(f"| {row} | " + " | ".join(cells) + " |")
    return out


def not_run(data: dict) -> dict[str, list[str]]:
    """Per task, the rows the grid did not train (planned() left them out): no accuracy on record."""
    return {t: [row for row in rows(data["settings"]) if not data["accuracy"][t][row]]
            for t in data["settings"]["tasks"]}


def named(cells: dict[str, list[str]]) -> str:
    """{task: rows} as 'reverse: nope, learned; shift: nope'."""
    return "; ".join(f"{t}: {', '.join(r)}" for t, r in cells.items() if r)


def choice(data: dict) -> list[str]:
    """How the default grid was chosen: its probe's table (results/encodings-probe.json, copied into the grid's
    results when it ran), the cells it planned, and what the cells it left out would cost to train."""
    if "probe" not in data:
        return ["**How this design was chosen**: no probe on record beside the results (`--probe` writes one), so "
                "every cell was planned.", ""]
    probe, setup, full = data["probe"], data["settings"], PRESETS["full"]
    fits = probe["fits"]
    left = {t: r for t, r in not_run(data).items() if r}
    unfit = {t: [row for row in r if not fitted(fits[t][row])] for t, r in left.items()}
    unused = {t: [row for row in r if row not in unfit[t]] for t, r in left.items()}
    steps, budgeted = setup.get("budget"), "budget" in setup  # before issue 51: a cap, models stopped at the bar
    minutes = sum(map(len, unfit.values())) * len(full["seeds"]) * max(full["budget"].values()) \
        * cpu_per_step(probe) / 60
    ran = [(t, row) for t, by_row in data["accuracy"].items() for row, per_seed in by_row.items() if per_seed]
    predicted = predicted_cpu_s(probe, ran, len(setup["seeds"]), steps) / 60
    every = {**setup, "tasks": list(fits), "seeds": full["seeds"]}  # every task the probe measured, 5 seeds
    whole = [(t, label(e, p)) for t, e, p in planned(every, probe)]
    whole_min = predicted_cpu_s(probe, whole, len(full["seeds"]), steps) / 60
    reach = f"{budget_text(probe['settings'])} each" if budgeted else f"to {probe['settings']['cap']} steps"
    short_at = "at the end of its budget" if budgeted else f"at {probe['settings']['cap']} steps"
    return ["**How this design was chosen** (before the run, from `results/encodings-probe.md`: one seed a cell, "
            f"{reach}, at L only). " + probe_cost(probe), "",
            *probe_table(fits, rows(probe["settings"]), "encoding"), "",
            "The grid trains the cells whose probe model " + ("was at the bar at the end of its budget" if budgeted
                                                              else f"fitted within {probe['settings']['cap']} steps")
            + (" and that a comparison of the claims table can use (its other cell fitted too)"
               if data.get("partnered") else "")
            + f", {len(setup['seeds'])} seeds each, "
            + (f"{budget_text(setup)} each whatever the encoding: " if budgeted else
               f"to a cap of {setup['cap']} (room for a slower seed): ")
            + f"{len(ran)} cells, {data['models']} models, predicted at {predicted:.0f} CPU-min of training (each "
            f"cell's {'budget' if budgeted else 'probe steps to fit'} x seeds, at the probe's CPU-s per step); they took "
            f"{data['runtime']['cpu_s'] / 60:.0f} CPU-min, evaluation included."
            + (f" By the same count, every task the probe measured at {len(full['seeds'])} seeds would be "
               f"{len(whole)} cells, {whole_min:.0f} CPU-min." if set(fits) != set(setup["tasks"]) else "")
            + (f" Not run, because their probe model was short of the bar {short_at}: {named(unfit)}. A comparison "
               f"leaves out the tasks where they are one of its cells, and says {UNFIT} when no task is left. "
               f"Training them as `--full` does ({len(full['seeds'])} seeds to {max(full['budget'].values())} steps) "
               "would take up "
               f"to {minutes:.0f} CPU-min at the probe's cost per step; whether they would fit then, the probe "
               "cannot say (its table shows how far each got)." if any(unfit.values()) else "")
            + (f" Not run, because every cell they would be compared with did not fit: {named(unused)}."
               if any(unused.values()) else "") + randomized_left_out(probe, setup), ""]


def randomized_left_out(probe: dict, setup: dict) -> str:
    """For a preset that trains no randomized ids (the default since issue 51): what the cells it left out, those
    of the one claim that reads them, would add, planned from the same probe at the same budget and seeds."""
    if setup.get("randomized", True):
        return ""
    every = {**setup, "randomized": [e for e in ENCODINGS if e != "nope"]}
    # every cell that plan adds: the randomized ones, and any contiguous one whose only partner is its twin
    more = [(t, label(e, p)) for t, e, p in sorted(set(planned(every, probe)) - set(planned(setup, probe)))]
    minutes = predicted_cpu_s(probe, more, len(setup["seeds"]), setup["budget"]) / 60
    return (f" {LEFT_OUT.capitalize()}: the cells with randomized ids, which only the claim \"randomized positions "
            f"help\" reads; planned from the same probe they would add {len(more)} cells, {len(more) * len(setup['seeds'])} "
            f"models, about {minutes:.0f} CPU-min at the probe's cost per step (`--full` trains them).")


def training_text(setup: dict) -> str:
    """How long every model trained: its task's budget whatever its encoding, judged at the end (issue 51); in
    results recorded before it, until it fitted or the cap."""
    if "budget" not in setup:
        return (f"with cosine decay over a cap of {setup['cap']} steps, stopped as soon as it **fits**: accuracy >= "
                f"{FIT_BAR} on {train.FIT_SAMPLES} held-out sequences at {setup['L']} tokens (a seed used nowhere "
                f"else), checked every {setup['every']} steps.")
    return (f"with cosine decay over its task's budget, {budget_text(setup)} for every encoding; it **fits** when its "
            f"accuracy at the last step is >= {FIT_BAR} on {train.FIT_SAMPLES} held-out sequences at {setup['L']} "
            f"tokens (a seed used nowhere else). The same check every {setup['every']} steps, and one on "
            f"{train.FAR_SAMPLES} sequences at {8 * setup['L']} tokens, are its curves over training.")


def training_time(data: dict) -> str:
    """What the models' training took, each its own: a model reused from an earlier invocation of the same
    command (one stopped part-way and run again) is not in this invocation's times. '' for results that
    predate the record."""
    if "training_cpu_s" not in data:
        return ""
    return (f" The models' own training took {data['training_cpu_s'] / 60:.1f} CPU-min, a model reused from an "
            "earlier invocation of this command included (the times above are this invocation's alone).")


def markdown(data: dict) -> str:
    """results/encodings.md, or for a probe's data (its "fits") results/encodings-probe.md."""
    if "fits" in data:
        return probe_markdown(data)
    setup, rt = data["settings"], data["runtime"]
    L = setup["L"]
    out = ["# Every encoding on every task", "",
           f"`{data['command']}`: {rt['wall_s'] / 60:.1f} min wall, {rt['cpu_s'] / 60:.1f} min CPU (all "
           f"processes), {rt['jobs']} job(s) of {rt['threads']} thread(s), {rt['cores']} cores; {data['models']} "
           f"models, {data['steps_trained']:,} training steps in all" + (
               "." if "budget" in setup else f" (training every model to the cap would take "
                                             f"{data['models'] * setup['cap']:,}).") + training_time(data), "",
           f"Every model: {setup.get('layers', 2)} layers, 2 heads, dim 64, batches of 32 sequences at lengths "
           f"{L // 2}..{L}, AdamW 1e-3 " + training_text(setup) + f" Evaluated on {setup['samples']} test sequences at "
           f"{', '.join(str(m * L) for m in MULTIPLES)} tokens, the same for every model; seeds "
           f"{', '.join(map(str, setup['seeds']))}. " + (f"'+ rand' (Ruoss et al.'s protocol): in training and at "
           f"evaluation, position ids are a sorted random draw from [0, {8 * L}); the others use contiguous ids. "
           if setup.get("randomized", True) else "Position ids are contiguous. ")
           + (f"ALiBi takes the paper's {data['alibi_slope_heads']}-head slopes, evenly spaced over its 2 heads (1/2, "
              "1/32; the rule for 2 heads, 1/16 and 1/256, is nearly flat over 32 tokens); T5's bias, KERPLE, FIRE "
              "and xPos take their papers' defaults (pinned by tests/test_paper_defaults.py). "
              if "alibi_slope_heads" in data else "")
           + f"Beyond L = the mean of {', '.join(str(m * L) for m in MULTIPLES[1:])}" + (
               f", each scored only on the answer tokens at index >= {L}, which no training sequence reached (shift "
               "answers at every index; the other tasks at the end)." if data.get("scored_from_L") else
               ", scored on every answer token (shift's below L too)."), "",
           *(choice(data) if data["scale"] == "default" else []),
           "**The rule, fixed before the run.** A cell (task, encoding) counts when at least "
           f"{MIN_SEEDS} seeds ran and every one fitted; a comparison A - B is measured on the tasks where both "
           "cells count: per seed, the mean over those tasks of A's accuracy beyond L minus B's; the seeds are "
           f"the independent units; **{UNFIT}**: no task where both cells count. A claim that one encoding beats "
           "several needs each comparison: reproduced when all are, not (or partly) reproduced when one fails, "
           "undecided otherwise. " + rule_text(THRESHOLD, "this project's +0.05: the papers report accuracies, "
                                                          "not a gap to replicate", "each seed"),
           "", "## The published findings", "", data["caption"], "",
           "| claim | what the paper says | measured here (beyond L, mean [adjusted interval over seeds]) | "
           "verdict |", "|---|---|---|---|"]
    for claim, result in data["claims"].items():
        out.append(f"| {claim} | {PAPER[claim]} | {result['measured']} | **{result['verdict']}** |")
    return "\n".join(out + tasks_note(data) + tables(data)) + "\n"


def tasks_note(data: dict) -> list[str]:
    """Under the claims, from issue 51 on: which claims rest on one task only. Issue 32 asked every "X is best"
    claim to be compared on two or more tasks where all its cells fit; since issue 51 a claim is decided on
    every task where its cells fit at the equal budget, and this says where that is one."""
    if "budget" not in data["settings"]:
        return []
    one = [claim for claim, r in data["claims"].items() if len(set(r["tasks"])) == 1]
    if not one:
        return []
    setup = data["settings"]
    trained = len(setup["tasks"])
    return ["", wrapped(f"**On one task only**: {', '.join(one)}. " + (
        f"This run trains one task ({setup['tasks'][0]}), so no claim can rest on more; " if trained == 1 else "Their other tasks lack a fitted cell at this budget; ")
        + "a claim here says how the encodings compare on that task, not across tasks. A second task costs "
        "another run of this size at the same budget and seeds (`--full` trains all seven); docs/every-encoding.md "
        "says which comparisons the next task could hold.")]


def tables(data: dict) -> list[str]:
    """The grid's tables under the claims: how training ended (over training, or before issue 51 the steps to
    fit), accuracy beyond L beside the accuracy at L the models ended at, and accuracy at L."""
    budgeted = "budget" in data["settings"]
    if budgeted:
        out = ["", f"## Over training (mean over seeds: accuracy at L at the end; at {data['curve_at']} tokens, "
               "few sequences, at each seed's first check at the bar -> at the end)", ""] + over_training_grid(data)
    else:
        out = ["", "## Steps to fit (per seed; — did not fit within the cap)", ""] + steps_grid(data)
    out += ["", "## Accuracy beyond L (mean ± sd over seeds; "
            + ("in a cell's parentheses the accuracy at L its models ended training at, the fit check's; chance in "
               "the heading's" if budgeted else "chance in parentheses") + "; † the cell did not count: "
            f"a seed did not fit, or fewer than {MIN_SEEDS} seeds)", ""]
    out += grid(data, beyond, ended=budgeted)
    out += ["", "## Accuracy at L, in distribution (the test set, not the fit sequences)", ""]
    out += grid(data, lambda a: a[0])
    return out + ["", "Every number, and every model's train.py command: `results/encodings.json`. Heatmaps: "
                  "`results/encodings.png`."]


def summary(data: dict) -> str:
    """README.md's table: each published claim, the tasks it could be measured on, its verdict."""
    rows = ["| claim | measured on (tasks where both cells of a comparison fitted) | verdict |", "|---|---|---|"]
    for claim, r in data["claims"].items():
        rows.append(f"| {claim} | {', '.join(sorted(set(r['tasks']))) or 'none'} | {short(r['verdict'])} |")
    return "\n".join(rows) + "\n"


def findings(data: dict) -> str:
    """docs/every-encoding.md's sentence: what each claim measured beyond L, mean [adjusted interval]."""
    measured = "; ".join(f"**{claim}** ({short(r['verdict'])}): {r['measured'].split('; by encoding')[0]}"
                         for claim, r in data["claims"].items())
    return wrapped(f"Beyond L, mean [adjusted interval] over seeds: {measured}.") + "\n"


def figure(data: dict):
    """The grid's heatmaps (beyond L, at L, and how training ended: the accuracy at L at the end, or before issue
    51 the steps to fit) and, from issue 51 on, its curves over training (over_training_panels), as a
    draw(plt) function; a probe has none."""
    if "fits" in data:
        return None
    tasks_, labels, setup = data["settings"]["tasks"], rows(data["settings"]), data["settings"]
    budgeted = "budget" in setup

    def matrix(at):  # NaN where the cell was not run: drawn blank
        return [[spread([at(a) for a in data["accuracy"][t][row]])["mean"] if data["accuracy"][t][row]
                 else float("nan") for t in tasks_] for row in labels]

    def steps(row, t):  # mean steps to fit over seeds, a seed that did not fit counting as the cap
        per_seed = data["steps_to_fit"][t][row]
        return sum(setup["cap"] if s is None else s for s in per_seed) / len(per_seed) if per_seed else float("nan")

    def ended(row, t):  # mean accuracy at L at the end of training, the fit check's
        per_seed = data["fit_at_end"][t][row]
        return spread(per_seed)["mean"] if per_seed else float("nan")

    L = setup["L"]
    panels = [(f"accuracy beyond L ({2 * L}-{8 * L} tokens)", matrix(beyond), 1, "{:.2f}"),
              (f"accuracy at L ({L} tokens)", matrix(lambda a: a[0]), 1, "{:.2f}"),
              (f"at L at the end of training ({budget_text(setup)}; fit check)",
               [[ended(r, t) for t in tasks_] for r in labels], 1, "{:.2f}") if budgeted else
              (f"steps to fit (cap {setup['cap']})", [[steps(r, t) for t in tasks_] for r in labels], setup["cap"],
               "{:.0f}")]

    def draw(plt):
        columns = max(3, 2 * len(tasks_)) if budgeted else 3
        height = 0.42 * len(labels) + 2.2
        fig, axes = plt.subplots(2 if budgeted else 1, columns, figsize=(16 if columns == 3 else 5.5 * columns,
                                                                         height + (5 if budgeted else 0)),
                                 squeeze=False)
        for ax, panel in zip(axes[0], panels):
            heatmap(ax, data, panel, tasks_, labels)
        for ax in axes[0][len(panels):]:
            ax.axis("off")
        if budgeted:
            over_training_panels(axes[1], data, tasks_, labels)
        fig.suptitle(f"Every encoding on every task, trained at {L // 2}-{L} tokens "
                     + (f"for {budget_text(setup)}" if budgeted else "until it fits") + " (mean over "
                     f"{len(setup['seeds'])} seed(s); † did not count"
                     + ("; '+ rand': randomized positions)" if setup.get("randomized", True) else ")"), fontsize=10)
        fig.tight_layout()
        return fig

    return draw


def heatmap(ax, data: dict, panel: tuple, tasks_: list[str], labels: list[str]) -> None:
    """One heatmap of the grid, panel = (title, values[row][task], top of the colour scale, number format)."""
    title, values, top, form = panel
    ax.imshow(values, vmin=0, vmax=top, cmap="viridis", aspect="auto")
    for i, (row, line) in enumerate(zip(labels, values)):
        for j, (t, v) in enumerate(zip(tasks_, line)):
            mark = "" if cell_fitted(data["steps_to_fit"], t, row) else "†"
            text = "not run" if v != v else form.format(v) + mark  # v != v: NaN
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="black" if v != v or v > 0.6 * top else "white")
    ax.set_xticks(range(len(tasks_)), [t.replace("_", "\n") for t in tasks_], fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_title(title, fontsize=10)


def over_training_panels(axes, data: dict, tasks_: list[str], labels: list[str]) -> None:
    """Per task, accuracy at L and at 8L against the step, one line per variant run (mean over seeds; every
    seed is checked at the same steps), the bar drawn at L; a ranking that flips over training shows here."""
    styles = line_styles(labels, {label: {"ls": "--"} for label in labels if label.endswith("+ rand")})
    panels = [(t, key) for t in tasks_ for key in ("in_range", "out_of_range")]
    for ax, (t, key) in zip(axes, panels):
        for row in labels:
            curves = data["curves"][t][row]
            if curves:
                means = [spread(values)["mean"] for values in zip(*(c[key] for c in curves))]
                ax.plot(curves[0]["steps"], means, label=row, lw=1, **styles[row])
        if key == "in_range":
            ax.axhline(FIT_BAR, color="black", lw=0.8, ls=":")
        where = f"at L = {data['settings']['L']}" if key == "in_range" else f"at {data['curve_at']} tokens"
        ax.set(ylim=(-0.02, 1.02), xlabel="step", ylabel="accuracy", title=f"{t} over training, {where}")
        if ax.get_legend_handles_labels()[0]:  # a variant was run on this task
            ax.legend(fontsize=6, ncol=2)
    for ax in axes[len(panels):]:
        ax.axis("off")


# ---------------------------------------------------------------------------------------------------------
# The probe's markdown, and the claims decided again
# ---------------------------------------------------------------------------------------------------------

def probe_markdown(data: dict) -> str:
    """results/encodings-probe.md: the probe's cost, how each cell's model fitted, and for a probe of the
    budget (every model trained all its steps) how its accuracy at L moved over the last quarter of training."""
    setup = data["settings"]
    budgeted = "budget" in setup
    out = ["# The encodings grid's probe: steps to fit, one seed a cell", "", probe_cost(data), "",
           "Each model as in the grid (`results/encodings.md`), seed 0, trained " + (
               f"every step of {budget_text(setup)}, its accuracy on the held-out fit sequences at L = {setup['L']} "
               f"checked every {setup['every']} steps. " if budgeted else
               f"until accuracy >= {FIT_BAR} on the held-out fit sequences at L = {setup['L']} (checked every "
               f"{setup['every']} steps) or {setup['cap']} steps. ")
           + "Nothing beyond L is measured: the probe plans which cells the grid can afford, not by how they "
           "extrapolate. Task settings: " + ("; ".join(f"{t} " + ", ".join(f"{k}={v}" for k, v in o.items())
                                                          for t, o in data["task_options"].items() if t in data["fits"])
                                              or "defaults")
           + f"; ALiBi with the {ALIBI_SLOPE_HEADS}-head slopes. " + (
               f"The last check's accuracy, and the first step at the bar ({FIT_BAR}):" if budgeted else
               "Steps to fit, or the last check's accuracy:"), ""]
    out += probe_table(data["fits"], rows(data["settings"]), "encoding")
    if budgeted:
        out += ["", *probe_stretch_table(data["fits"], rows(data["settings"]), "encoding")]
    out += ["", "Every model's train.py command: `results/encodings-probe.json`."]
    return "\n".join(out) + "\n"


def decide_again(data: dict) -> dict:
    """The recorded results with their claims decided again from their numbers by the study's claims() under
    the current rule (eval.py --render)."""
    data = dict(data)
    data["claims"], data["caption"] = claims(data["accuracy"], data["steps_to_fit"], data["settings"]["tasks"])
    return data
