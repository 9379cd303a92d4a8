"""What the paper experiments share: the runner (eval.py --experiment NAME lands in run_experiment), one way of
reporting (results/NAME.md, .json, .png, with the command and its runtime), the job pool and the run cache.

Each experiment is two files: experiments/NAME.py, its study (setup, recipes, measures, claims; run(args)
returns data and writes nothing), and experiments/NAME_report.py, which writes it (markdown, figure, the
README and docs blocks; decide_again for --render). The statistics and the verdict rule are in stats.py.
- figures: line_styles (one colour per method in every panel), seed_curve; plot_curves and pyplot are eval.py's;
- results: write_results, and render_blocks (the claims tables of README.md and docs/, rendered from
  results/NAME.json);
- the runner: preset_name, results_name, command_line (the command a results file states), check_out_dir,
  run_experiment;
- statistics over seeds: spread and fmt (a statistic over seeds and how it is written), beyond (the beyond-L
  mean);
- running: map_jobs (--jobs N worker processes), train_once (a run trained once), fit_of (a probe's model;
  probe trains them all, probe_cost and probe_table report them), cpu_seconds and runtime (what a run took).

Imports run one way, down: experiments/NAME_report -> experiments/NAME -> {common, stats} -> {train, eval} ->
{finetune} -> {hf, dist, runs} -> {lengen, tasks, text_tasks}; eval.py imports this file only when asked to run
an experiment, late, and nothing below imports an experiment.
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import importlib
import json
import math
import multiprocessing
import multiprocessing.resource_tracker
import os
import re
import resource
import shlex
import signal
import sys
import tempfile
import textwrap
import threading
import time

import torch
from tqdm import tqdm

import train
from eval import experiment_names, pyplot, sample_sd, save_figure
from experiments.stats import FIT_BAR
from folder_lock import release_held
from runs import Interrupted, UsageError, code_digest, hold, read_fit, save_atomic, signals_deferred

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
    # Each file whole or not at all: a kill, a full disk or a size limit leaves the previous one in place.
    # The json goes first: a results folder never holds a new .md beside an older .json that contradicts it.
    text = json.dumps(data, indent=1)
    save_atomic(os.path.join(out_dir, f"{name}.json"), lambda f: f.write(text.encode()))
    save_atomic(os.path.join(out_dir, f"{name}.md"), lambda f: f.write(markdown.encode()))
    if figure is not None and (plt := pyplot()):
        fig = figure(plt)
        save_figure(fig, os.path.join(out_dir, f"{name}.png"))
        plt.close(fig)
    print(markdown)
    print(f"wrote {out_dir}/{name}.md, .json" + (", .png" if figure is not None else ""))


def int_keys(obj: dict) -> dict:
    """JSON keeps a dict's integer keys (a length, a width) as text: a dict whose keys all read as integers had
    integers for keys when its experiment wrote it."""
    if obj and all(k.lstrip("-").isdigit() for k in obj):
        return {int(k): v for k, v in obj.items()}
    return obj


# A claims table in README.md or docs/*.md is never typed: it stands between these two lines, and is what the
# named function of experiments/NAME_report.py renders from results/NAME.json (tests/test_rendered.py checks it).
# A block holds no other block's first line, so that one whose end line was lost never runs on to the next's end.
BLOCK_START = "<!-- rendered by experiments/"
BLOCK = re.compile(r"(<!-- rendered by experiments/(\w+)_report\.py (\w+)\(\) from results/\2\.json -->\n)"
                   r"((?:(?!<!-- rendered by experiments/).)*?)(<!-- end rendered -->)", re.S)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pages() -> list[str]:
    """The pages whose tables are rendered: README.md and docs/*.md."""
    docs = os.path.join(ROOT, "docs")
    return [os.path.join(ROOT, "README.md")] + sorted(os.path.join(docs, f) for f in os.listdir(docs)
                                                      if f.endswith(".md"))


def rendered(name: str, function: str) -> str:
    """What experiments/NAME_report.py's function renders from the committed results/NAME.json."""
    with open(os.path.join(ROOT, "results", f"{name}.json"), encoding="utf-8") as f:
        data = json.load(f, object_hook=int_keys)
    return getattr(importlib.import_module(f"experiments.{name}_report"), function)(data)


def wrapped(text: str, width: int = 110) -> str:
    """A rendered sentence as README.md's prose is written: lines of at most `width` characters."""
    return textwrap.fill(text, width, break_on_hyphens=False, break_long_words=False)


def render_blocks(text: str, only: str | None = None) -> str:
    """The page with every rendered block (or only experiment `only`'s) made anew from its results. A block whose
    end line is missing is refused: rendered, it would take the page's prose up to the next end line with it."""
    if len(BLOCK.findall(text)) != text.count(BLOCK_START):
        raise UsageError("a rendered block has lost its end line (<!-- end rendered -->), or its first line is "
                         "damaged: nothing was rendered; mend it")

    def fill(m):
        if only and m.group(2) != only:
            return m.group(0)
        return m.group(1) + rendered(m.group(2), m.group(3)).rstrip("\n") + "\n" + m.group(5)
    return BLOCK.sub(fill, text)


# ---------------------------------------------------------------------------------------------------------
# The runner: eval.py --experiment NAME imports this file, and this file imports the experiment
# ---------------------------------------------------------------------------------------------------------

PRESETS = ("quick", "default", "full")  # every study's PRESETS dict has these keys, and "probe" where it has one


def preset_name(args) -> str:
    """--quick (for the tests), --full (paper scale, a GPU helps), --probe (the short run that chose the default's
    design, where an experiment has one) or the default (minutes on a laptop CPU)."""
    given = [flag for flag in ("quick", "probe", "full") if getattr(args, flag)]
    if len(given) > 1:
        raise UsageError(f"choose one of --{' and --'.join(given)}")
    return given[0] if given else "default"


def results_name(name: str, args) -> str:
    """NAME, or NAME-probe for --probe: a probe never replaces the results it was run to plan."""
    return f"{name}-probe" if args.probe else name


def command_line(args, *extra: str) -> str:
    """The command that reproduces an experiment's results, as the user would type it: every option that
    differs from its default, so that the results file states exactly what was run."""
    words = ["python eval.py", "--bench" if args.bench else f"--experiment {args.experiment}"]
    words += [f"--{preset_name(args)}"] if preset_name(args) != "default" else []
    words += [f"--threads {args.threads}"] if args.threads else []
    words += [f"--device {args.device}"] if args.device != "cpu" else []
    words += [f"--out-dir {args.out_dir}"] if args.out_dir != default_out_dir(args) else []
    words += [f"--jobs {args.jobs}"] if args.jobs != 1 else []
    return " ".join(words + list(extra))


def default_out_dir(args) -> str:
    """results/, or results/quick/ (not committed) for --quick, which must never replace the real results."""
    return os.path.join("results", "quick") if args.quick else "results"


def check_out_dir(name: str, args) -> None:
    """Before anything is computed: the results can be written to --out-dir, and they would not replace results
    that another command wrote there (another preset, other options) unless --force."""
    folder, path = args.out_dir, os.path.join(args.out_dir, f"{name}.json")
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()  # what writing there will take
    except OSError as e:  # a file, a read-only folder or mount, no permission
        raise UsageError(f"--out-dir {folder}: {e.strerror}") from None
    if args.render:  # the same command's results, decided again: they must be there, and readable
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)["command"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(f"--render decides again from {path}, which is missing or not an experiment's "
                             "results: run the experiment first") from None
    elif os.path.isfile(path) and not args.force:
        try:
            with open(path, encoding="utf-8") as f:
                previous = json.load(f).get("command")
        except (ValueError, AttributeError):  # not JSON (cut short?), or not an experiment's
            raise UsageError(f"{path} is not an experiment's results (not readable JSON, or cut short): give "
                             "--force to replace it") from None
        if previous != command_line(args):
            raise UsageError(f"{path} holds the results of `{previous}`, not of this command: give another "
                             "--out-dir, or --force to replace them")


def run_experiment(name: str, args) -> None:
    """eval.py --experiment NAME (or --bench): check the command, import the study experiments/NAME.py and its
    report experiments/NAME_report.py, let the study refuse what it cannot run here (its refuse(args), if it has
    one), hold its run folders, and write its results once: data = study.run(args), which trains and measures
    and writes nothing, then report.markdown(data) and report.figure(data). --render runs no study: the report
    decides the recorded data again (report.decide_again) and writes them anew."""
    if name not in experiment_names() + ["bench"]:
        raise UsageError(f"unknown experiment '{name}'; choose from {', '.join(experiment_names())}")
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give N >= 1 (how many runs train at once)")
    if args.bench and args.jobs != 1:
        raise UsageError("--bench measures what --jobs does itself: leave --jobs out")
    preset = preset_name(args)  # --quick with --full is refused before anything is written
    study = importlib.import_module(f"experiments.{name}")
    report = importlib.import_module(f"experiments.{name}_report")
    if preset == "probe" and "probe" not in getattr(study, "PRESETS", {}):
        raise UsageError(f"--probe: {name} has no probe (its design is given in its results file)")
    if args.render and preset == "probe":
        raise UsageError("--render decides claims again; a probe has none: run --probe itself")
    if args.render and not hasattr(report, "decide_again"):
        raise UsageError(f"--render: {name} makes no claims to decide again; run it instead")
    if args.dry_run:  # what it would run, printed: nothing is run or written, so no device is needed
        if not hasattr(study, "dry_run"):
            raise UsageError(f"--dry-run: {name} has no plan to print (gpu has: the llm experiment's --full)")
        print(study.dry_run(args))
        return
    if hasattr(study, "refuse"):  # what this machine cannot run, said before any folder is made
        study.refuse(args)
    args.out_dir = args.out_dir or default_out_dir(args)
    if args.cells or args.launcher != "local":
        check_cells(name, study, args, preset)
    if args.cells:  # the models still to train, as commands for a scheduler: nothing is trained or written here
        write_cells(study.cells(args), args.cells)
        return
    results = results_name(name, args)
    check_out_dir(results, args)
    # A second command on the same experiment and preset would race this one for its run folders: it is
    # turned away in one line, and this one goes on.
    with hold(os.path.join("runs", name, preset), holder=f"eval.py --experiment {name}"):
        if args.render:
            data, markdown = render_again(report, os.path.join(args.out_dir, f"{results}.json"))
        else:
            if args.launcher != "local":  # every model trained by the scheduler first; the run then reuses them
                launch_cells(study.cells(args), args, os.path.join("runs", name, preset, "submitit"))
            data = study.run(args)
            markdown = report.markdown(data)
        if args.render:  # the recorded command stays the one that measured the numbers; this says who decided
            markdown = markdown.rstrip("\n") + (f"\n\nVerdicts decided from these numbers by `python eval.py "
                                                f"--experiment {name} --render` (the shared rule: "
                                                "experiments/stats.py).\n")
        write_results(results, markdown, data, report.figure(data), args.out_dir)
    if args.render and os.path.abspath(args.out_dir) == os.path.join(ROOT, "results"):
        render_pages(name)


def render_pages(name: str) -> None:
    """The tables README.md and docs/ render from experiment `name`'s results, made anew. One command at a time
    (a flock on the repository's folder, waited for): two renders of different experiments at once each read a
    page, and the later one's write dropped the other's tables (both wrote README.md.tmp, too)."""
    fd = os.open(ROOT, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for page in pages():
            with open(page, encoding="utf-8") as f:
                text = f.read()
            try:
                new = render_blocks(text, only=name)
            except UsageError as e:  # the results are written; the page, as it was, says what to mend
                raise UsageError(f"{os.path.relpath(page, ROOT)}: {e}") from None
            if new != text:
                save_atomic(page, lambda f: f.write(new.encode()))
                print(f"rendered its tables in {os.path.relpath(page, ROOT)}")
    finally:
        os.close(fd)  # and the lock with it


def render_again(report, path: str) -> tuple[dict, str]:
    """--render: the results at `path` decided again (report.decide_again) and written as markdown. Results
    that are readable JSON with a command but not what this experiment's report reads (damaged, edited, another
    experiment's) are one line, not the report's KeyError."""
    try:
        with open(path, encoding="utf-8") as f:
            data = report.decide_again(json.load(f, object_hook=int_keys))
        return data, report.markdown(data)
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise UsageError(f"--render: {path} is damaged or not this experiment's results ({type(e).__name__}: "
                         f"{e}); run the experiment again, or restore the file") from None


# ---------------------------------------------------------------------------------------------------------
# Scaling out: an experiment's models as commands a scheduler runs (--cells), or through submitit (--launcher)
# ---------------------------------------------------------------------------------------------------------

# A study whose run(args) trains a grid of small GPTs has cells(args): the train.py argvs run() trains, in waves
# (a model of wave 2 may start from one of wave 1: --init). Every one of them goes through train_once, which
# reuses a run that train.py recorded (made-by.json) for this very argv and code, so once every cell is trained
# outside, run(args) trains nothing and gives the results it would have given alone.
SUBMITIT_CLUSTERS = ("slurm", "local", "debug")


def check_cells(name: str, study, args, preset: str) -> None:
    """--cells and --launcher: the study lists its cells, the command is one that trains, the launcher is known."""
    flag = "--cells" if args.cells else f"--launcher {args.launcher}"
    if not hasattr(study, "cells"):
        raise UsageError(f"{flag}: {name} does not list its models as cells (ryarn and distance do); run it "
                         "without, --jobs N for several at once")
    if args.render or preset == "probe":
        raise UsageError(f"{flag}: --{'render' if args.render else 'probe'} trains nothing to share out (a probe "
                         "measures what a step costs on one machine)")
    if args.cells and args.launcher != "local":
        raise UsageError("--cells writes the commands, --launcher runs them: choose one")
    if args.launcher != "local":
        kind, _, cluster = args.launcher.partition(":")
        if kind != "submitit" or (cluster and cluster not in SUBMITIT_CLUSTERS):
            raise UsageError(f"--launcher {args.launcher}: give local, submitit or submitit:CLUSTER "
                             f"({', '.join(SUBMITIT_CLUSTERS)})")


def cell_line(argv: list[str]) -> str:
    """One model's command, whole: from this folder (where runs/ is), with this Python and this checkout's
    train.py, so that a node sharing the filesystem runs the same code (made-by.json's digest matches)."""
    return (f"cd {shlex.quote(os.getcwd())} && {shlex.quote(sys.executable)} "
            f"{shlex.quote(os.path.join(ROOT, 'train.py'))} {shlex.join(argv)}")


def write_cells(waves: list[list[list[str]]], folder: str) -> None:
    """--cells DIR: DIR/wave1.txt, wave2.txt, ...: one line per model of that wave still to train (a model
    already trained by this code is left out; a wave may be empty). Wave k + 1 starts once wave k has finished."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--cells {folder}: {e.strerror}") from None
    counts = []
    for k, wave in enumerate(waves, 1):
        lines = "".join(cell_line(argv) + "\n" for argv in wave if not trained(argv))
        save_atomic(os.path.join(folder, f"wave{k}.txt"), lambda f: f.write(lines.encode()))
        counts.append(f"wave{k}.txt {lines.count(chr(10))} of {len(wave)} models")
    print(f"wrote {folder}/: {'; '.join(counts)} still to train. Run every line of a wave, the waves in order; "
          "then the same command without --cells trains nothing more and writes the results.")


def launch_cells(waves: list[list[list[str]]], args, folder: str) -> None:
    """--launcher submitit[:CLUSTER]: each wave's models still to train as one job array of submitit's executor
    (SLURM where sbatch is found, else processes on this machine; "debug": one by one in this process), each
    job its cell's command (cell_line), waited for before the next wave starts."""
    try:
        import submitit  # an optional extra, needed only here (CI installs it: .ci/run)
    except ImportError:
        raise UsageError(f"--launcher {args.launcher} needs submitit: pip install submitit") from None
    cluster = args.launcher.partition(":")[2] or None
    executor = submitit.AutoExecutor(folder=os.path.join(folder, "%j"), cluster=cluster)
    executor.update_parameters(name=f"lengen-{args.experiment}", cpus_per_task=args.threads or 1,
                               **({"gpus_per_node": 1} if args.device.startswith("cuda") else {}))
    for k, wave in enumerate(waves, 1):
        todo = [argv for argv in wave if not trained(argv)]
        with executor.batch():
            jobs = [executor.submit(submitit.helpers.CommandFunction(
                [sys.executable, os.path.join(ROOT, "train.py"), *argv], cwd=os.getcwd(), verbose=False))
                for argv in todo]
        failed = []
        for job in tqdm(jobs, desc=f"wave {k} on {executor.cluster}", disable=not jobs):
            try:
                job.result()
            except Exception:  # submitit's FailedJobError (the command failed) or a job lost: its log says why
                failed.append(job.job_id)
        if failed:
            raise UsageError(f"wave {k}: {len(failed)} of {len(jobs)} jobs failed (first: {failed[0]}; its log is "
                             f"in {folder}/{failed[0]}); the finished models are kept: run the same command again")


# ---------------------------------------------------------------------------------------------------------
# Statistics over seeds and how they are written; ALiBi's slopes; the beyond-L mean
# ---------------------------------------------------------------------------------------------------------


def spread(values) -> dict:
    """Mean, sample standard deviation and range of a few numbers (one per seed, or per seed and offset)."""
    values = [float(v) for v in values]
    mean = sum(values) / len(values)
    sd = sample_sd(values) if len(values) > 1 else 0.0
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


# ALiBi's paper sets a model's slopes by its head count; for the experiments' 2-4 heads that leaves slopes near 0
# (2 heads: 1/16, 1/256, nearly flat over 32 tokens), where its own models have 8 heads or more. The experiments
# give ALiBi the 8-head slopes, evenly spaced over their heads (train.py --alibi-slope-heads 8): 2 heads 1/2, 1/32.
ALIBI_SLOPE_HEADS = 8


def beyond(acc: list[float]) -> float:
    """A model's mean accuracy beyond L, from its accuracies at L, 2L, 4L, ...: every one but the first. The
    number the length experiments compare (encodings, ryarn)."""
    return sum(acc[1:]) / len(acc[1:])



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
                                                initializer=worker_setup, initargs=(threads, os.getpid())) as pool:
        try:
            futures = start_workers(pool, worker, items)
            for future in concurrent.futures.as_completed(futures):
                done.append(future.result())
                if bar is not None:
                    bar.update(1)
            return [f.result() for f in futures]
        except KeyboardInterrupt:
            stop_workers(pool)
            raise stopped(len(done), len(items)) from None
        except concurrent.futures.process.BrokenProcessPool:
            raise UsageError("a worker process died (killed, or out of memory); the models it had finished are "
                             "in runs/: run the same command again") from None
        except Exception:  # one run failed (its error is reported): nothing behind it is trained for nothing
            stop_workers(pool)
            raise


def start_workers(pool, worker, items: list) -> list:
    """Every item submitted to the pool, which starts its workers. A worker spends its first second or more
    importing torch, and until worker_setup it would take Ctrl-C (SIGINT, which a terminal sends to every process
    of the command) as a KeyboardInterrupt and print its traceback. So SIGINT is blocked while they start: they
    inherit the block, and worker_setup drops what came meanwhile. Here a Ctrl-C in that time is deferred, and
    stops the experiment (KeyboardInterrupt) once they have started."""
    multiprocessing.resource_tracker.ensure_running()  # starting it unblocks SIGINT when done: started before the block
    with signals_deferred() as stop:
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            futures = [pool.submit(run_job, worker, item) for item in items]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    if stop:
        raise KeyboardInterrupt
    return futures


def stop_workers(pool) -> None:
    """Cancel what has not started and stop the workers now: SIGTERM each (see worker_setup), so that one in a
    training step finishes that step and saves its checkpoint, and the others end at once."""
    with signals_deferred():  # a second Ctrl-C while the workers stop changes nothing
        workers = list(pool._processes.values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in workers:
            process.terminate()
        for process in workers:
            process.join()


def worker_setup(threads: int, parent: int) -> None:
    """In each --jobs worker: its torch threads; Ctrl-C left to the main process, which cancels the queue and
    sends the workers SIGTERM; SIGTERM ends a worker at once, except inside a training step (train.py's loop
    defers it), which finishes and saves its checkpoint first (run_job then ends the worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C that came while it started (start_workers) is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, lambda *_: (release_held(), os._exit(130)))  # no run folder left locked
    torch.set_num_threads(threads)
    threading.Thread(target=stop_when_orphaned, args=(parent, threading.main_thread().ident), daemon=True).start()


def stop_when_orphaned(parent: int, main_thread: int) -> None:
    """A worker whose experiment (`parent`) was killed outright (kill -9, the OOM killer, a closed terminal) is
    adopted by another process: it then stops as SIGTERM stops it, signalled to its main thread so that a wait
    for work (a blocking read) is interrupted too, rather than hold its run's lock and ~0.5 GB forever. The
    parent comes from the experiment itself: one killed while this worker was still importing is gone already."""
    while os.getppid() == parent:
        time.sleep(0.5)
    signal.pthread_kill(main_thread, signal.SIGTERM)


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
    trained with this very code (an experiment stopped part-way and started again, or the model trained from
    its cell's command: --cells): then that run, untouched. made-by.json, which train.py writes once training has
    finished, says which, and what the training took (cpu_s), so that a reused model still reports its cost: a
    probe run again plans from it. train.py --force into the folder with another command line replaces it.
    Returns {"run", "rows", "cpu_s"}."""
    out = argv[argv.index("--out") + 1]
    recorded = trained(argv)
    if recorded is not None:
        final = os.path.join(out, "final.json")  # absent when its caller measures the run itself
        try:
            with open(final) as f:
                return {"run": out, "rows": json.load(f), "cpu_s": recorded["cpu_s"]}
        except FileNotFoundError:
            return {"run": out, "rows": [], "cpu_s": recorded["cpu_s"]}
        except (OSError, ValueError):  # one cut short: train
            pass
    return train.run(argv)


def trained(argv: list[str]) -> dict | None:
    """train.py's argv's made-by.json record where it has already been trained, by this code, into its --out, and
    the record can be trusted (a finite cpu_s; with --fit-bar, a readable fit record, which its caller reads);
    None where it must be trained (no such file, one cut short, from older code, no fit record)."""
    out = argv[argv.index("--out") + 1]
    try:
        with open(os.path.join(out, "made-by.json")) as f:
            recorded = json.load(f)
        if {k: recorded[k] for k in ("argv", "code")} != {"argv": argv, "code": code_digest()}:
            return None
        if not finite_number(recorded["cpu_s"]):
            return None
        if "--fit-bar" in argv:
            fit = read_fit(out)
            if not (isinstance(fit, dict) and "steps_to_fit" in fit and fit.get("checks")):
                return None
        return recorded
    except (OSError, ValueError, KeyError, TypeError, UsageError):
        return None


def finite_number(x) -> bool:
    """A number a record can be trusted to hold: an int or float (not a bool), finite."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fit_of(argv: list[str]) -> dict:
    """A probe's model: train.py's argv (with --fit-bar) trained, or reused (train_once), and how it fitted: the
    step its last check reached the bar (None: it did not), the last check, [step, accuracy], and, from a run
    trained every step (--no-fit-stop), the first step at the bar and every check, the in-range curve a budget
    is planned from. Nothing beyond the training length is measured: a probe plans which cells a run can
    afford, never by their results. cpu_s: what its training took, when it was trained (train_once's record,
    so a reused model's too)."""
    trained = train_once(argv)
    fit = read_fit(trained["run"])
    through = {"first_fit": fit["first_fit"], "checks": fit["checks"]} if fit.get("stop") is False else {}
    return {"steps_to_fit": fit["steps_to_fit"], "last": fit["checks"][-1], **through, "cpu_s": trained["cpu_s"]}


def probe(cells: list[tuple[str, str, list[str]]], args, setup: dict, bar=None) -> dict:
    """Train a probe's models, one (column, row, train.py argv) a cell, --jobs at a time (fit_of), and return
    the record every probe keeps: its command, what it took, its settings, fits[column][row], every command."""
    since = (time.perf_counter(), cpu_seconds())
    results = map_jobs(fit_of, [argv for *_, argv in cells], args.jobs, args.threads or 1, bar)
    fits = {}
    for (column, row, _), result in zip(cells, results):
        fits.setdefault(column, {})[row] = result
    return {"command": command_line(args), "runtime": runtime(since, args), "settings": setup, "fit_bar": FIT_BAR,
            "fits": fits, "models": len(cells), "steps_trained": sum(r["last"][0] for r in results),
            "commands": ["python train.py " + " ".join(argv) for *_, argv in cells]}


def probe_on_record(name: str, out_dir: str, settings: dict, **recorded) -> dict | None:
    """The probe beside an experiment's results (out_dir/NAME-probe.json) without its commands, which its own
    file keeps: what the default copies into its results as how it was planned. None when there is none. A
    record that is there but cut short or damaged (damaged_probe), or measured with other settings than
    `settings` (--probe's now), another fit bar than FIT_BAR, or other values of `recorded` (the task options,
    say) cannot plan this run: UsageError, never a plan made as if there were no probe, or from wrong numbers."""
    path = os.path.join(out_dir, f"{name}-probe.json")
    again = f"run `python eval.py --experiment {name} --probe` first, or give another --out-dir"
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # unreadable, not JSON, cut short
        raise UsageError(f"{path} is not a readable probe record (cut short?): {again}") from None
    if problem := damaged_probe(record):
        raise UsageError(f"{path} is damaged ({problem}): {again}")
    record = {k: v for k, v in record.items() if k != "commands"}
    now = json.loads(json.dumps(settings))  # as the record stores them: tuples as lists
    changed = sorted(k for k in set(now) | set(record["settings"]) if now.get(k) != record["settings"].get(k))
    expected = json.loads(json.dumps({"fit_bar": FIT_BAR, **recorded}))
    changed += [k for k, v in expected.items() if record.get(k) != v]
    if changed:
        raise UsageError(f"{path} was measured with other settings than --probe's now ({', '.join(changed)}): "
                         + again)
    return record


def damaged_probe(record) -> str | None:
    """What makes a probe's record unfit to plan from, or None: a key missing, a count or time that is not a
    finite number, a fit whose steps to fit are neither None nor a positive whole number (NaN would count as
    fitted), or whose last check is not [step, accuracy]."""
    if not isinstance(record, dict):
        return "not a probe's record"
    missing = [k for k in ("command", "settings", "runtime", "fits", "steps_trained", "fit_bar") if k not in record]
    if missing:
        return f"no '{missing[0]}'"
    if not (isinstance(record["settings"], dict) and isinstance(record["runtime"], dict)
            and finite_number(record["runtime"].get("cpu_s")) and finite_number(record["steps_trained"])
            and record["steps_trained"] > 0 and finite_number(record["fit_bar"])):
        return "its settings, runtime, steps_trained or fit_bar"
    if not isinstance(record["fits"], dict) or not all(isinstance(c, dict) for c in record["fits"].values()):
        return "its fits are not a table"
    for column, rows in record["fits"].items():
        for row, fit in rows.items():
            steps = fit.get("steps_to_fit", "missing") if isinstance(fit, dict) else "missing"
            last = fit.get("last") if isinstance(fit, dict) else None
            if not (steps is None or (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1)) \
                    or not (isinstance(last, list) and len(last) == 2 and all(map(finite_number, last))) \
                    or not finite_number(fit.get("cpu_s", 0)):
                return f"the fit of {column}, {row}"
    return None


def fitted(fit: dict) -> bool:
    """Whether a probe's model reached the bar within its cap (a record of fit_of's)."""
    return fit["steps_to_fit"] is not None


def cpu_per_step(probe: dict) -> float:
    """A probe's measured CPU seconds per training step: what a plan multiplies. Its models' own training time
    (fit_of's cpu_s), which a probe run again or resumed keeps for the models it reuses; this invocation's CPU
    time over every model's steps would be ~0 there. A record from before models kept their time: its runtime."""
    fits = [fit for column in probe.get("fits", {}).values() for fit in column.values()]
    if fits and all("cpu_s" in fit for fit in fits):
        return sum(fit["cpu_s"] for fit in fits) / probe["steps_trained"]
    return probe["runtime"]["cpu_s"] / probe["steps_trained"]


def probe_cell(fit: dict) -> str:
    """A probe's table cell: '1400' (steps to fit, where the model stopped there), or '0.63 at 4000' (did not
    fit: the last check's accuracy); a model trained every step (it has first_fit) shows its last check and,
    where it reached the bar, the first step it did: '0.99 at 6000, bar at 1400'."""
    step, accuracy = fit["last"]
    if "first_fit" not in fit:
        return str(fit["steps_to_fit"]) if fitted(fit) else f"{accuracy:.2f} at {step}"
    return f"{accuracy:.2f} at {step}" + (f", bar at {fit['first_fit']}" if fit["first_fit"] else "")


def probe_cost(data: dict) -> str:
    """A probe's first line: its command, what it took, and a training step's cost for planning the run."""
    rt = data["runtime"]
    return (f"`{data['command']}`: {rt['wall_s'] / 60:.1f} min wall, {rt['cpu_s'] / 60:.1f} min CPU, {rt['jobs']} "
            f"job(s) of {rt['threads']} thread(s); {data['models']} models, {data['steps_trained']:,} steps: "
            f"{1000 * cpu_per_step(data):.1f} CPU-s per 1000 steps.")


def probe_table(fits: dict[str, dict[str, dict]], rows: list[str], first: str) -> list[str]:
    """fits[column][row] (fit_of's) as a markdown table, with how many rows fitted in each column."""
    columns = list(fits)
    out = [f"| {first} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    out += [f"| {row} | " + " | ".join(probe_cell(fits[c][row]) for c in columns) + " |" for row in rows]
    counts = {c: sum(fitted(fits[c][row]) for row in rows) for c in columns}
    return out + ["", "Fitted: " + "; ".join(f"{c} {n} of {len(rows)}" for c, n in counts.items()) + "."]


def last_stretch(fit: dict) -> str:
    """A probe model's accuracy in range over the last quarter of its checks (one trained every step: it has
    them all): '0.95 -> 0.99 (+0.04)'."""
    checks = fit["checks"]
    start = checks[min(len(checks) - 1, (3 * len(checks)) // 4)][1]
    return f"{start:.2f} -> {checks[-1][1]:.2f} ({checks[-1][1] - start:+.2f})"


def probe_stretch_table(fits: dict[str, dict[str, dict]], rows: list[str], first: str) -> list[str]:
    """fits[column][row]'s last stretch (last_stretch) as a markdown table, with what a budget is planned from:
    a budget suffices for a model whose accuracy in range is flat over its last stretch."""
    columns = list(fits)
    return ["In range over the last quarter of training, from the check at three quarters to the last: flat where "
            "the budget suffices.", "", f"| {first} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns),
            *(f"| {row} | " + " | ".join(last_stretch(fits[c][row]) for c in columns) + " |" for row in rows)]


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


def runtime(since: tuple[float, float], args) -> dict:
    """What an experiment took since since = (time.perf_counter(), cpu_seconds()), and how it ran."""
    return {"wall_s": round(time.perf_counter() - since[0], 1), "cpu_s": round(cpu_seconds() - since[1], 1),
            "jobs": args.jobs, "threads": args.threads or 1, "cores": os.cpu_count()}


def cpu_seconds() -> float:
    """CPU time of this process and of its finished child processes (--jobs workers, once their pool is
    closed): an experiment's CPU cost whether it runs its models here or in workers."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime
