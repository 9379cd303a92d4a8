"""Paper R (Randomized YaRN, arXiv 2606.23687) on the small GPT, replicated over independently pretrained bases.

    python eval.py --experiment ryarn --jobs 2 --threads 1     # results/ryarn.{md,json,png}

Paper R fine-tunes a model pretrained at context L on short data, giving every token a YaRN rotary encoding
(factor s) at a position drawn from a range that a curriculum widens from the training length to about
twice it, then evaluates with ordinary contiguous positions far beyond L. Its benchmarks (BABILong, MRCR)
find the answer by content among distractors, where order matters. The main task here is of that kind:
tasks.latest_recall, facts key=value stated and restated among filler, then a key: answer with its latest
value. Copy and fixed-offset retrieval are kept as controls: they define the answer by position, which is
exactly what random gaps between positions take away.

A claim about fine-tuning methods is a claim about what they do to a pretrained model, so the unit of
replication is the pretrained base: several bases, each pretrained from its own seed, each fine-tuned with
several seeds by every method. Every method fine-tunes every base at every rate of one grid, so that the
primary claims compare methods at matched rates (a protocol that favours no method's best rate); test
sequences come from a seed used nowhere else.

Read top to bottom: the setup and every method's train.py flags; training and measuring; the claims and the
rule; the runs, and run(args), which returns the data. The writing (results/ryarn.md, the figure, README's table)
is experiments/ryarn_report.py; how this design was chosen is told in docs/randomized-yarn.md.
"""
from __future__ import annotations

import os
import shlex
import time

from tqdm import tqdm

from eval import evaluate, load_run
from experiments.common import (beyond, command_line, cpu_seconds, map_jobs, preset_name, runtime, spread,
                                train_once)
from experiments.stats import FIT_BAR, THRESHOLD, decide
from runs import read_fit

# ---------------------------------------------------------------------------------------------------------
# The setup
# ---------------------------------------------------------------------------------------------------------

# The pretrained bases: RoPE GPTs of `layers` layers (else train.py's defaults: 2 heads, dim 64) trained on the task at
# lengths L/2..L with contiguous positions from the seeds in `bases`, so their original context is L; each
# trains until its held-out accuracy at L reaches `pretrain_bar` (checked every 500 steps), or `pretrain`
# steps. Fine-tuning keeps those lengths, with the seeds in `seeds` on every base. YaRN's factor s makes
# sL = 16L, the longest evaluated length; inference may stretch further (s' = 2s). Randomized positions come
# from [0, M), M widening from L to range x L in Paper R's stages (1, 1.25, 1.5, 2, 2 x; LengthCurriculum
# "paper-r"); "-nocurr" draws from [0, range x L) from the first step. `lrs`: one grid of learning rates on
# which every method of GRID_METHODS fine-tunes every base; the ablations run at their twin's rate. `fit_bar`:
# a base has learned the task when its validation accuracy at L is at least this, and so has a fine-tune:
# stats.FIT_BAR (chance 1/8; the quick preset's 150 steps reach about half, so its fit bar is lower: it exists
# for the tests). The bases pretrain to 0.98, a margin: fine-tuning moves them (ryarn cost up to ~0.08 at L in
# the fifth design), and each fine-tune is gated too. Three layers: two-layer bases sat at ~0.6 for 5000-10000
# steps; three facts, not four: at four, 3-layer bases ended at 0.84-0.97 after 10000 steps (the designs before
# this one: docs/randomized-yarn.md, "How this design was chosen").
PRESETS = {
    "quick": dict(L=24, factor=16, layers=2, pretrain=150, pretrain_bar=None, finetune=30, bases=(0, 1, 2),
                  seeds=(10,), lrs=(3e-4, 1e-3), samples=32, validation_samples=32, fit_bar=0.4, ranges=(2, 4),
                  control_bases=(0,), control_pretrain=60, control_finetune=20),
    "default": dict(L=32, factor=16, layers=3, pretrain=10000, pretrain_bar=0.98, finetune=800, bases=tuple(range(8)),
                    seeds=(10,), lrs=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2), samples=256, validation_samples=256,
                    fit_bar=FIT_BAR, ranges=(2,), control_bases=(), control_pretrain=1500, control_finetune=400),
    "full": dict(L=32, factor=16, layers=3, pretrain=20000, pretrain_bar=0.98, finetune=2000, bases=tuple(range(10)),
                 seeds=(10, 11), lrs=(3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2), samples=1024, validation_samples=512,
                 fit_bar=FIT_BAR, ranges=(2, 4, 8, 16), control_bases=(0, 1, 2), control_pretrain=4000,
                 control_finetune=1000),
}
TASK = "latest_recall"
TASK_OPTIONS = {"keys": 8, "values": 8, "statements": 3, "fillers": 8}  # chance 1/8; the queried key is stated
CONTROLS = ("copy", "retrieval")                                          # twice, so order decides
MULTIPLES = (1, 2, 4, 8, 16)  # evaluation lengths, as multiples of L; common.beyond: the mean of 2L .. 16L
# Evaluation sequences come from these generator seeds. Training draws its batches from seed + 1 and its
# positions from seed + 2, with every seed above below 100, so neither stream is ever one of these.
TEST_SEED, VALIDATION_SEED = 7_000_001, 7_000_002

