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
rule; the markdown and the figure; run(args).
"""
from __future__ import annotations

import itertools
import os
import shlex
import time

from tqdm import tqdm

import tasks
from eval import command_line, evaluate, load_run, plot_curves, scale_name
from experiments.common import (FIT_BAR, THRESHOLD, UNFIT, beyond, caption, cpu_seconds, decide, fmt, line_styles,
                                map_jobs, rerender, runtime, seed_curve, short, spread, train_once, write_results)
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
# common.FIT_BAR (chance 1/8; the quick scale's 150 steps reach about half, so its bar is lower: it exists for
# the tests). The bases pretrain to 0.98, a margin: fine-tuning moves them (ryarn cost up to ~0.08 at L in the
# fifth design), and each fine-tune is gated too. Three layers: two-layer bases sat at ~0.6 for 5000-10000
# steps; three facts, not four: at four, 3-layer bases ended at 0.84-0.97 after 10000 steps (design_section).
SCALES = {
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


def finetune_argv(task: str, out: str, base: str, method: str, steps: int, seed: int, lr: float, setup: dict,
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
# The claims and the rule (common.unit_verdict): a gain is measured on each pretrained base as the mean over its
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


def base_gains(accuracy: dict, better: str, worse: str, measure_, fitted: dict) -> list[float]:
    """The gain on each base where both sides fitted (fitted[method][base]): the mean over its fine-tuning seeds
    of measure(better) - measure(worse), seed by seed; a side that was not fine-tuned (zero-shot,
    zero-shot+yarn) has one value per base."""
    gains = []
    for base, (b_runs, w_runs) in enumerate(zip(accuracy[better], accuracy[worse])):
        if not (fitted[better][base] and fitted[worse][base]):
            continue
        n = max(len(b_runs), len(w_runs))
        pairs = [(b_runs[i % len(b_runs)], w_runs[i % len(w_runs)]) for i in range(n)]
        gains.append(sum(measure_(b) - measure_(w) for b, w in pairs) / n)
    return gains


def fitted_models(data: dict, bar: float, validation: dict | None = None) -> dict:
    """fitted[method][base]: the base learned the task (validation accuracy at L >= bar) and, for a fine-tune,
    every one of its seeds still does (validation[method][base][seed] >= bar; default: at the chosen rates).
    The two readings of a pretrained base (zero-shot, zero-shot+yarn) are the base itself: they count where it
    fitted."""
    validation = validation or data["validation"]
    bases = [v >= bar for v in data["base_validation"]]
    return {m: [ok and (m in ("zero-shot", "zero-shot+yarn") or all(v >= bar for v in validation[m][i]))
                for i, ok in enumerate(bases)] for m in data["accuracy"]}


def claims(data: dict, bar: float) -> dict:
    """The primary claims at every rate of the grid, matched (one family: Holm over claims x rates), each with a
    summary of where it holds; the exploratory claims at each method's validation-chosen rate (another family).
    A gain is measured on the bases where both sides fitted."""
    matched = {}
    for lr in data["by_rate"]["ryarn"]:
        accuracy, validation = at_rate(data, lr)
        fitted = fitted_models({**data, "accuracy": accuracy}, bar, validation)
        matched |= {(name, lr): base_gains(accuracy, *CLAIMS[name][1:], fitted) for name in PRIMARY}
    decided = decide({f"{name} at lr {lr}": g for (name, lr), g in matched.items()}, THRESHOLD)
    out = {name: {"better": CLAIMS[name][1], "worse": CLAIMS[name][2], "primary": True,
                  "by_rate": {lr: decided[f"{name} at lr {lr}"] for (n, lr) in matched if n == name}}
           for name in PRIMARY}
    for result in out.values():
        result["verdict"] = over_rates(result["by_rate"])
    exploratory = [name for name in CLAIMS if name not in PRIMARY]
    fitted = fitted_models(data, bar)
    gains = {name: base_gains(data["accuracy"], *CLAIMS[name][1:], fitted) for name in exploratory}
    decided = decide(gains, THRESHOLD)
    return out | {name: {"better": CLAIMS[name][1], "worse": CLAIMS[name][2], "primary": False, **decided[name]}
                  for name in exploratory}


def at_rate(data: dict, lr: str) -> tuple[dict, dict]:
    """The accuracies and validation accuracies of every grid method fine-tuned at one rate of the grid, beside
    the two readings of the pretrained bases: what a matched-rate comparison reads."""
    accuracy = {m: data["accuracy"][m] for m in ("zero-shot", "zero-shot+yarn")}
    accuracy |= {m: data["by_rate"][m][lr] for m in GRID_METHODS}
    return accuracy, {m: data["by_rate_validation"][m][lr] for m in GRID_METHODS}


def over_rates(by_rate: dict) -> str:
    """A primary claim's verdict over the grid: what it is at every rate, or where it holds and where not."""
    outcomes = {lr: short(r["verdict"]) for lr, r in by_rate.items()}
    if len(set(outcomes.values())) == 1:
        return f"{next(iter(outcomes.values()))} at every rate"
    return "; ".join(f"{v} at {', '.join(lr for lr, o in outcomes.items() if o == v)}"
                     for v in dict.fromkeys(outcomes.values()))

# ---------------------------------------------------------------------------------------------------------
# The markdown and the figure
# ---------------------------------------------------------------------------------------------------------


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
        f"different values, answer its latest value. {len(setup['bases'])} RoPE GPTs ({setup.get('layers', 2)} "
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


def design_section(data: dict) -> list[str]:
    """How this design was chosen: what was run before, what it showed, what changed, what is fixed now."""
    setup = data["settings"]
    return [
        "## How this design was chosen", "",
        "The first design fine-tuned on copy and fixed-offset retrieval (L = 16, s = 8, positions from up to 8L "
        "with a linear curriculum, 1200 pretraining steps). Randomized YaRN did not beat trained YaRN there "
        "(copy +0.002, retrieval -0.924 beyond L): both tasks define the answer by position, which random gaps "
        "take away. The second design moved to `latest_recall`, a content-addressed task like Paper R's "
        "benchmarks, with Paper R's own range (to 2L, in its stages), L = 32, s = 16 and 10000 pretraining "
        "steps, but all its fine-tuning seeds shared one base. The third replicated it on three bases, each "
        "method at the learning rate best at L on one base's validation sequences: that protocol picked the "
        "grid's lowest rate (1e-4) for 5 of 6 methods while accuracy beyond L peaked at its top (1e-3), one base "
        "ended under the fit bar, and under the shared rule no claim could be decided. The fourth ran 8 bases "
        "pretrained to 0.95 and every method at every rate of 1e-4..3e-3: every primary claim stayed undecided, "
        "because ryarn's cost at L (validation 0.890 at 1e-4 down to 0.805 at 3e-3, against bases at 0.81-0.97) "
        "put most of its fine-tunes under the 0.9 bar (bases usable per rate: 3, 1, 0, 0), and ryarn beyond L "
        "still rose at the grid's top. A probe then pretrained seed 2, the slowest base, with `python train.py "
        "--task latest_recall --keys 8 --values 8 --statements 4 --fillers 8 --train-len 16:32 --steps 8000 "
        "--fit-bar 0.99 --fit-every 500 --seed 2`: at two layers it sat at 0.55-0.65 for all 8000 steps (lr 3e-3; "
        "and with 4 heads at lr 2e-3); with `--layers 3 --steps 12000 --fit-bar 0.97` it left that plateau by step "
        "3500 and reached 0.92 by step 7500 (seed 0: 0.945), where the probe was stopped. The fifth ran 8 bases of "
        "3 layers, pretrained towards 0.97 for at most 10000 steps, at 1e-4..1e-2: no base reached 0.97 (0.840-0.969, "
        "3 under the 0.9 bar), ryarn's validation at L fell from 0.885 at 1e-4 to 0.817 at 3e-3, bases usable per "
        "rate were 3, 1, 1, 0, 0, and every primary claim stayed undecided; 1e-2 broke every method (0.36-0.61 at "
        "L), the grid's upper edge. A probe then stated three facts instead of four (the queried key twice, one "
        "other): `python train.py --task latest_recall --keys 8 --values 8 --statements 3 --fillers 8 --train-len "
        "16:32 --layers 3 --fit-bar 0.98 --fit-every 500 --seed S`, with a --steps (which sets the cosine schedule) "
        "that was not recorded, reached 0.984 at step 8000 (seed 5, the fifth design's weakest base), 0.992 at 7000 "
        "(seed 2) and 1.000 at 5500 (seed 6); on seed 5's base, 800-step fine-tunes at 3e-4 and 1e-3 kept "
        "0.98-0.99 at L (ft and ryarn). This design's own bases (--steps 10000) reached 0.98 at 6000, 7000 and "
        "4000 steps for those seeds. This design: "
        f"{len(setup['bases'])} bases of {setup.get('layers', 2)} layers pretrained until they reach "
        f"{setup['pretrain_bar']} at L (at most {setup['pretrain']} steps), every method of "
        f"{', '.join(GRID_METHODS)} on every base at every rate of {', '.join(f'{lr:g}' for lr in setup['lrs'])} "
        "(below 1e-4 a fine-tune barely moves its base, whose YaRN reading is the zero-shot+yarn control), the "
        "primary claims compared at matched rates, and the test sequences from a seed used nowhere else.", ""]


def rule_section(data: dict) -> list[str]:
    return [
        "## The rule (fixed before the run)", "",
        f"A gain is measured on each base as the mean over its fine-tuning seeds; the bases are the independent "
        f"units. A claim is **reproduced** when its mean gain is >= +{THRESHOLD} and its interval lies above 0; "
        f"**reversed** when the mean is <= -{THRESHOLD} and the interval lies below 0; **smaller than claimed** "
        f"when the interval lies below +{THRESHOLD}; **undecided** otherwise, and always with fewer than 3 bases. "
        "The intervals are t-intervals over bases, Holm-adjusted within their table. **Primary** (named before "
        "the run, what isolates randomization): ryarn against trained YaRN and against YaRN at inference only, "
        "and the gain growing with length, each at every rate of the grid with both sides at that rate: one "
        "family of claims x rates; a claim's verdict says at which rates it holds. **Exploratory**: the rest, "
        "each method at the rate with the best mean validation accuracy at L over the bases (ties: the smaller), "
        "another family. A base counts for a claim when it learned the task (validation accuracy at L >= "
        f"{data['fit_bar']}) and so did every fine-tune the claim compares on it (its validation accuracy at L >= "
        f"{data['fit_bar']}); with no base left, the verdict is undecided (models did not fit). *detectable*: "
        "the adjusted interval's half-width, the smallest mean gain these bases could tell from 0.", ""]


def matched_table(data: dict) -> list[str]:
    """The primary claims at every rate: gains per base, mean [adjusted interval], detectable, verdict."""
    family = {f"{n} at {lr}": r for n, c in data["claims"].items() if c["primary"] for lr, r in c["by_rate"].items()}
    rows = [caption(family), "", "| claim | lr | gain per base | mean [adjusted interval] | detectable | verdict |",
            "|---|---:|---|---|---:|---|"]
    for name, c in data["claims"].items():
        if not c["primary"]:
            continue
        for lr, r in c["by_rate"].items():
            per = ", ".join(f"{g:+.3f}" for g in r["per_unit"]) or "-"
            interval = f"{r['mean']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]" if "low" in r else "-"
            detect = f"{(r['high'] - r['low']) / 2:.3f}" if "low" in r else "-"
            rows.append(f"| {name} ({c['better']} − {c['worse']}) | {lr} | {per} | {interval} | {detect} | "
                        f"**{r['verdict']}** |")
    rows += ["", "Over the grid: " + "; ".join(f"**{n}**: {c['verdict']}" for n, c in data["claims"].items()
                                               if c["primary"]) + "."]
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


def per_rate(by_rate: dict) -> str:
    """A primary claim's verdicts along the grid, in a word each, runs of one counted: "reproduced, undecided x3,
    unfit", lowest rate first (the rates and the full verdicts are in results/ryarn.md)."""
    words = ["unfit" if x["verdict"] == UNFIT else short(x["verdict"]).split(" (")[0]
             .replace(" than claimed", "") for x in by_rate.values()]
    runs = [(w, len(list(run))) for w, run in itertools.groupby(words)]
    return ", ".join(w if k == 1 else f"{w} x{k}" for w, k in runs)


def summary(data: dict) -> str:
    """README.md's table: each claim, the bases it rests on (for a primary claim: at each rate of the grid),
    its mean [adjusted interval] and its verdict; the primary ones first, over the whole grid."""
    rows = ["| claim (beyond L unless said; * primary) | bases measured | mean [adjusted interval] | "
            "verdict |", "|---|---|---|---|"]
    for name, r in data["claims"].items():
        if r["primary"]:
            counts = ", ".join(str(len(x["per_unit"])) for x in r["by_rate"].values())
            rows.append(f"| **{SHORT[name]}** * | {counts} | in results | {per_rate(r['by_rate'])} |")
            continue
        interval = f" [{r['low']:+.3f}, {r['high']:+.3f}]" if "low" in r else ""
        mean = f"{r['mean']:+.3f}{interval}" if "mean" in r else "-"
        rows.append(f"| {SHORT[name]} | {len(r['per_unit'])} | {mean} | {short(r['verdict'])} |")
    rates = ", ".join(f"{lr:g}" for lr in data["settings"]["lrs"])
    return "\n".join(rows) + f"\n\n\\* at each rate, {rates}, both sides at it; smaller: smaller than claimed.\n"


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
    out = header(data) + design_section(data) + rule_section(data) + [fit_line(data), ""]
    out += ["## Primary claims, at matched learning rates", ""] + matched_table(data)
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


# ---------------------------------------------------------------------------------------------------------
# The run: three waves of independent runs (--jobs N runs N at once), each needing the one before: the bases;
# the learning-rate grid on the first base; every other fine-tune at the chosen rates.
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
    return {(method, lr, b, seed): (finetune_argv(
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
                jobs[f"{method}-b{b}-s{seed}"] = (finetune_argv(
                    TASK, os.path.join(root, TASK, f"{method}-b{b}-s{seed}"), base, method, setup["finetune"], seed,
                    lr[method], setup, args), TASK, setup, args, [None])
        for top in setup["ranges"][1:]:
            name = f"ryarn-range{top}L-b{b}-s{setup['seeds'][0]}"
            jobs[name] = (finetune_argv(TASK, os.path.join(root, TASK, name), base, "ryarn", setup["finetune"],
                                        setup["seeds"][0], lr["ryarn"], setup, args, top), TASK, setup, args, [None])
    for task in CONTROLS:
        for b in setup["control_bases"]:
            for method in ("ft", "yarn", "ryarn"):
                jobs[f"{task}-{method}-b{b}"] = (finetune_argv(
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


def commands(setup: dict, bases: dict, grid: dict, tunes: dict) -> dict:
    """name -> the train.py command of every model this experiment trained (base-0, ryarn-b1-s10-lr0.001,
    rpe-nocurr-b1-s10, ...)."""
    out = {name: command(job[0]) for name, job in bases.items()}
    out |= {f"{m}-b{b}-s{seed}-lr{lr:g}": command(job[0]) for (m, lr, b, seed), job in grid.items()}
    return out | {name: command(job[0]) for name, job in tunes.items()}


def render(data: dict):
    """The results decided again from their numbers under the current rule and fit bar (python eval.py
    --experiment ryarn --render): the data with its claims, the markdown and the figure."""
    data = {**data, "fit_bar": SCALES[data["scale"]]["fit_bar"]}
    data["claims"] = claims(data, data["fit_bar"])
    return data, markdown(data), figure(data)


def run(args) -> None:
    if args.render:
        return rerender("ryarn", render, args)
    scale = scale_name(args)
    setup = SCALES[scale]
    root = os.path.join("runs", "ryarn", scale)
    since = (time.perf_counter(), cpu_seconds())
    base_jobs, grid_jobs = base_runs(setup, root, args), grid_runs(setup, root, args)
    n_tunes = len(tune_runs(setup, root, args, dict.fromkeys(FINE_TUNES, setup["lrs"][0])))
    with tqdm(total=len(base_jobs) + len(grid_jobs) + n_tunes, desc="ryarn") as bar:
        bases = run_all(base_jobs, args, bar)
        grid = run_all(grid_jobs, args, bar)
        lr = choose(grid, setup)
        tune_jobs = tune_runs(setup, root, args, lr)
        tunes = run_all(tune_jobs, args, bar)
    data = {"command": command_line(args), "scale": scale, "settings": setup, "task": TASK,
            "task_options": TASK_OPTIONS, "lengths": [m * setup["L"] for m in MULTIPLES], "threshold": THRESHOLD,
            "fit_bar": setup["fit_bar"], "test_seed": TEST_SEED, "validation_seed": VALIDATION_SEED,
            "pretrain_steps": pretrain_steps(setup, root), **tables(setup, bases, grid, lr, tunes)}
    data["claims"] = claims(data, setup["fit_bar"])
    data["commands"] = commands(setup, base_jobs, grid_jobs, tune_jobs)
    data["runtime"] = runtime(since, args)
    write_results("ryarn", markdown(data), data, figure(data), args.out_dir)
