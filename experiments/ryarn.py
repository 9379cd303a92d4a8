"""Paper R (Randomized YaRN, arXiv 2606.23687) on the small GPT, tested on a task where it can win.

    python eval.py --experiment ryarn          # results/ryarn.{md,json,png}

Paper R fine-tunes a model pretrained at context L on short data, giving every token a YaRN rotary encoding
(factor s) at a position drawn from a range that a curriculum widens from the training length to about
twice it, then evaluates with ordinary contiguous positions far beyond L. Its benchmarks (BABILong, MRCR)
find the answer by content among distractors, where order matters. The main task here is of that kind:
tasks.latest_recall, facts key=value stated and restated among filler, then a key: answer with its latest
value. Copy and fixed-offset retrieval are kept as controls: they define the answer by position, which is
exactly what random gaps between positions take away.

Read top to bottom: the setup and every method's train.py flags; training and measuring; the claims with
their thresholds; the markdown and the figure; run(args).
"""
from __future__ import annotations

import os
import time

from tqdm import tqdm

import tasks
import train
from eval import (THRESHOLD, beyond, command_line, cpu_seconds, fmt, line_styles, map_jobs, paired_gain,
                  plot_curves, scale_name, seed_curve, spread, verdict, write_results)

# ---------------------------------------------------------------------------------------------------------
# The setup
# ---------------------------------------------------------------------------------------------------------

# The pretrained model: a RoPE GPT (train.py's defaults: 2 layers, 2 heads, dim 64) trained on the task at
# lengths L/2..L with contiguous positions, so its original context is L. Fine-tuning keeps those lengths.
# YaRN's factor s makes sL = 16L, the longest evaluated length; inference may stretch further (s' = 2s).
# Randomized positions come from [0, M), M widening from L to range x L in Paper R's stages (1, 1.25, 1.5,
# 2, 2 x; lengen.LengthCurriculum "paper-r"); "-nocurr" draws from [0, range x L) from the first step.
# The default shares one pretrained model among the fine-tuning seeds; "full" pretrains one per seed.
SCALES = {
    "quick": dict(L=24, factor=16, pretrain=150, finetune=30, seeds=(0,), shared_base=True, samples=32,
                  ranges=(2, 4), control_pretrain=60, control_finetune=20),
    "default": dict(L=32, factor=16, pretrain=10000, finetune=800, seeds=(0, 1, 2), shared_base=True,
                    samples=256, ranges=(2, 4, 8), control_pretrain=1500, control_finetune=400),
    "full": dict(L=32, factor=16, pretrain=20000, finetune=2000, seeds=(0, 1, 2, 3, 4), shared_base=False,
                 samples=1024, ranges=(2, 4, 8, 16), control_pretrain=4000, control_finetune=1000),
}
TASK = "latest_recall"
TASK_OPTIONS = {"keys": 8, "values": 8, "statements": 4, "fillers": 8}  # chance 1/8; half of the facts' keys
CONTROLS = ("copy", "retrieval")                                          # repeat, so order decides
MULTIPLES = (1, 2, 4, 8, 16)  # evaluation lengths, as multiples of L; eval.beyond: the mean of 2L .. 16L

METHODS = {  # label: what it is (a fine-tune's train.py flags: method_flags)
    "zero-shot": "the pretrained model, no fine-tuning, plain RoPE",
    "zero-shot+yarn": "the same weights read with YaRN (factor s) at inference only",
    "ft": "plain fine-tuning: plain RoPE, contiguous positions",
    "yarn": "fine-tuning with YaRN (factor s), contiguous positions (Paper R's \"trained YaRN\")",
    "rpe": "randomized positions with the curriculum, plain RoPE (Paper R's RPE baseline)",
    "ryarn": "Randomized YaRN: YaRN + randomized positions, range widened from L to 2L in Paper R's stages",
    "rpe-nocurr": "RPE without the curriculum: positions from [0, 2L) from the first step",
    "ryarn-nocurr": "Randomized YaRN without the curriculum: positions from [0, 2L) from the first step",
}
FINE_TUNES = list(METHODS)[2:]  # every method but the two readings of the pretrained model


def method_flags(method: str, L: int, s: float, top: int = 2) -> list[str]:
    """train.py flags of a fine-tuning method; `top` is where the position range ends, as a multiple of L."""
    yarn = ["--scaling", "yarn", "--factor", str(s), "--original-len", str(L)]
    curriculum = ["--positions", "randomized", "--curriculum", f"{L}:{top * L}:paper-r"]
    whole_range = ["--positions", "randomized", "--max-position", str(top * L)]
    return {"ft": [], "yarn": yarn, "rpe": curriculum, "ryarn": yarn + curriculum,
            "rpe-nocurr": whole_range, "ryarn-nocurr": yarn + whole_range}[method]


# ---------------------------------------------------------------------------------------------------------
# Training and measuring
# ---------------------------------------------------------------------------------------------------------


def task_flags(task: str) -> list[str]:
    options = TASK_OPTIONS if task == TASK else {}
    return ["--task", task] + [word for key, value in options.items() for word in (f"--{key}", str(value))]


def train_argv(task: str, out: str, L: int, steps: int, seed: int, args, *extra: str) -> list[str]:
    """One train.py command line: lengths L/2..L, no final table (the experiment measures every model on the
    same sequences itself), --force so that every number comes from this run."""
    return task_flags(task) + ["--train-len", f"{L // 2}:{L}", "--steps", str(steps), "--seed", str(seed),
                               "--threads", str(args.threads or 1), "--device", args.device, "--out", out,
                               "--eval-samples", "0", "--force", "--quiet", *extra]


def finetune_argv(task, root, base, method, setup, seed, args, top=2) -> list[str]:
    """Fine-tune from the pretrained run `base`; a short warm-up, since the weights are trained already."""
    name = method if top == 2 else f"{method}-range{top}"
    return train_argv(task, os.path.join(root, f"{name}-s{seed}"), setup["L"], setup["finetune"], seed, args,
                      "--init", base, "--warmup", "20", *method_flags(method, setup["L"], setup["factor"], top))


def accuracies(run_dir: str, task: str, setup: dict, args, factor: float | None = None) -> list[float]:
    """Accuracy at every evaluated length, with contiguous positions; the same sequences for every model
    (train.evaluate draws them from one fixed seed). factor: read the model with YaRN x factor instead."""
    L = setup["L"]
    overrides = {"scaling": "yarn", "factor": factor, "original_len": L} if factor else {}
    model, cfg = train.load_run(run_dir, args.device, **overrides)
    return [train.evaluate(model, task, m * L, cfg["task_options"], setup["samples"], device=args.device)["accuracy"]
            for m in MULTIPLES]


# ---------------------------------------------------------------------------------------------------------
# The claims: each a seed-paired gain in accuracy beyond L (eval.beyond) of at least eval.THRESHOLD
# ---------------------------------------------------------------------------------------------------------

PAPER = {  # what Paper R reports (secondary source, OOD averages on Qwen2.5-7B)
    "ryarn > yarn > ft beyond L": "trained YaRN -> Randomized YaRN: BABILong 81.3 -> 90.3, MRCR 59.3 -> 72.7; "
                                  "trained YaRN above plain fine-tuning",
    "ryarn > rpe beyond L": "RPE is the baseline Randomized YaRN beats (MRCR with the curriculum: 75.1 vs 77.3)",
    "the curriculum helps": "without it MRCR drops by 18.3 points for RPE (75.1 -> 56.8) and by 7.9 for "
                            "Randomized YaRN (77.3 -> 69.4)",
}
CLAIMS = {"ryarn > yarn > ft beyond L": [("ryarn", "yarn"), ("yarn", "ft")],
          "ryarn > rpe beyond L": [("ryarn", "rpe")],
          "the curriculum helps": [("ryarn", "ryarn-nocurr"), ("rpe", "rpe-nocurr")]}


def claims(accuracy: dict) -> dict:
    """Each claim: its seed-paired gains beyond L and a verdict (all gains hold / some / none)."""
    out = {}
    for claim, pairs in CLAIMS.items():
        gains = [{"better": b, "worse": w, **paired_gain([beyond(a) for a in accuracy[b]],
                                                         [beyond(a) for a in accuracy[w]], THRESHOLD)}
                 for b, w in pairs]
        out[claim] = {"gains": gains, "verdict": verdict(all(g["holds"] for g in gains),
                                                         any(g["holds"] for g in gains))}
    return out


