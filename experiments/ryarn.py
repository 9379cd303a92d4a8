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
from eval import (command_line, cpu_seconds, map_jobs, mean_sd, paired_gain, plot_curves, scale_name, spread,
                  verdict, write_results)

# ---------------------------------------------------------------------------------------------------------
# The setup
# ---------------------------------------------------------------------------------------------------------

# The pretrained model: a RoPE GPT (train.py's defaults: 2 layers, 2 heads, d_model 64) trained on the task at
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
MULTIPLES = (1, 2, 4, 8, 16)  # evaluation lengths, as multiples of L
THRESHOLD = 0.05  # a gain counts when it is >= 5 accuracy points on average and positive in every seed

METHODS = {  # label: (what it is, its fine-tuning flags given L, s and the range multiple)
    "zero-shot": "the pretrained model, no fine-tuning, plain RoPE",
    "zero-shot+yarn": "the same weights read with YaRN (factor s) at inference only",
    "ft": "plain fine-tuning: plain RoPE, contiguous positions",
    "yarn": "fine-tuning with YaRN (factor s), contiguous positions (Paper R's \"trained YaRN\")",
    "rpe": "randomized positions with the curriculum, plain RoPE (Paper R's RPE baseline)",
    "ryarn": "Randomized YaRN: YaRN + randomized positions, range widened from L to 2L in Paper R's stages",
    "rpe-nocurr": "RPE without the curriculum: positions from [0, 2L) from the first step",
    "ryarn-nocurr": "Randomized YaRN without the curriculum: positions from [0, 2L) from the first step",
}


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
# The claims
# ---------------------------------------------------------------------------------------------------------

def beyond(acc: list[float]) -> float:
    """A model's mean accuracy beyond L (2L .. 16L): the number every comparison below is about."""
    return sum(acc[1:]) / len(acc[1:])


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
        cells = [mean_sd(list(a), 3) for a in zip(*per_seed)] + [mean_sd([beyond(a) for a in per_seed], 3)]
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return rows


def markdown(data: dict) -> str:
    setup, L, s = data["settings"], data["settings"]["L"], data["settings"]["factor"]
    lengths = [m * L for m in MULTIPLES]
    seeds = ", ".join(map(str, setup["seeds"]))
    base = "one pretrained model shared by the fine-tuning seeds" if setup["shared_base"] else \
        "one pretrained model per seed"
    runtime = data["runtime"]
    out = [
        "# Randomized YaRN (Paper R, arXiv 2606.23687) on a small GPT", "",
        f"Command: `{data['command']}`  ",
        f"Runtime: {runtime['wall_s'] / 60:.1f} min wall clock, {runtime['cpu_s'] / 60:.1f} min of CPU time "
        f"({runtime['threads']} torch thread(s) in each of {runtime['jobs']} process(es) at once, "
        f"{runtime['cores']} cores, shared with other work).", "",
        f"**Setup.** Task `{TASK}` ({', '.join(f'{k}={v}' for k, v in TASK_OPTIONS.items())}; chance "
        f"1/{TASK_OPTIONS['values']}): facts key=value among filler, the queried key stated at least twice with "
        f"different values, answer its latest value. A RoPE GPT (2 layers, 2 heads, d_model 64) is pretrained "
        f"for {setup['pretrain']} steps at lengths {L // 2}..{L} with contiguous positions ({base}), so L = {L}. "
        f"Each method then fine-tunes it for {setup['finetune']} steps at the same lengths. YaRN: s = {s} over "
        f"L (sL = {s * L}). Randomized positions: n sorted distinct ids from [0, M), M widening from L to 2L in "
        f"Paper R's stages (1, 1.25, 1.5, 2, 2 x L, equal stages), the default of train.py --llm too. Evaluation: "
        f"contiguous positions at {', '.join(map(str, lengths))}, the same {setup['samples']} sequences per "
        f"length for every model; fine-tuning seeds {seeds}. \"Beyond L\" is a model's mean accuracy at "
        f"{', '.join(map(str, lengths[1:]))}; the sampled range ends at 2L, well inside that.", "",
        "## Claims", "",
        f"A claim holds when every seed-paired difference of beyond-L accuracy is >= +{THRESHOLD} on average and "
        "> 0 in every seed (threshold fixed before the run).", "",
        "| claim | Paper R | measured: better − worse, mean ± sd [min, max] over seeds | verdict |",
        "|---|---|---|---|"]
    for claim, result in data["claims"].items():
        cells = "<br>".join(f"{g['better']} − {g['worse']} = {g['mean']:+.3f} ± {g['sd']:.3f} "
                            f"[{g['min']:+.3f}, {g['max']:+.3f}]" for g in result["gains"])
        out.append(f"| {claim} | {PAPER[claim]} | {cells} | **{result['verdict']}** |")
    out += ["", f"## `{TASK}`: accuracy by length (mean ± sd over seeds)", ""]
    out += accuracy_table(data["accuracy"], lengths)
    out += ["", "Methods: " + "; ".join(f"`{m}`: {what}" for m, what in METHODS.items()) + ".", "",
            "## How far to randomize: the top of the range (ryarn)", "",
            f"The same recipe with the range widened to 2L, 4L, ... ({', '.join(f'{r}L' for r in setup['ranges'])}); "
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


def figure(data: dict):
    L, lengths = data["settings"]["L"], [m * data["settings"]["L"] for m in MULTIPLES]

    def curves(by_method):  # mean over seeds, band from the worst to the best seed
        return {m: [{"length": n, "accuracy": spread(list(a))["mean"], "low": min(a), "high": max(a)}
                    for n, a in zip(lengths, zip(*per_seed))] for m, per_seed in by_method.items()}

    def draw(plt):
        panels = [(f"{TASK}: every method", data["accuracy"]), ("ryarn: the top of the range, and s'", data["sweep"])]
        panels += [(f"control: {task}", by) for task, by in data["controls"].items()]
        fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4))
        for ax, (title, by_method) in zip(axes, panels):
            plot_curves(ax, curves(by_method), "length", (L // 2, L))
            for line in ax.get_lines():
                if line.get_label().startswith("zero-shot"):
                    line.set_linestyle("--")
                if line.get_label() == "ryarn":
                    line.set_linewidth(2.5)
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


def run(args) -> None:
    scale = scale_name(args)
    setup = SCALES[scale]
    L, s = setup["L"], setup["factor"]
    root = os.path.join("runs", "ryarn", scale)
    start, cpu_start = time.perf_counter(), cpu_seconds()
    fine_tunes = list(METHODS)[2:]
    seeds = setup["seeds"]
    threads = args.threads or 1

    def base_dir(task, seed):  # the pretrained model a fine-tune of this seed starts from
        shared = task != TASK or setup["shared_base"]
        return os.path.join(root, task, f"pretrain-s{(0 if task != TASK else seeds[0]) if shared else seed}")

    # Two waves of independent runs (--jobs N runs N at once): the pretrained models, then the fine-tunes,
    # which start from them. A shared base is trained and measured once, then paired with each seed.
    bases = [(train_argv(TASK, base_dir(TASK, seed), L, setup["pretrain"], seed, args), TASK, setup, args, [None, s])
             for seed in (seeds[:1] if setup["shared_base"] else seeds)]
    bases += [(train_argv(task, base_dir(task, 0), L, setup["control_pretrain"], 0, args), task, setup, args, [None])
              for task in CONTROLS]
    tunes = []  # (key, job): key says where the accuracies go
    for seed in seeds:
        base = base_dir(TASK, seed)
        for method in fine_tunes:
            factors = [None, 2 * s] if method == "ryarn" else [None]  # ryarn is also read with s' = 2s
            tunes.append(((method, seed), (finetune_argv(TASK, os.path.join(root, TASK), base, method, setup, seed,
                                                         args), TASK, setup, args, factors)))
        for top in setup["ranges"][1:]:
            tunes.append(((f"ryarn, range {top}L", seed), (finetune_argv(
                TASK, os.path.join(root, TASK), base, "ryarn", setup, seed, args, top), TASK, setup, args, [None])))
    control_setup = {**setup, "finetune": setup["control_finetune"]}
    for task in CONTROLS:
        for method in ("ft", "yarn", "ryarn"):
            tunes.append(((task, method), (finetune_argv(task, os.path.join(root, task), base_dir(task, 0), method,
                                                         control_setup, 0, args), task, setup, args, [None])))
    bar = tqdm(total=len(bases) + len(tunes), desc="ryarn")
    measured_bases = map_jobs(fit_worker, bases, args.jobs, threads, bar)
    measured = dict(zip([key for key, _ in tunes], map_jobs(fit_worker, [job for _, job in tunes], args.jobs,
                                                            threads, bar)))

    # accuracy[method][seed] = accuracies at MULTIPLES x L; the same for the sweep and the controls
    accuracy = {m: [] for m in METHODS}
    sweep = {f"ryarn, range {r}L": [] for r in setup["ranges"]} | {f"ryarn, range 2L, s' = {2 * s}": []}
    for k, seed in enumerate(seeds):
        zero_shot = measured_bases[0 if setup["shared_base"] else k]
        accuracy["zero-shot"].append(zero_shot[0])
        accuracy["zero-shot+yarn"].append(zero_shot[1])
        for method in fine_tunes:
            accuracy[method].append(measured[method, seed][0])
        sweep[f"ryarn, range {2}L"].append(accuracy["ryarn"][-1])
        sweep[f"ryarn, range 2L, s' = {2 * s}"].append(measured["ryarn", seed][1])
        for top in setup["ranges"][1:]:
            sweep[f"ryarn, range {top}L"].append(measured[f"ryarn, range {top}L", seed][0])
    controls = {}
    for task, control_base in zip(CONTROLS, measured_bases[-len(CONTROLS):]):
        controls[task] = {"zero-shot": [control_base[0]]}
        for method in ("ft", "yarn", "ryarn"):
            controls[task][method] = [measured[task, method][0]]
    bar.close()
    runtime = {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(cpu_seconds() - cpu_start, 1),
               "threads": threads, "jobs": args.jobs, "cores": os.cpu_count()}
    data = {"command": command_line(args), "runtime": runtime, "scale": scale, "settings": setup, "task": TASK,
            "task_options": TASK_OPTIONS, "lengths": [m * L for m in MULTIPLES], "threshold": THRESHOLD,
            "accuracy": accuracy, "sweep": sweep, "controls": controls, "claims": claims(accuracy)}
    write_results("ryarn", markdown(data), data, figure(data), args.out_dir)
