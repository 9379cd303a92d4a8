"""Every encoding on every algorithmic task, trained at <= L and measured up to 8L, with and without randomized
positions: the comparison the published studies each make on a few encodings and their own tasks.

    python eval.py --experiment encodings --jobs 2 --threads 1     # results/encodings.{md,json,png}

Ruoss et al. 2023 (arXiv 2305.16843) compare none/sinusoidal/relative/RoPE/ALiBi/learned, with and without
randomized positions, on 15 algorithmic tasks; Kazemnejad et al. 2023 (arXiv 2305.19466) compare NoPE, T5's
bias, ALiBi, RoPE and absolute positions in decoder-only models; FIRE (arXiv 2310.04418) compares itself with
NoPE, RoPE, ALiBi, KERPLE and T5's bias; xPos (arXiv 2212.10554) with RoPE. Here all nine encodings of
lengen.py meet the same tasks, model, budget and seeds.

Read top to bottom: the setup; training and measuring one model (one job; the jobs are independent, so
--jobs N runs them in N processes with identical results); the published findings as claims with
thresholds; the markdown and the heatmaps; run(args).
"""
from __future__ import annotations

import os
import time

from tqdm import tqdm

import lengen
import tasks
import train
from eval import (THRESHOLD, beyond, command_line, cpu_seconds, fmt, map_jobs, paired_gain, scale_name, spread,
                  train_once, verdict, write_results)

# ---------------------------------------------------------------------------------------------------------
# The setup
# ---------------------------------------------------------------------------------------------------------

# One model for all: train.py's defaults (2 layers, 2 heads, dim 64, batch 32, AdamW 1e-3 with warm-up
# and cosine decay), trained at lengths L/2..L and evaluated with contiguous positions at 1, 2, 4 and 8 x L.
# Randomized positions are drawn from [0, 8L) (train.py's default range), so every position met at
# evaluation was met in training, as in Ruoss et al.; the learned table has 8L rows either way.
TASKS = ("copy", "reverse", "duplicate", "associative_recall", "retrieval", "shift", "latest_recall")
SCALES = {
    "quick": dict(L=12, steps=20, seeds=(0,), samples=16, tasks=("copy", "associative_recall")),
    "default": dict(L=32, steps=1000, seeds=(0, 1), samples=128, tasks=TASKS),
    "full": dict(L=32, steps=4000, seeds=(0, 1, 2, 3, 4), samples=512, tasks=TASKS),
}
ENCODINGS = tuple(lengen.ENCODINGS)  # nope, learned, sinusoidal, rope, xpos, alibi, t5, kerple, fire
# NoPE reads no position, and train.py draws position ids from a generator of their own, so NoPE with
# randomized positions is bit for bit the same run as without: it is trained once and shown once.
POSITIONS = ("contiguous", "randomized")
MULTIPLES = (1, 2, 4, 8)  # evaluation lengths, as multiples of L; eval.beyond: the mean of 2L, 4L and 8L


def variants() -> list[tuple[str, str]]:
    """(encoding, positions) of every model trained per task and seed."""
    return [(e, p) for e in ENCODINGS for p in POSITIONS if not (e == "nope" and p == "randomized")]


def label(encoding: str, positions: str) -> str:
    return encoding if encoding == "nope" or positions == "contiguous" else f"{encoding} + rand"


# ---------------------------------------------------------------------------------------------------------
# Training and measuring one model: one job
# ---------------------------------------------------------------------------------------------------------


def train_and_measure(job: tuple) -> list[float]:
    """Train one model with train.py's own code and return its accuracy at every multiple of L. The same
    evaluation sequences for every model (train.evaluate draws them from one fixed seed)."""
    task, encoding, positions, seed, setup, root, device = job
    L = setup["L"]
    out = os.path.join(root, task, f"{encoding}-{positions}-s{seed}")
    train_once(["--task", task, "--encoding", encoding, "--positions", positions, "--train-len", f"{L // 2}:{L}",
               "--steps", str(setup["steps"]), "--seed", str(seed), "--device", device, "--out", out,
               "--eval-samples", "0", "--force", "--quiet"])
    model, cfg = train.load_run(out, device)
    return [train.evaluate(model, task, m * L, cfg["task_options"], setup["samples"], device=device)["accuracy"]
            for m in MULTIPLES]


def chance(task: str) -> float:
    """Accuracy of a uniform guess among the symbols an answer can be."""
    options = tasks.task_options(task)
    return 1 / options.get("symbols", options.get("values", 1))


