"""What the paper experiments share: one way of reporting (results/NAME.md, .json, .png, with the command and
its runtime), statistics over seeds and the verdict rule, the job pool and the run cache.

An experiment reads top to bottom as a story (its building blocks, its runs, its claims, its writers); this file
is the machinery under those stories:
- figures: line_styles (one colour per method in every panel), seed_curve; plot_curves and pyplot are eval.py's;
- results: write_results;
- statistics: spread and fmt (a statistic over seeds and how it is written), beyond (the beyond-L mean);
- verdicts: UNFIT, FIT_BAR, verdict (a claim made of sub-claims), unit_verdict with THRESHOLD (a gain over
  independent units), all_of (a claim that needs several comparisons);
- running: map_jobs (--jobs N worker processes), train_once (a run trained once), cpu_seconds.
How an experiment is found by its name and started (scale_name, command_line, check_out_dir, run_experiment)
is eval.py's command line.

Imports run one way, down: experiments -> train -> eval -> {runs, hf, dist} -> {lengen, tasks, text_tasks}.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import resource
import signal
import sys
import time

import torch

import train
from eval import pyplot, t_interval
from runs import Interrupted, UsageError, save_atomic, signals_deferred

# ---------------------------------------------------------------------------------------------------------
# Figures: one colour per method, fixed across panels; bands over seeds
# ---------------------------------------------------------------------------------------------------------

# Ten strong colours (matplotlib's tab10), then their light partners from tab20 for an experiment that draws more.
PALETTE = [f"C{i}" for i in range(10)] + ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
                                          "#c7c7c7", "#dbdb8d", "#9edae5"]


def line_styles(labels: list[str], extra: dict[str, dict] | None = None) -> dict[str, dict]:
    """A colour per label, fixed by its place in the experiment's one list of them, so that a method is drawn
    alike in every panel and figure whichever others share the panel (matplotlib's cycle would give it the
    next colour free); extra adds to a label's style, e.g. {"zero-shot": {"ls": "--"}}."""
    return {label: {"color": PALETTE[i % len(PALETTE)], "ls": "-", **(extra or {}).get(label, {})}
            for i, label in enumerate(labels)}


def seed_curve(key: str, xs: list, per_seed: list[list[float]], band: str = "range") -> list[dict]:
    """Rows for plot_curves from one list of accuracies per seed: at each x the mean over seeds, with a band
    from the worst seed to the best (band "range") or of one sample sd either side (band "sd")."""
    rows = []
    for x, values in zip(xs, zip(*per_seed)):
        s = spread(values)
        low, high = (s["min"], s["max"]) if band == "range" else (s["mean"] - s["sd"], s["mean"] + s["sd"])
        rows.append({key: x, "accuracy": s["mean"], "low": low, "high": high})
    return rows


# ---------------------------------------------------------------------------------------------------------
# Experiments share one way of reporting: results/NAME.md, .json, .png, with the command and its runtime.
# ---------------------------------------------------------------------------------------------------------


def write_results(name: str, markdown: str, data: dict, figure=None, out_dir: str = "results") -> None:
    """Write results/NAME.md and .json; figure(plt) draws results/NAME.png when matplotlib is there."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(markdown)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    if figure is not None and (plt := pyplot()):
        fig = figure(plt)
        fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=120)
        plt.close(fig)
    print(markdown)
    print(f"wrote {out_dir}/{name}.md, .json" + (", .png" if figure is not None else ""))


# ---------------------------------------------------------------------------------------------------------
# What every experiment shares: spreads over seeds and how they are written, verdicts, seed-paired gains and
# their threshold, the beyond-L mean, the scale, the command line it states, and where it is found.
# ---------------------------------------------------------------------------------------------------------


def spread(values) -> dict:
    """Mean, sample standard deviation and range of a few numbers (one per seed, or per seed and offset)."""
    values = [float(v) for v in values]
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return {"mean": mean, "sd": sd, "min": min(values), "max": max(values), "values": values}


def fmt(s, spec: str = ".2f", form: str = "range") -> str:
    """How every experiment writes a spread over seeds. s: a spread() (or a dict with its keys) or the values
    themselves; spec: the format of each number (".2f", ".1e", "+.3f"; an sd is never signed). form "range":
    '0.93 [0.90, 0.95]'; "sd": '0.93 ± 0.02', a single value alone (in a table, ± 0.00 would read as a
    measured spread); "sd range": '+0.05 ± 0.01 [+0.04, +0.06]'."""
    s = s if isinstance(s, dict) else spread(s)
    mean, sd = f"{s['mean']:{spec}}", f"{s['sd']:{spec.replace('+', '')}}"
    span = f"[{s['min']:{spec}}, {s['max']:{spec}}]"
    if form == "sd" and len(s["values"]) == 1:
        return mean
    return {"range": f"{mean} {span}", "sd": f"{mean} ± {sd}", "sd range": f"{mean} ± {sd} {span}"}[form]


# A claim about how models generalize cannot be tested on models that did not learn their task where nothing
# is extrapolated: whatever they do beyond it says how far training got. Such a claim gets this fourth verdict,
# never "not reproduced". Every experiment's verdicts pass through verdict() or unit_verdict() below, which
# take `fitted`: did the models the claim rests on reach the experiment's fit bar in distribution?
UNFIT = "undecided (models did not fit)"

# The one fit bar: a model has learned its task when its accuracy in distribution (at the longest training length
# L, on held-out sequences) reaches this. retrieval, distance and encodings gate their claims on it.
FIT_BAR = 0.9


def verdict(full: bool, some: bool, fitted: bool = True) -> str:
    """The verdict of a claim made of sub-claims: all of it holds, some of it, or none; undecided (UNFIT)
    when the models it rests on did not fit."""
    if not fitted:
        return UNFIT
    return "reproduced" if full else "partly reproduced" if some else "not reproduced"


# A gain counts when it is >= 5 accuracy points on average and positive on every independent unit (a seed, a
# pretrained base): unit_verdict below; fixed before the runs.
THRESHOLD = 0.05


def beyond(acc: list[float]) -> float:
    """A model's mean accuracy beyond L, from its accuracies at L, 2L, 4L, ...: every one but the first. The
    number the length experiments compare (encodings, ryarn)."""
    return sum(acc[1:]) / len(acc[1:])



# ---------------------------------------------------------------------------------------------------------
# The verdict on a gain replicated over independent units (seeds; pretrained bases): four outcomes
# ---------------------------------------------------------------------------------------------------------


def unit_verdict(per_unit, threshold: float, fitted: bool = True) -> dict:
    """The verdict on a claimed gain from its value on each independent unit (for a fine-tuning method, the
    mean over fine-tuning seeds on one pretrained base), with its mean and 95 % t-interval:
    - reproduced: >= threshold on average and positive on every unit;
    - not reproduced (reversed): <= -threshold on average and negative on every unit;
    - not reproduced: the interval lies below the threshold, so it excludes the claimed gain;
    - undecided: anything else (the interval straddles the threshold, or the units disagree);
    - undecided (models did not fit): fitted is False, or no unit is left to measure (UNFIT).
    The caller decides what fitted, and leaves out what did not (bases in ryarn, tasks in encodings). One unit
    alone has no interval, and no replication to decide on: undecided."""
    values = [float(v) for v in per_unit]
    if not fitted or not values:
        return {"per_unit": values, "verdict": UNFIT}
    if len(values) < 2:
        return {"per_unit": values, "mean": values[0], "verdict": "undecided"}
    mean, low, high = t_interval(values)
    if mean >= threshold and min(values) > 0:
        outcome = "reproduced"
    elif mean <= -threshold and max(values) < 0:
        outcome = "not reproduced (reversed)"
    elif high < threshold:
        outcome = "not reproduced"
    else:
        outcome = "undecided"
    return {"per_unit": values, "mean": mean, "low": low, "high": high, "verdict": outcome}


def all_of(verdicts: list[str]) -> str:
    """The verdict of a claim that needs every one of several comparisons ("X beats each of Y and Z"): each
    comparison reproduced -> reproduced; one decidedly failing -> the claim fails (partly, where another
    holds); otherwise some comparison is open, and so is the claim: undecided, or UNFIT where none could
    be measured on fitted models."""
    failed = [v for v in verdicts if v.startswith("not reproduced")]
    if failed:
        return verdict(False, "reproduced" in verdicts)
    if verdicts and all(v == "reproduced" for v in verdicts):
        return "reproduced"
    return UNFIT if verdicts and all(v == UNFIT for v in verdicts) else "undecided"


def map_jobs(worker, items: list, jobs: int = 1, threads: int = 1, bar=None) -> list:
    """[worker(item) for item in items], in that order: here (jobs 1) or in `jobs` worker processes of
    `threads` torch threads each. An experiment seeds every item from its own arguments, so what it computes
    does not depend on jobs; worker must be a module-level function (a spawned process imports it).

    Ctrl-C or SIGTERM stops it promptly: work not started is cancelled, a worker in a training step finishes
    that step and saves its checkpoint, the others stop at once; what finished stays in runs/, and running the
    same command again goes on from it (train_once reuses finished runs, the llm experiment its scores)."""
    jobs, done = usable_jobs(jobs, len(items), threads), []
    if jobs <= 1:
        try:
            for item in items:
                done.append(worker(item))
                if bar is not None:
                    bar.update(1)
        except (KeyboardInterrupt, Interrupted):
            raise stopped(len(done), len(items)) from None
        return done
    # A worker that stops part-way leaves semaphores for multiprocessing's resource tracker to clear: it does,
    # with a warning that is not the user's concern.
    quiet_tracker = "ignore::UserWarning:multiprocessing.resource_tracker"
    if quiet_tracker not in sys.warnoptions:  # the tracker process starts with this process's -W options
        sys.warnoptions.append(quiet_tracker)
    with concurrent.futures.ProcessPoolExecutor(jobs, multiprocessing.get_context("spawn"),
                                                initializer=worker_setup, initargs=(threads,)) as pool:
        futures = [pool.submit(run_job, worker, item) for item in items]
        try:
            for future in concurrent.futures.as_completed(futures):
                done.append(future.result())
                if bar is not None:
                    bar.update(1)
            return [f.result() for f in futures]
        except KeyboardInterrupt:
            with signals_deferred():  # a second Ctrl-C while the workers stop changes nothing
                workers = list(pool._processes.values())
                pool.shutdown(wait=False, cancel_futures=True)
                for process in workers:  # SIGTERM each: see worker_setup
                    process.terminate()
                for process in workers:
                    process.join()
            raise stopped(len(done), len(items)) from None
        except concurrent.futures.process.BrokenProcessPool:
            raise UsageError("a worker process died (killed, or out of memory); the models it had finished are "
                             "in runs/: run the same command again") from None
        except Exception:  # one run failed (its error is reported): the queue behind it is not trained for nothing
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def worker_setup(threads: int) -> None:
    """In each --jobs worker: its torch threads; Ctrl-C left to the main process, which cancels the queue and
    sends the workers SIGTERM; SIGTERM ends a worker at once, except inside a training step (train.py's loop
    defers it), which finishes and saves its checkpoint first (run_job then ends the worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(130))
    torch.set_num_threads(threads)


def run_job(worker, item):
    """worker(item) in a --jobs worker; a worker that was told to stop ends, rather than take more work."""
    try:
        return worker(item)
    except (KeyboardInterrupt, Interrupted):
        os._exit(130)


def stopped(finished: int, total: int) -> Interrupted:
    return Interrupted(f"interrupted with {finished} of {total} runs finished; they are kept in runs/, and "
                             "the same command again goes on from them")


def train_once(argv: list[str]) -> dict:
    """train.run(argv) for an experiment's model, unless its --out already holds the run that this very argv
    trained with this very code (an experiment stopped part-way and started again): then that run, untouched.
    made-by.json, written once training has finished, says which; train.py --force into the folder drops it."""
    out = argv[argv.index("--out") + 1]
    made_by = {"argv": argv, "code": code_digest()}
    try:
        with open(os.path.join(out, "made-by.json")) as f:
            reuse = json.load(f) == made_by
        final = os.path.join(out, "final.json")  # absent when its caller measures the run itself
        if reuse and not os.path.isfile(final):
            return {"run": out, "rows": []}
        if reuse:
            with open(final) as f:
                return {"run": out, "rows": json.load(f)}
    except (OSError, ValueError):  # no such file, or one cut short: train
        pass
    result = train.run(argv)
    save_atomic(os.path.join(out, "made-by.json"), lambda f: f.write(json.dumps(made_by).encode()))
    return result


def code_digest() -> str:
    """sha256 of the code a small GPT's training runs: a run trained by older code is trained again."""
    digest = hashlib.sha256()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("lengen.py", "tasks.py", "train.py", "eval.py", "runs.py"):
        with open(os.path.join(root, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def usable_jobs(jobs: int, items: int, threads: int = 1) -> int:
    """--jobs N, capped at what this machine can run at once: one worker per `threads` CPU cores, 1 GiB of
    free memory each (a small GPT's worker takes ~0.3 GiB, an LLM's ~2), and never more than the work items."""
    cores = max(1, (os.cpu_count() or 1) // threads)
    try:  # Linux: what new processes can take, page cache included
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) // 2 ** 20
    except (OSError, StopIteration, ValueError):  # not reported on this system
        free = cores
    usable = max(1, min(jobs, cores, free, items))
    if usable < min(jobs, items):
        print(f"--jobs {jobs}: running {usable} at once ({os.cpu_count()} CPU cores, {free} GiB free)",
              file=sys.stderr)
    return usable


def cpu_seconds() -> float:
    """CPU time of this process and of its finished child processes (--jobs workers, once their pool is
    closed): an experiment's CPU cost whether it runs its models here or in workers."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime
