"""The run folder: what train.py writes in runs/NAME and how, so that nothing is ever lost.

- Every file is written to a temporary name, flushed to the disk and renamed over the old one (save_atomic):
  a kill or a power cut leaves the old file or the new one, never a part of one.
- A run is held while it trains (hold; the lock itself is folder_lock.py): a second train.py on the same
  folder, on this machine or on another node of a cluster that shares the filesystem, is turned away in one line.
- --force builds the new run beside the old one and swaps it in only once it is whole (prepare_run_dir,
  swap_in): a new run that fails to start leaves the old one exactly as it was, and a swap that a kill cuts
  short is finished by the next command on the folder (finish_swap). Weights that are not finite are never saved.
- Ctrl-C and SIGTERM (what a cluster scheduler sends before it preempts a job) finish the step in flight
  (signals_deferred), so a checkpoint is always a step boundary and --resume continues bit for bit.
- config.json and checkpoint.pt are checked to hold what a run holds before anything reads them.
- What a small-GPT run (train.py) and an LLM fine-tune (finetune.py) share besides the folder: the checks of
  the settings both take, the thread count, the learning-rate schedule.

Bad input anywhere in lengen is a UsageError: one line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import resource
import shutil
import signal
import stat
import sys
import threading
import time

import torch

from folder_lock import LOCK_NAME, Busy, beating, release, take_lock


class UsageError(Exception):
    """Bad input from the user: reported as one line and exit status 2, never a traceback. `everywhere`: every
    process of a torchrun launch finds it alike (the command line, the model), so rank 0 alone says it."""
    everywhere = False


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during training: the checkpoint is saved, the run can be resumed."""