MODELS = {  # label: what it is (a fine-tune's train.py flags: method_flags)
    "zero-shot": "the pretrained model, no fine-tuning, plain RoPE",
    "zero-shot+yarn": "the same weights read with YaRN (factor s) at inference only (Paper R's zero-shot + YaRN)",
    "ft": "plain fine-tuning: plain RoPE, contiguous positions",
    "yarn": "fine-tuning with YaRN (factor s), contiguous positions (Paper R's \"trained YaRN\")",
    "rpe": "randomized positions with the curriculum, plain RoPE (Paper R's RPE baseline)",
    "ryarn": "Randomized YaRN: YaRN + randomized positions, range widened from L to 2L in Paper R's stages",
    "rpe-nocurr": "RPE without the curriculum: positions from [0, 2L) from the first step",
    "ryarn-nocurr": "Randomized YaRN without the curriculum: positions from [0, 2L) from the first step",
}
FINE_TUNES = list(MODELS)[2:]  # every method but the two readings of the pretrained model
# The methods run at every rate of the grid on every base; each ablation runs at the rate chosen for its twin.
GRID_METHODS = ("ft", "yarn", "rpe", "ryarn")


ABLATIONS = {"rpe-nocurr": "rpe", "ryarn-nocurr": "ryarn"}


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


def train_argv(task: str, out: str, L: int, layers: int, steps: int, seed: int, args, *extra: str) -> list[str]:
    """One train.py command line: lengths L/2..L, no final table (the experiment measures every model on the
    same sequences itself), --force so that every number comes from this run."""
    return task_flags(task) + ["--train-len", f"{L // 2}:{L}", "--layers", str(layers), "--steps", str(steps),
                               "--seed", str(seed),
                               "--threads", str(args.threads or 1), "--device", args.device, "--out", out,
                               "--eval-samples", "0", "--force", "--quiet", *extra]


def fine_tune_argv(task: str, out: str, base: str, method: str, steps: int, seed: int, lr: float, setup: dict,
                  args, top: int = 2) -> list[str]:
    """Fine-tune from the pretrained run `base`; a short warm-up, since the weights are trained already."""
    return train_argv(task, out, setup["L"], setup["layers"], steps, seed, args, "--init", base, "--warmup", "20",
                      "--lr", f"{lr:g}",
                      *method_flags(method, setup["L"], setup["factor"], top))


def measure(run_dir: str, task: str, setup: dict, args, factor: float | None = None) -> dict:
    """A model's test accuracy at every evaluated length (contiguous positions; the same TEST_SEED sequences
    for every model) and its validation accuracy at L (VALIDATION_SEED). factor: read it with YaRN x factor."""
    L = setup["L"]
    overrides = {"scaling": "yarn", "factor": factor, "original_len": L} if factor else {}
    model, cfg = load_run(run_dir, args.device, **overrides)

    def accuracy(length, samples, seed):
        return evaluate(model, task, length, cfg.task_options, samples, seed, device=args.device)["accuracy"]
    return {"test": [accuracy(m * L, setup["samples"], TEST_SEED) for m in MULTIPLES],
            "validation": accuracy(L, setup["validation_samples"], VALIDATION_SEED)}