# ---------------------------------------------------------------------------------------------------------
# The published findings, as claims
# ---------------------------------------------------------------------------------------------------------

def average(accuracy: dict, tasks_: list[str], encoding: str, positions: str, at=beyond) -> list[float]:
    """Per seed: the mean over tasks of at(accuracies) for one variant (beyond L by default)."""
    per_task = [[at(a) for a in accuracy[t][label(encoding, positions)]] for t in tasks_]
    return [sum(values) / len(values) for values in zip(*per_task)]


def ranking(accuracy: dict, tasks_: list[str], encodings: tuple[str, ...]) -> list[tuple[str, float]]:
    """Encodings (contiguous positions) from best to worst by mean accuracy beyond L over tasks and seeds."""
    means = {e: spread(average(accuracy, tasks_, e, "contiguous"))["mean"] for e in encodings}
    return sorted(means.items(), key=lambda item: -item[1])


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


def claims(accuracy: dict, tasks_: list[str]) -> dict:
    """Each finding measured with the same rule: seed-paired where it compares two models, a ranking where
    the paper ranks several; 'partly' says how much of it holds."""
    out = {}
    gains = {e: paired_gain(average(accuracy, tasks_, e, "randomized"), average(accuracy, tasks_, e, "contiguous"),
                            THRESHOLD) for e in ENCODINGS if e != "nope"}
    held = [e for e, g in gains.items() if g["holds"]]
    # the same difference at L itself: randomized training may cost accuracy where nothing is extrapolated
    at_L = spread([a - b for e in gains for a, b in zip(average(accuracy, tasks_, e, "randomized", lambda a: a[0]),
                                                         average(accuracy, tasks_, e, "contiguous", lambda a: a[0]))])
    out["randomized positions help"] = {
        "measured": "; ".join(f"{e} {fmt(g, '+.3f')}" for e, g in gains.items())
                    + f" (at L itself: {at_L['mean']:+.3f} on average)",
        "mean_gain": spread([g["mean"] for g in gains.values()])["mean"], "gain_at_L": at_L["mean"],
        "verdict": verdict(len(held) == len(gains), bool(held)), "holds_for": held}
    for claim, field, winner in (("NoPE generalizes best", KAZEMNEJAD, "nope"),
                                 ("FIRE generalizes best", FIRE_FIELD, "fire")):
        order = ranking(accuracy, tasks_, field)
        place = [e for e, _ in order].index(winner)
        out[claim] = {"measured": " > ".join(f"{e} {m:.3f}" for e, m in order), "place": place + 1,
                      "verdict": verdict(place == 0, place < len(order) / 2)}
    g = paired_gain(average(accuracy, tasks_, "xpos", "contiguous"), average(accuracy, tasks_, "rope", "contiguous"),
                    THRESHOLD)
    out["xPos beats RoPE"] = {"measured": f"xpos - rope = {fmt(g, '+.3f')}",
                              "verdict": verdict(g["holds"], g["mean"] > 0)}
    return out


# ---------------------------------------------------------------------------------------------------------
# Markdown and figure
# ---------------------------------------------------------------------------------------------------------

def grid(data: dict, at) -> list[str]:
    """One row per variant, one column per task and their mean: mean ± sd over seeds of at(accuracies)."""
    tasks_, rows = data["settings"]["tasks"], [label(e, p) for e, p in variants()]
    out = ["| encoding | " + " | ".join(f"{t} ({chance(t):.2f})" for t in tasks_) + " | mean |",
           "|---|" + "---:|" * (len(tasks_) + 1)]
    for row in rows:
        per_task = [[at(a) for a in data["accuracy"][t][row]] for t in tasks_]  # each: one value per seed
        per_seed = [sum(v) / len(v) for v in zip(*per_task)]
        cells = [fmt(values, form="sd") for values in per_task]
        out.append(f"| {row} | " + " | ".join(cells) + f" | **{fmt(per_seed, form='sd')}** |")
    return out