def save_atomic(path: str, write) -> None:
    """write(f) fills a temporary file that is flushed to the disk before it is renamed over `path`, and the
    rename is flushed too: a kill or a power cut leaves the old file or the new one, never a part of one. The new
    file keeps the old one's permissions (a private file stays private)."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            if os.path.isfile(path):
                os.fchmod(f.fileno(), stat.S_IMODE(os.stat(path).st_mode))
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:  # a full disk, a size limit, a kill signal turned exception: no half file is left
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise UsageError(f"cannot write {path}: {e.strerror or e} (what was there before stands)") from None
        raise
    os.replace(tmp, path)
    sync_folder(os.path.dirname(path))


def sync_folder(folder: str) -> None:
    """Flush a folder's entries (new names, renames) to the disk."""
    fd = os.open(folder or ".", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


@dataclasses.dataclass
class RunConfig:
    """A small-GPT run's settings: train.py's command line, checked, with every default resolved (train.resolve),
    saved as the run's config.json. One name each: the field, the flag (--max-position) and the key.
    The model's fields are lengen.GPTConfig's of the same name (eval.model_config takes them from here)."""
    # the task (tasks.py)
    task: str                           # a name in tasks.TASKS
    task_options: dict                  # its own settings (--offset, --delays, ...), defaults filled in
    train_len: tuple[int, int]          # each batch's length is drawn from [LOW, HIGH]
    vocab_size: int                     # the task's, with its special tokens
    # the model (lengen.GPTConfig)
    layers: int
    heads: int
    dim: int
    no_mlp: bool                        # attention-only blocks
    attention: str                      # "softmax" or "linear"
    linear_normalised: bool
    encoding: str                       # a name in lengen.ENCODINGS
    rope_base: float
    scaling: str                        # a rotary scaling in lengen.SCALINGS ("none", "pi", "ntk", "yarn", ...)
    factor: float                       # the scaling's s (1: none)
    original_len: int                   # the length L a scaling stretches (default: train_len's HIGH)
    max_len: int                        # rows of a learned position table
    # positions during training (evaluation is contiguous unless told)
    positions: str                      # a sampler in lengen.POSITION_SAMPLERS
    max_position: int                   # samplers draw ids from [0, max_position)
    curriculum: tuple | None            # (start, end, shape): the range widens over training (lengen.LengthCurriculum)
    # optimisation
    steps: int
    batch: int
    lr: float                           # peak: linear warm-up, cosine decay to a tenth (learning_rate)
    wd: float                           # AdamW weight decay on 2-D weights that are not an encoding's
    warmup: int
    seed: int                           # the model's init; seed + 1 the data, seed + 2 the position ids
    init: str | None                    # a run whose weights the model starts from
    # the run
    out: str                            # its folder
    save_every: int                     # steps between checkpoints
    eval_samples: int                   # sequences per length in the final table (0: none)
    device: str
    threads: int | None                 # torch CPU threads (CPU results depend on it: saved)
    compile: bool = False               # torch.compile the training forward
    fit_bar: float | None = None        # the fit check's bar: held-out accuracy at train_len's HIGH (fit.json)
    fit_every: int = 100                # steps between fit checks
    fit_stop: bool = True               # stop at the first check that reaches the bar (False: train every step)
    fit_far: int | None = None          # each fit check also measures here, beyond training: a length or a delay
    alibi_slope_heads: int | None = None  # ALiBi: take the slopes the paper gives this many heads (lengen.ALiBi)
    # how this command runs it, never saved: a resumed run takes them afresh
    quiet: bool = False
    resume: bool = False
    force: bool = False

    def saved(self) -> dict:
        """What config.json holds."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in RUNTIME_KEYS}


# How a run is being executed, not what it is: never saved in config.json.
RUNTIME_KEYS = ("resume", "force", "quiet")
# What every small-GPT run's config.json must hold (older runs lack the fields that have defaults), and its
# checkpoint.pt; eval.py and --resume refuse files without them.
RUN_KEYS = tuple(f.name for f in dataclasses.fields(RunConfig)
                 if f.default is dataclasses.MISSING and f.name != "out")


CHECKPOINT_KEYS = ("model", "optimizer", "step", "data_rng", "position_rng", "torch_rng")


def fit_record(bar: float | None, every: int, stop: bool = True, far: int | None = None) -> dict:
    """A fit record as fit.json holds it (read_fit), before its first check; the same for both kinds of run.
    With far (a small GPT's --fit-far), "far" holds where the out-of-range check measures and its checks."""
    fit = {"bar": bar, "every": every, "stop": stop, "checks": [], "steps_to_fit": None, "first_fit": None}
    if far is not None:
        fit["far"] = {"at": far, "checks": []}
    return fit


def fit_due(fit: dict, step: int, steps: int) -> bool:
    """Whether the fit check runs after step `step` of `steps`: with a bar, every `every` steps and at the last."""
    return bool(fit["bar"]) and (step % fit["every"] == 0 or step == steps)


def record_fit(fit: dict, step: int, accuracy: float, far: float | None = None) -> dict:
    """One check into the record: steps_to_fit is this check's step when it reached the bar, None when not (a
    run that stops at the bar stops there; one trained every step is judged by its last check); first_fit
    keeps the first step at the bar. far: the out-of-range accuracy of the same check (--fit-far). Returns
    the check's log line."""
    fit["checks"].append([step, round(accuracy, 4)])
    fit["steps_to_fit"] = step if accuracy >= fit["bar"] else None
    if fit.get("first_fit") is None:  # .get: a record from before first_fit was kept
        fit["first_fit"] = fit["steps_to_fit"]
    line = {"step": step, "fit_accuracy": round(accuracy, 4)}
    if far is not None:
        fit["far"]["checks"].append([step, round(far, 4)])
        line["far_accuracy"] = round(far, 4)
    return line


def check_fit_flags(args, parser) -> None:
    """--fit-bar and --fit-every, for both kinds of run: a bar in (0, 1], checks at least every step, and an
    interval only with a bar (alone it would be accepted and ignored)."""
    if args.fit_every < 1:
        raise UsageError("--fit-every must be >= 1")
    if args.fit_bar is not None and not 0 < args.fit_bar <= 1:
        raise UsageError(f"--fit-bar {args.fit_bar:g}: an accuracy in (0, 1]")
    if args.fit_bar is None and args.fit_every != parser.get_default("fit_every"):
        raise UsageError(f"--fit-every {args.fit_every} sets how often the fit check runs: give --fit-bar with it")
    for flag in ("fit_stop", "fit_far"):  # a small GPT's (--llm refuses them)
        if args.fit_bar is None and getattr(args, flag, None) != parser.get_default(flag):
            name = "--no-fit-stop" if flag == "fit_stop" else "--fit-far"
            raise UsageError(f"{name} belongs to the fit check: give --fit-bar with it")


def read_fit(run_dir: str) -> dict:
    """The fit record (fit.json) of a run trained with train.py --fit-bar: {"bar", "every", "stop", "checks":
    [[step, accuracy], ...], "steps_to_fit": the last check's step if it reached the bar, else None,
    "first_fit": the first step at the bar, and with --fit-far "far": {"at": N, "checks": [[step, accuracy],
    ...]}} (records written before issue 51 lack stop, first_fit and far)."""
    try:
        with open(os.path.join(run_dir, "fit.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        raise UsageError(f"{run_dir}: no readable fit.json (was it trained with --fit-bar?)") from None


def read_config(run_dir: str) -> RunConfig:
    """The settings of the run in run_dir, from its config.json (a key it does not know is left aside)."""
    settle(run_dir)
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        raise UsageError(f"{run_dir}: not a run directory (no config.json)")
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except ValueError:  # not JSON, or not even UTF-8 text
        raise UsageError(f"{path} is corrupt (not JSON)") from None
    missing = [k for k in RUN_KEYS if k not in saved] if isinstance(saved, dict) else RUN_KEYS
    if missing:
        raise UsageError(f"{path} is not a small-GPT run's config (no '{missing[0]}')")
    known = {f.name for f in dataclasses.fields(RunConfig)} - set(RUNTIME_KEYS)
    cfg = RunConfig(**{**{k: v for k, v in saved.items() if k in known}, "out": run_dir})
    check_saved_types(run_dir, cfg)
    return cfg


def load_checkpoint(run_dir: str) -> dict:
    path = os.path.join(run_dir, "checkpoint.pt")
    if not os.path.isfile(path):
        raise UsageError(f"{run_dir}: no checkpoint.pt (is it a run directory?)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file: any unpickling error means the same to the user
        raise UsageError(f"{path} is corrupt or not a lengen checkpoint ({type(e).__name__})") from None
    missing = [k for k in CHECKPOINT_KEYS if k not in ckpt] if isinstance(ckpt, dict) else CHECKPOINT_KEYS
    if missing:
        raise UsageError(f"{path} is not a lengen checkpoint (no '{missing[0]}')")
    return ckpt


def code_digest() -> str:
    """sha256 of the code a small GPT's training runs: a run trained by older code is trained again."""
    digest = hashlib.sha256()
    root = os.path.dirname(os.path.abspath(__file__))
    for name in ("lengen.py", "tasks.py", "train.py", "eval.py", "runs.py", "folder_lock.py"):
        with open(os.path.join(root, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def made_by_record(argv: list[str], cpu_s: float | None = None) -> dict:
    """What a finished small-GPT run's made-by.json holds: the command line that trained it (train.py's argv), the
    code that did (code_digest), and what the training took (cpu_s: the process's CPU seconds, its threads
    included). An experiment reuses the run only where argv and code are its own; cpu_s lets a reused model still
    report its cost, so that a probe run again plans from it."""
    return {"argv": list(argv), "code": code_digest()} | ({} if cpu_s is None else {"cpu_s": round(cpu_s, 2)})


# what --force replaces
RUN_FILES = ("config.json", "checkpoint.pt", "log.jsonl", "final.json", "fit.json", "model", "made-by.json")
# The stages of swap_in into a folder, each a folder of its own inside it, so that a process killed at any point
# (SIGKILL, the OOM killer, a power cut) leaves a state that says how far it went: the new run is built in
# .lengen.new; the old run's files go into .lengen.going, which is renamed .lengen.old once all of them are
# there; the new run's files come in; .lengen.old is renamed .lengen.gone, and only then deleted.
SWAP = {stage: f".lengen.{stage}" for stage in ("new", "going", "old", "gone")}


def beside(out: str, suffix: str) -> str:
    """A hidden name next to the run folder: runs/NAME -> runs/.NAME.new. Of the folder itself, not of a name
    for it: a symlink runs/far -> /scratch/run gives /scratch/.run.new."""
    parent, name = os.path.split(os.path.realpath(out))
    return os.path.join(parent, f".{name}.{suffix}")


def build_folder(out: str) -> str:
    """Where a new run is built before it takes out's place: inside `out` when that is a folder already (so on
    the filesystem of the files it replaces, even when out is a symlink to another disk or a mount point),
    else beside it, where a rename makes it `out`."""
    real = os.path.realpath(out)
    return os.path.join(real, SWAP["new"]) if os.path.isdir(real) else beside(real, "new")


@contextlib.contextmanager
def hold(out: str, holder: str = "train.py"):
    """Hold the run folder `out` while the block runs: a second train.py on it, on this machine or another that
    shares the filesystem, is turned away in one line instead of racing this one for its files (`holder` names
    the command in that line). The lock is out/.lengen.lock (folder_lock.take_lock), touched every
    folder_lock.LOCK_BEAT_S while the block runs. `out` is made for it if it is not there, and removed again if
    the block leaves it empty. What a process killed outright leaves is put right on the way in (tidy: a swap
    cut short finished, a half-built new run and *.tmp files cleared); this process's own on the way out."""
    if os.path.islink(out) and not os.path.exists(out):  # its lock would be made where the link points
        raise UsageError(f"cannot write to {out}: a symlink to nothing")
    made = not os.path.lexists(out)
    try:
        os.makedirs(out, exist_ok=True)
        take_lock(out, holder)
    except (OSError, Busy) as e:  # a file where the folder should be, a read-only folder; held already
        if made:  # left as it was (a process racing this one may have made it and hold it: then it stays)
            with contextlib.suppress(OSError):
                os.rmdir(out)
        raise UsageError(str(e) if isinstance(e, Busy) else f"cannot write to {out}: {e.strerror}") from None
    lock = os.path.join(out, LOCK_NAME)
    try:
        with beating(lock):
            tidy(out)
            yield
    finally:
        try:
            tidy(out, entering=False)
        finally:  # released even where tidying fails (as it will again where it failed on the way in)
            release(lock)
            if made and not os.listdir(out):  # a run that never started leaves no folder behind
                os.rmdir(out)


def tidy(out: str, entering: bool = True) -> None:
    """Put right what a process killed outright left in `out`: a swap it cut short is finished (finish_swap), and
    so, on the way in, is one it was about to begin, on a new run that was whole (swap_whole_build); what is left
    of a build that never went in is cleared (on the way out: this process's own, which failed or was stopped)."""
    try:
        done = finish_swap(out) if os.path.isdir(out) else None
    except OSError as e:  # nothing is deleted: the stages stay as they are for the next try
        raise UsageError(f"{out}: cannot finish a --force swap of runs that was cut short ({e.strerror}); its "
                         f"files are in {', '.join(SWAP.values())} there") from None
    if done is None and entering and os.path.isdir(out):
        done = swap_whole_build(out)
    if done:
        print(done, file=sys.stderr)
    for left in (beside(out, "new"), os.path.join(out, SWAP["new"]), os.path.join(out, SWAP["gone"])):
        shutil.rmtree(left, ignore_errors=True)
    for tmp in (os.path.join(out, name + ".tmp") for name in RUN_FILES):
        if os.path.isfile(tmp):
            os.remove(tmp)


# Where a container's memory limit is read: cgroup v2, then v1 ("max" or a huge number: no limit).
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def physical_memory(limits: tuple[str, ...] = CGROUP_LIMITS) -> int:
    """The memory this process may use, in bytes: the machine's, or its container's (cgroup) limit when lower,
    or its address-space limit (ulimit -v). The bound a size that cannot fit is refused against."""
    have = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    for path in limits:
        try:
            with open(path) as f:
                have.append(int(f.read().strip()))
        except (OSError, ValueError):  # not in a cgroup of that version, or "max"
            pass
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return min(have + ([soft] if soft != resource.RLIM_INFINITY else []))


def out_of_memory(error: BaseException) -> str | None:
    """One line for an allocation that failed (the size checks are lower bounds: attention, the MLP and the
    optimizer need more), or None for any other error."""
    if not (isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(error)):
        return None
    asked = re.search(r"allocate (\d+) bytes", str(error))
    size = f" ({int(asked.group(1)) / 2 ** 30:,.3g} GiB asked at once)" if asked else ""
    return (f"out of memory{size}: fewer tokens at once (--lengths, --train-len, --batch, --samples) would fit; "
            f"this process may use {physical_memory() / 2 ** 30:,.0f} GiB")


def saved_settings(folder: str) -> dict | None:
    """What folder's config.json holds, if it is there and a JSON object; None otherwise."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def holds_run(folder: str) -> bool:
    """Whether folder's config.json is a lengen run's (a small GPT's or an LLM fine-tune's: both name their task,
    training length, steps and seed), not a Hugging Face model's or anything else's."""
    return {"task", "train_len", "steps", "seed"} <= set(saved_settings(folder) or {})


def check_out(out: str, force: bool) -> None:
    """`out` may take a new run: it holds none (or --force replaces it), and no file there that a run writes
    (model/, checkpoint.pt, config.json, ...) belongs to something else, since the new run would replace it."""
    if os.path.lexists(os.path.join(out, "config.json")) and not holds_run(out):
        raise UsageError(f"{out} holds a config.json that is not a lengen run's (a Hugging Face model's?): a run "
                         "there would replace it; give an empty or new folder")
    if os.path.exists(os.path.join(out, "config.json")):
        if not force:
            raise UsageError(f"{out} already holds a run: --resume to continue it, --force to overwrite it")
        return
    foreign = [name for name in RUN_FILES if os.path.lexists(os.path.join(out, name))]
    if foreign:
        raise UsageError(f"{out} holds {', '.join(foreign)} but no run (no config.json): a run there would replace "
                         "them; give an empty or new folder")


def prepare_run_dir(out: str, force: bool) -> str:
    """Check that `out` may take a new run, and make the empty folder where the run is built (build_folder);
    swap_in puts it in place once it is whole."""
    check_out(out, force)
    if os.path.lexists(out) and not (os.path.isdir(out) and os.access(out, os.W_OK)):
        why = "a symlink to nothing" if os.path.islink(out) and not os.path.exists(out) else "not a writable folder"
        raise UsageError(f"cannot write to {out}: {why}")
    new = build_folder(out)
    try:
        os.makedirs(new)
    except OSError as e:
        raise UsageError(f"cannot write to {out}: {e.strerror}") from None
    return new


def swap_in(new: str, out: str) -> None:
    """Put the run built in `new` (build_folder) where `out` is: one rename, or, when `out` is a folder already,
    its run's files replaced by the new run's (other files there, such as a figure saved beside the run, stay).
    The old files are moved aside first and deleted only once every new one is in place (the stages of SWAP);
    a rename that fails puts them back and says so. Ctrl-C and SIGTERM wait for it; a SIGKILL within these few
    renames leaves the stages, which the next command on the folder finishes (finish_swap)."""
    real = os.path.realpath(out)
    with signals_deferred() as stop:
        if not os.path.isdir(real):
            os.rename(new, real)
        else:
            stage = {name: os.path.join(real, folder) for name, folder in SWAP.items()}
            moved = []
            try:
                if new != stage["new"]:  # built beside a folder that appeared since (an LLM fine-tune's --out)
                    os.rename(new, stage["new"])
                    new = stage["new"]
                os.makedirs(stage["going"], exist_ok=True)
                for name in RUN_FILES:
                    if os.path.lexists(os.path.join(real, name)):
                        os.rename(os.path.join(real, name), os.path.join(stage["going"], name))
                os.rename(stage["going"], stage["old"])  # every old file is aside: all that comes in now is new
                sync_folder(real)
                for name in os.listdir(new):
                    os.rename(os.path.join(new, name), os.path.join(real, name))
                    moved.append(name)
                os.rename(stage["old"], stage["gone"])
            except OSError as e:  # the old run goes back as it was; the new one stays where it was built
                for name in moved:
                    os.rename(os.path.join(real, name), os.path.join(new, name))
                put_back(real, stage)
                raise UsageError(f"cannot put the new run in {out} ({e.strerror}); the run there is unchanged") \
                    from None
            shutil.rmtree(stage["gone"], ignore_errors=True)  # what it cannot delete, the next tidy will
            os.rmdir(new)
        sync_folder(real)
        sync_folder(os.path.dirname(real))
    if stop:  # now that the run is whole, a Ctrl-C or SIGTERM that came during the swap stops the command
        raise KeyboardInterrupt


def finish_swap(out: str) -> str | None:
    """A swap_in that a kill cut short, finished: the new run was whole before the swap began (swap_in comes after
    its checkpoint, or an LLM's saved model), so the swap goes on from the stage it reached and the new run takes
    the folder, as the command that was killed asked. Nothing is deleted before the new run is in place. Returns
    one line that says so, or None where no swap was cut short (.lengen.gone alone: it was done)."""
    real = os.path.realpath(out)
    stage = {name: os.path.join(real, folder) for name, folder in SWAP.items()}
    if not (os.path.isdir(stage["going"]) or os.path.isdir(stage["old"])):
        return None
    if os.path.isdir(stage["going"]) and not os.path.isfile(os.path.join(stage["new"], "config.json")):
        put_back(real, stage)  # no new run to finish with (not one swap_in began with): the old one stays
        return f"{out}: a --force swap of runs here was cut short (the process was killed); the old run is back"
    if os.path.isdir(stage["going"]):  # still moving the old files aside: the rest follow
        for name in RUN_FILES:
            if os.path.lexists(os.path.join(real, name)):
                os.rename(os.path.join(real, name), os.path.join(stage["going"], name))
        os.rename(stage["going"], stage["old"])
    for name in os.listdir(stage["new"]) if os.path.isdir(stage["new"]) else ():
        os.rename(os.path.join(stage["new"], name), os.path.join(real, name))
    os.rename(stage["old"], stage["gone"])
    sync_folder(real)
    return (f"{out}: a --force swap of runs here was cut short (the process was killed); it is finished now: the "
            "new run is in place")


def whole_build(folder: str) -> bool:
    """Whether a new run built in `folder` (build_folder) is whole, as swap_in takes it: its config.json and a
    small GPT's first checkpoint, or an LLM fine-tune's model/ (which finetune.save renames in once written)."""
    return os.path.isfile(os.path.join(folder, "config.json")) and (
        os.path.isfile(os.path.join(folder, "checkpoint.pt")) or os.path.isdir(os.path.join(folder, "model")))


def swap_whole_build(out: str) -> str | None:
    """A new run that was whole but never went in (train.py --force killed between its last file and swap_in),
    put in place, as the command asked and as a swap cut short one rename later is (finish_swap). Returns one
    line that says so, or None where there is none."""
    for new in (os.path.join(os.path.realpath(out), SWAP["new"]), beside(out, "new")):
        if whole_build(new):
            resumable = os.path.isfile(os.path.join(new, "checkpoint.pt"))
            swap_in(new, out)
            return (f"{out}: a --force run here was killed as it was about to go in; it is in place now" +
                    ("" if not resumable else ": continue it with the command line that started it and --resume"
                     if llm_run(out) else f": continue it with python train.py --resume --out {out}"))
    return None


def settle(run_dir: str) -> None:
    """Before a run is read: a swap that a kill cut short in its folder is finished (finish_swap, which says so),
    under the folder's lock, so that a swap going on in another process is left alone (and said to be)."""
    if any(os.path.isdir(os.path.join(run_dir, SWAP[stage])) for stage in ("going", "old")) \
            or whole_build(os.path.join(run_dir, SWAP["new"])):
        with hold(run_dir):
            pass


def put_back(real: str, stage: dict) -> None:
    """The old run's files, moved aside by swap_in (stage: SWAP's folders in `real`), back in their place."""
    for aside in (stage["going"], stage["old"]):
        if os.path.isdir(aside):
            for name in os.listdir(aside):
                os.rename(os.path.join(aside, name), os.path.join(real, name))
            os.rmdir(aside)


@contextlib.contextmanager
def signals_deferred():
    """Ctrl-C and SIGTERM only add their number to the list this yields, so that the work in the block (a
    training step, a swap) completes; the block decides when to stop. Only the main thread can catch signals:
    elsewhere (an experiment's worker thread) the block runs unguarded."""
    stop = []
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, lambda signum, _: stop.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class RunFolder:
    """A training run's folder, from its config to its last checkpoint, as a context manager:

        with RunFolder(cfg.out, cfg.saved(), resume=cfg.resume, force=cfg.force) as run:
            ...; run.log({"step": step, "loss": loss}); run.save_checkpoint(state)
            if run.stop: ...  # Ctrl-C or SIGTERM came: the step in flight has finished

    A new run is built in a hidden folder beside `out` (prepare_run_dir), with its config.json and an empty
    log.jsonl, and takes out's place with its first checkpoint (swap_in): a run that fails before then
    replaces nothing. A resumed run appends to its own folder. While the block runs, Ctrl-C and SIGTERM only
    add their number to `stop` (signals_deferred), so a checkpoint is always a step boundary."""

    def __init__(self, out: str, config: dict, resume: bool = False, force: bool = False):
        self.out, self.config, self.resume, self.force = out, config, resume, force

    def __enter__(self) -> "RunFolder":
        self.folder = self.out if self.resume else prepare_run_dir(self.out, self.force)
        if not self.resume:
            write_config(self.folder, self.config)
        self._stack = contextlib.ExitStack()
        self.stop = self._stack.enter_context(signals_deferred())
        self._log = self._stack.enter_context(open_log(self.folder, fresh=not self.resume))
        return self

    def __exit__(self, *exc) -> bool:
        return self._stack.__exit__(*exc)

    @property
    def started(self) -> bool:
        """Whether the run stands in `out` (a new one: once its first checkpoint is written)."""
        return self.folder == self.out

    def log(self, row: dict) -> None:
        self._log.write(json.dumps(row) + "\n")

    def save(self, name: str, data: bytes) -> None:
        """A file of the run (fit.json, final.json), written whole or not at all."""
        save_atomic(os.path.join(self.folder, name), lambda f: f.write(data))

    def save_checkpoint(self, state: dict) -> None:
        """checkpoint.pt, of finite weights (check_weights); the first one of a new run puts the run in out's place."""
        check_weights(state["model"], f"after step {state['step']}")
        save_atomic(os.path.join(self.folder, "checkpoint.pt"), lambda f: torch.save(state, f))
        if not self.started:
            swap_in(self.folder, self.out)
            self.folder = self.out


def check_weights(weights: dict, when: str) -> None:
    """Weights about to be saved are finite. A step can turn them to inf or NaN while its own loss was finite (a
    backward that overflows, a huge --lr); saved, they would replace the last checkpoint, or the run that --force
    replaces, with a model that computes nothing."""
    if not all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point()):
        raise UsageError(f"the weights are not finite (inf or NaN) {when}: training diverged (lower --lr); they "
                         "were not saved")


def write_config(out: str, config: dict) -> None:
    """config.json: a small-GPT run's RunConfig.saved(), or an LLM fine-tune's settings."""
    text = json.dumps({k: v for k, v in config.items() if k not in RUNTIME_KEYS}, indent=1)
    save_atomic(os.path.join(out, "config.json"), lambda f: f.write(text.encode()))


def open_log(out: str, fresh: bool):
    """log.jsonl, line-buffered so that `tail -f` works; a fresh run starts it empty, a resumed one appends."""
    return open(os.path.join(out, "log.jsonl"), "w" if fresh else "a", buffering=1)


def cut_log(out: str, step: int) -> None:
    """A resumed run's log.jsonl cut back to its checkpoint's `step`: the steps trained past it are trained and
    logged again. Lines cut short or garbled (a power cut) go; a deleted log starts empty."""
    path = os.path.join(out, "log.jsonl")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except FileNotFoundError:  # deleted: the run goes on, logging from its checkpoint
        lines = []
    except OSError as e:  # a folder in its place
        raise UsageError(f"{path}: {e.strerror}; move it aside to resume (the run goes on from its checkpoint)") \
            from None
    # each kept line ends with its newline: one that lost it (a power cut) would run into the next step's
    kept = [line.rstrip("\n") + "\n" for line in lines if (logged := logged_step(line)) is not None
            and logged <= step]
    save_atomic(path, lambda f: f.write("".join(kept).encode()))


def logged_step(line: str) -> int | None:
    """The step of one whole log.jsonl line; None for a line cut short, garbled (NUL bytes after a power cut) or
    not the log's (edited by hand). A line that parses is whole, with or without its newline: a JSON object cut
    anywhere before its closing brace does not parse."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, TypeError, KeyError):
        return None
    return step if isinstance(step, int) else None


def printable_output() -> None:
    """Print what the terminal's encoding cannot show (a run named é under PYTHONIOENCODING=ascii, a ± in a
    table) as escapes, as Python already does on stderr, instead of failing after the work is done."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def closed_stdout(program: str) -> None:
    """stdout was closed by its reader (| head): say so in one line, and send whatever Python still flushes
    at exit to /dev/null, so that no second error follows."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    print(f"{program}: error: the output was closed before all of it was written", file=sys.stderr)


def launch_rank() -> int:
    """This process's rank as a launcher (torchrun) set it, 0 without one: known before any process group."""
    return int(os.environ.get("RANK", "0"))


def wait_for_rank_0(seconds: float = 60.0) -> None:
    """A rank that keeps quiet about an error every rank finds waits for the launcher to end it: torchrun ends
    every process once one has failed, so a quiet rank that exited first could have rank 0 ended before it said
    the error (no line at all on a loaded machine). Rank 0 says it and exits; the launcher's SIGTERM then ends
    this one quietly, or it exits after `seconds`."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(2))
    time.sleep(seconds)


def cli_main(program: str, command, argv: list[str] | None = None, alike: bool = False) -> int:
    """The one entry of train.py and eval.py: command(argv), with every way it can end turned into one line
    and an exit status: 0 done; 2 bad input (UsageError), an allocation that failed, or a closed pipe (| head);
    130 Ctrl-C, or SIGTERM, a scheduler's preemption, which is made a Ctrl-C so it stops the same clean way.
    Any other error is a bug and keeps its traceback. Under torchrun an error every process finds alike
    (UsageError.everywhere, or every error of a command that is `alike` in every process) is said by rank 0
    alone."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # train.py and eval.py exit at once while they load
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    printable_output()
    try:
        command(argv)
        sys.stdout.flush()  # a closed pipe (| head) shows here, inside the try, rather than at exit
    except UsageError as e:
        if launch_rank() == 0 or not (alike or e.everywhere):
            print(f"{program}: error: {e}", file=sys.stderr)
        elif os.environ.get("GROUP_RANK", "0") == "0":  # rank 0 on this node: the launcher here ends this one
            wait_for_rank_0()
        return 2
    except Interrupted as e:  # Ctrl-C inside a training run: its checkpoint is saved
        print(f"{program}: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # outside the training loop: nothing is left half-written
        print(f"{program}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        closed_stdout(program)
        return 2
    except (RuntimeError, MemoryError) as e:  # an allocation that failed is one line; any other error is a bug
        if (line := out_of_memory(e)) is None:
            raise
        print(f"{program}: error: {line}", file=sys.stderr)
        return 2
    return 0


# What --resume takes besides the run: how it runs, not what it computes.
# (The device is where a run runs, not what it is: a run trained on a GPU may continue on a CPU.)
RESUME_FLAGS = ("resume", "out", "quiet", "threads", "device")


def llm_run(folder: str) -> bool:
    """Whether the config.json in `folder` is an LLM fine-tune's (it names the model, --llm)."""
    return bool((saved_settings(folder) or {}).get("llm"))


def resume_config(args, given: dict) -> RunConfig:
    """The saved settings of the run in --out (args: train.py's parsed command line; given: the options typed,
    train.given_flags). A flag given with --resume must agree with them: continued with other settings, the
    run would give other numbers under its name."""
    if not args.out:
        raise UsageError("--resume needs --out RUN_DIR")
    if args.force:
        raise UsageError("--resume continues a run and --force replaces it: choose one")
    if os.path.isdir(os.path.join(args.out, "model")) or llm_run(args.out):  # a fine-tune (finetune.py)
        raise UsageError(f"{args.out} is an LLM run: resume it with the command line that started it and "
                         "--resume (from the checkpoint --checkpoint-every saved)")
    cfg = read_config(args.out)
    saved = {**cfg.saved(), **cfg.task_options}

    def show(value):  # tuples given, lists saved: compared and shown as JSON (strings as they are)
        return value if isinstance(value, str) else json.dumps(value)
    differ = [f"--{k.replace('_', '-')} {show(v)} (the run has {show(saved.get(k))})"
              for k, v in given.items() if k not in RESUME_FLAGS and show(v) != show(saved.get(k))]
    if differ:
        raise UsageError(f"{args.out} was trained with other settings: {', '.join(differ)}; resume without them, "
                         "or start again with --force")
    return dataclasses.replace(cfg, resume=True, force=False, out=args.out, quiet=args.quiet,
                               threads=args.threads or cfg.threads, device=given.get("device", cfg.device),
                               train_len=tuple(cfg.train_len), curriculum=cfg.curriculum and tuple(cfg.curriculum))


# What each key of a small-GPT run's config.json holds, as the command line gives it (None: also none at all).
SAVED_KINDS = {**dict.fromkeys(("vocab_size", "layers", "heads", "dim", "original_len", "max_len", "max_position",
                                "steps", "batch", "warmup", "seed", "save_every", "eval_samples", "fit_every"),
                               "an integer"),
               **dict.fromkeys(("rope_base", "factor", "lr", "wd"), "a finite number"),
               **dict.fromkeys(("task", "encoding", "scaling", "positions", "attention", "device"), "a string"),
               **dict.fromkeys(("no_mlp", "linear_normalised", "compile"), "true or false"),
               "task_options": "an object", "threads": "an integer or none", "alibi_slope_heads": "an integer or none",
               "fit_bar": "a finite number or none", "init": "a run's folder or none"}


def saved_kind(value, kind: str) -> bool:
    """Whether a value read from config.json is of a kind SAVED_KINDS names."""
    if kind.endswith(" or none"):
        return value is None or saved_kind(value, kind[:-len(" or none")])
    whole = isinstance(value, int) and not isinstance(value, bool)
    return {"an integer": whole, "a finite number": (whole or isinstance(value, float)) and math.isfinite(value),
            "a string": isinstance(value, str), "a run's folder": isinstance(value, str),
            "true or false": isinstance(value, bool),
            "an object": isinstance(value, dict) and all(isinstance(k, str) for k in value)}[kind]


def check_saved_types(out: str, cfg: RunConfig) -> None:
    """A config.json edited by hand holds what the command line would have given: integers where it takes
    integers, numbers where it takes numbers, and so on (SAVED_KINDS); train.check_resumed then checks their
    ranges and builds the model it describes."""
    for key, kind in SAVED_KINDS.items():
        value = getattr(cfg, key)
        if not saved_kind(value, kind):
            raise UsageError(f"{out}/config.json: {key} is {json.dumps(value)}, not {kind.removesuffix(' or none')}")
    length = cfg.train_len
    if not (isinstance(length, list) and len(length) == 2 and all(saved_kind(n, "an integer") for n in length)
            and 0 < length[0] <= length[1]):
        raise UsageError(f"{out}/config.json: train_len is {json.dumps(length)}, not [LOW, HIGH] with "
                         "0 < LOW <= HIGH")
    shape = cfg.curriculum
    whole = isinstance(shape, list) and len(shape) == 3 and all(saved_kind(n, "an integer") for n in shape[:2])
    if shape is not None and not (whole and isinstance(shape[2], str)):
        raise UsageError(f"{out}/config.json: curriculum is {json.dumps(shape)}, not [START, END, SHAPE] or null")


# ---------------------------------------------------------------------------------------------------------
# What both trainers and eval.py share: the command line's types, checked settings, the learning rate
# ---------------------------------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UsageError(message)


def finite(text: str) -> float:
    """A float option. NaN and infinity are refused here: a range check such as x > 0 is false for NaN."""
    value = float(text)  # not a number: argparse says so
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got '{text}'")
    return value


def int_range(text: str) -> tuple[int, int]:
    """'24' -> (24, 24); '8:24' -> (8, 24)."""
    try:
        lo, _, hi = text.partition(":")
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LOW:HIGH, got '{text}'") from None
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 0 < LOW <= HIGH, got '{text}'")
    return lo, hi


MAX_SET = 100_000  # far beyond any window a delay fits in; a list of 10^9 numbers alone would fill the memory


def int_set(text: str) -> tuple[int, ...]:
    """'15:25' -> 15, 16, ..., 25 (inclusive); '1,4,9' -> 1, 4, 9; the two mix: '0:3,10'."""
    values = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition(":")
            lo, hi = int(lo), int(hi or lo)
            if len(values) + hi - lo >= MAX_SET:  # counted before the list is made
                raise argparse.ArgumentTypeError(f"'{text}' lists more than {MAX_SET:,} values")
            values += range(lo, hi + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a list like 15:25 or 1,4,9, got '{text}'") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got '{text}'")
    return tuple(sorted(set(values)))


def refuse_unused(args, parser, flags, why) -> None:
    """Options the run would ignore are refused, not silently dropped: why(flag) says what they are for."""
    for flag in sorted(flags):
        if getattr(args, flag) != parser.get_default(flag):
            raise UsageError(f"--{flag.replace('_', '-')} {why(flag)}")


def check_runtime(args) -> None:
    """Settings every run shares: optimizer numbers, the seed, threads, device."""
    check_optimizer(args)
    check_machine(args.device, args.threads)


def check_optimizer(args) -> None:
    """The optimizer's numbers and the seed (args: a command line, or a RunConfig read back)."""
    if args.lr <= 0 or args.wd < 0 or args.warmup < 0:
        raise UsageError("--lr must be > 0, --wd and --warmup >= 0")
    if not -2 ** 63 <= args.seed < 2 ** 63:  # torch seeds are 64-bit
        raise UsageError(f"--seed must fit in a signed 64-bit integer, got {args.seed}")
    if args.lr > torch.finfo(torch.float32).max:  # the optimizer's step scales float32 numbers by it
        raise UsageError(f"--lr {args.lr:g} is beyond float32's range (a learning rate is far below 1)")


# Sequences or prompts measured per length: at 10^6 a 95 % interval is already +-0.001; 10^12 would only grow the
# memory the per-sequence scores take until the machine runs out.
MAX_SAMPLES = 1_000_000


def check_machine(device: str, threads: int | None) -> None:
    """--device and --threads, for train.py and eval.py. More torch threads than CPU cores only slow a run down
    (100,000 of them crash torch); and a CPU run's numbers depend on its thread count, so it is refused rather
    than quietly capped."""
    if threads is not None and threads < 1:
        raise UsageError("--threads must be >= 1")
    if threads is not None and threads > (os.cpu_count() or 1):
        raise UsageError(f"--threads {threads}: this machine has {os.cpu_count()} CPU cores")
    try:
        where = torch.device(device)
    except RuntimeError:
        raise UsageError(f"unknown --device '{device}' (cpu, cuda, cuda:1, mps)") from None
    count = {"cpu": 1, "cuda": torch.cuda.device_count(), "mps": int(torch.backends.mps.is_available())}
    if (where.index or 0) >= count.get(where.type, 0):
        raise UsageError(f"--device {device}, but this machine has no such device")


def check_memory(dim: int, vocab_size: int, tokens: int, what: str, device: str) -> None:
    """Refuse, before any allocation, a small GPT's forward over `tokens` tokens that cannot fit. The bound is
    low on purpose: int64 inputs and targets, a bool mask, and the float32 hidden state and logits that meet at
    the output layer; attention and the other layers need more on top."""
    need = tokens * (8 + 8 + 1 + 4 * (dim + vocab_size))
    on_gpu = torch.device(device).type == "cuda"
    have = torch.cuda.get_device_properties(device).total_memory if on_gpu else physical_memory()
    if need > have:
        raise UsageError(f"{what} needs at least {need / 2 ** 30:,.4g} GiB; {device if on_gpu else 'this machine'} "
                         f"has {have / 2 ** 30:,.0f} GiB")