def fit_worker(job) -> list[dict]:
    """Train one run (train.py's command line `argv`), then measure it as trained and read with YaRN x each
    factor in `factors` (None: as trained). Module-level, so that a --jobs worker process can run it; every run
    is seeded by its own command line, so where it runs changes nothing."""
    argv, task, setup, args, factors = job
    out = train_once(argv)["run"]
    return [measure(out, task, setup, args, factor) for factor in factors]


def command(argv: list[str]) -> str:
    """The command that retrains this one model alone, bit for bit (its base must exist: --init)."""
    return "python train.py " + shlex.join(argv)


# ---------------------------------------------------------------------------------------------------------
# The claims and the rule (stats.decide): a gain is measured on each pretrained base as the mean over its
# fine-tuning seeds (seed-paired where both sides are fine-tuned); the bases are the replicates.
# ---------------------------------------------------------------------------------------------------------


def at_L(acc: list[float]) -> float:
    return acc[0]


def far_minus_near(acc: list[float]) -> float:
    """Accuracy at 16L minus accuracy at 2L: a difference of two of these is how much a gain grows with length."""
    return acc[-1] - acc[1]


# name: (Paper R's words, better, worse, the measure compared). Every one is a gain of `better` over `worse`.
CLAIMS = {
    "ryarn > zero-shot+yarn beyond L": (
        "Randomized YaRN beats inference-time YaRN on the model as it is (a baseline of the paper)",
        "ryarn", "zero-shot+yarn", beyond),
    "ryarn > yarn beyond L": ("trained YaRN -> Randomized YaRN: BABILong 81.3 -> 90.3, MRCR 59.3 -> 72.7 "
                              "(OOD averages, Qwen2.5-7B)", "ryarn", "yarn", beyond),
    "ryarn > ft beyond L": ("Randomized YaRN beats plain fine-tuning", "ryarn", "ft", beyond),
    "ryarn > rpe beyond L": ("RPE is the baseline Randomized YaRN beats (MRCR with the curriculum: 75.1 vs 77.3)",
                             "ryarn", "rpe", beyond),
    "the curriculum helps ryarn": ("without it Randomized YaRN drops by 7.9 on MRCR (77.3 -> 69.4)",
                                   "ryarn", "ryarn-nocurr", beyond),
    "the curriculum helps rpe": ("without it RPE drops by 18.3 on MRCR (75.1 -> 56.8)", "rpe", "rpe-nocurr",
                                 beyond),
    "ryarn's gain over yarn grows with length": (
        "the gains are largest far out of distribution (64K-128K); here: (ryarn - yarn) at 16L minus at 2L",
        "ryarn", "yarn", far_minus_near),
    "ryarn costs accuracy at L, against ft": ("not a claim of the paper: the price of random gaps at L itself",
                                              "ft", "ryarn", at_L),
    "ryarn costs accuracy at L, against yarn": ("not a claim of the paper: the price of random gaps at L itself",
                                                "yarn", "ryarn", at_L),
    "zero-shot+yarn > ft beyond L": ("the control a \"beats ft\" is read against: YaRN alone, no fine-tuning",
                                     "zero-shot+yarn", "ft", beyond),
    "zero-shot+yarn > rpe beyond L": ("the same control against randomized positions alone",
                                      "zero-shot+yarn", "rpe", beyond),
}
# Named before the run as what decides Paper R's question, does randomizing add anything to YaRN: ryarn against
# YaRN trained and YaRN at inference, and the paper's "the gain grows with length". One family; the rest another.
PRIMARY = ("ryarn > yarn beyond L", "ryarn > zero-shot+yarn beyond L", "ryarn's gain over yarn grows with length")


def base_gains(accuracy: dict, better: str, worse: str, measure_, fitted: dict) -> dict[int, float]:
    """base -> the gain on that base, where both sides fitted (fitted[method][base]): the mean over its
    fine-tuning seeds of measure(better) - measure(worse), seed by seed; a side that was not fine-tuned
    (zero-shot, zero-shot+yarn) has one value per base."""
    gains = {}
    for base, (b_runs, w_runs) in enumerate(zip(accuracy[better], accuracy[worse])):
        if not (fitted[better][base] and fitted[worse][base]):
            continue
        n = max(len(b_runs), len(w_runs))
        pairs = [(b_runs[i % len(b_runs)], w_runs[i % len(w_runs)]) for i in range(n)]
        gains[base] = sum(measure_(b) - measure_(w) for b, w in pairs) / n
    return gains


def fitted_models(data: dict, fit_bar: float, validation: dict | None = None) -> dict:
    """fitted[method][base]: the base learned the task (validation accuracy at L >= fit_bar) and, for a
    fine-tune, every one of its seeds still does (validation[method][base][seed] >= fit_bar; default: at the
    chosen rates).
    The two readings of a pretrained base (zero-shot, zero-shot+yarn) are the base itself: they count where it
    fitted."""
    validation = validation or data["validation"]
    bases = [v >= fit_bar for v in data["base_validation"]]
    return {m: [ok and (m in ("zero-shot", "zero-shot+yarn") or all(v >= fit_bar for v in validation[m][i]))
                for i, ok in enumerate(bases)] for m in data["accuracy"]}


def claims(data: dict, fit_bar: float) -> dict:
    """Three families, each decided at once (stats.decide). Primary: each PRIMARY claim pooled over the matched
    learning rates of the grid, one gain per base, the mean over the rates at which both sides fitted on it
    (never the best rate picked afterwards). Exploratory: the same claims at each rate alone (by_rate), and
    every other claim at each method's validation-chosen rate. A gain is measured on the bases where both
    sides fitted."""
    matched = {}
    for lr in data["by_rate"]["ryarn"]:
        accuracy, validation = at_rate(data, lr)
        fitted = fitted_models({**data, "accuracy": accuracy}, fit_bar, validation)
        matched |= {(name, lr): base_gains(accuracy, *CLAIMS[name][1:], fitted) for name in PRIMARY}
    pooled = {}
    for name in PRIMARY:
        at = [gains for (n, _), gains in matched.items() if n == name]
        pooled[name] = [sum(g[b] for g in at if b in g) / sum(b in g for g in at)
                        for b in sorted({b for g in at for b in g})]
    primary = decide(pooled, THRESHOLD)
    by_rate = decide({f"{name} at lr {lr}": list(g.values()) for (name, lr), g in matched.items()}, THRESHOLD)
    out = {name: {"better": CLAIMS[name][1], "worse": CLAIMS[name][2], "primary": True, **primary[name],
                  "by_rate": {lr: by_rate[f"{name} at lr {lr}"] for (n, lr) in matched if n == name}}
           for name in PRIMARY}
    exploratory = [name for name in CLAIMS if name not in PRIMARY]
    fitted = fitted_models(data, fit_bar)
    gains = {name: list(base_gains(data["accuracy"], *CLAIMS[name][1:], fitted).values()) for name in exploratory}
    decided = decide(gains, THRESHOLD)
    return out | {name: {"better": CLAIMS[name][1], "worse": CLAIMS[name][2], "primary": False, **decided[name]}
                  for name in exploratory}


def at_rate(data: dict, lr: str) -> tuple[dict, dict]:
    """The accuracies and validation accuracies of every grid method fine-tuned at one rate of the grid, beside
    the two readings of the pretrained bases: what a matched-rate comparison reads."""
    accuracy = {m: data["accuracy"][m] for m in ("zero-shot", "zero-shot+yarn")}
    accuracy |= {m: data["by_rate"][m][lr] for m in GRID_METHODS}
    return accuracy, {m: data["by_rate_validation"][m][lr] for m in GRID_METHODS}


# ---------------------------------------------------------------------------------------------------------
# The run: three waves of independent runs (--jobs N runs N at once), each needing the one before: the bases;
# the learning-rate grid on every base; every other fine-tune at the chosen rates.
# ---------------------------------------------------------------------------------------------------------


def base_runs(setup: dict, root: str, args) -> dict:
    """name -> job of every pretrained model: the bases of the main task (until they fit, or at most `pretrain`
    steps), then the controls'."""
    fit = ["--fit-bar", str(setup["pretrain_bar"]), "--fit-every", "500"] if setup["pretrain_bar"] else []
    jobs = {f"base-{b}": (train_argv(TASK, os.path.join(root, TASK, f"base-{b}"), setup["L"], setup["layers"],
                                     setup["pretrain"], b, args, *fit), TASK, setup, args, [None, setup["factor"]])
            for b in setup["bases"]}
    for task in CONTROLS:
        jobs |= {f"{task}-base-{b}": (train_argv(task, os.path.join(root, task, f"base-{b}"), setup["L"],
                                                 setup["layers"], setup["control_pretrain"], b, args), task, setup,
                                      args, [None])
                 for b in setup["control_bases"]}
    return jobs


def grid_runs(setup: dict, root: str, args) -> dict:
    """(method, lr, base, seed) -> job: every grid method at every rate on every base, with every seed; ryarn
    is also read with s' = 2s."""
    return {(method, lr, b, seed): (fine_tune_argv(
        TASK, os.path.join(root, TASK, f"lr{lr:g}", f"{method}-b{b}-s{seed}"), os.path.join(root, TASK, f"base-{b}"),
        method, setup["finetune"], seed, lr, setup, args), TASK, setup, args,
        [None, 2 * setup["factor"]] if method == "ryarn" else [None])
        for method in GRID_METHODS for lr in setup["lrs"] for b in setup["bases"] for seed in setup["seeds"]}


def tune_runs(setup: dict, root: str, args, lr: dict) -> dict:
    """name -> job of every run at a chosen rate: the ablations on every base and seed, the wider ranges for
    ryarn, the controls."""
    jobs = {}
    for b in setup["bases"]:
        base = os.path.join(root, TASK, f"base-{b}")
        for seed in setup["seeds"]:
            for method in ABLATIONS:
                jobs[f"{method}-b{b}-s{seed}"] = (fine_tune_argv(
                    TASK, os.path.join(root, TASK, f"{method}-b{b}-s{seed}"), base, method, setup["finetune"], seed,
                    lr[method], setup, args), TASK, setup, args, [None])
        for top in setup["ranges"][1:]:
            name = f"ryarn-range{top}L-b{b}-s{setup['seeds'][0]}"
            jobs[name] = (fine_tune_argv(TASK, os.path.join(root, TASK, name), base, "ryarn", setup["finetune"],
                                        setup["seeds"][0], lr["ryarn"], setup, args, top), TASK, setup, args, [None])
    for task in CONTROLS:
        for b in setup["control_bases"]:
            for method in ("ft", "yarn", "ryarn"):
                jobs[f"{task}-{method}-b{b}"] = (fine_tune_argv(
                    task, os.path.join(root, task, f"{method}-b{b}"), os.path.join(root, task, f"base-{b}"), method,
                    setup["control_finetune"], setup["seeds"][0], lr[method], setup, args), task, setup, args, [None])
    return jobs


def pretrain_steps(setup: dict, root: str) -> list[int]:
    """How many steps each base trained: to the check that reached pretrain_bar, or all of them."""
    if not setup["pretrain_bar"]:
        return [setup["pretrain"]] * len(setup["bases"])
    fits = [read_fit(os.path.join(root, TASK, f"base-{b}")) for b in setup["bases"]]
    return [fit["steps_to_fit"] or setup["pretrain"] for fit in fits]


def run_all(jobs: dict, args, bar) -> dict:
    return dict(zip(jobs, map_jobs(fit_worker, list(jobs.values()), args.jobs, args.threads or 1, bar)))


def choose(grid: dict, setup: dict) -> dict:
    """Each method's learning rate: the best mean validation accuracy at L over bases and seeds (ties: the
    smaller rate); an ablation takes its twin's."""
    def validation(m, lr):
        return spread([grid[m, lr, b, s][0]["validation"] for b in setup["bases"] for s in setup["seeds"]])["mean"]
    chosen = {m: max(setup["lrs"], key=lambda lr: (validation(m, lr), -lr)) for m in GRID_METHODS}
    return chosen | {ablation: chosen[twin] for ablation, twin in ABLATIONS.items()}


