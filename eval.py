"""Evaluate a run across lengths or delays; the statistics and writers every experiment shares; the CLI.

    python eval.py runs/NAME --lengths 24,48,96,192          # accuracy table with 95 % intervals
    python eval.py runs/NAME --delays 0:60 --plot delays.png  # delay tasks: accuracy at each delay
    python eval.py runs/NAME --lengths 64,128 --scaling yarn --factor 4   # inference-time YaRN
    python eval.py runs/LLM_RUN --task babilong --lengths 2048,12288     # a train.py --llm run
    torchrun --nproc_per_node 2 eval.py runs/LLM_RUN ...     # the prompts shared out over 2 processes
    python eval.py --experiment retrieval                    # experiments/retrieval.py -> results/retrieval.*
    python eval.py --experiment distance --jobs 4            # its independent models in 4 processes
    python eval.py --bench                                   # experiments/bench.py -> results/bench.*

The paper experiments live in experiments/, one file each, found here by name and imported only when asked
for (experiments -> eval -> train -> {tasks, lengen}). Each trains its models through train.py's own
functions (the same settings a user would type), writes results/NAME.md (claim, what the paper says, what we
measured, verdict), results/NAME.json and results/NAME.png, prints the table and states its command and
runtime.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import resource
import signal
import sys
import tempfile
import time

import torch
from tqdm import tqdm

import dist
import hf
import lengen
import text_tasks
import train
from runs import UsageError, check_machine, hold, save_atomic, signals_deferred

# ---------------------------------------------------------------------------------------------------------
# Plotting: optional. Without matplotlib every command still runs and says how to get the figure.
# ---------------------------------------------------------------------------------------------------------


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("(no figure: pip install matplotlib to get it)", file=sys.stderr)
        return None


def plot_curves(ax, curves: dict[str, list[dict]], key: str, train_range=None, log_x=True, styles=None):
    """One line per label: accuracy (with its 95 % band) against length or delay. styles[label] holds its
    colour and line style (line_styles), so that it looks the same in every panel; without, matplotlib's
    colour cycle."""
    for label, rows in curves.items():
        xs = [r[key] for r in rows]
        line, = ax.plot(xs, [r["accuracy"] for r in rows], marker="o", ms=3, label=label,
                        **(styles or {}).get(label, {}))
        ax.fill_between(xs, [r["low"] for r in rows], [r["high"] for r in rows], color=line.get_color(), alpha=0.15)
    if train_range:
        ax.axvspan(*train_range, color="grey", alpha=0.15, lw=0, label="trained")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(key)
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)


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
# Evaluating one run (train.evaluate_table does the measuring; train.py's final table uses it too)
# ---------------------------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got '{text}'") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive, got '{text}'")
    return values


def eval_command(args) -> None:
    if (args.factor is not None or args.original_len is not None) and args.scaling in (None, "none"):
        raise UsageError("--factor and --original-len set a rotary schedule: give --scaling with them")
    if args.scaling not in (None, "none") and args.factor is None:
        raise UsageError(f"--scaling {args.scaling} needs --factor S (how far it stretches the context)")
    overrides = {k: v for k, v in (("scaling", args.scaling), ("factor", args.factor),
                                   ("original_len", args.original_len)) if v is not None}
    model, cfg = train.load_run(args.run, args.device, **overrides)
    if args.lengths is None and args.delays is None:
        hi = cfg["train_len"][1]
        if "delays" in cfg["task_options"]:
            args.delays = list(range(0, 4 * max(cfg["task_options"]["delays"]) + 1, 2))
        else:
            args.lengths = [hi, 2 * hi, 4 * hi, 8 * hi]
    start = time.perf_counter()
    rows, key = train.evaluate_table(model, cfg, args.lengths, args.delays, args.samples, args.device)
    label = os.path.basename(os.path.normpath(args.run))
    if args.scaling:
        label += f" ({args.scaling} x{args.factor:g})" if args.factor else f" ({args.scaling})"
    print(f"{label}: {cfg['task']}, {cfg['encoding']}, trained on {key}s "
          + (f"{cfg['train_len'][0]}..{cfg['train_len'][1]}" if key == "length"
             else ",".join(map(str, cfg["task_options"]["delays"]))))
    print(train.markdown_table(rows, key))
    print(f"({args.samples} sequences per {key}, {time.perf_counter() - start:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": args.run, "config": cfg, "rows": rows}, f, indent=1)
    if args.plot and (plt := pyplot()):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        trained = cfg["train_len"] if key == "length" else (min(cfg["task_options"]["delays"]),
                                                             max(cfg["task_options"]["delays"]))
        plot_curves(ax, {label: rows}, key, trained, log_x=key == "length")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"figure: {args.plot}")


def check_writable(path: str | None, flag: str) -> None:
    """Refuse, before anything is computed, a --json or --plot file that could not be written."""
    if path is None:
        return
    existed = os.path.exists(path)
    try:
        open(path, "a").close()  # what writing it will take, without changing a file that is there
    except OSError as e:  # a missing folder, a folder, no permission
        raise UsageError(f"{flag} {path}: {e.strerror}") from None
    if not existed:
        os.remove(path)


def llm_eval_command(args) -> None:
    """eval.py on a train.py --llm run or a base model: exact match on a text task at each length."""
    # An LLM is measured as saved, or with inference-time YaRN over its own context: refuse, before loading
    # anything, the options that would otherwise be ignored or break the schedule.
    if args.scaling not in (None, "none", "yarn"):
        raise UsageError(f"--scaling {args.scaling}: an LLM is evaluated as saved or with --scaling yarn")
    if args.factor is not None and args.scaling != "yarn":
        raise UsageError("--factor needs --scaling yarn for an LLM")
    if args.factor is not None and not args.factor >= 1:
        raise UsageError(f"scaling factor must be >= 1, got {args.factor}")
    if args.original_len is not None:
        raise UsageError("--original-len is for small-GPT runs: an LLM's original context is read from its config")
    device = dist.start(args.device)  # under torchrun, each process scores a share of the prompts (dist.py)
    model, tokenizer, label = hf.load_for_eval(args.run or args.llm, device, args.scaling, args.factor)
    task = args.task or "babilong"
    lengths = args.lengths or [1024, 4096, 8192, 12288]
    samples = args.samples or 5
    start = time.perf_counter()
    with tqdm(total=len(lengths) * samples, desc=label, disable=dist.rank() > 0) as bar:
        rows = [evaluate_llm(model, tokenizer, task, n, samples, {}, device, bar=bar) for n in lengths]
    dist.stop()
    if dist.launch_rank() > 0:  # rank 0 reports for all
        return
    print(f"{label}: {task}, exact match")
    print(train.markdown_table(rows))
    print(f"({samples} prompts per length, {time.perf_counter() - start:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": label, "task": task, "rows": rows}, f, indent=1)


def evaluate_llm(model, tokenizer, task: str, length: int, samples: int, options: dict | None = None,
                 device: str = "cpu", seed: int = 10 ** 9, bar=None, bf16: bool = False) -> dict:
    """Exact match (greedy), answer log-likelihood and candidate rank on `samples` prompts of about `length`
    tokens, the same prompts for every model. Exact match and the fraction of prompts where the right
    candidate ranks first have 95 % Wilson intervals (train.interval); the answer's log-probability, its 95 %
    t-interval. The seeds lie far from the training samples' (finetune.py uses seed * 1,000,003 + i)."""
    candidates = text_tasks.ANSWER_CANDIDATES.get(task, ())
    scores = []
    # Under a launcher (torchrun) process r scores prompts r, r + N, ...; every process gets all the scores,
    # in prompt order, as one process computes them (each prompt is scored on its own).
    for i in range(dist.rank(), samples, dist.world()):
        prompt, answer = hf.text_sample(tokenizer, task, length, seed + i, options or {})
        scores.append((i, {"answer": answer, **hf.score_prompt(model, tokenizer, prompt, answer, candidates, device,
                                                            bf16=bf16)}))
        if bar is not None:
            bar.update(min(dist.world(), samples - i))  # this round of prompts, one per process
    scores = [score for _, score in sorted(dist.gather(scores), key=lambda pair: pair[0])]
    mean, low, high = train.interval(torch.tensor([float(s["right"]) for s in scores]))
    row = {"length": length, "accuracy": mean, "low": low, "high": high, "samples": samples}
    logprob = torch.tensor([s["logprob"] for s in scores])
    row["logprob"], row["logprob_low"], row["logprob_high"] = t_interval(logprob.tolist())
    if candidates:
        first = torch.tensor([float(s["rank"] == 1) for s in scores])
        row["top1"], row["top1_low"], row["top1_high"] = train.interval(first)
        row["mean_rank"], row["candidates"] = float(torch.tensor([s["rank"] for s in scores]).mean()), len(candidates)
    row["prompts"] = scores
    return row



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