# ---------------------------------------------------------------------------------------------------------
# The markdown and the figure
# ---------------------------------------------------------------------------------------------------------

def accuracy_table(by_method: dict, lengths: list[int]) -> list[str]:
    rows = ["| method | " + " | ".join(map(str, lengths)) + " | beyond L |", "|---|" + "---:|" * (len(lengths) + 1)]
    for method, per_seed in by_method.items():
        cells = [fmt(list(a), ".3f", "sd") for a in zip(*per_seed)] + [fmt([beyond(a) for a in per_seed], ".3f", "sd")]
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return rows


def header(data: dict) -> list[str]:
    """The title, the command and what it cost, and the setup."""
    setup, L, s = data["settings"], data["settings"]["L"], data["settings"]["factor"]
    lengths = [m * L for m in MULTIPLES]
    seeds = ", ".join(map(str, setup["seeds"]))
    base = "one pretrained model shared by the fine-tuning seeds" if setup["shared_base"] else \
        "one pretrained model per seed"
    runtime = data["runtime"]
    return [
        "# Randomized YaRN (Paper R, arXiv 2606.23687) on a small GPT", "",
        f"Command: `{data['command']}`  ",
        f"Runtime: {runtime['wall_s'] / 60:.1f} min wall clock, {runtime['cpu_s'] / 60:.1f} min of CPU time "
        f"({runtime['threads']} torch thread(s) in each of {runtime['jobs']} process(es) at once, "
        f"{runtime['cores']} cores, shared with other work).", "",
        f"**Setup.** Task `{TASK}` ({', '.join(f'{k}={v}' for k, v in TASK_OPTIONS.items())}; chance "
        f"1/{TASK_OPTIONS['values']}): facts key=value among filler, the queried key stated at least twice with "
        f"different values, answer its latest value. A RoPE GPT (2 layers, 2 heads, dim 64) is pretrained "
        f"for {setup['pretrain']} steps at lengths {L // 2}..{L} with contiguous positions ({base}), so L = {L}. "
        f"Each method then fine-tunes it for {setup['finetune']} steps at the same lengths. YaRN: s = {s} over "
        f"L (sL = {s * L}). Randomized positions: n sorted distinct ids from [0, M), M widening from L to 2L in "
        f"Paper R's stages (1, 1.25, 1.5, 2, 2 x L, equal stages), the default of train.py --llm too. Evaluation: "
        f"contiguous positions at {', '.join(map(str, lengths))}, the same {setup['samples']} sequences per "
        f"length for every model; fine-tuning seeds {seeds}. \"Beyond L\" is a model's mean accuracy at "
        f"{', '.join(map(str, lengths[1:]))}; the sampled range ends at 2L, well inside that.", ""]


def claims_table(claims_: dict) -> list[str]:
    """The rule, then each claim with its seed-paired gains and its verdict."""
    rows = [f"A claim holds when every seed-paired difference of beyond-L accuracy is >= +{THRESHOLD} on average and "
            "> 0 in every seed (threshold fixed before the run).", "",
            "| claim | Paper R | measured: better − worse, mean ± sd [min, max] over seeds | verdict |",
            "|---|---|---|---|"]
    for claim, result in claims_.items():
        cells = "<br>".join(f"{g['better']} − {g['worse']} = {fmt(g, '+.3f', 'sd range')}" for g in result["gains"])
        rows.append(f"| {claim} | {PAPER[claim]} | {cells} | **{result['verdict']}** |")
    return rows


def markdown(data: dict) -> str:
    s = data["settings"]["factor"]
    lengths = [m * data["settings"]["L"] for m in MULTIPLES]
    out = header(data) + ["## Claims", ""] + claims_table(data["claims"])
    out += ["", f"## `{TASK}`: accuracy by length (mean ± sd over seeds)", ""]
    out += accuracy_table(data["accuracy"], lengths)
    out += ["", "Methods: " + "; ".join(f"`{m}`: {what}" for m, what in METHODS.items()) + ".", "",
            "## How far to randomize: the top of the range (ryarn)", "",
            f"The same recipe with the range widened to 2L, 4L, ... "
            f"({', '.join(f'{r}L' for r in data['settings']['ranges'])}); "
            f"and the 2L model read at inference with a larger factor s' = {2 * s}.", ""]
    out += accuracy_table(data["sweep"], lengths)
    sweep = {name: spread([beyond(a) for a in per_seed])["mean"] for name, per_seed in data["sweep"].items()}
    best = max(sweep, key=sweep.get)
    out += ["", f"Best beyond L: `{best}` ({sweep[best]:.3f}).", "",
            "## Controls: copy and fixed-offset retrieval", "",
            "Both define the answer by position, which is what random gaps take away: in copy the i-th output is "
            "the token exactly n + 1 places back, in retrieval the token exactly k places back, and with gaps "
            "between positions \"n + 1 places back\" no longer has one rotary phase. Randomized positions are "
            "not expected to help here. One seed, one pretrained model each.", ""]
    for task, by_method in data["controls"].items():
        out += [f"### {task} (chance 1/{tasks.task_options(task)['symbols']})", ""]
        out += accuracy_table(by_method, lengths) + [""]
    out += ["Every number: `results/ryarn.json`. Figure: `results/ryarn.png`."]
    return "\n".join(out) + "\n"


def styles(data: dict) -> dict[str, dict]:
    """Every label the figure draws, each alike in every panel: the methods, then the sweep's variants ("ryarn,
    range 2L" is the ryarn model itself). Dashed: not fine-tuned; thick: the method Paper R proposes."""
    sweep = [name for name in data["sweep"] if name != "ryarn, range 2L"]
    out = line_styles(list(METHODS) + sweep, {"zero-shot": {"ls": "--"}, "zero-shot+yarn": {"ls": "--"},
                                              "ryarn": {"lw": 2.5}})
    return out | {"ryarn, range 2L": out["ryarn"]}


def figure(data: dict):
    L, lengths = data["settings"]["L"], [m * data["settings"]["L"] for m in MULTIPLES]
    style = styles(data)

    def draw(plt):
        panels = [(f"{TASK}: every method", data["accuracy"]), ("ryarn: the top of the range, and s'", data["sweep"])]
        panels += [(f"control: {task}", by) for task, by in data["controls"].items()]
        fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4))
        for ax, (title, by_method) in zip(axes, panels):
            curves = {m: seed_curve("length", lengths, per_seed) for m, per_seed in by_method.items()}
            plot_curves(ax, curves, "length", (L // 2, L), styles=style)
            ax.axvline(2 * L, color="grey", ls=":", lw=1)  # the top of the sampled range
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.set_title(title, fontsize=9)
        fig.suptitle(f"Randomized YaRN on a small GPT (L = {L}, s = {data['settings']['factor']}; dotted: top of "
                     f"the sampled range; bands: min-max over seeds)", fontsize=10)
        fig.tight_layout()
        return fig

    return draw


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------

def fit_worker(job) -> list[list[float]]:
    """Train one run (train.py's command line `argv`), then measure it: its accuracies as trained, and read
    with YaRN x each factor in `factors` (None: as trained). Module-level, so that a --jobs worker process
    can run it; every run is seeded by its own command line, so where it runs changes nothing."""
    argv, task, setup, args, factors = job
    out = train.run(argv)["run"]
    return [accuracies(out, task, setup, args, factor) for factor in factors]


def base_dir(root: str, setup: dict, task: str, seed: int) -> str:
    """The pretrained model a fine-tune of this seed starts from: one per seed, or one shared (the controls
    always share theirs)."""
    shared = task != TASK or setup["shared_base"]
    return os.path.join(root, task, f"pretrain-s{(0 if task != TASK else setup['seeds'][0]) if shared else seed}")


def planned_runs(setup: dict, root: str, args) -> tuple[list, list]:
    """Two waves of independent runs (--jobs N runs N at once): the pretrained models, then the fine-tunes,
    which start from them. A shared base is trained and measured once, then paired with each seed. Returns
    (the bases' jobs, the fine-tunes' (key, job) pairs); a key says where its accuracies go."""
    L, s, seeds = setup["L"], setup["factor"], setup["seeds"]
    bases = [(train_argv(TASK, base_dir(root, setup, TASK, seed), L, setup["pretrain"], seed, args), TASK, setup, args,
              [None, s]) for seed in (seeds[:1] if setup["shared_base"] else seeds)]
    bases += [(train_argv(task, base_dir(root, setup, task, 0), L, setup["control_pretrain"], 0, args), task, setup,
               args, [None]) for task in CONTROLS]
    tunes = []
    for seed in seeds:
        base = base_dir(root, setup, TASK, seed)
        for method in FINE_TUNES:
            factors = [None, 2 * s] if method == "ryarn" else [None]  # ryarn is also read with s' = 2s
            tunes.append(((method, seed), (finetune_argv(TASK, os.path.join(root, TASK), base, method, setup, seed,
                                                         args), TASK, setup, args, factors)))
        for top in setup["ranges"][1:]:
            tunes.append(((f"ryarn, range {top}L", seed), (finetune_argv(
                TASK, os.path.join(root, TASK), base, "ryarn", setup, seed, args, top), TASK, setup, args, [None])))
    control_setup = {**setup, "finetune": setup["control_finetune"]}
    for task in CONTROLS:
        for method in ("ft", "yarn", "ryarn"):
            tunes.append(((task, method), (finetune_argv(task, os.path.join(root, task), base_dir(root, setup, task, 0),
                                                         method, control_setup, 0, args), task, setup, args, [None])))
    return bases, tunes


def tables(setup: dict, bases: list, measured: dict) -> tuple[dict, dict, dict]:
    """The measured runs as the claims and the writers read them: accuracy[method][seed] = accuracies at
    MULTIPLES x L; the same for the sweep, and for the controls (one seed)."""
    s = setup["factor"]
    accuracy = {m: [] for m in METHODS}
    sweep = {f"ryarn, range {r}L": [] for r in setup["ranges"]} | {f"ryarn, range 2L, s' = {2 * s}": []}
    for k, seed in enumerate(setup["seeds"]):
        zero_shot = bases[0 if setup["shared_base"] else k]
        accuracy["zero-shot"].append(zero_shot[0])
        accuracy["zero-shot+yarn"].append(zero_shot[1])
        for method in FINE_TUNES:
            accuracy[method].append(measured[method, seed][0])
        sweep["ryarn, range 2L"].append(accuracy["ryarn"][-1])
        sweep[f"ryarn, range 2L, s' = {2 * s}"].append(measured["ryarn", seed][1])
        for top in setup["ranges"][1:]:
            sweep[f"ryarn, range {top}L"].append(measured[f"ryarn, range {top}L", seed][0])
    controls = {}
    for task, control_base in zip(CONTROLS, bases[-len(CONTROLS):]):
        controls[task] = {"zero-shot": [control_base[0]]}
        for method in ("ft", "yarn", "ryarn"):
            controls[task][method] = [measured[task, method][0]]
    return accuracy, sweep, controls


def run(args) -> None:
    scale = scale_name(args)
    setup = SCALES[scale]
    start, cpu_start = time.perf_counter(), cpu_seconds()
    threads = args.threads or 1
    bases, tunes = planned_runs(setup, os.path.join("runs", "ryarn", scale), args)
    with tqdm(total=len(bases) + len(tunes), desc="ryarn") as bar:
        measured_bases = map_jobs(fit_worker, bases, args.jobs, threads, bar)
        measured = dict(zip([key for key, _ in tunes], map_jobs(fit_worker, [job for _, job in tunes], args.jobs,
                                                                threads, bar)))
    accuracy, sweep, controls = tables(setup, measured_bases, measured)
    runtime = {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(cpu_seconds() - cpu_start, 1),
               "threads": threads, "jobs": args.jobs, "cores": os.cpu_count()}
    data = {"command": command_line(args), "runtime": runtime, "scale": scale, "settings": setup, "task": TASK,
            "task_options": TASK_OPTIONS, "lengths": [m * setup["L"] for m in MULTIPLES], "threshold": THRESHOLD,
            "accuracy": accuracy, "sweep": sweep, "controls": controls, "claims": claims(accuracy)}
    write_results("ryarn", markdown(data), data, figure(data), args.out_dir)
