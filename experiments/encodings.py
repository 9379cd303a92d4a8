"""Every encoding on algorithmic tasks, each model trained for its task's budget of steps, the same for every
encoding, then measured up to 8L, with and without randomized positions: the comparison the published studies
each make on a few encodings and their own tasks.

    python eval.py --experiment encodings --jobs 2 --threads 1     # results/encodings.{md,json,png}

Ruoss et al. 2023 (arXiv 2305.16843) compare none/sinusoidal/relative/RoPE/ALiBi/learned, with and without
randomized positions, on 15 algorithmic tasks; Kazemnejad et al. 2023 (arXiv 2305.19466) compare NoPE, T5's
bias, ALiBi, RoPE and absolute positions in decoder-only models; FIRE (arXiv 2310.04418) compares itself with
NoPE, RoPE, ALiBi, KERPLE and T5's bias; xPos (arXiv 2212.10554) with RoPE. Here all nine encodings of
lengen.py meet the same tasks, model, budget and seeds; the default trains the cells its probe (--probe, run
first) saw fit at the end of the probe's budget and that a comparison can pair with another such cell, and says
which it left out.

A claim about how a model behaves beyond its training length is only tested by models that learned the task
at that length: one that did not is still learning, and its accuracy beyond L says how far training got. Nor
is a model stopped the moment it learned the task comparable with one trained on (issue 51). So every model of
a task trains the same budget whatever its encoding (train.py --no-fit-stop), fits when it is at the bar at
the end, and a claim is measured only on the models that fitted; each logs its accuracy at L and at 8L over
training (its curves).

Read top to bottom: the setup; training and measuring one model (one job; the jobs are independent, so
--jobs N runs them in N processes with identical results); the published findings as claims and the rule that
decides them; the probe; run(args), which returns the data and writes nothing. The markdown, the heatmaps and
the README/docs table are in experiments/encodings_report.py.
"""
from __future__ import annotations

import os
import time

from tqdm import tqdm

import lengen
import tasks
from eval import evaluate, load_run
from experiments.common import (ALIBI_SLOPE_HEADS, beyond, command_line, cpu_per_step, cpu_seconds, fitted, map_jobs,
                                preset_name, probe, probe_on_record, runtime, train_once)
from experiments.stats import FIT_BAR, LEFT_OUT, THRESHOLD, all_of, caption, decide
from runs import UsageError, read_fit

# ---------------------------------------------------------------------------------------------------------
# The setup
# ---------------------------------------------------------------------------------------------------------

# One model for all: train.py's defaults (2 heads, dim 64, batch 32, AdamW 1e-3 with warm-up and cosine decay
# over the budget) at setup["layers"] layers, trained at lengths L/2..L for its task's budget, evaluated at 1, 2,
# 4 and 8 x L. Fit: accuracy >= FIT_BAR on train.py's held-out fit sequences at L (a seed of their own, neither
# the training stream nor the test set) at the last step; the same check every `every` steps, and one at 8L
# (train.py --fit-far), draw the curves over training. The same rule for every model.
#
# Randomized positions follow Ruoss et al.'s protocol: in training AND at evaluation, each sequence's position
# ids are a sorted random draw from [0, 8L), a range as long as the longest test length (at 8L the draw is every
# id: contiguous). Their models always draw (the draw is part of the model); evaluating such a model with
# contiguous ids instead would measure it on gaps it never saw, even at L.
TASKS = ("copy", "reverse", "duplicate", "associative_recall", "retrieval", "shift", "latest_recall")


def budget(steps: int) -> dict:
    """The same number of steps for every task."""
    return dict.fromkeys(TASKS, steps)