# Two-sided 95 % quantiles of Student's t for 1..10 degrees of freedom; beyond 10, Cornish and Fisher's
# expansion about the normal quantile, within 0.003 of the exact value there and closer above.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def t95(df: int) -> float:
    if df in T95:
        return T95[df]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def t_interval(values) -> tuple[float, float, float]:
    """Mean and its 95 % t-interval over n independent units (n - 1 degrees of freedom). Honest for a handful
    of units, where mean +- 1.96 standard errors is far too narrow: for 3 units the half-width is 4.30
    standard errors."""
    s = spread(values)
    if len(s["values"]) < 2:
        return s["mean"], float("nan"), float("nan")
    half = t95(len(s["values"]) - 1) * s["sd"] / len(s["values"]) ** 0.5
    return s["mean"], s["mean"] - half, s["mean"] + half


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


SCALES = ("quick", "default", "full")  # every experiment's SCALES dict has these keys


def scale_name(args) -> str:
    """--quick (for the tests), --full (paper scale, a GPU helps) or the default (minutes on a laptop CPU)."""
    if args.quick and args.full:
        raise UsageError("choose one of --quick and --full")
    return "quick" if args.quick else "full" if args.full else "default"


def command_line(args, *extra: str) -> str:
    """The command that reproduces an experiment's results, as the user would type it: every option that
    differs from its default, so that the results file states exactly what was run."""
    words = ["python eval.py", "--bench" if args.bench else f"--experiment {args.experiment}"]
    words += [f"--{scale_name(args)}"] if scale_name(args) != "default" else []
    words += [f"--threads {args.threads}"] if args.threads else []
    words += [f"--device {args.device}"] if args.device != "cpu" else []
    words += [f"--out-dir {args.out_dir}"] if args.out_dir != default_out_dir(args) else []
    words += [f"--jobs {args.jobs}"] if args.jobs != 1 else []
    return " ".join(words + list(extra))


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
        except (KeyboardInterrupt, train.Interrupted):
            raise stopped(len(done), len(items)) from None
        return done
    import concurrent.futures
    import multiprocessing
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
    except (KeyboardInterrupt, train.Interrupted):
        os._exit(130)


def stopped(finished: int, total: int) -> train.Interrupted:
    return train.Interrupted(f"interrupted with {finished} of {total} runs finished; they are kept in runs/, and "
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
    for name in ("lengen.py", "tasks.py", "train.py", "runs.py"):
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), "rb") as f:
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


def experiment_names() -> list[str]:
    """The experiments: one file each in experiments/ (bench.py is reached through --bench)."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments")
    return sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f not in ("__init__.py", "bench.py"))


def default_out_dir(args) -> str:
    """results/, or results/quick/ (not committed) for --quick, which must never replace the real results."""
    return os.path.join("results", "quick") if args.quick else "results"


def check_out_dir(name: str, args) -> None:
    """Before anything is computed: the results can be written to --out-dir, and they would not replace results
    that another command wrote there (another scale, other options) unless --force."""
    folder, path = args.out_dir, os.path.join(args.out_dir, f"{name}.json")
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()  # what writing there will take
    except OSError as e:  # a file, a read-only folder or mount, no permission
        raise UsageError(f"--out-dir {folder}: {e.strerror}") from None
    if os.path.isfile(path) and not args.force:
        try:
            with open(path, encoding="utf-8") as f:
                previous = json.load(f).get("command")
        except (ValueError, AttributeError):  # not JSON, or not an experiment's
            previous = None
        if previous != command_line(args):
            raise UsageError(f"{path} holds the results of `{previous}`, not of this command: give another "
                             "--out-dir, or --force to replace them")


def run_experiment(name: str, args) -> None:
    """Import experiments/NAME.py only now (it imports this module, not the other way round) and run it."""
    if name not in experiment_names() + ["bench"]:
        raise UsageError(f"unknown experiment '{name}'; choose from {', '.join(experiment_names())}")
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give N >= 1 (how many runs train at once)")
    if args.bench and args.jobs != 1:
        raise UsageError("--bench measures what --jobs does itself: leave --jobs out")
    scale = scale_name(args)  # --quick with --full is refused before anything is written
    args.out_dir = args.out_dir or default_out_dir(args)
    check_out_dir(name, args)
    # A second command on the same experiment and scale would race this one for its run folders: it is
    # turned away in one line, and this one goes on.
    with hold(os.path.join("runs", name, scale), holder=f"eval.py --experiment {name}"):
        importlib.import_module(f"experiments.{name}").run(args)


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = train.Parser(description="Evaluate a run, or run a named experiment (see README).")
    p.add_argument("run", nargs="?", help="a run directory written by train.py")
    p.add_argument("--lengths", type=int_list, default=None, help="e.g. 24,48,96,192")
    p.add_argument("--delays", type=train.int_set, default=None, help="delay tasks: e.g. 0:60")
    p.add_argument("--samples", type=int, default=None,
                   help="sequences per length or delay (default 256; an LLM: 5 prompts)")
    p.add_argument("--llm", default=None, help="evaluate a base LLM (smollm2, a directory, a .gguf, a hub id)")
    p.add_argument("--task", default=None, choices=sorted(text_tasks.TEXT_TASKS), help="LLM text task (babilong)")
    p.add_argument("--scaling", choices=tuple(lengen.SCALINGS), default=None,
                   help="evaluate with another rotary schedule (e.g. inference-time YaRN)")
    p.add_argument("--factor", type=train.finite, default=None)
    p.add_argument("--original-len", type=int, default=None)
    p.add_argument("--plot", default=None, metavar="PNG")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--experiment", default=None, help="a named experiment: " + ", ".join(experiment_names()))
    p.add_argument("--quick", action="store_true", help="experiment: a small version for the tests")
    p.add_argument("--full", action="store_true", help="experiment: closer to paper scale (a GPU helps)")
    p.add_argument("--bench", action="store_true", help="speed and memory benchmark (results/bench.md)")
    p.add_argument("--out-dir", default=None,
                   help="experiment or bench: where results go (default results/; --quick: results/quick/)")
    p.add_argument("--force", action="store_true",
                   help="experiment or bench: replace results that another command wrote in --out-dir")
    p.add_argument("--jobs", type=int, default=1,
                   help="experiment: this many independent runs at once, each in its own process (results are "
                        "identical to --jobs 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a scheduler's SIGTERM is a Ctrl-C
    try:
        args = build_parser().parse_args(argv)
        check_machine(args.device, args.threads)
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.factor is not None and args.factor < 1:
            raise UsageError(f"--factor must be >= 1 (it stretches the context), got {args.factor:g}")
        llm = args.llm or (args.run and os.path.isdir(os.path.join(args.run, "model")))
        if dist.launched() and (args.bench or args.experiment or not llm):
            raise UsageError("torchrun shares out an LLM evaluation's prompts; everything else runs in one process "
                             "(an experiment's runs in several: --jobs N)")
        if not (args.bench or args.experiment) and dist.launch_rank() == 0:  # rank 0 writes them
            check_writable(args.json, "--json")
            check_writable(args.plot, "--plot")
        if args.bench:
            run_experiment("bench", args)
        elif args.experiment:
            run_experiment(args.experiment, args)
        elif args.samples is not None and args.samples < 1:
            raise UsageError("--samples must be >= 1")
        elif llm:
            llm_eval_command(args)
        elif args.run:
            args.samples = args.samples or 256
            eval_command(args)
        else:
            raise UsageError("give a run directory, --experiment NAME or --bench")
        sys.stdout.flush()  # a closed pipe (| head) shows here, inside the try, rather than at exit
    except UsageError as e:
        if dist.launch_rank() == 0:  # under torchrun every process checks the same command line: said once
            print(f"eval.py: error: {e}", file=sys.stderr)
        return 2
    except train.Interrupted as e:  # Ctrl-C inside a training run: its checkpoint is saved
        print(f"eval.py: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("eval.py: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        train.closed_stdout("eval.py")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