def tables(setup: dict, bases: dict, grid: dict, lr: dict, tunes: dict) -> dict:
    """The measured runs as the claims and the writers read them: accuracy[method][base][seed] = test
    accuracies at MULTIPLES x L at each method's chosen rate (one 'seed' for the two readings of a base);
    validation likewise; by_rate[method][lr][base][seed] and by_rate_validation for the whole grid; the sweep
    and the controls (one seed)."""
    s, first, B, S = setup["factor"], setup["seeds"][0], setup["bases"], setup["seeds"]

    def run(method, b, seed):  # a fine-tune at its method's chosen rate
        return grid[method, lr[method], b, seed] if method in GRID_METHODS else tunes[f"{method}-b{b}-s{seed}"]
    accuracy = {"zero-shot": [[bases[f"base-{b}"][0]["test"]] for b in B],
                "zero-shot+yarn": [[bases[f"base-{b}"][1]["test"]] for b in B]}
    accuracy |= {m: [[run(m, b, seed)[0]["test"] for seed in S] for b in B] for m in FINE_TUNES}
    validation = {m: [[run(m, b, seed)[0]["validation"] for seed in S] for b in B] for m in FINE_TUNES}
    by_rate = {m: {f"{r:g}": [[grid[m, r, b, seed][0]["test"] for seed in S] for b in B] for r in setup["lrs"]}
               for m in GRID_METHODS}
    by_rate_validation = {m: {f"{r:g}": [[grid[m, r, b, seed][0]["validation"] for seed in S] for b in B]
                              for r in setup["lrs"]} for m in GRID_METHODS}
    sweep = {"ryarn, range 2L": [[run("ryarn", b, first)[0]["test"]] for b in B]}
    sweep |= {f"ryarn, range {top}L": [[tunes[f"ryarn-range{top}L-b{b}-s{first}"][0]["test"]] for b in B]
              for top in setup["ranges"][1:]}
    sweep[f"ryarn, range 2L, s' = {2 * s}"] = [[run("ryarn", b, first)[1]["test"]] for b in B]
    controls = {task: {"zero-shot": [[bases[f"{task}-base-{b}"][0]["test"]] for b in setup["control_bases"]]}
                | {m: [[tunes[f"{task}-{m}-b{b}"][0]["test"]] for b in setup["control_bases"]]
                   for m in ("ft", "yarn", "ryarn")} for task in CONTROLS if setup["control_bases"]}
    learning_rates = {"chosen": lr, "grid": {m: {f"{r:g}": {
        "validation": spread([v for per_base_ in by_rate_validation[m][f"{r:g}"] for v in per_base_])["mean"],
        "beyond": spread([beyond(a) for per_base_ in by_rate[m][f"{r:g}"] for a in per_base_])["mean"]}
        for r in setup["lrs"]} for m in GRID_METHODS}}
    return {"accuracy": accuracy, "validation": validation, "by_rate": by_rate,
            "by_rate_validation": by_rate_validation, "sweep": sweep, "controls": controls,
            "learning_rates": learning_rates,
            "base_validation": [bases[f"base-{b}"][0]["validation"] for b in B]}


def commands(bases: dict, grid: dict, tunes: dict) -> dict:
    """name -> the train.py command of every model this experiment trained (base-0, ryarn-b1-s10-lr0.001,
    rpe-nocurr-b1-s10, ...)."""
    out = {name: command(job[0]) for name, job in bases.items()}
    out |= {f"{m}-b{b}-s{seed}-lr{lr:g}": command(job[0]) for (m, lr, b, seed), job in grid.items()}
    return out | {name: command(job[0]) for name, job in tunes.items()}


def run(args) -> dict:
    """Train and measure every model (or reuse those this code already trained), decide the claims, and return
    the data that becomes results/ryarn.json."""
    preset = preset_name(args)
    setup = PRESETS[preset]
    root = os.path.join("runs", "ryarn", preset)
    since = (time.perf_counter(), cpu_seconds())
    base_jobs, grid_jobs = base_runs(setup, root, args), grid_runs(setup, root, args)
    n_tunes = len(tune_runs(setup, root, args, dict.fromkeys(FINE_TUNES, setup["lrs"][0])))
    with tqdm(total=len(base_jobs) + len(grid_jobs) + n_tunes, desc="ryarn") as bar:
        bases = run_all(base_jobs, args, bar)
        grid = run_all(grid_jobs, args, bar)
        lr = choose(grid, setup)
        tune_jobs = tune_runs(setup, root, args, lr)
        tunes = run_all(tune_jobs, args, bar)
    data = {"command": command_line(args), "scale": preset, "settings": setup, "task": TASK,
            "task_options": TASK_OPTIONS, "lengths": [m * setup["L"] for m in MULTIPLES], "threshold": THRESHOLD,
            "fit_bar": setup["fit_bar"], "test_seed": TEST_SEED, "validation_seed": VALIDATION_SEED,
            "pretrain_steps": pretrain_steps(setup, root), **tables(setup, bases, grid, lr, tunes)}
    data["claims"] = claims(data, setup["fit_bar"])
    data["commands"] = commands(base_jobs, grid_jobs, tune_jobs)
    data["runtime"] = runtime(since, args)
    return data