def markdown(data: dict) -> str:
    setup, rt = data["settings"], data["runtime"]
    L = setup["L"]
    out = ["# Every encoding on every task", "",
           f"`{data['command']}`: {rt['wall_s'] / 60:.1f} min wall, {rt['cpu_s'] / 60:.1f} min CPU (all "
           f"processes), {rt['jobs']} job(s) of {rt['threads']} thread(s), {rt['cores']} cores; "
           f"{data['models']} models.", "",
           f"Every model: 2 layers, 2 heads, dim 64, {setup['steps']} steps of 32 sequences at lengths "
           f"{L // 2}..{L}; evaluated with contiguous positions on {setup['samples']} sequences at "
           f"{', '.join(str(m * L) for m in MULTIPLES)} tokens; seeds {', '.join(map(str, setup['seeds']))}. "
           f"'+ rand': positions drawn from [0, {8 * L}) in training. Beyond L = the mean of "
           f"{', '.join(str(m * L) for m in MULTIPLES[1:])}. A gain counts at >= {THRESHOLD} on average and "
           "> 0 in every seed.", "",
           "## The published findings", "",
           "| claim | what the paper says | measured here (mean over tasks, beyond L) | verdict |", "|---|---|---|---|"]
    for claim, result in data["claims"].items():
        out.append(f"| {claim} | {PAPER[claim]} | {result['measured']} | **{result['verdict']}** |")
    gap = data["claims"]["randomized positions help"]["gain_at_L"]
    out += ["", f"Randomized training changed accuracy at L itself, where nothing is extrapolated, by {gap:+.3f} on "
            "average. Where that is well below zero, those models had not yet learned the tasks in distribution within "
            "this budget, and their accuracy beyond L measures that as much as generalization: what would decide the "
            "first claim is training until both kinds fit the training lengths equally well (`--full` trains 4x "
            "longer, with 5 seeds).", "",
            "## Accuracy beyond L (mean ± sd over seeds; chance in brackets)", ""] + grid(data, beyond)
    out += ["", "## Accuracy at L, in distribution: did the model learn the task at all?", ""]
    out += grid(data, lambda a: a[0])
    out += ["", "Every number: `results/encodings.json`. Heatmaps: `results/encodings.png`."]
    return "\n".join(out) + "\n"


def figure(data: dict):
    tasks_, rows = data["settings"]["tasks"], [label(e, p) for e, p in variants()]

    def matrix(at):
        cells = [[spread([at(a) for a in data["accuracy"][t][row]])["mean"] for t in tasks_] for row in rows]
        return [r + [sum(r) / len(r)] for r in cells]

    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(15, 0.42 * len(rows) + 2.2))
        L = data["settings"]["L"]
        for ax, (title, at) in zip(axes, [(f"beyond L ({2 * L}-{8 * L} tokens)", beyond),
                                          (f"at L ({L} tokens), in distribution", lambda a: a[0])]):
            values = matrix(at)
            ax.imshow(values, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            for i, row in enumerate(values):
                for j, v in enumerate(row):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                            color="black" if v > 0.6 else "white")
            ax.set_xticks(range(len(tasks_) + 1), [t.replace("_", "\n") for t in tasks_] + ["mean"], fontsize=8)
            ax.set_yticks(range(len(rows)), rows, fontsize=8)
            ax.set_title(f"accuracy {title}", fontsize=10)
        fig.suptitle(f"Every encoding on every task (trained at {L // 2}-{L} tokens; mean over "
                     f"{len(data['settings']['seeds'])} seed(s); '+ rand': randomized positions in training)",
                     fontsize=10)
        fig.tight_layout()
        return fig

    return draw


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------

def run(args) -> None:
    scale = scale_name(args)
    setup = SCALES[scale]
    root = os.path.join("runs", "encodings", scale)
    start, cpu_start = time.perf_counter(), cpu_seconds()
    jobs = [(t, e, p, seed, setup, root, args.device) for t in setup["tasks"] for e, p in variants()
            for seed in setup["seeds"]]
    with tqdm(total=len(jobs), desc="encodings") as bar:
        results = map_jobs(train_and_measure, jobs, args.jobs, args.threads or 1, bar)
    # accuracy[task][variant label] = one list of accuracies at MULTIPLES x L per seed
    accuracy = {t: {label(e, p): [] for e, p in variants()} for t in setup["tasks"]}
    for (t, e, p, _, _, _, _), acc in zip(jobs, results):
        accuracy[t][label(e, p)].append(acc)
    runtime = {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(cpu_seconds() - cpu_start, 1),
               "jobs": args.jobs, "threads": args.threads or 1, "cores": os.cpu_count()}
    data = {"command": command_line(args), "runtime": runtime, "scale": scale, "settings": setup,
            "models": len(jobs), "lengths": [m * setup["L"] for m in MULTIPLES], "threshold": THRESHOLD,
            "chance": {t: chance(t) for t in setup["tasks"]}, "accuracy": accuracy,
            "claims": claims(accuracy, setup["tasks"])}
    write_results("encodings", markdown(data), data, figure(data), args.out_dir)