# The default's training budget, in steps by task: every model of a task trains all of them, whatever its
# encoding or positions. 12000: its probe of 12000 steps (issue 51, results/encodings-probe.md) saw every cell
# that fits move by at most 0.02 in range over its last quarter; at 4000, the budget before it, ALiBi, T5 and
# KERPLE were still rising.
DEFAULT_BUDGET = budget(12000)
PRESETS = {
    "quick": dict(L=12, layers=2, budget=budget(20), every=10, seeds=(0,), samples=16, tasks=("reverse", "shift")),
    # the contiguous-id cells its probe saw fit that a comparison can use (planned()), on one task, reverse (read
    # by position), at 3 seeds, the fewest a verdict takes (stats.MIN_UNITS), each its whole budget: 8 cells, 24
    # models, 127 CPU-min of training at the probe's cost, over an hour on 2 cores with the checks and the
    # evaluation. The randomized-id cells (the one claim that reads them, "randomized positions help") are not
    # in it: they would nearly double it (the results say by how much); --full trains them. Decided before the
    # run, from the 12000-step probe: the fewest cells that keep the other three claims whole.
    "default": dict(L=32, layers=4, budget=DEFAULT_BUDGET, every=100, seeds=(0, 1, 2), samples=256,
                    tasks=("reverse",), randomized=()),
    "full": dict(L=32, layers=4, budget=budget(12000), every=100, seeds=(0, 1, 2, 3, 4), samples=512, tasks=TASKS),
    # eval.py --experiment encodings --probe: one seed of every cell of the default's task, at L only, each
    # trained its whole budget (its checks at L are the curve a budget is planned from); the default is planned
    # from it. 12000 steps, three times the 4000 at whose end ALiBi, T5 and KERPLE were still rising in
    # range (the probe of 4000 steps, issue 51): long enough to see where each cell's curve flattens.
    "probe": dict(L=32, layers=4, budget=budget(12000), every=100, seeds=(0,), tasks=("reverse",)),
}
# latest_recall with three facts, one of them about another key: the answer is found by matching the key
TASK_OPTIONS = {"latest_recall": {"statements": 3}}
MIN_SEEDS = 2  # a cell (task, variant) counts as fitted when at least this many seeds ran, and every one fitted
ENCODINGS = tuple(lengen.ENCODINGS)  # nope, learned, sinusoidal, rope, xpos, alibi, t5, kerple, fire
# NoPE reads no position, and train.py draws position ids from a generator of their own, so NoPE with
# randomized positions is bit for bit the same run as without: it is trained once and shown once.
POSITIONS = ("contiguous", "randomized")
MULTIPLES = (1, 2, 4, 8)  # evaluation lengths, as multiples of L; common.beyond: the mean of 2L, 4L and 8L


def variants(setup: dict) -> list[tuple[str, str]]:
    """(encoding, positions) of every model trained per task and seed: every encoding with contiguous ids, and
    with randomized ids those of setup["randomized"] (default: all but NoPE)."""
    randomized = setup.get("randomized", [e for e in ENCODINGS if e != "nope"])
    return [(e, p) for e in ENCODINGS for p in POSITIONS if p == "contiguous" or e in randomized]


def label(encoding: str, positions: str) -> str:
    return encoding if encoding == "nope" or positions == "contiguous" else f"{encoding} + rand"


def rows(setup: dict) -> list[str]:
    """The labels of every variant: one row of each table, and the keys of a task's accuracy and steps_to_fit."""
    return [label(e, p) for e, p in variants(setup)]


def planned(setup: dict, probe: dict | None) -> list[tuple[str, str, str]]:
    """(task, encoding, positions) of every cell the grid trains. With its probe on record (the default), the
    cells whose probe model fitted within the probe's cap and that some comparison of the claims table can use
    (the other cell of it fitted too): a cell that did not fit is not run (the results show how far its probe
    got), nor one whose every partner did not, so no seed is spent on a model the budget cannot fit or no claim
    can read. Without a probe, every cell; a probe that lacks a cell cannot plan it: UsageError (planning it as
    fitted, or as not, would be a guess the results do not show)."""
    cells = [(t, e, p) for t in setup["tasks"] for e, p in variants(setup)]
    if probe is None:
        return cells
    fits = probe["fits"]
    lacking = [(t, label(e, p)) for t, e, p in cells if label(e, p) not in fits.get(t, {})]
    if lacking:
        raise UsageError(f"the probe on record has no {lacking[0][1]} model for {lacking[0][0]}, which the default "
                         "trains: run `python eval.py --experiment encodings --probe` first")
    fit = {(t, label(e, p)) for t, e, p in cells if fitted(fits[t][label(e, p)])}
    randomized = [e for e, p in variants(setup) if p == "randomized"]
    used = {(t, row) for triples in comparisons(setup["tasks"], randomized).values() for t, b, w in triples
            if (t, b) in fit and (t, w) in fit for row in (b, w)}
    return [(t, e, p) for t, e, p in cells if (t, label(e, p)) in used]


def predicted_cpu_s(probe: dict, cells: list[tuple[str, str]], seeds: int, steps: dict | None = None) -> float:
    """What the probe predicts the planned cells (task, row) cost to train, at its CPU seconds per step: each
    cell's budget, steps[task], once per seed; without steps (a grid stopped at the bar, before issue 51),
    each cell's probe steps to fit, a seed slower than the probe's adding to it. Evaluation adds to it too; a
    cell of a task the probe did not measure adds nothing."""
    trained = sum(steps[t] if steps else probe["fits"][t][row]["steps_to_fit"] for t, row in cells
                  if t in probe["fits"])
    return trained * seeds * cpu_per_step(probe)


# ---------------------------------------------------------------------------------------------------------
# Training and measuring one model: one job
# ---------------------------------------------------------------------------------------------------------


def model_argv(task: str, encoding: str, positions: str, seed: int, setup: dict, root: str, device: str,
               far: bool = True) -> list:
    """The train.py command line of one model: what it trains with, and what results/encodings.json lists. Its
    task's whole budget (--no-fit-stop), checked at L every `every` steps and at the end, and, with far (all
    but the probe, which measures nothing beyond L), at 8L too."""
    L = setup["L"]
    options = [word for flag, value in TASK_OPTIONS.get(task, {}).items() for word in (f"--{flag}", str(value))]
    slopes = ["--alibi-slope-heads", str(ALIBI_SLOPE_HEADS)] if encoding == "alibi" else []
    return ["--task", task, *options, "--encoding", encoding, *slopes, "--positions", positions,
            "--layers", str(setup["layers"]), "--train-len", f"{L // 2}:{L}",
            "--steps", str(setup["budget"][task]), "--fit-bar", str(FIT_BAR), "--fit-every", str(setup["every"]),
            "--no-fit-stop", *(["--fit-far", str(MULTIPLES[-1] * L)] if far else []), "--seed", str(seed),
            "--device", device,
            "--out", os.path.join(root, task, f"{encoding}-{positions}-s{seed}"), "--eval-samples", "0", "--force",
            "--quiet"]


def train_and_measure(job: tuple) -> dict:
    """Train one model with train.py's own code for its task's budget, and return its accuracy at every multiple
    of L with the positions it was trained with; from its fit record, whether it fitted (steps_to_fit: its last
    step, None when not at the bar there), the steps it trained, its accuracy at L there (the fit check's) and
    its curves over training (at L and at 8L).
    Beyond L only the answers at index >= L count (evaluate's score_from): shift answers at every index, and
    its answers below L are ones training reached. The same evaluation sequences for every model (evaluate
    draws them from one fixed seed)."""
    task, encoding, positions, seed, setup, root, device = job
    argv = model_argv(task, encoding, positions, seed, setup, root, device)
    trained = train_once(argv)
    out = trained["run"]
    model, cfg = load_run(out, device)
    fit = read_fit(out)
    accuracy = [evaluate(model, task, m * setup["L"], cfg.task_options, setup["samples"], device=device,
                         positions=positions, max_position=cfg.max_position,
                         score_from=setup["L"] if m > 1 else 0)["accuracy"] for m in MULTIPLES]
    curve = {"steps": [step for step, _ in fit["checks"]], "in_range": [acc for _, acc in fit["checks"]],
             "out_of_range": [acc for _, acc in fit["far"]["checks"]]}
    return {"accuracy": accuracy, "steps_to_fit": fit["steps_to_fit"], "steps": fit["checks"][-1][0],
            "fit_at_end": fit["checks"][-1][1], "curve": curve, "cpu_s": trained["cpu_s"]}


def chance(task: str) -> float:
    """Accuracy of a uniform guess among the symbols an answer can be."""
    options = {**tasks.task_options(task), **TASK_OPTIONS.get(task, {})}
    return 1 / options.get("symbols", options.get("values", 1))


# ---------------------------------------------------------------------------------------------------------
# The published findings, as claims, and the rule (stats.decide, fixed before the run)
# ---------------------------------------------------------------------------------------------------------
#
# A comparison "A beats B" is measured on the tasks where both cells fitted (MIN_SEEDS seeds or more, every one
# fitted). Per seed, the mean over those tasks of A's accuracy beyond L minus B's; the seeds are the
# independent units. Every comparison of the claims table is one family (stats.decide: simultaneous intervals),
# "undecided (models did not fit)" when no task has both cells fitted. A claim that A beats several encodings
# needs each comparison (stats.all_of).

PAPER = {
    "randomized positions help": "Ruoss et al. (2305.16843): randomized positions raise test accuracy beyond the "
                                 "training length by 12.0 % on average (6000 models, 15 tasks, several encodings)",
    "NoPE generalizes best": "Kazemnejad et al. (2305.19466): NoPE beats T5's bias, ALiBi, RoPE and absolute "
                             "positions on average in decoder-only models",
    "FIRE generalizes best": "FIRE (2310.04418): FIRE generalizes to longer inputs better than NoPE, RoPE, ALiBi, "
                             "KERPLE and T5's bias",
    "xPos beats RoPE": "xPos (2212.10554): RoPE with xPos's decay extrapolates better than RoPE",
}
KAZEMNEJAD = ("nope", "t5", "alibi", "rope", "learned", "sinusoidal")
FIRE_FIELD = ("fire", "nope", "rope", "alibi", "kerple", "t5")
FIELDS = {"NoPE generalizes best": KAZEMNEJAD, "FIRE generalizes best": FIRE_FIELD}  # the first beats the rest


def comparisons(tasks_: list[str], randomized: list[str]) -> dict[str, list[tuple[str, str, str]]]:
    """The claims table's comparisons, one family: each a list of (task, better, worse) cells, pooled by
    gain(). `randomized`: the encodings trained with randomized ids too."""
    family = {"randomized positions help": [(t, label(e, "randomized"), e) for e in randomized for t in tasks_]
              } if randomized else {}  # a preset without randomized ids (the default) leaves the claim out
    family["xPos beats RoPE"] = [(t, "xpos", "rope") for t in tasks_]
    for field in FIELDS.values():
        family |= {f"{field[0]} - {o}": [(t, field[0], o) for t in tasks_] for o in field[1:]}
    return family


def cell_fitted(steps: dict, task: str, row: str) -> bool:
    """A cell (task, variant) counts when MIN_SEEDS or more seeds ran and every one reached FIT_BAR."""
    per_seed = steps[task][row]
    return len(per_seed) >= MIN_SEEDS and all(s is not None for s in per_seed)


def gain(accuracy: dict, steps: dict, triples: list[tuple[str, str, str]], at=beyond) -> dict:
    """(task, better, worse) comparisons pooled: per seed, the mean of at(better) - at(worse) over the triples
    whose two cells fitted, and how many triples of how many it rests on."""
    kept = [(t, b, w) for t, b, w in triples if cell_fitted(steps, t, b) and cell_fitted(steps, t, w)]
    counts = {len(accuracy[t][row]) for t, b, w in kept for row in (b, w)}
    assert len(counts) <= 1, "every cell holds the same seeds, in the same order"
    seeds = counts.pop() if counts else 0
    per_seed = [sum(at(accuracy[t][b][s]) - at(accuracy[t][w][s]) for t, b, w in kept) / len(kept)
                for s in range(seeds)]
    return {"per_unit": per_seed, "tasks": [t for t, _, _ in kept], "of": len(triples)}


def shown(g: dict, what: str = "tasks") -> str:
    """'+0.123 [+0.050, +0.196] (2 of 3 tasks)': the mean and adjusted interval over seeds (the mean alone when
    it was not tested), and how many of the comparisons had both cells fitted; or 'not fitted'."""
    if not g["tasks"]:
        return "not fitted"
    mean = sum(g["per_unit"]) / len(g["per_unit"])
    interval = f" [{g['low']:+.3f}, {g['high']:+.3f}]" if "low" in g else ""
    return f"{mean:+.3f}{interval} ({len(g['tasks'])} of {g['of']} {what})"


def claims(accuracy: dict, steps: dict, tasks_: list[str]) -> tuple[dict, str]:
    """The claims table: its comparisons decided as one family (pooled randomized gain, each pairwise comparison
    of the two "X is best" claims, xPos - RoPE); the by-encoding and at-L numbers are shown, not tested."""
    randomized = [e for e in ENCODINGS if e != "nope" and label(e, "randomized") in accuracy[tasks_[0]]]
    triples = comparisons(tasks_, randomized)
    pairs = triples.get("randomized positions help")
    family = {k: gain(accuracy, steps, t) for k, t in triples.items()}
    decided = decide({k: g["per_unit"] for k, g in family.items()}, THRESHOLD,
                     fitted={k: bool(g["tasks"]) for k, g in family.items()})
    family = {k: {**g, **decided[k]} for k, g in family.items()}
    out = {"randomized positions help": {"verdict": LEFT_OUT, "tasks": [], "measured": "no model with randomized "
                                         "ids in this preset (`--full` trains them)"}}
    if randomized:
        at_L = gain(accuracy, steps, pairs, at=lambda a: a[0])  # where nothing is extrapolated
        each = {e: gain(accuracy, steps, [(t, label(e, "randomized"), e) for t in tasks_]) for e in randomized}
        pooled = family["randomized positions help"]
        out["randomized positions help"] = {
            **pooled, "measured": f"over every fitted (encoding, task) pair: {shown(pooled, 'pairs')}, at L itself "
                                  f"{shown(at_L, 'pairs')}; by encoding: "
                                  + "; ".join(f"{e} {shown(g)}" for e, g in each.items())}
    for claim, field in FIELDS.items():
        each = {o: family[f"{field[0]} - {o}"] for o in field[1:]}
        out[claim] = {"measured": "; ".join(f"{field[0]} - {o} {shown(g)}" for o, g in each.items()),
                      "comparisons": {o: g["verdict"] for o, g in each.items()},
                      "tasks": sorted(set().union(*(g["tasks"] for g in each.values()))),
                      "verdict": all_of([g["verdict"] for g in each.values()])}
    xpos = family["xPos beats RoPE"]
    out["xPos beats RoPE"] = {**xpos, "measured": f"xpos - rope {shown(xpos)}"}
    return out, caption(family)


# ---------------------------------------------------------------------------------------------------------
# The probe, and the run
# ---------------------------------------------------------------------------------------------------------

def run_probe(args, setup: dict) -> dict:
    """--probe: one seed of every cell, each trained for its task's budget (common.probe); nothing beyond L is
    measured, so the plan cannot choose cells by how they extrapolate."""
    root = os.path.join("runs", "encodings", "probe")
    cells = [(t, label(e, p), model_argv(t, e, p, setup["seeds"][0], setup, root, args.device, far=False))
             for t in setup["tasks"] for e, p in variants(setup)]
    with tqdm(total=len(cells), desc="encodings probe") as bar:
        data = probe(cells, args, setup, bar)
    data["task_options"] = TASK_OPTIONS
    return data


def per_cell(setup: dict, jobs: list, results: list[dict], key: str) -> dict:
    """results[i][key] of every job as [task][row], one entry per seed, in the order of the seeds ([]: not run)."""
    table = {t: {row: [] for row in rows(setup)} for t in setup["tasks"]}
    for (t, e, p, *_), result in zip(jobs, results):
        table[t][label(e, p)].append(result[key])
    return table


def run(args) -> dict:
    """Train and measure every planned model (--probe: the probe) and return what results/encodings.json holds:
    per [task][row], one entry per seed (none: not run), the accuracy at every multiple of L, steps_to_fit
    (None: not at the bar at the end), the steps each model trained, its accuracy at L at the end (the fit
    check's) and its curves over training ({"steps", "in_range": at L, "out_of_range": at 8L}); every model's
    command, and the claims decided from them."""
    preset = preset_name(args)
    setup = PRESETS[preset]
    if preset == "probe":
        return run_probe(args, setup)
    root = os.path.join("runs", "encodings", preset)
    since = (time.perf_counter(), cpu_seconds())
    on_record = probe_on_record("encodings", args.out_dir, PRESETS["probe"], task_options=TASK_OPTIONS) \
        if preset == "default" else None
    jobs = [(t, e, p, seed, setup, root, args.device) for t, e, p in planned(setup, on_record)
            for seed in setup["seeds"]]
    if on_record:  # said before the run spends it
        cells = {(t, label(e, p)) for t, e, p, *_ in jobs}
        tqdm.write(f"encodings: {len(cells)} cells planned from the probe, {len(jobs)} models; the probe predicts "
                   f"{predicted_cpu_s(on_record, cells, len(setup['seeds']), setup['budget']) / 60:.0f} CPU-min "
                   "of training")
    with tqdm(total=len(jobs), desc="encodings") as bar:
        results = map_jobs(train_and_measure, jobs, args.jobs, args.threads or 1, bar)
    accuracy, steps = per_cell(setup, jobs, results, "accuracy"), per_cell(setup, jobs, results, "steps_to_fit")
    data = {"command": command_line(args), "runtime": runtime(since, args), "scale": preset, "settings": setup,
            "fit_bar": FIT_BAR, "models": len(jobs), "steps_trained": sum(r["steps"] for r in results),
            # what training the models took, each its own (train_once): runtime is this invocation's, ~0 for a
            # model an earlier, stopped invocation of the same command trained
            "training_cpu_s": round(sum(r["cpu_s"] for r in results), 1),
            "lengths": [m * setup["L"] for m in MULTIPLES], "threshold": THRESHOLD,
            "chance": {t: chance(t) for t in setup["tasks"]}, "scored_from_L": True,
            "alibi_slope_heads": ALIBI_SLOPE_HEADS, "accuracy": accuracy,
            "steps_to_fit": steps, "steps": per_cell(setup, jobs, results, "steps"),
            "fit_at_end": per_cell(setup, jobs, results, "fit_at_end"), "curve_at": MULTIPLES[-1] * setup["L"],
            "curves": per_cell(setup, jobs, results, "curve"),
            "commands": ["python train.py " + " ".join(model_argv(*job)) for job in jobs]}
    if on_record:
        data["probe"], data["partnered"] = on_record, True  # planned(): fitted cells a comparison can use
    data["claims"], data["caption"] = claims(accuracy, steps, setup["tasks"])
    return data
